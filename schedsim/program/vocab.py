"""The names of the engine's comm semantics, comm streams and group semantics: the one
home of these words and of what each semantics means (``schedsim.sim.costs.CommModel``
types its fields with them; the CLI's choices, ``schedsim list``, the planner and the
checks of a loaded Timeline read them). See DESIGN.md, "Comm semantics"."""
from __future__ import annotations

from typing import Literal, get_args

from schedsim.errors import ScenarioError

Semantics = Literal["data", "eager", "rendezvous"]
CommStream = Literal["none", "per-peer", "per-rank"]
#: how the ops of one BATCH progress (``CommModel.group_semantics``, docs/messages.md)
GroupSemantics = Literal["independent", "atomic"]
SEMANTICS: tuple[str, ...] = get_args(Semantics)
COMM_STREAMS: tuple[str, ...] = get_args(CommStream)
GROUP_SEMANTICS: tuple[str, ...] = get_args(GroupSemantics)
#: the semantics a run that posts its sends and recvs can have (a measured Timeline's,
#: and a prediction checked against one: data semantics ignores the posts), the default
#: first: gloo and NCCL sends complete only once the receiver posted (measured)
MEASURED_SEMANTICS: tuple[str, ...] = ("rendezvous", "eager")

#: what each semantics means (``schedsim list``; the engine's rules: CommModel's
#: docstring and docs/comm-semantics.md)
SEMANTICS_SUMMARY: dict[str, str] = {
    "data": "comm instructions are ignored: an op waits only for its producers' outputs "
            "(producer end + link cost); what papers draw (default)",
    "eager": "a send completes once its bytes have left; data waits at the receiver",
    "rendezvous": "a transfer starts once both sides have posted; both complete at "
                  "arrival (--eager-threshold: small messages eager); how NCCL and gloo "
                  "sends behave",
}
assert set(MEASURED_SEMANTICS) <= set(SEMANTICS) and tuple(SEMANTICS_SUMMARY) == SEMANTICS


def one_of(names: tuple[str, ...]) -> str:
    """``a, b or c``: the names for an error message."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_semantics(name: str, *, measured: bool = False) -> str:
    """``name`` if it is a comm semantics (``measured``: one a measured run can have,
    :data:`MEASURED_SEMANTICS`); else :class:`ScenarioError` naming the known ones."""
    if measured and name not in MEASURED_SEMANTICS:
        raise ScenarioError(f"unknown --semantics {name!r}: expected "
                            f"{one_of(MEASURED_SEMANTICS)} (a measured run posts its sends "
                            f"and recvs, so data semantics does not apply)")
    if name not in SEMANTICS:
        raise ScenarioError(f"unknown --semantics {name!r}: expected {one_of(SEMANTICS)}")
    return name

"""Lowering: Schedule (compute order) -> Program, by a named comm policy.

A comm policy decides where each rank launches its sends and recvs (one by one or as a
``BATCH``) and where it waits them. The policies:

- ``async``: :mod:`schedsim.program.async_policy`;
- ``commit``: :mod:`schedsim.program.commit_policy`;
- ``torch``: torch 2.13's runtimes, :mod:`schedsim.program.torch_runtime`;
- ``megatron``: Megatron-LM's ``_communicate`` calls, :mod:`schedsim.program.megatron`.

Each policy is one module over the flat form (what they share, which messages an op
sends and receives and the link order of recvs, is :mod:`schedsim.program.comm_plan`).
A policy is a function ``fn(schedule, **params) -> Program`` whose keyword-only
parameters (annotated, with defaults) are the policy's parameters; :data:`POLICIES` holds
each with a summary and one line of help per parameter. On the command line they are
``--param KEY=VALUE`` (or keys of the scenario's ``[schedule]`` table).
"""
from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from schedsim.errors import ScheduleError
from schedsim.program.ir import Program, Schedule
from schedsim.program.async_policy import lower_async
from schedsim.program.commit_policy import lower_commit
from schedsim.program.megatron import lower_megatron
from schedsim.program.torch_runtime import lower_torch


@dataclass(frozen=True)
class CommPolicy:
    """A registered comm policy: its function, what it imitates, and its parameters
    (name -> one line of help; defaults and types come from the function's signature)."""

    name: str
    fn: Callable[..., Program]
    summary: str
    params: dict[str, str] = field(default_factory=dict)

    def defaults(self) -> dict[str, Any]:
        """Parameter name -> default value, from the function's keyword-only parameters."""
        sig = inspect.signature(self.fn)
        return {k: p.default for k, p in sig.parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}


#: policy name -> :class:`CommPolicy`
POLICIES: dict[str, CommPolicy] = {p.name: p for p in (
    CommPolicy("async", lower_async,
               "each send posted after its producer, recvs one op early, waited just in "
               "time"),
    CommPolicy("commit", lower_commit,
               "DualPipe style: one BATCH + COMMIT of a step's sends and recvs before each "
               "compute"),
    CommPolicy("torch", lower_torch,
               "torch 2.13 pipelining runtimes (Schedule1F1B, ScheduleGPipe, "
               "_PipelineScheduleRuntime)",
               {"overlap_f_b": "a custom function is registered for OVERLAP_F_B: run each "
                               "F&B pair as one overlapped FB (default false: F then B, "
                               "each after its recv's wait)",
                "defer_pp_recv": "torch's defer_pp_recv=True: each RECV moved to just "
                                 "before its consumer, with torch's rank-parity rule "
                                 "(default false)"}),
    CommPolicy("megatron", lower_megatron,
               "Megatron-LM p2p_communication._communicate calls of 1F1B and interleaved "
               "1F1B",
               {"batch_p2p_comm": "one batch_isend_irecv per call, waited at once "
                                  "(false: one launch and one WAIT per op; default: true "
                                  "unless overlap_p2p_comm)",
                "overlap_p2p_comm": "interleaved only: steady-state calls launched "
                                    "unbatched, waits deferred to the consumer "
                                    "(default false)",
                "overlap_p2p_comm_warmup_flush": "with overlap_p2p_comm: warmup and "
                                                 "cooldown overlapped too, receives "
                                                 "prefetched an iteration ahead "
                                                 "(default false)",
                "deallocate_pipeline_outputs": "each overlapped forward send waited "
                                               "right after its launch, before the "
                                               "output is freed (default false; "
                                               "Megatron-LM's training sets it true)",
                "variable_seq_lengths": "each call preceded by its shape round "
                                        "(_communicate_shapes: one batch of 3-int64 "
                                        "shape messages, SEND_FS/RECV_FS/SEND_BS/"
                                        "RECV_BS, waited at once; default false)"}),
)}


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(POLICIES)


def get_policy(policy: str) -> CommPolicy:
    """The policy called ``policy``. Raises :class:`ScheduleError` naming the choices."""
    pol = POLICIES.get(policy)
    if pol is None:
        raise ScheduleError(f"unknown comm policy {policy!r}: expected one of "
                            f"{', '.join(policy_names())}")
    return pol


def policy_of_param(key: str) -> list[str]:
    """Names of the policies that take parameter ``key`` (for error hints)."""
    return [n for n in policy_names() if key in POLICIES[n].params]


def lower(schedule: Schedule, policy: str = "async", **params: Any) -> Program:
    """Lower ``schedule`` to a :class:`Program` with the named comm ``policy`` and its
    parameters (see :data:`POLICIES`; ``None`` values take the default).

    Raises :class:`ScheduleError` for an unknown policy, a parameter the policy does not
    take (naming the ones it does), a value of the wrong type, or a schedule the policy
    cannot run (e.g. ``megatron`` on an order Megatron-LM does not run).
    """
    pol = get_policy(policy)
    given = {k: v for k, v in params.items() if v is not None}
    for k in given:
        if k not in pol.params:
            takes = ", ".join(pol.params) or "none"
            raise ScheduleError(f"comm policy {policy!r} takes no parameter {k!r} (it "
                                f"takes: {takes})")
    from schedsim.util.memory import large_blocks_unpooled

    large_blocks_unpooled(len(schedule.flat()))      # a large lowering frees its temporaries
    return pol.fn(schedule, **coerce_params(pol, given))


def coerce_params(pol: CommPolicy, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` converted to the annotated types (``"false"`` -> False). Raises
    :class:`ScheduleError` naming a bad value."""
    from pydantic import TypeAdapter, ValidationError

    hints = typing.get_type_hints(pol.fn)
    out = {}
    for k, v in params.items():
        try:
            out[k] = TypeAdapter(hints[k]).validate_python(v)
        except ValidationError as e:
            raise ScheduleError(f"comm policy {pol.name!r}: bad value {k}={v!r}: "
                                f"{e.errors()[0]['msg']}") from None
    return out

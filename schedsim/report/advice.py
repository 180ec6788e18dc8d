"""What schedsim tells a user beside the numbers: cost warnings and deadlock fixes.

- :func:`cost_warnings`: the given costs are probably not what the user meant, e.g. a
  schedule that runs only full backwards (``BW``) while only ``B`` was given (``BW``
  then defaults to ``B + W`` with ``W = 1``: ``--cost F=1,B=2`` on 1F1B gives makespan
  44, not 33), or overlapped ``FB`` pairs without an ``FB`` cost.
- :func:`deadlock_fixes`: changes that make a deadlocked scenario complete (another comm
  policy, an eager threshold), each **verified** by simulating it, within a bounded
  budget of simulated instructions and wall time.
- :func:`format_deadlock`: the deadlock message with its wait-for cycle one edge per line
  and the fixes found.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from schedsim.scenario import Scenario
from schedsim.sim.costs import CostModel
from schedsim.timeline import Deadlock, Timeline
from schedsim.util.units import fmt_time, with_unit

KINDS = ("F", "B", "W", "BW", "FB")
#: most instructions simulated in all while looking for a deadlock fix
FIX_BUDGET_INSTRUCTIONS = 3_000_000
#: most wall-clock seconds spent looking for a deadlock fix
FIX_BUDGET_SECONDS = 8.0


def given_costs(costs: CostModel) -> set[str]:
    """The kinds whose cost the user set anywhere: the top level, a ``[costs.stage.N]``
    table or a ``[[costs.overrides]]`` entry (pydantic's ``model_fields_set``, which
    :func:`schedsim.cli.common.build_scenario` keeps for the ``--cost`` flag)."""
    out = {k for k in KINDS if k in costs.model_fields_set and getattr(costs, k) is not None}
    for st in costs.stage.values():
        out |= {k for k in KINDS if k in st.model_fields_set and getattr(st, k) is not None}
    out |= {o.kind for o in costs.overrides}
    return out


def run_kinds(tl: Timeline) -> set[str]:
    """The compute kinds ``tl`` ran; an FB span counts as ``FB`` (its parts' costs do
    not matter once ``FB`` is given) and, for the defaults, as its parts ``FB:F`` etc."""
    out: set[str] = set()
    for kind, parts in tl.span_kinds():      # no span objects built for a simulated run
        out.add(kind)
        out |= {f"FB:{p}" for p in parts}
    return out


def _num(x: float) -> str:
    return f"{x:g}"


def policy_warnings(schedule: str, ranks: int | None, microbatches: int | None,
                    policy: str | None) -> list[str]:
    """One-line warnings for a comm policy imitating a framework that would refuse the
    run: torch's ``Schedule1F1B`` raises for fewer microbatches than stages (torch 2.13,
    ``torch/distributed/pipelining/schedules.py``: "Number of microbatches (m) must be
    greater than or equal to the number of stages (p)"), so ``1f1b`` with m < p under
    ``--comm-policy torch`` is what torch's generic runtime would run, not what
    ``Schedule1F1B`` runs."""
    if policy != "torch" or schedule != "1f1b" or ranks is None or microbatches is None \
            or microbatches >= ranks:
        return []
    return [f"torch's Schedule1F1B refuses {microbatches} microbatches on {ranks} stages "
            f"(\"Number of microbatches ({microbatches}) must be greater than or equal to "
            f"the number of stages ({ranks})\"); this program posts and waits as torch's "
            f"_PipelineScheduleRuntime would run the same order"]


def cost_warnings(kinds: Iterable[str], costs: CostModel, schedule: str) -> list[str]:
    """One-line warnings for costs that are probably not what the user meant.

    ``kinds``: what the program runs (:func:`run_kinds`). Nothing is said when no cost
    was given at all (the defaults F = B = W = 1 are then taken knowingly), nor when the
    costs carry a derived stage model (a ``[workload]`` or ``[model]`` table,
    :meth:`CostModel.with_derived`): a kind nobody typed then costs what the model derives,
    never a default, so no rule below applies. Warned:

    - a full backward ``BW`` runs, ``BW`` was not given and only one of ``B``, ``W`` was:
      ``BW = B + W`` silently takes the other's default;
    - ``BW`` runs, none of ``B``, ``W``, ``BW`` was given while others were;
    - split ``B``/``W`` run, neither was given, but ``BW`` was (it applies to full
      backwards only);
    - ``FB`` pairs run and ``FB`` was not given: each costs its parts' sum (no overlap
      gain).
    """
    kinds = set(kinds)
    given = given_costs(costs)
    if not given or costs._derived is not None:      # untyped kinds: derived, not defaults
        return []
    out = []
    B, W, F = costs.B, costs.W, costs.F
    if "BW" in kinds and "BW" not in given:
        only = "only full backwards (BW)" if not kinds & {"B", "W"} else "full backwards (BW)"
        if "B" in given and "W" not in given:
            out.append(f"{schedule} runs {only} and BW was not given, so BW = B + W = "
                       f"{_num(B)} + {_num(W)} (W's default) = {_num(B + W)}; if B={_num(B)} "
                       f"is your full backward, write BW={_num(B)} (in schedsim B is only "
                       f"the input-gradient part of a split backward)")
        elif "W" in given and "B" not in given:
            out.append(f"{schedule} runs {only} and BW was not given, so BW = B + W = "
                       f"{_num(B)} (B's default) + {_num(W)} = {_num(B + W)}; give BW (or "
                       f"B) explicitly")
        elif "B" not in given and "W" not in given:
            out.append(f"{schedule} runs {only} but no backward cost was given: BW = B + W "
                       f"= {_num(B)} + {_num(W)} = {_num(B + W)} (defaults); give BW")
    split = kinds & {"B", "W"}
    if split and not split & given and "BW" in given:
        out.append(f"{schedule} runs split backwards ({' and '.join(sorted(split))}), which "
                   f"were not given (B={_num(B)}, W={_num(W)}, the defaults); BW="
                   f"{_num(costs.BW or 0)} applies to full backwards only: give B and W")
    if "FB" in kinds and "FB" not in given:
        fb_bw = costs.BW if costs.BW is not None else B + W
        back = fb_bw if "FB:BW" in kinds else B
        out.append(f"{schedule} runs overlapped forward+backward pairs (FB) and FB was not "
                   f"given, so each costs its parts' sum, F + {'BW' if 'FB:BW' in kinds else 'B'}"
                   f" = {_num(F + back)} (no overlap gain); give FB for the overlapped cost")
    return out


# -- deadlocks ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Fix:
    """A change that makes the scenario complete: ``flags`` to add on the command line,
    the ``makespan`` it then has, and ``why`` it helps."""

    flags: str
    makespan: float
    why: str


_POLICY_WHY = {
    "torch": "the order torch's runtime posts and waits its sends and recvs",
    "async": "each send right after its producer, each recv waited right before its consumer",
    "commit": "DualPipe-style batches committed before each compute",
}


def _candidates(sc: Scenario) -> list[tuple[str, str, Scenario, Callable[[], Any]]]:
    """``(flags, why, scenario, build)`` to try, most likely fix first: each boolean
    parameter of the comm policy the user set, flipped; another comm policy (``torch``
    first; for a hand-written program with its own comm instructions, its compute order
    re-lowered); then an eager threshold under rendezvous."""
    from schedsim.program.lower import POLICIES, lower

    out: list[tuple[str, str, Scenario, Callable[[], Any]]] = []
    current = sc.schedule.comm_policy
    for k, v in sc.schedule.generator_params().items():    # the user's own switches
        pol = POLICIES.get(current or "")
        if isinstance(v, bool) and pol is not None and k in pol.params:
            s2 = sc.model_copy(update={"schedule": sc.schedule.model_copy(
                update={k: not v})})
            out.append((f"--param {k}={str(not v).lower()}",
                        f"the {current} policy without {k}={str(v).lower()} "
                        f"({pol.params[k]})", s2, s2.build_program))
    order = ["torch"] + sorted(p for p in POLICIES if p != "torch")
    own_comms = bool(sc.schedule.program)
    for pol in order:
        if pol == current and not own_comms:
            continue
        why = _POLICY_WHY.get(pol, f"the {pol} comm policy")
        if own_comms:
            def build(pol: str = pol) -> Any:
                return lower(sc.build_program().schedule(), pol)
            out.append((f"--comm-policy {pol}", f"{why}; remove the program's own "
                        f"comm tokens (SEND/RECV, BATCH, WAIT, COMMIT) so that the policy "
                        f"places them", sc, build))
            continue
        s2 = sc.model_copy(update={"schedule": sc.schedule.model_copy(
            update={"comm_policy": pol})})
        out.append((f"--comm-policy {pol}", why, s2, s2.build_program))
    if sc.comm.semantics == "rendezvous" and sc.comm.eager_threshold_bytes is None:
        nbytes = max([sc.costs.message_bytes, *sc.costs.stage_bytes.values()])
        if nbytes > 0:
            s2 = sc.model_copy(update={"comm": sc.comm.model_copy(
                update={"eager_threshold_bytes": nbytes})})
            out.append((f"--eager-threshold {nbytes:g}", "messages this small complete "
                        "eagerly, as NCCL and gloo send small messages", s2,
                        s2.build_program))
    return out


def deadlock_fixes(sc: Scenario, tl: Timeline | None = None, *,
                   budget_instructions: int = FIX_BUDGET_INSTRUCTIONS,
                   budget_seconds: float = FIX_BUDGET_SECONDS, first_only: bool = True
                   ) -> list[Fix]:
    """Fixes for a scenario that deadlocks, each verified by simulating it: another comm
    policy (``torch`` first), then an eager threshold under rendezvous. Stops at the
    first fix found (``first_only``) or when the budget of simulated instructions or
    seconds is spent (a candidate that would exceed it is not tried). ``tl``: the
    deadlocked run (unused; kept for callers that have it). Never raises for a candidate
    that cannot be built."""
    from schedsim.errors import SchedsimError
    from schedsim.sim.simulate import simulate

    t0 = time.monotonic()
    spent = 0
    out: list[Fix] = []
    for flags, why, s2, build in _candidates(sc):
        if time.monotonic() - t0 > budget_seconds:
            break
        try:
            prog = build()
        except SchedsimError:
            continue
        size = prog.num_instructions()
        if spent + size > budget_instructions:
            break
        spent += size
        try:
            got = simulate(prog, s2.costs, s2.link, s2.comm, raise_on_deadlock=False)
        except SchedsimError:
            continue
        if got.deadlock is None:
            out.append(Fix(flags, got.makespan, why))
            if first_only:
                break
    return out


_MSG = re.compile(r"(?s)(deadlock: .*?\(instructions count from 0\))\. (.*)\. "
                  r"(Blocked ranks: .*)$")


def format_deadlock(dl: Deadlock | str, fixes: Iterable[Fix] = (), unit: str = "") -> str:
    """The deadlock message with its wait-for cycle one edge per line, then the fixes
    (``fix: --comm-policy torch completes (makespan 33 slots): ...``). A message of
    another shape is kept as it is."""
    msg = dl if isinstance(dl, str) else dl.message
    m = _MSG.match(msg)
    if m:
        head, body, tail = m.groups()
        edges = re.split(r"\. (?=rank \d)", body)
        msg = "\n".join([f"{head}; wait-for cycle:", *(f"  {e}" for e in edges), tail])
    for f in fixes:
        made = with_unit(f.makespan, unit) if unit else fmt_time(f.makespan)
        msg += f"\nfix: {f.flags} completes (makespan {made}): {f.why}"
    return msg

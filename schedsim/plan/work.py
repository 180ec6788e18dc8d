"""The plan's total work, bounded before anything is generated or simulated.

Each candidate the workload's rules allow may be simulated (the pruning is known only
after its bounds are computed), and a simulation runs its whole program: on each of its
``ranks = pp`` ranks, ``per_rank x microbatches`` (stage, microbatch) cells of at most
:data:`~schedsim.util.limits.INSTR_PER_CELL` instructions each (the ``instructions``
limit's own closed form, :func:`~schedsim.util.limits.estimate_instructions`, an upper
bound of what every generator and comm policy emits). So a plan runs at most

    ``sum over points of len(recompute) x len(zero) x estimate(pp x per_rank, microbatches)``

instructions, from the grid's degrees alone (:func:`~schedsim.plan.candidates.
grid_points`: no program is built). :func:`check_plan_work` refuses a plan above the
``instructions`` limit (``--max instructions=N``, the flag every command's work limit
takes) with one line naming the total, the limit and what to shrink. Simulating costs
about 0.6 KB and 25 µs an instruction (:mod:`schedsim.util.limits`), so the default
limit of 20 M keeps a plan to minutes and about a gigabyte at worst.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedsim.util.limits import estimate_instructions


@dataclass(frozen=True)
class PlanWork:
    """What a plan would simulate at most: ``candidates`` (the workload's rules passed),
    ``instructions`` (their programs' instructions, all together), and the point whose
    candidates cost most (``largest``: a :class:`~schedsim.plan.candidates.Point`, its
    ``largest_each`` instructions a candidate), None when no candidate passed."""

    candidates: int
    instructions: int
    largest: Any = None
    largest_each: int = 0


def point_instructions(pt: Any) -> int:
    """The closed-form instructions of one candidate of point ``pt`` (a legal
    workload): ``INSTR_PER_CELL x (pp x per_rank stages) x microbatches``."""
    w = pt.workload
    return estimate_instructions(w.pp * pt.per_rank, w.microbatches)


def plan_work(res: Any, points: list) -> PlanWork:
    """:class:`PlanWork` of the grid ``points`` of resolved space ``res`` (module
    docstring); a point that breaks a workload rule costs nothing."""
    from schedsim.workload import WorkloadError

    per_point = len(res.lists["recompute"]) * len(res.lists["zero"])
    cands = total = each_max = 0
    largest = None
    for pt in points:
        if isinstance(pt.workload, WorkloadError):
            continue
        each = point_instructions(pt)
        cands += per_point
        total += per_point * each
        if each > each_max:
            largest, each_max = pt, each
    return PlanWork(cands, total, largest, each_max)


#: what the refusal tells the user to shrink
SHRINK = ("fewer --gpus, --tp/--pp/--cp/--ep/--micro-batch-size values, --schedules or "
          "--recompute/--zero modes, or fewer microbatches with a smaller "
          "--global-batch-size")


def check_plan_work(res: Any, points: list) -> PlanWork:
    """:func:`plan_work` of ``points``; raises :class:`~schedsim.errors.LimitError` (exit
    2) when its instructions exceed the ``instructions`` limit, naming the total, the
    limit, the largest candidate and what to shrink (or ``--max instructions=TOTAL``)."""
    from schedsim.util.limits import check

    work = plan_work(res, points)
    pt = work.largest
    big = "" if pt is None else (
        f"; the largest, tp{pt.tp} pp{pt.pp} dp{pt.dp} {pt.schedule} with "
        f"{pt.workload.microbatches:,} microbatches, about {work.largest_each:,} each")
    check("instructions", work.instructions,
          f"a plan of {work.candidates:,} candidates: about {work.instructions:,} "
          f"instructions if each is simulated{big}", shrink=SHRINK)
    return work

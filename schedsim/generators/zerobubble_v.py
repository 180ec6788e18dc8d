"""V-shape zero-bubble schedules: ZB-V, V-Half and V-Min (two chunks per rank).

Placement ``v``: rank r holds stage r (chunk 0) and stage 2p-1-r (chunk 1), so a
microbatch's forward goes down the ranks and comes back up, and the loss is on rank 0.

- ``zbv``: ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv version
  Section 6; "Pipeline Parallelism with Controllable Memory", 2024) as the authors'
  ``zerobubble/scheduler/zbv.py`` builds it (:mod:`schedsim.generators.zbv_heuristic`);
  ``variant="torch"`` gives torch's ``ScheduleZBVZeroBubble`` order instead.
- ``v-half`` / ``v-min``: the controllable-memory schedules (about 1/2 and 1/3 of 1F1B's
  activation memory) as ``zerobubble/scheduler/zbv_greedy.py`` builds them
  (:mod:`schedsim.generators.vshape_greedy`).

Costs are per chunk pass (one stage of the 2p-stage model).
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.generators.vshape_greedy import (
    greedy_v_order,
    pattern_v_half,
    pattern_v_min,
)
from schedsim.generators.zbv_heuristic import VProblem, zbv_plan
from schedsim.generators.zerobubble import (
    COST_PARAMS,
    parse_mem_deltas,
    planner_mem_limit,
    scheduler_costs,
)
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.sim.costs import CostModel, LinkModel

KINDS = "FBW"


def _stage(ranks: int, rank: int, chunk: int) -> int:
    return rank if chunk == 0 else 2 * ranks - 1 - rank


def _v_schedule(name: str, ranks: int, m: int, rows: list[list[Op]], params: dict
                ) -> Schedule:
    return Schedule(name=name, placement=Placement(kind="v", ranks=ranks, stages=2 * ranks),
                    microbatches=m, ranks=rows,
                    params={"ranks": ranks, "microbatches": m, **params})


def v_costs(costs: CostModel | None, link: LinkModel | None, ranks: int
            ) -> tuple[tuple[float, float, float], float]:
    """Per-chunk-pass ``(F, B, W)`` and the per-hop comm cost for a V planner.

    As the authors' runtime does for V schedules: average each rank's two chunks, then
    take the median over ranks (``sorted(x)[p // 2]``). Comm: see
    :func:`~schedsim.generators.zerobubble.scheduler_costs`.
    """
    f, b, w, comm = scheduler_costs(costs, link, 2 * ranks)

    def mid(v: list[float]) -> float:
        per_rank = sorted((v[r] + v[2 * ranks - 1 - r]) / 2 for r in range(ranks))
        return per_rank[ranks // 2]
    return (mid(f), mid(b), mid(w)), comm


def _check_ranks(name: str, ranks: int, minimum: int = 1) -> None:
    if ranks < minimum:
        raise ScheduleError(f"{name} needs ranks >= {minimum} (got {ranks})")


@register("zbv", summary="ZB-V: near-zero bubble on a V placement (2 chunks/rank), "
          "1F1B's memory (p); --variant torch: torch's ScheduleZBVZeroBubble order",
          constraints="variant sail (default) or torch; mem_limit (sail only) default p, "
                      "below p the plan may not exist (error)",
          placement="v (stages r and 2p-1-r)",
          params={"variant": "sail (authors' zbv.py, default) | torch",
                  "mem_limit": "activation limit per rank in microbatches (default p; "
                               "a list of one per rank: their smallest)",
                  "mem_deltas": "F,B,W activation deltas of a chunk pass the planner uses "
                                "(default 2,-1,-1)",
                  **COST_PARAMS},
          source="Qi et al., Zero Bubble PP (ICLR 2024, arXiv Sec. 6) / Controllable "
                 "Memory (2024); sail-sg zerobubble/scheduler/zbv.py; torch "
                 "ScheduleZBVZeroBubble")
def zbv(ranks: int, microbatches: int, variant: str | None = None,
        mem_limit: float | list[float] | None = None, costs: CostModel | None = None,
        link: LinkModel | None = None, mem_deltas: object = None) -> Schedule:
    """ZB-V as the authors' ``scheduler/zbv.py`` builds it (``try_v_schedule`` with
    ``fill_b`` x ``fill_f``, refined by re-running with approved bubbles), under an
    activation limit of ``mem_limit`` microbatches per rank (default p, i.e. 2p chunk
    forwards, the authors' default and 1F1B's peak). The order depends on the costs
    (``costs``/``link``, per chunk pass; see :func:`v_costs`) and on the activation deltas
    of a chunk pass ``mem_deltas`` (default 2,-1,-1).

    ``variant="torch"`` returns torch's ``ScheduleZBVZeroBubble`` order (implemented in
    :mod:`schedsim.generators.torch_family`), whose cooldown differs.

    Raises :class:`ScheduleError` for an unknown variant, a limit below 1, mem_limit or
    costs with the torch variant, or a limit too small for the V warm-up.
    """
    v = str(variant or "sail").lower()
    if v == "torch":
        if mem_limit is not None or mem_deltas is not None:
            raise ScheduleError("zbv --variant torch has a fixed order: --mem-limit and "
                                "mem_deltas apply only to the default (sail) variant")
        try:
            from schedsim.generators.torch_family import zbv_torch
        except ImportError:
            raise ScheduleError("zbv --variant torch is not available in this build "
                                "(schedsim.generators.torch_family is missing)") from None
        return zbv_torch(ranks, microbatches)
    if v != "sail":
        raise ScheduleError(f"zbv: unknown variant {variant!r}: expected sail (the "
                            f"authors' zbv.py, default) or torch (ScheduleZBVZeroBubble)")
    _check_ranks("zbv", ranks)
    limit = planner_mem_limit(mem_limit, ranks, "zbv", ranks)
    if isinstance(limit, list):         # one limit per rank: the planner takes one
        limit = min(limit)
    cost, comm = v_costs(costs, link, ranks)
    md = parse_mem_deltas(mem_deltas, "zbv")
    # a chunk forward holds half a microbatch's activations: limit = 2 x mem_limit x F
    plan = zbv_plan(VProblem(ranks, microbatches, cost, comm, mem=md,
                             max_mem=2 * limit * md[0]))
    rows = []
    for r, seq in enumerate(plan.order):
        rows.append([Op(KINDS[k], _stage(ranks, r, leg if k == 0 else 1 - leg), mb)
                     for k, leg, mb in seq])
    params = {"variant": "sail", "mem_limit": limit, "mem_deltas": list(md),
              "cost_F": cost[0], "cost_B": cost[1],
              "cost_W": cost[2], "cost_comm": comm, "planned_bubble": plan.worst}
    return _v_schedule("zbv", ranks, microbatches, rows, params)


# greedy types: F (chunk 0), f (chunk 1), B (chunk 1), b (chunk 0), W of chunk 1, W of chunk 0
_GREEDY = (("F", 0), ("F", 1), ("B", 1), ("B", 0), ("W", 1), ("W", 0))


def _greedy(name: str, pattern: list[list[int]], ranks: int, m: int) -> Schedule:
    order = greedy_v_order(pattern, m)
    rows = [[Op(_GREEDY[t][0], _stage(ranks, r, _GREEDY[t][1]), mb) for t, mb in seq]
            for r, seq in enumerate(order)]
    return _v_schedule(name, ranks, m, rows, {})


@register("v-half", summary="V-Half: V placement, (p+2)//2 microbatches of activations "
          "(half of 1F1B), small bubble; order independent of costs",
          constraints="ranks >= 1, microbatches >= 1",
          placement="v (stages r and 2p-1-r)",
          source="Qi et al., Pipeline Parallelism with Controllable Memory (2024) Sec. 4; "
                 "sail-sg zerobubble/scheduler/zbv_greedy.py")
def v_half(ranks: int, microbatches: int) -> Schedule:
    """V-Half (Controllable Memory paper, Section 4): the ``stable_pattern_v_half``
    building block repeated, squeezed and reordered as ``scheduler/zbv_greedy.py`` does.
    Raises :class:`ScheduleError` if the pattern cannot be laid out."""
    _check_ranks("v-half", ranks)
    return _greedy("v-half", pattern_v_half(ranks), ranks, microbatches)


@register("v-min", summary="V-Min: V placement, (p+4)//3 microbatches of activations "
          "(a third of 1F1B), more bubble; order independent of costs",
          constraints="ranks >= 1, microbatches >= 1",
          placement="v (stages r and 2p-1-r)",
          source="Qi et al., Pipeline Parallelism with Controllable Memory (2024) Sec. 4; "
                 "sail-sg zerobubble/scheduler/zbv_greedy.py")
def v_min(ranks: int, microbatches: int) -> Schedule:
    """V-Min (Controllable Memory paper, Section 4): the ``stable_pattern_v_min``
    building block repeated, squeezed and reordered as ``scheduler/zbv_greedy.py`` does.
    Raises :class:`ScheduleError` if the pattern cannot be laid out."""
    _check_ranks("v-min", ranks)
    return _greedy("v-min", pattern_v_min(ranks), ranks, microbatches)

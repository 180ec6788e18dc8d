"""Zero Bubble Pipeline Parallelism, one chunk per rank: ZB-H1, ZB-H2, ZB-1p, ZB-2p.

Source: Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024); repository
sail-sg/zero-bubble-pipeline-parallelism. The backward is split into ``B`` (gradient of
the stage input, on the critical path) and ``W`` (gradient of the weights, deferred into
what would otherwise be bubbles).

- ``zb-h1`` / ``zb-h2``: the handcrafted schedules of Section 3 (Figure 3), ordered as
  ``megatron/core/pipeline_parallel/efficiency.py:get_hand_schedule`` (branch ``arxiv``)
  builds them with ``warmup_c`` 1 and 2.
- ``zb-1p`` / ``zb-2p``: the automatic heuristic of Section 3.1 under an activation
  memory limit of p or 2p microbatches (:mod:`schedsim.generators.zb_heuristic`).

The heuristic plans with the scenario's costs: the scenario passes its
:class:`~schedsim.sim.costs.CostModel` and :class:`~schedsim.sim.costs.LinkModel` to generators that
take ``costs`` / ``link`` parameters (see :func:`scheduler_costs`).
"""
from __future__ import annotations

import math

from pydantic import ValidationError

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.generators.zb_heuristic import ZBProblem, zb_schedule
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.sim.costs import CostModel, LinkModel

KINDS = "FBW"

COST_PARAMS = {
    "costs": "F/B/W costs the scheduler plans with (a scenario passes its [costs])",
    "link": "comm cost per hop = link latency + message_bytes / bandwidth "
            "(a scenario passes its [link])",
}


def _as_model(cls: type, value: object, what: str):
    """``value`` as a ``cls`` (a model, a dict of its fields, or None for defaults)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        try:
            return cls.model_validate(value)
        except ValidationError as e:
            raise ScheduleError(f"bad {what} parameter: {e.errors()[0]['msg']}") from None
    raise ScheduleError(f"bad {what} parameter {value!r}: expected a table like the "
                        f"scenario's [{what if what == 'link' else 'costs'}] section")


def scheduler_costs(costs: CostModel | None, link: LinkModel | None, stages: int
                    ) -> tuple[list[float], list[float], list[float], float]:
    """Per-stage ``F``, ``B``, ``W`` costs and the per-hop comm cost a planner uses.

    Stage s's costs are ``costs.kind_cost(kind, s, 0)`` (per-microbatch overrides are
    ignored: the authors' planners take one cost per stage). The comm cost is
    ``link.latency + costs.message_bytes / link.bandwidth`` (per-link overrides ignored),
    the pure per-hop delay of their timing model. Defaults: F = B = W = 1, comm 0.
    """
    costs = _as_model(CostModel, costs, "costs")
    link = _as_model(LinkModel, link, "link")
    per = [[costs.kind_cost(k, s, 0) for s in range(stages)] for k in KINDS]
    comm = link.latency
    if costs.message_bytes and not math.isinf(link.bandwidth):
        comm += costs.message_bytes / link.bandwidth
    return per[0], per[1], per[2], float(comm)


def planner_mem_limit(value: object, default: float, name: str,
                      ranks: int | None = None) -> float | list[float]:
    """The activation limit in microbatches (``M_B``): ``value`` or ``default`` when None;
    with ``ranks``, ``value`` may also be a sequence of one limit per rank (a size
    ``--mem-limit`` through a ``[workload]`` gives one:
    :func:`schedsim.workload.table.planner_memory`), returned as a list. Raises
    :class:`ScheduleError` unless each is a finite number >= 1 (a rank must hold at least
    one microbatch), or for a sequence of another length."""
    if value is None:
        return float(default)
    if ranks is not None and isinstance(value, (list, tuple)):
        if len(value) != ranks:
            raise ScheduleError(f"{name}: --mem-limit per rank needs {ranks} numbers (one "
                                f"per rank), got {len(value)}")
        return [float(planner_mem_limit(v, default, name)) for v in value]
    try:
        limit = float(value)                      # type: ignore[arg-type]
    except (TypeError, ValueError):
        limit = math.nan
    if not limit >= 1 or math.isinf(limit):
        raise ScheduleError(
            f"{name}: --mem-limit must be a finite number >= 1 (in microbatches' "
            f"activations M_B; a rank must hold at least one microbatch), got {value!r}")
    return limit


def parse_mem_deltas(value: object, name: str) -> tuple[float, float, float]:
    """Activation deltas ``(F, B, W)`` for a planner, in any unit: a sequence or a
    ``"F,B,W"`` string; default ``(2, -1, -1)`` (the paper's simple model: B and W each
    free half a microbatch's activations). Rules: F > 0, B <= 0, W <= 0, F + B + W = 0
    (as the authors' ``GraphConfig`` asserts). Raises :class:`ScheduleError`."""
    if value is None:
        return (2, -1, -1)
    items = value.split(",") if isinstance(value, str) else value
    try:
        vals = tuple(float(x) for x in items)       # type: ignore[union-attr]
    except (TypeError, ValueError):
        vals = ()
    if len(vals) != 3:
        raise ScheduleError(f"{name}: mem_deltas must be three numbers F,B,W (e.g. "
                            f"2,-1,-1), got {value!r}")
    vals = tuple(int(v) if v.is_integer() else v for v in vals)
    f, b, w = vals
    if not (f > 0 and b <= 0 and w <= 0 and f + b + w == 0):
        raise ScheduleError(f"{name}: mem_deltas {f:g},{b:g},{w:g} must have F > 0, B <= 0, "
                            f"W <= 0 and F + B + W = 0 (a microbatch's activations are "
                            f"allocated by F and freed by B and W)")
    return vals


def _cost_params(f: list[float], b: list[float], w: list[float], comm: float) -> dict:
    def one(v: list[float]) -> float | list[float]:
        return v[0] if len(set(v)) == 1 else list(v)
    return {"cost_F": one(f), "cost_B": one(b), "cost_W": one(w), "cost_comm": comm}


def _rows_from_kinds(ranks: int, order: list[list[tuple[int, int]]]) -> list[list[Op]]:
    return [[Op(KINDS[k], r, mb) for k, mb in order[r]] for r in range(ranks)]


def _loop_schedule(name: str, ranks: int, m: int, rows: list[list[Op]],
                   params: dict) -> Schedule:
    return Schedule(name=name, placement=Placement(kind="loop", ranks=ranks, stages=ranks),
                    microbatches=m, ranks=rows,
                    params={"ranks": ranks, "microbatches": m, **params})


def hand_schedule_order(ranks: int, microbatches: int, warmup_c: int
                        ) -> list[list[tuple[int, int]]]:
    """The handcrafted ZB-H1 (``warmup_c=1``) / ZB-H2 (``warmup_c=2``) order per rank.

    Rank r runs ``warmup_c x (p-1-r)`` warm-up forwards; then, for each microbatch i, the
    next ``F`` (while any is left) and ``B_i``, followed by a ``W`` once i reaches
    ``warmup_c x r`` (W passes fill the slots 1F1B leaves idle); the last ``warmup_c x r``
    ``W`` passes run at the end. Kinds are 0=F, 1=B, 2=W. Source: ``efficiency.py:
    get_hand_schedule`` (branch ``arxiv`` of sail-sg/zero-bubble-pipeline-parallelism).
    """
    p, m = ranks, microbatches
    rows = []
    for r in range(p):
        warm = (p - r - 1) * warmup_c
        row = [(0, i) for i in range(warm)]
        f = warm
        w = 0
        for i in range(m):
            if warm + i < m:
                row.append((0, f))
                f += 1
            row.append((1, i))
            if warm + i >= (p - 1) * warmup_c:
                row.append((2, w))
                w += 1
        row += [(2, j) for j in range(w, m)]
        rows.append(row)
    return rows


@register("zb-h1", summary="zero bubble, handcrafted H1: 1F1B with W deferred into the "
          "cooldown bubbles; same activation memory as 1F1B",
          constraints="microbatches >= ranks (p-r-1 warm-up forwards must exist)",
          placement="loop (1 stage/rank)",
          source="Qi et al., Zero Bubble PP (ICLR 2024) Sec. 3, Fig. 3; sail-sg "
                 "efficiency.py:get_hand_schedule(warmup_c=1)")
def zb_h1(ranks: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024, Section 3, Figure 3 top), ordered as the authors'
    ``efficiency.py:get_hand_schedule(warmup_c=1)``.

    Rank r: ``p-1-r`` warm-up F, then ``F B`` per microbatch with a ``W`` after each once
    ``i >= r``, and ``r`` trailing W. Peak activation memory equals 1F1B's (p microbatches
    on rank 0); with comm 0 the longest stage span is ``m(F+B+W) + (p-1)(F+B-W)``.

    Raises :class:`ScheduleError` if ``microbatches < ranks`` (the reference generator
    allows ``m >= p``; fewer microbatches leave no room for the warm-up forwards of the
    first ranks).
    """
    if microbatches < ranks:
        raise ScheduleError(
            f"zb-h1 needs microbatches >= ranks (got {microbatches} < {ranks}): rank 0 runs "
            f"{ranks - 1} warm-up forwards, and with fewer than {ranks} microbatches no rank "
            f"reaches the steady F-B-W phase that makes it ZB-H1")
    rows = _rows_from_kinds(ranks, hand_schedule_order(ranks, microbatches, 1))
    return _loop_schedule("zb-h1", ranks, microbatches, rows, {})


@register("zb-h2", summary="zero bubble, handcrafted H2: twice the warm-up forwards, W "
          "fills the rest; zero bubble when W >= (F+B)/2, 2p microbatches of memory",
          constraints="microbatches >= 2 x ranks",
          placement="loop (1 stage/rank)",
          source="Qi et al., Zero Bubble PP (ICLR 2024) Sec. 3, Fig. 3; sail-sg "
                 "efficiency.py:get_hand_schedule(warmup_c=2)")
def zb_h2(ranks: int, microbatches: int) -> Schedule:
    """ZB-H2 (Qi et al. 2024, Section 3, Figure 3 bottom), ordered as the authors'
    ``efficiency.py:get_hand_schedule(warmup_c=2)``.

    Rank r: ``2(p-1-r)`` warm-up F, then ``F B`` per microbatch with a ``W`` after each
    once ``i >= 2r``, and ``2r`` trailing W. Peak activation memory about 2p microbatches;
    with comm 0 the longest stage span is ``m(F+B+W) + (p-1)(F+B-2W)`` (zero bubble when
    ``F = B = W``).

    Raises :class:`ScheduleError` if ``microbatches < 2 x ranks`` (the authors'
    ``get_hand_schedule`` asserts ``n >= 2p``: rank 0 needs ``2(p-1)`` warm-up forwards
    and the pattern's steady state needs them all in flight).
    """
    if microbatches < 2 * ranks:
        raise ScheduleError(
            f"zb-h2 needs microbatches >= 2 x ranks (got {microbatches} < {2 * ranks}): "
            f"rank 0 runs {2 * (ranks - 1)} warm-up forwards (the authors' "
            f"get_hand_schedule asserts m >= 2p)")
    rows = _rows_from_kinds(ranks, hand_schedule_order(ranks, microbatches, 2))
    return _loop_schedule("zb-h2", ranks, microbatches, rows, {})


def _auto(name: str, ranks: int, microbatches: int, mem_limit: float | list[float] | None,
          default_limit: float, costs: CostModel | None, link: LinkModel | None,
          mem_deltas: object) -> Schedule:
    limit = planner_mem_limit(mem_limit, default_limit, name, ranks)
    f, b, w, comm = scheduler_costs(costs, link, ranks)
    md = parse_mem_deltas(mem_deltas, name)
    per_rank = limit if isinstance(limit, list) else [limit] * ranks
    pb = ZBProblem(ranks, microbatches, f, b, w, comm, mem=md,
                   max_mem=[x * md[0] for x in per_rank])
    res = zb_schedule(pb)
    params = {"mem_limit": limit, "mem_deltas": list(md), **_cost_params(f, b, w, comm),
              "planned_span": res.span}
    return _loop_schedule(name, ranks, microbatches, _rows_from_kinds(ranks, res.order),
                          params)


_AUTO_PARAMS = {
    "mem_limit": "activation memory limit per rank, in microbatches (M_B), or a list of "
                 "one per rank; --mem-limit",
    "mem_deltas": "F,B,W activation deltas the planner uses (default 2,-1,-1)",
    **COST_PARAMS,
}


@register("zb-1p", summary="zero bubble, automatic heuristic under a memory limit of p "
          "microbatches (1F1B's peak); plans with the scenario's F/B/W/comm costs",
          constraints="mem_limit >= 1 (default p; below p the plan degrades fast); any "
                      "ranks/microbatches",
          placement="loop (1 stage/rank)", params=_AUTO_PARAMS,
          source="Qi et al., Zero Bubble PP (ICLR 2024) Sec. 3.1; sail-sg "
                 "zerobubble/scheduler/zb.py (manual_order, initial_solution)")
def zb_1p(ranks: int, microbatches: int, mem_limit: float | list[float] | None = None,
          costs: CostModel | None = None, link: LinkModel | None = None,
          mem_deltas: object = None) -> Schedule:
    """ZB-1p: the authors' heuristic (Section 3.1; ``scheduler/zb.py``) with an
    activation limit of ``mem_limit`` microbatches per rank (default ``p``; a list: one
    limit per rank).

    The order depends on the costs: ``costs``/``link`` are what the scenario simulates
    with (:func:`scheduler_costs`); and on the activation deltas ``mem_deltas`` (F,B,W,
    default 2,-1,-1; the limit is ``mem_limit x F``). Below ``p`` the heuristic (like the
    authors') degrades fast: p=8, m=24, unit costs: limit 6 gives span 155, limit 8 79.

    Raises :class:`ScheduleError` for a limit below 1, bad ``mem_deltas``/``costs``, or
    a limit no variant of the heuristic can respect.
    """
    return _auto("zb-1p", ranks, microbatches, mem_limit, ranks, costs, link, mem_deltas)


@register("zb-2p", summary="zero bubble, automatic heuristic under a memory limit of 2p "
          "microbatches; zero bubble at unit costs once m >= 2p",
          constraints="mem_limit >= 1 (default 2p); any ranks/microbatches",
          placement="loop (1 stage/rank)", params=_AUTO_PARAMS,
          source="Qi et al., Zero Bubble PP (ICLR 2024) Sec. 3.1; sail-sg "
                 "zerobubble/scheduler/zb.py (manual_order, initial_solution)")
def zb_2p(ranks: int, microbatches: int, mem_limit: float | list[float] | None = None,
          costs: CostModel | None = None, link: LinkModel | None = None,
          mem_deltas: object = None) -> Schedule:
    """ZB-2p: the authors' heuristic (Section 3.1; ``scheduler/zb.py``) with an
    activation limit of ``mem_limit`` microbatches per rank (default ``2p``).

    Same algorithm and errors as :func:`zb_1p`; only the default limit differs.
    """
    return _auto("zb-2p", ranks, microbatches, mem_limit, 2 * ranks, costs, link,
                 mem_deltas)

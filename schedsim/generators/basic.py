"""GPipe and 1F1B: one stage per rank, fused backward (``BW``)."""
from __future__ import annotations

from schedsim.generators import register
from schedsim.program.ir import Op, Placement, Schedule


@register("gpipe", summary="all forwards, then all backwards (fused BW), ascending mb",
          constraints="ranks >= 1, microbatches >= 1", placement="loop (1 stage/rank)",
          source="Huang et al., GPipe (NeurIPS 2019); torch ScheduleGPipe")
def gpipe(ranks: int, microbatches: int) -> Schedule:
    """GPipe: rank r runs ``F0..F(m-1)`` then ``BW0..BW(m-1)`` on stage r.

    Ordered as torch.distributed.pipelining's ``ScheduleGPipe``
    (torch/distributed/pipelining/schedules.py). Returns a compute-only Schedule.
    """
    rows = [[Op("F", r, i) for i in range(microbatches)]
            + [Op("BW", r, i) for i in range(microbatches)] for r in range(ranks)]
    return Schedule(name="gpipe", placement=Placement(kind="loop", ranks=ranks, stages=ranks),
                    microbatches=microbatches, ranks=rows,
                    params={"ranks": ranks, "microbatches": microbatches})


@register("1f1b", summary="warmup p-r-1 forwards, then one-forward-one-backward, cooldown",
          constraints="ranks >= 1, microbatches >= 1", placement="loop (1 stage/rank)",
          source="Narayanan et al., PipeDream-Flush (2021); torch Schedule1F1B runtime")
def one_f_one_b(ranks: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): rank r runs ``w = min(m, p-r-1)`` warmup forwards, then
    alternates ``F(w+i), BW(i)`` for ``i < m-w`` (steady state), then the remaining
    backwards (cooldown).

    This is the order torch's ``Schedule1F1B._step_microbatches`` really issues (its
    ``pipeline_order`` table is off by one on the last rank; see ../shared/refs/torch).
    Returns a compute-only Schedule (fused ``BW`` backwards).
    """
    rows = []
    m = microbatches
    for r in range(ranks):
        w = min(m, ranks - r - 1)
        row = [Op("F", r, i) for i in range(w)]
        for i in range(m - w):
            row += [Op("F", r, w + i), Op("BW", r, i)]
        row += [Op("BW", r, i) for i in range(m - w, m)]
        rows.append(row)
    return Schedule(name="1f1b", placement=Placement(kind="loop", ranks=ranks, stages=ranks),
                    microbatches=m, ranks=rows, params={"ranks": ranks, "microbatches": m})

"""GPipe and 1F1B: one stage per rank, fused backward (``BW``).

Both emit the flat form (:class:`~schedsim.program.flat.FlatSchedule`): per rank, integer
columns of op kind, stage and microbatch; the object rows are built only if asked for.
Their output is validated by construction (the tests check every rule on it).
"""
from __future__ import annotations

import numpy as np

from schedsim.generators import register
from schedsim.program.flat import FlatSchedule, OpKind
from schedsim.program.ir import Placement, Schedule

F, BW = int(OpKind.F), int(OpKind.BW)


def _schedule(name: str, ranks: int, m: int, rows: list) -> Schedule:
    return Schedule.from_flat(FlatSchedule.from_columns(rows), name=name,
                              placement=Placement(kind="loop", ranks=ranks, stages=ranks),
                              microbatches=m, params={"ranks": ranks, "microbatches": m},
                              validated=True)


@register("gpipe", summary="all forwards, then all backwards (fused BW), ascending mb",
          constraints="ranks >= 1, microbatches >= 1", placement="loop (1 stage/rank)",
          source="Huang et al., GPipe (NeurIPS 2019); torch ScheduleGPipe")
def gpipe(ranks: int, microbatches: int) -> Schedule:
    """GPipe: rank r runs ``F0..F(m-1)`` then ``BW0..BW(m-1)`` on stage r.

    Ordered as torch.distributed.pipelining's ``ScheduleGPipe``
    (torch/distributed/pipelining/schedules.py). Returns a compute-only Schedule.
    """
    m = microbatches
    kind = np.repeat([F, BW], m)
    mb = np.tile(np.arange(m), 2)
    return _schedule("gpipe", ranks, m, [(kind, np.full(2 * m, r), mb) for r in range(ranks)])


@register("1f1b", summary="warmup p-r-1 forwards, then one-forward-one-backward, cooldown",
          constraints="ranks >= 1, microbatches >= 1", placement="loop (1 stage/rank)",
          source="Narayanan et al., PipeDream-Flush (2021); torch Schedule1F1B runtime")
def one_f_one_b(ranks: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): rank r runs ``w = min(m, p-r-1)`` warmup forwards, then
    alternates ``F(w+i), BW(i)`` for ``i < m-w`` (steady state), then the remaining
    backwards (cooldown).

    This is the order torch's ``Schedule1F1B._step_microbatches`` really issues (its
    ``pipeline_order`` table is off by one on the last rank; see tests/data/refs/torch).
    Returns a compute-only Schedule (fused ``BW`` backwards).
    """
    m = microbatches
    rows = []
    for r in range(ranks):
        w = min(m, ranks - r - 1)
        steady = m - w
        kind = np.empty(2 * m, np.int32)
        mb = np.empty(2 * m, np.int32)
        kind[:w], mb[:w] = F, np.arange(w)                           # warmup
        kind[w:w + 2 * steady:2], mb[w:w + 2 * steady:2] = F, np.arange(w, m)   # steady:
        kind[w + 1:w + 2 * steady:2], mb[w + 1:w + 2 * steady:2] = BW, np.arange(steady)
        kind[w + 2 * steady:], mb[w + 2 * steady:] = BW, np.arange(steady, m)   # cooldown
        rows.append((kind, np.full(2 * m, r), mb))
    return _schedule("1f1b", ranks, m, rows)

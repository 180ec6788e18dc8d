"""Schedule variants that exist to be compared with a reference order.

``1f1b-megatron-figure``: the non-interleaved 1F1B order as drawn in Figure 4 (top) of
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21), against the order Megatron's code runs
(``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_without_interleaving``: ``num_warmup_microbatches = p - r - 1``
forwards, then one forward + one backward per step, then the remaining backwards — the
``1f1b`` generator's order). The figure draws every device doing one more forward before
its first backward: device 1 (rank 0) runs ``p + 1`` forwards, not stopping at the
pipeline depth, and the last device runs two. With one stage per rank and BW = 2F the
extra forward fits in time the rank would idle anyway, so the makespan is unchanged
(``schedsim diff`` shows the moved forwards and a makespan delta of 0) while rank 0 holds
``p + 1`` microbatches' activations instead of ``p``.
"""
from __future__ import annotations

from schedsim.generators import register
from schedsim.program.ir import Op, Placement, Schedule


@register("1f1b-megatron-figure",
          summary="1F1B as drawn in the Megatron-LM paper (one extra warm-up forward per "
                  "rank); compare with 1f1b, the code's order",
          constraints="ranks >= 1, microbatches >= 1", placement="loop (1 stage/rank)",
          source="Narayanan et al., Megatron-LM (SC'21), Figure 4 (top)")
def one_f_one_b_figure(ranks: int, microbatches: int) -> Schedule:
    """Rank r runs ``w = min(m, p - r + 1)`` forwards, then alternates ``BW(i), F(w + i)``
    while forwards remain, then the remaining backwards. Compute-only Schedule, fused
    ``BW`` backwards, one stage per rank."""
    m = microbatches
    rows = []
    for r in range(ranks):
        w = min(m, ranks - r + 1)
        row = [Op("F", r, i) for i in range(w)]
        for i in range(m):
            row.append(Op("BW", r, i))
            if w + i < m:
                row.append(Op("F", r, w + i))
        rows.append(row)
    return Schedule(name="1f1b-megatron-figure",
                    placement=Placement(kind="loop", ranks=ranks, stages=ranks),
                    microbatches=m, ranks=rows, params={"ranks": ranks, "microbatches": m})

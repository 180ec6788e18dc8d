"""The overlapped 1F1B family: steady-state forward of one microbatch paired with the
backward of another as one ``FB`` op, so that (with a stage model whose ``overlap`` is
``megatron`` or ``fb``) one part's expert-parallel all-to-alls run under the other part's
compute.

- ``1f1b-overlap``: one stage per rank. Rank r runs ``w = min(m, 2(p-1-r) + 1)`` warmup
  forwards, then ``m - w`` pairs ``FB(F(w+i), BW(i))``, then the last ``w`` backwards
  (Victarry/PP-Schedule-Visualization ``src/strategies.py``,
  ``generate_1f1b_overlap_schedule``). The doubled warmup (against 1F1B's ``p-1-r``)
  makes the two parts of every pair independent: the backward of microbatch i reaches
  rank r while rank r+1 is still running its own pairs. With ``p = 1`` it is Megatron-LM's
  ``combined_1f1b_schedule_for_no_pipelining`` (one forward, pairs, one backward).
- ``interleaved-overlap``: Megatron-LM's interleaved 1F1B with
  ``overlap_moe_expert_parallel_comm`` (``megatron/core/pipeline_parallel/schedules.py``,
  ``get_pp_rank_microbatches``: one more warmup microbatch than the interleaved schedule,
  "to ensure the forward and backward computations are independent in all 1f1b steps";
  ``combined_1f1b.py``, ``combined_1f1b_schedule_for_interleaved_pipelining``: each
  steady step's forward of virtual microbatch ``k + w`` and backward of virtual
  microbatch ``k`` run as one combined step). Microbatch groups of ``group_size`` (default
  p, Victarry's ``generate_1f1b_interleave_overlap_schedule`` fixes it to p) as in
  ``interleaved-1f1b --variant megatron``.

``delay_wgrad=True`` pairs each forward with the input-gradient backward ``B`` only and
runs the weight gradient ``W`` as its own op right after the pair (the weight gradient
deferred out of the pair, so the pair is shorter and W fills the time after it);
unpaired backwards stay ``BW``. Inside a pair, Megatron's own ``delay_wgrad_compute``
position of W is the stage model's ``[model] delay_wgrad`` (docs/stage-model.md).
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.program.megatron import (
    megatron_group_size,
    megatron_schedule_table,
    megatron_warmup,
)


def _rank_order(fwd: list[Op], bwd: list[Op], warmup: int, delay_wgrad: bool) -> list[Op]:
    """One rank: ``warmup`` forwards, then each next forward paired with the next
    backward, then the backwards left. ``fwd``/``bwd``: the rank's forwards and (``BW``)
    backwards in the order it runs them."""
    n = len(fwd)
    row = fwd[:warmup]
    for k in range(n - warmup):
        f, b = fwd[warmup + k], bwd[k]
        if delay_wgrad:
            row += [Op.fb(f, Op("B", b.stage, b.mb)), Op("W", b.stage, b.mb)]
        else:
            row.append(Op.fb(f, b))
    return row + bwd[n - warmup:]


@register("1f1b-overlap",
          summary="1F1B with each steady-state forward paired with a backward as one FB "
                  "op (EP all-to-all overlap); warmup 2(p-1-r)+1",
          constraints="ranks >= 1, microbatches >= 1 (pairs need m > 2(p-1-r)+1)",
          placement="loop (1 stage/rank)",
          source="Victarry/PP-Schedule-Visualization src/strategies.py "
                 "generate_1f1b_overlap_schedule; Megatron-LM combined_1f1b.py",
          params={"delay_wgrad": "pair F with B only and run W right after the pair "
                                 "(default false: F with BW)"})
def one_f_one_b_overlap(ranks: int, microbatches: int, delay_wgrad: bool = False
                        ) -> Schedule:
    """The ``1f1b-overlap`` order (module docstring). Compute-only Schedule, one stage per
    rank, fused ``BW`` backwards (``B`` + ``W`` with ``delay_wgrad``)."""
    p, m = ranks, microbatches
    rows = []
    for r in range(p):
        fwd = [Op("F", r, i) for i in range(m)]
        bwd = [Op("BW", r, i) for i in range(m)]
        rows.append(_rank_order(fwd, bwd, min(m, 2 * (p - 1 - r) + 1), delay_wgrad))
    return Schedule(name="1f1b-overlap", placement=Placement(kind="loop", ranks=p, stages=p),
                    microbatches=m, ranks=rows,
                    params={"ranks": p, "microbatches": m, "delay_wgrad": delay_wgrad})


@register("interleaved-overlap",
          summary="Megatron-LM's interleaved 1F1B with overlap_moe_expert_parallel_comm: "
                  "one more warmup forward, each steady forward/backward pair one FB op",
          constraints="--chunks >= 2; ranks >= 2 and p <= group_size <= m and "
                      "m % group_size in {0} or >= p (as interleaved-1f1b --variant "
                      "megatron)",
          placement="loop (stage s on rank s mod p, --chunks stages per rank)",
          source="Megatron-LM schedules.py get_pp_rank_microbatches + combined_1f1b.py "
                 "combined_1f1b_schedule_for_interleaved_pipelining; Victarry "
                 "generate_1f1b_interleave_overlap_schedule",
          params={"chunks": "stages per rank (default 2)",
                  "group_size": "microbatch_group_size_per_vp_stage N (default p; "
                                "--param group_size=N)",
                  "delay_wgrad": "pair F with B only and run W right after the pair "
                                 "(default false)"})
def interleaved_overlap(ranks: int, microbatches: int, chunks: int = 2,
                        group_size: int | None = None, delay_wgrad: bool = False
                        ) -> Schedule:
    """The ``interleaved-overlap`` order (module docstring): rank r's virtual microbatch
    k is ``megatron_schedule_table[k]`` (forward on chunk c, backward on chunk v-1-c), its
    warmup ``min(2(p-1-r) + (v-1)N + 1, m v)``. Raises :class:`ScheduleError` for chunks
    < 2 and Megatron's group rules."""
    p, m, v = ranks, microbatches, chunks
    if v < 2:
        raise ScheduleError(f"interleaved-overlap: --chunks must be >= 2 (got {v}); for one "
                            f"stage per rank use 1f1b-overlap")
    try:
        n = megatron_group_size(p, m, group_size)
    except ScheduleError as e:
        raise ScheduleError(str(e).replace("interleaved-1f1b --variant megatron",
                                           "interleaved-overlap")) from None
    table = megatron_schedule_table(m, v, n)
    rows = []
    for r in range(p):
        fwd = [Op("F", c * p + r, mb) for mb, c in table]
        bwd = [Op("BW", (v - 1 - c) * p + r, mb) for mb, c in table]
        warmup = min(megatron_warmup(p, r, v, n, m) + 1, m * v)
        rows.append(_rank_order(fwd, bwd, warmup, delay_wgrad))
    return Schedule(name="interleaved-overlap",
                    placement=Placement(kind="loop", ranks=p, stages=p * v),
                    microbatches=m, ranks=rows,
                    params={"ranks": p, "microbatches": m, "chunks": v, "group_size": n,
                            "delay_wgrad": delay_wgrad})

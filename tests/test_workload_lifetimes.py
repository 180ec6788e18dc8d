"""Stage-held bytes over a step (schedsim.workload.lifetimes): FSDP's gathered parameters
and unsharded gradients under pipeline parallelism, and torch pipelining's per-microbatch
retention, as closed forms on hand-made op lists and as invariants on random ones."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.program.flat import COMPUTE_KINDS
from schedsim.workload.lifetimes import StageHeld, lifetime_events

K = {k: i for i, k in enumerate(COMPUTE_KINDS)}


def ops(rows):
    """rows of (rank, stage, kind, start, end) -> the five arrays."""
    r, s, k, a, b = zip(*rows)
    return (np.array(r), np.array(s), np.array([K[x] for x in k]), np.array(a, float),
            np.array(b, float))


def level(t, r, d, rank, at):
    """Bytes held by ``rank`` just after time ``at`` (frees at one instant first)."""
    m = (r == rank) & (t <= at)
    return float(d[m].sum())


def peak(t, r, d, rank):
    m = r == rank
    o = np.lexsort((d[m] >= 0, t[m]))
    return float(np.cumsum(d[m][o]).max())


def test_one_stage_holds_params_from_first_f_and_grads_from_first_bw_to_last_bw():
    # rank 0: F0 [0,1] F1 [1,2] BW0 [3,5] BW1 [5,7]; step ends at 9
    t, r, d = lifetime_events(*ops([(0, 0, "F", 0, 1), (0, 0, "F", 1, 2),
                                    (0, 0, "BW", 3, 5), (0, 0, "BW", 5, 7)]),
                              [StageHeld(gathered=10, grads=100, sharded_grads=25)], 9.0)
    assert level(t, r, d, 0, 0.5) == 10
    assert level(t, r, d, 0, 2.5) == 10
    assert level(t, r, d, 0, 3.5) == 110            # params + unsharded grads
    assert level(t, r, d, 0, 7.5) == 25             # reduce-scattered, resharded
    assert level(t, r, d, 0, 9.0) == 25 and float(d.sum()) == 0   # freed just after
    assert peak(t, r, d, 0) == 110


def test_interleaved_chunk_grads_do_not_overlap_when_the_later_chunk_finishes_first():
    # one rank, stages 0 and 2 (chunks 0 and 1): all forwards, then stage 2's backwards,
    # then stage 0's (torch ScheduleInterleaved1F1B on rank 0 with m = p)
    rows = [(0, 0, "F", 0, 1), (0, 0, "F", 1, 2), (0, 2, "F", 2, 3), (0, 2, "F", 3, 4),
            (0, 2, "BW", 4, 6), (0, 2, "BW", 6, 8), (0, 0, "BW", 8, 10), (0, 0, "BW", 10, 12)]
    held = [StageHeld(gathered=1, grads=100), StageHeld(), StageHeld(gathered=1, grads=100)]
    t, r, d = lifetime_events(*ops(rows), held, 12.0)
    assert peak(t, r, d, 0) == 102                  # both gathered, one chunk's grads
    # the same bytes held by one stage of twice the layers (1F1B): grads of both at once
    rows1 = [(0, 0, "F", 0, 1), (0, 0, "F", 1, 2), (0, 0, "BW", 4, 6), (0, 0, "BW", 6, 8)]
    t1, r1, d1 = lifetime_events(*ops(rows1), [StageHeld(gathered=2, grads=200)], 8.0)
    assert peak(t1, r1, d1, 0) == 202


def test_split_backward_grads_start_at_the_first_w():
    rows = [(0, 0, "F", 0, 1), (0, 0, "B", 1, 2), (0, 0, "W", 3, 4)]
    t, r, d = lifetime_events(*ops(rows), [StageHeld(grads=7)], 5.0)
    assert level(t, r, d, 0, 2.5) == 0
    assert level(t, r, d, 0, 3.5) == 7
    assert level(t, r, d, 0, 4.0) == 0


def test_torch_retention_outputs_from_f_end_logits_and_input_grads_from_backward_end():
    # last stage (1) on rank 1: its logits count from its backward's end; stage 0's output
    # from each F end; stage 1's input grads from each BW end
    rows = [(0, 0, "F", 0, 1), (0, 0, "F", 1, 2), (1, 1, "F", 1, 2), (1, 1, "BW", 2, 4),
            (1, 1, "F", 4, 5), (1, 1, "BW", 5, 7), (0, 0, "BW", 4, 6), (0, 0, "BW", 7, 9)]
    held = [StageHeld(output=3), StageHeld(output_after_backward=50, input_grad=3)]
    t, r, d = lifetime_events(*ops(rows), held, 10.0)
    assert level(t, r, d, 0, 1.5) == 3 and level(t, r, d, 0, 9.5) == 6
    assert level(t, r, d, 1, 3.0) == 0 and level(t, r, d, 1, 4.5) == 53
    assert level(t, r, d, 1, 9.5) == 106 and float(d[r == 1].sum()) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["F", "B", "W", "BW"]),
                          st.floats(0, 50), st.floats(0, 5)), min_size=1, max_size=30),
       st.lists(st.tuples(*[st.integers(0, 9)] * 6), min_size=4, max_size=4))
def test_every_byte_is_freed_by_the_step_end_and_the_level_never_goes_negative(raw, sizes):
    rows = [(s % 2, s, k, a, a + dur) for s, k, a, dur in raw]
    held = [StageHeld(*map(float, z)) for z in sizes]
    end = max(b for *_, b in rows) + 1
    t, r, d = lifetime_events(*ops(rows), held, end)
    for q in (0, 1):
        m = r == q
        o = np.lexsort((d[m] >= 0, t[m]))
        lv = np.cumsum(d[m][o])
        assert len(lv) == 0 or (lv.min() >= -1e-9 and abs(lv[-1]) < 1e-9)
        assert np.all(t[m] <= np.nextafter(end, np.inf))

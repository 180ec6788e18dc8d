"""The caching allocator model (schedsim/workload/allocator.py) on hand cases with closed
answers (the rules of pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp), and its
invariants under random streams (hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.workload.allocator import CachingAllocator, OutOfMemory, round_size, segment_size

KiB, MiB = 1 << 10, 1 << 20


def test_round_size_is_512_bytes():
    assert [round_size(n) for n in (1, 511, 512, 513, 1024, 1025)] == [
        512, 512, 512, 1024, 1024, 1536]


def test_segment_sizes():
    assert segment_size(512) == segment_size(MiB) == 2 * MiB             # small pool
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB                            # rounded to 2 MiB
    assert segment_size(round_size(10 * MiB + 1)) == 12 * MiB
    assert segment_size(101 * MiB) == 102 * MiB


def test_small_requests_pack_into_one_2_mib_segment():
    a = CachingAllocator()
    x = a.malloc(1000)
    y = a.malloc(1000)
    assert (a.reserved, a.allocated, a.requested) == (2 * MiB, 2048, 2000)
    assert y == x + 1024                     # split off the same segment, above x
    z = a.malloc(MiB)                        # 1 MiB is still small: it fits the rest
    assert a.reserved == 2 * MiB and z == y + 1024


def test_large_pool_splits_only_above_1_mib_of_remainder():
    a = CachingAllocator()
    a.free(a.malloc(12 * MiB))               # a 12 MiB segment, cached
    b = a.malloc(11 * MiB)                   # 1 MiB would remain: not split
    assert a.allocated == 12 * MiB and a.requested == 11 * MiB
    a.free(b)
    a.malloc(11 * MiB - 512)                 # 1 MiB + 512 remains: split
    assert a.allocated == 11 * MiB - 512 and a.reserved == 12 * MiB


def test_a_1_to_10_mib_request_takes_a_20_mib_segment_that_others_share():
    a = CachingAllocator()
    x = a.malloc(3 * MiB)
    y = a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB and y == x + 3 * MiB and a.segments == 1


def test_coalescing_makes_the_segment_whole_again():
    a = CachingAllocator()
    x, y, z = (a.malloc(3 * MiB) for _ in range(3))
    a.free(x)
    a.free(z)                                # merges with the 11 MiB tail
    a.free(y)                                # merges both sides: one 20 MiB block
    assert a.all_free()
    w = a.malloc(20 * MiB)                   # served by the whole cached segment
    assert w == x and a.reserved == 20 * MiB and a.segments == 1
    a.free(w)
    assert a.release_cached() == 20 * MiB and a.reserved == 0


def test_best_fit_smallest_block_then_lowest_address():
    a = CachingAllocator()
    big, small, small2 = a.malloc(16 * MiB), a.malloc(12 * MiB), a.malloc(12 * MiB)
    for h in (big, small2, small):
        a.free(h)
    assert a.malloc(11 * MiB) == small       # 12 MiB beats 16; the lower of the two 12s
    assert a.malloc(11 * MiB) == small2
    assert a.malloc(11 * MiB) == big and a.reserved == 40 * MiB


def test_fragmentation_reserved_above_allocated():
    a = CachingAllocator()
    x = a.malloc(100 * MiB)
    a.malloc(100 * MiB)
    a.free(x)
    a.malloc(150 * MiB)                      # fits no cached block: a new segment
    assert (a.reserved, a.allocated) == (350 * MiB, 250 * MiB)


def test_streams_do_not_share_cached_blocks():
    a = CachingAllocator()
    a.free(a.malloc(100 * MiB, stream=0))
    a.malloc(100 * MiB, stream=1)
    assert a.reserved == 200 * MiB


def test_at_capacity_the_cache_is_released_and_the_segment_retried():
    a = CachingAllocator(capacity=300 * MiB)
    a.free(a.malloc(200 * MiB))              # cached, unsplit
    a.malloc(250 * MiB)                      # 450 > 300: release the 200, retry
    assert (a.reserved, a.releases, a.segments) == (250 * MiB, 1, 1)
    with pytest.raises(OutOfMemory) as e:
        a.malloc(100 * MiB)                  # nothing cached to release
    assert e.value.reserved == 250 * MiB and a.allocated == 250 * MiB


def test_a_segment_made_after_a_release_keeps_its_remainder_cached():
    a = CachingAllocator(capacity=40 * MiB)
    a.free(a.malloc(30 * MiB, stream=1))     # cached on another stream
    a.malloc(3 * MiB)                        # 30 + 20 > 40: release, a 20 MiB segment
    a.check()
    a.malloc(3 * MiB)                        # the 17 MiB remainder serves it
    assert (a.reserved, a.segments, a.releases) == (20 * MiB, 1, 1)


def test_a_split_segment_is_not_released():
    a = CachingAllocator(capacity=300 * MiB)
    x = a.malloc(200 * MiB)
    a.free(a.malloc(50 * MiB))               # a 50 MiB segment, whole and free
    a.malloc(20 * MiB)                       # reuses the 50 (split: 30 MiB remain)
    a.free(x)                                # 200 free and whole
    a.malloc(250 * MiB)                      # 500 > 300: the 200 goes, the split 50 stays
    assert (a.reserved, a.releases, a.segments) == (300 * MiB, 1, 2)


def test_expandable_segment_grows_by_pages_at_its_end():
    a = CachingAllocator(expandable=True)
    x = a.malloc(3 * MiB)                    # one 20 MiB page
    y = a.malloc(30 * MiB)                   # 17 MiB free at the end: one page more
    assert a.reserved == 40 * MiB and y == x + 3 * MiB and a.segments == 1
    b = CachingAllocator(expandable=True)
    b.malloc(20 * MiB - 512)                 # 512 bytes remain: split all the same
    assert b.allocated == 20 * MiB - 512


def test_expandable_segment_unmaps_its_free_end():
    a = CachingAllocator(expandable=True)
    x = a.malloc(100 * MiB)
    a.malloc(100 * MiB)
    a.free(x)
    z = a.malloc(150 * MiB)                  # the end is taken: 8 pages more
    assert (a.reserved, a.allocated) == (360 * MiB, 250 * MiB)
    a.free(z)
    assert a.release_cached() == 160 * MiB and a.reserved == 200 * MiB   # x stays mapped


def test_expandable_segments_are_per_stream_and_released_at_capacity():
    a = CachingAllocator(capacity=300 * MiB, expandable=True)
    a.free(a.malloc(200 * MiB))
    a.malloc(100 * MiB, stream=1)            # a second segment: 300 of 300
    a.malloc(50 * MiB, stream=1)             # 60 more: unmap stream 0's free 200 first
    assert (a.reserved, a.releases, a.segments) == (160 * MiB, 1, 1)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([100, 600 * KiB, MiB, MiB + 1, 3 * MiB,
                                           10 * MiB, 33 * MiB, 128 * MiB]),
                          st.integers(0, 9), st.integers(0, 1)), max_size=120),
       st.booleans())
def test_reserved_covers_allocated_and_freeing_all_frees_every_block(ops, expandable):
    """At every event reserved covers allocated, within the capacity (a small one: the
    release-and-retry path runs often), and the blocks, free lists and sums stay
    consistent; freeing everything leaves every block free and every segment whole."""
    cap = 300 * MiB
    a = CachingAllocator(capacity=cap, expandable=expandable)
    live = []
    for size, pick, stream in ops:
        if live and pick < 4:
            a.free(live.pop(pick % len(live)))
        else:
            try:
                live.append(a.malloc(size, stream))
            except OutOfMemory:
                pass
        assert a.reserved >= a.allocated >= a.requested >= 0
        assert a.reserved <= cap and a.peak_reserved >= a.reserved
        a.check()
    for h in live:
        a.free(h)
    assert a.all_free() and a.allocated == a.requested == 0
    cached = a.reserved
    assert a.release_cached() == cached          # every segment is whole again
    assert a.reserved == 0 and a.segments == 0


# --- the tensor-level stream of a workload (schedsim/workload/tensors.py, reserved.py) ---

def _stream(w, schedule: str):
    """(result, per-rank ReservedMemory) of ``w`` under ``schedule``, the stream walked
    in program order."""
    import numpy as np

    from schedsim.program.flat import Opcode
    from schedsim.workload.reserved import reserved_run
    from schedsim.workload.run import _fb_parts, simulate_workload, workload_program

    r = simulate_workload(w, schedule)
    fl = workload_program(w, schedule).flat()
    gi = np.flatnonzero(fl.code == Opcode.COMPUTE)
    kind, stage = fl.kind[gi].astype(np.int64), fl.stage[gi].astype(np.int64)
    bkind, bstage = _fb_parts(fl, gi, kind, stage)
    pos = gi.astype(np.float64)
    return r, reserved_run(r.derived, fl.ranks, fl.rank_of_instr()[gi], kind, stage, bkind,
                           bstage, pos, pos + 0.5)


def _small(framework: str, recompute: str, chunks: int):
    from schedsim.workload.layout import Workload

    kw = dict(model="llama3.1-8b", gpu="h100-sxm", seq=4096, tp=2, pp=4, dp=1,
              global_batch_size=16, recompute=recompute, chunks=chunks,
              framework=framework, allocator="caching")
    if framework == "torchtitan":
        kw.update(zero=3, recv_buffers="per-microbatch", sequence_parallel=True)
    return Workload(**kw)


@pytest.mark.parametrize("framework,recompute,schedule,chunks", [
    ("torchtitan", "full", "1f1b", 1), ("torchtitan", "selective", "interleaved-1f1b", 2),
    ("torchtitan", "none", "zb-1p", 1), ("torchtitan", "full", "zbv", 2),
    ("megatron", "none", "1f1b", 1), ("megatron", "none", "dualpipev", 2)])
def test_stream_peaks_at_the_byte_models_peak(framework, recompute, schedule, chunks):
    """The tensor-level stream's allocated peak is the aggregated byte model's on every
    rank (the same sizes cut into blocks: whole bytes, a rounding tolerance), reserved
    covers it, and the allocator's blocks (rounded, unsplit remainders) lie between."""
    res, rr = _stream(_small(framework, recompute, chunks), schedule)
    assert [r.peak_requested for r in rr] == pytest.approx(res.peak_memory_bytes, rel=1e-6)
    for r in rr:
        assert r.peak_reserved >= r.peak_allocated >= r.peak_requested and not r.oom
        assert 2 <= r.steps <= 8               # run to the cache's steady state
    assert [r.peak_reserved for r in rr] == res.peak_reserved_bytes
    # every step's block is freed again: what stays is the static bytes and buffers
    d = res.derived
    assert [r.end_requested for r in rr] == pytest.approx(
        [x.total + b for x, b in zip(d.static, d.recv_bytes)], rel=1e-6)


def test_stream_frees_a_last_stages_head_before_its_layers_backward():
    """Megatron full recompute: the last stage's layer backward (the whole layer
    recomputed) outweighs its loss (none counted), and autograd frees the head's saved
    tensors first, so the stream's peak there is below the aggregate's, by at most the
    head's kept bytes; on the other ranks they agree. The result's allocated peaks are
    the stream's (the one its reserved peaks come from), the byte model's in ``memory``."""
    from schedsim.workload.memory import head_activations

    w = _small("megatron", "full", 1)
    res, rr = _stream(w, "1f1b")
    head = head_activations(w.model, w.seq, w.micro_batch_size, w.tp, w.sp, 2.0,
                            w.vocab_divisor)
    last = res.derived.placement.stages_of
    assert res.peak_memory_bytes == [r.peak_requested for r in rr]
    for q, (r, agg) in enumerate(zip(rr, (m.peak for m in res.memory))):
        if w.stages - 1 in last(q):
            assert agg - head - 1 <= r.peak_requested < agg
        else:
            assert r.peak_requested == pytest.approx(agg, rel=1e-6)


def _on_hbm(gib: float):
    w = _small("torchtitan", "none", 1)
    return _stream(w.model_copy(update={"gpu": w.gpu.model_copy(
        update={"hbm_bytes": gib * 2 ** 30})}), "1f1b")


def test_fragmentation_decides_the_fit_at_the_hbm():
    """The last rank's tensors peak at 33.9 GiB and its uncapped cache at 39.4: on 34.5
    GiB it is out of memory though its tensors would fit (the result says so: fits is
    false, its reserved figure above the HBM); on 35 GiB releasing the cached segments
    lets it through, below the uncapped figure."""
    free, _ = _on_hbm(96)
    tight, rr = _on_hbm(34.5)
    last = len(rr) - 1
    assert max(tight.peak_memory_bytes) < 34 * 2 ** 30 and not tight.fits
    assert rr[last].oom and tight.peak_reserved_bytes[last] > 34.5 * 2 ** 30
    assert not any(r.oom for r in rr[:last])
    ok, rr = _on_hbm(35)
    assert ok.fits and not any(r.oom for r in rr)
    assert ok.peak_reserved_bytes[last] < free.peak_reserved_bytes[last]
    assert free.peak_reserved_bytes[last] > 39 * 2 ** 30

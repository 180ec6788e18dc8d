"""The one Timeline assembler (:func:`schedsim.timeline_build.assemble_timeline`) and its
summary (:func:`schedsim.timeline.summarize_spans`): the array summary equals a plain
loop over the spans to the bit, whatever the span order, and the simulator's deferred
Timeline equals one assembled eagerly from the same lists."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.timeline import RankSummary, Timeline, summarize_spans
from schedsim.timeline_build import TimelineHeader, assemble_timeline


def loop_summary(ranks, rank, start, end):
    """The summary as a loop over the spans in order (the rule in Timeline's docs)."""
    busy = [0.0] * ranks
    first = [math.inf] * ranks
    last = [-math.inf] * ranks
    for r, a, b in zip(rank, start, end):
        busy[r] += b - a
        first[r] = min(first[r], a)
        last[r] = max(last[r], b)
    makespan = max(max(last), 0.0) if len(rank) else 0.0
    return makespan, [RankSummary(rank=r, busy=busy[r], idle=makespan - busy[r],
                                  bubble_ratio=(makespan - busy[r]) / makespan
                                  if makespan > 0 else 0.0,
                                  first_start=first[r] if first[r] < math.inf else None,
                                  last_end=last[r] if last[r] > -math.inf else None)
                      for r in range(ranks)]


times = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(ranks=st.integers(1, 5), data=st.data())
def test_summary_equals_the_loop_in_any_order(ranks, data):
    spans = data.draw(st.lists(st.tuples(st.integers(0, ranks - 1), times, times),
                               max_size=30))
    rank = [r for r, _, _ in spans]
    start = [min(a, b) for _, a, b in spans]
    end = [max(a, b) for _, a, b in spans]
    mk, rows = summarize_spans(ranks, rank, start, end)
    ref_mk, ref_rows = loop_summary(ranks, rank, start, end)
    assert mk == ref_mk
    assert [r.model_dump() for r in rows] == [r.model_dump() for r in ref_rows]


@settings(max_examples=200, deadline=None)
@given(ranks=st.integers(1, 5), data=st.data())
def test_summary_of_spans_grouped_by_rank_equals_the_loop(ranks, data):
    """Spans in rank order (a simulated run's: summed per rank by a sequential cumsum,
    not bincount), ranks as an int32 array: the loop's bits too, a zero-length span of
    -0.0 first included."""
    import numpy as np

    spans = sorted(data.draw(st.lists(st.tuples(st.integers(0, ranks - 1), times, times),
                                      max_size=30)), key=lambda x: x[0])
    rank = [r for r, _, _ in spans]
    start = [min(a, b) for _, a, b in spans]
    end = [max(a, b) for _, a, b in spans]
    if spans and data.draw(st.booleans()):
        start[0], end[0] = 0.0, -0.0
    mk, rows = summarize_spans(ranks, np.asarray(rank, np.int32), start, end)
    ref_mk, ref_rows = loop_summary(ranks, rank, start, end)
    assert mk == ref_mk
    assert [r.model_dump() for r in rows] == [r.model_dump() for r in ref_rows]
    assert [math.copysign(1.0, r.busy) for r in rows] == \
        [math.copysign(1.0, r.busy) for r in ref_rows]


def test_summary_values():
    """Two ranks, rank 1 given first and out of order; a third rank without spans."""
    mk, rows = summarize_spans(3, [1, 0, 1], [4.0, 0.0, 1.0], [6.0, 3.0, 2.0])
    assert mk == 6.0
    assert [(r.busy, r.idle, r.first_start, r.last_end) for r in rows] == [
        (3.0, 3.0, 0.0, 3.0), (3.0, 3.0, 1.0, 6.0), (0.0, 6.0, None, None)]
    assert [r.bubble_ratio for r in rows] == [0.5, 0.5, 1.0]
    assert summarize_spans(2, [], [], []) == (0.0, summarize_spans(2, [], [], [])[1])
    assert [r.bubble_ratio for r in summarize_spans(2, [], [], [])[1]] == [0.0, 0.0]


def test_summary_refuses_bad_columns():
    with pytest.raises(ValueError, match="differ in length"):
        summarize_spans(2, [0, 1], [0.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="outside 0..1"):
        summarize_spans(2, [0, 2], [0.0, 0.0], [1.0, 1.0])


@pytest.mark.parametrize("name,sem", [("1f1b", "rendezvous"), ("dualpipev", "eager"),
                                      ("zbv", "data")])
def test_deferred_timeline_equals_the_eager_one(name, sem):
    """The simulator's Timeline (deferred lists) and one assembled eagerly from the same
    span columns and lists serialise to the same JSON; its summary is the loop's."""
    prog = build_program(name, 4, 8)
    tl = simulate(prog, CostModel(F=1, B=1.5, W=0.5, BW=2, FB=2.5),
                  LinkModel(latency=0.25), CommModel(semantics=sem))
    assert tl.is_deferred
    spans = list(tl.spans)
    cols = ([s.rank for s in spans], [s.start for s in spans], [s.end for s in spans])
    head = TimelineHeader(prog.placement, tl.schedule, tl.microbatches, tl.semantics, tl.unit,
                          comm_stream=tl.comm_stream, params=tl.params)
    eager = assemble_timeline(head, *cols, spans=spans, messages=tl.messages, waits=tl.waits)
    assert not eager.is_deferred
    assert eager.to_json() == tl.to_json()
    mk, rows = loop_summary(tl.ranks, *cols)
    assert (tl.makespan, tl.per_rank) == (mk, rows)
    assert Timeline.summarize(tl.ranks, spans) == (mk, rows)

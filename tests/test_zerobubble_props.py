"""Invariants of the zero-bubble family over random sizes, costs and memory limits."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedsim import CommModel, CostModel, LinkModel, generate, lower, simulate
from schedsim.analysis.memory import MemoryModel, peak_activation
from schedsim.analysis.metrics import bubble_rate_paper, stage_spans
from schedsim.program.validate import validate_schedule

DATA, EAGER = CommModel(semantics="data"), CommModel(semantics="eager")
ZB = MemoryModel.preset("zb")
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

costs_st = st.builds(lambda f, b, w: CostModel(F=f, B=b, W=w),
                     st.integers(1, 6), st.integers(1, 8), st.integers(1, 5))
latency_st = st.sampled_from([0.0, 0.1, 0.5, 2.0])


@st.composite
def sizes(draw, min_m: int = 1) -> tuple[int, int]:
    p = draw(st.integers(1, 8))
    return p, draw(st.integers(max(1, min_m * p), 3 * p + 2))


def _check_runs(sched, costs: CostModel, link: LinkModel):
    """Valid, finishes under data semantics, and the async program under eager P2P
    semantics finishes at the same time (no stall beyond the data dependencies)."""
    validate_schedule(sched)
    tl = simulate(lower(sched), costs, link, DATA)
    assert tl.deadlock is None
    assert 0 <= bubble_rate_paper(tl) < 1
    eager = simulate(lower(sched), costs, link, EAGER)
    assert eager.makespan == pytest.approx(tl.makespan)
    return tl


@SETTINGS
@given(size=sizes(), costs=costs_st, latency=latency_st,
       name=st.sampled_from(["zb-1p", "zb-2p"]), limit=st.none() | st.floats(1, 30))
def test_auto_respects_memory_and_its_plan(size, costs, latency, name, limit) -> None:
    """zb-1p / zb-2p (any --mem-limit >= 1): peak activation never exceeds the limit, and
    the engine reproduces the span the heuristic planned."""
    p, m = size
    link = LinkModel(latency=latency)
    sched = generate(name, p, m, mem_limit=limit, costs=costs, link=link)
    tl = _check_runs(sched, costs, link)
    cap = limit if limit is not None else (p if name == "zb-1p" else 2 * p)
    assert max(peak_activation(tl, ZB)) <= cap + 1e-9
    assert max(stage_spans(tl)) == pytest.approx(sched.params["planned_span"], abs=1e-9)


@SETTINGS
@given(size=sizes(), costs=costs_st, latency=latency_st, extra=st.integers(0, 8))
def test_zbv_respects_memory(size, costs, latency, extra) -> None:
    """ZB-V with any limit >= p (the default) runs and stays under the limit."""
    p, m = size
    link = LinkModel(latency=latency)
    limit = p + extra / 2
    sched = generate("zbv", p, m, mem_limit=limit, costs=costs, link=link)
    assert sched.placement.kind == "v"
    tl = _check_runs(sched, costs, link)
    assert max(peak_activation(tl, ZB)) <= limit + 1e-9


@SETTINGS
@given(size=sizes(), costs=costs_st, latency=latency_st,
       name=st.sampled_from(["v-half", "v-min"]))
def test_greedy_v_runs_for_any_size(size, costs, latency, name) -> None:
    """V-Half / V-Min lay out for any (p, m) and their order ignores the costs."""
    p, m = size
    sched = generate(name, p, m)
    _check_runs(sched, costs, LinkModel(latency=latency))
    assert sched.ranks == generate(name, p, m).ranks


@SETTINGS
@given(size=sizes(min_m=1), costs=costs_st, latency=latency_st)
def test_handcrafted_memory_and_validity(size, costs, latency) -> None:
    """ZB-H1 keeps 1F1B's in-flight peak (p microbatches on every rank); ZB-H2 holds
    2p-1 (paper Section 3: about twice 1F1B's)."""
    p, m = size
    inflight = MemoryModel.preset("inflight")
    tl = _check_runs(generate("zb-h1", p, m), costs, LinkModel(latency=latency))
    assert peak_activation(tl, inflight) == [float(p)] * p
    if m >= 2 * p:
        tl = _check_runs(generate("zb-h2", p, m), costs, LinkModel(latency=latency))
        assert peak_activation(tl, inflight) == [float(max(1, 2 * p - 1))] * p

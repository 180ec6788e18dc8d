"""The zero-bubble authors' ILP results (tests/data/zb_ilp_authors.json: their
legacy-main ``auto_schedule.py`` run with CBC on their own cases; provenance in the file)
against our model and our solver. Every order they produced must be valid and within
their memory limit under our zb memory model (their ``mem_f=2, mem_b=-1, mem_w=-1``); on
the fast cases (m=8) our solver must prove a makespan no worse than their order's. The
full 24-case comparison at 60 s each is benchmarks/bench_search.py (docs/search.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedsim.analysis.memory import MemoryModel, peak_activation
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.program.lower import lower
from schedsim.program.validate import validate_schedule
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

DATA = Path(__file__).parent / "data" / "zb_ilp_authors.json"
CASES = json.loads(DATA.read_text())["cases"]


def _ids(c: dict) -> str:
    return f"p{c['p']}_m{c['m']}_{c['cost_set']}_mem{c['mem_limit_activations']}"


def _their_schedule(c: dict) -> Schedule:
    rows = [[Op(tok[0], s, int(tok[1:])) for tok in c["orders"][s].split()]
            for s in range(c["p"])]
    return Schedule(name="zb-ilp", placement=Placement(kind="loop", ranks=c["p"],
                                                       stages=c["p"]),
                    microbatches=c["m"], ranks=rows)


def _models(c: dict) -> tuple[CostModel, LinkModel]:
    k = c["costs"]
    return CostModel(F=k["F"], B=k["B"], W=k["W"]), LinkModel(latency=k["comm"])


def test_data_file_covers_their_cases_with_provenance():
    d = json.loads(DATA.read_text())
    src = d["source"]
    assert src["repo"] == "sail-sg/zero-bubble-pipeline-parallelism"
    assert len(src["commit"]) == 40 and src["file"].endswith("auto_schedule.py")
    got = {(c["p"], c["m"], c["cost_set"], c["mem_limit_activations"]) for c in CASES}
    want = {(p, m, cs, k * p) for p, m in ((4, 8), (4, 16), (4, 24), (8, 8))
            for cs in ("a_unit", "b_f1b2w1", "c_unit_comm0.1") for k in (1, 2)}
    assert got == want
    for c in CASES:
        assert c["their_max_mem"] == 2 * c["mem_limit_activations"]
        assert c["cbc_proven_optimal"] == c["cbc_result"].startswith("Optimal")


@pytest.mark.parametrize("c", CASES, ids=[_ids(c) for c in CASES])
def test_their_order_is_valid_and_fits_their_limit_in_our_model(c):
    sched = _their_schedule(c)
    validate_schedule(sched)
    costs, link = _models(c)
    tl = simulate(lower(sched), costs, link, CommModel())
    assert max(peak_activation(tl, MemoryModel())) <= c["mem_limit_activations"]
    # their objective is the longest stage span of their times; no order runs faster
    # than the busiest stage's work plus the pipeline fill
    k = c["costs"]
    work = c["m"] * (k["F"] + k["B"] + k["W"])
    assert c["objective_span"] >= work - 1e-9
    assert tl.makespan >= work + (c["p"] - 1) * (k["F"] + k["comm"]) - 1e-9


FAST = [c for c in CASES if c["m"] == 8]


@pytest.mark.parametrize("c", FAST, ids=[_ids(c) for c in FAST])
def test_our_solver_proves_a_makespan_no_worse_than_their_ilp(c):
    pytest.importorskip("ortools")
    from schedsim.search.baselines import run_baselines
    from schedsim.search.cpsat import solve
    from schedsim.search.problem import build_problem

    costs, link = _models(c)
    p, m = c["p"], c["m"]
    pb = build_problem(Placement(kind="loop", ranks=p, stages=p), m, costs, link,
                       MemoryModel(), float(c["mem_limit_activations"]))
    hint = run_baselines(pb, costs, link, CommModel(), "async", MemoryModel()).best_hint()
    res = solve(pb, hint.order, 30.0, workers=1)
    theirs = simulate(lower(_their_schedule(c)), costs, link, CommModel()).makespan
    assert res.optimal
    assert res.makespan <= theirs + 1e-9
    ours = simulate(lower(pb.schedule(res.order)), costs, link, CommModel())
    assert ours.makespan == pytest.approx(res.makespan)


def test_planners_past_the_deadline_are_skipped_not_run():
    """A spent baseline budget skips the cost-aware planners (zb-1p, zb-2p), naming
    why, and still runs the fixed-rule built-ins (the warm start)."""
    pytest.importorskip("ortools")
    from schedsim.search.baselines import run_baselines
    from schedsim.search.problem import build_problem

    costs, link = CostModel(F=1, B=1, W=1), LinkModel()
    pb = build_problem(Placement(kind="loop", ranks=4, stages=4), 8, costs, link,
                       MemoryModel(), 4.0)
    base = run_baselines(pb, costs, link, CommModel(), "async", MemoryModel(), deadline=0.0)
    ran = {row.name for row in base.rows}
    assert {"gpipe", "1f1b", "zb-h1", "zb-h2"} <= ran and not ran & {"zb-1p", "zb-2p"}
    assert set(base.skipped) == {"zb-1p", "zb-1p (mem-limit 4)", "zb-2p",
                                 "zb-2p (mem-limit 4)"}
    assert all("--time-limit" in why for why in base.skipped.values())
    full = run_baselines(pb, costs, link, CommModel(), "async", MemoryModel())
    assert {"zb-1p", "zb-2p"} <= {row.name for row in full.rows}

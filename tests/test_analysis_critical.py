"""Dependency graph, critical path and slack.

The graph must reproduce every time of the run it was built from (spans, transfers,
waits) under every semantics, comm stream and link setting; the 1F1B critical path is the
textbook chain; and slack is checked against the simulator itself: stretching an op by
its slack leaves the makespan, stretching it by one more moves it by one.
"""
from __future__ import annotations

import pytest
from conftest import FIGURE_COSTS

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis.critical import critical_path, op_slack
from schedsim.analysis.graph import build_graph
from schedsim.errors import ProgramError
from schedsim.sim.costs import CostOverride

FIG = CostModel(**FIGURE_COSTS, message_bytes=1.0)


def _assert_reproduces(tl, G) -> None:
    for s in tl.spans:
        assert G.time[("S", s.rank, s.index)] == pytest.approx(s.start, abs=1e-9)
        assert G.time[("E", s.rank, s.index)] == pytest.approx(s.end, abs=1e-9)
    for m in tl.messages:
        k = (m.kind, m.stage, m.mb)
        assert G.time[("T", k)] == pytest.approx(m.start, abs=1e-9)
        assert G.time[("A", k)] == pytest.approx(m.arrival, abs=1e-9)
        assert G.time[("DR", k)] == pytest.approx(m.recv_done, abs=1e-9)
        if ("DS", k) in G.time:
            assert G.time[("DS", k)] == pytest.approx(m.send_done, abs=1e-9)
    for w in tl.waits:
        if w.kind != "DATA":
            assert G.time[("W", w.rank, w.index)] == pytest.approx(w.end, abs=1e-9)


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev", "zb-1p"])
@pytest.mark.parametrize("sem,stream", [("data", "none"), ("eager", "none"),
                                        ("rendezvous", "none"), ("eager", "per-peer"),
                                        ("rendezvous", "per-rank")])
@pytest.mark.parametrize("link", [LinkModel(), LinkModel(latency=0.3, bandwidth=2.0)],
                         ids=["free", "slow"])
def test_graph_reproduces_the_run(name, sem, stream, link) -> None:
    prog = build_program(name, 4, 8)
    comm = CommModel(semantics=sem, comm_stream=stream)
    tl = simulate(prog, FIG, link, comm, raise_on_deadlock=False)
    if tl.deadlock is not None:
        with pytest.raises(ProgramError, match="deadlock"):
            build_graph(tl, prog, link, comm)
        return
    G = build_graph(tl, prog, link, comm)
    _assert_reproduces(tl, G)
    path = critical_path(G)
    ops = [s for s in path if s.kind == "op"]
    assert ops[-1].end == tl.makespan
    # consecutive steps never go back in time
    assert all(a.end <= b.start + 1e-9 or a.kind != "op" or b.kind != "op"
               for a, b in zip(ops, ops[1:]))


def test_1f1b_critical_path_is_the_textbook_chain() -> None:
    p, m = 4, 8
    prog = build_program("1f1b", p, m)
    tl = simulate(prog, CostModel(F=1, BW=2))
    G = build_graph(tl, prog)
    ops = [(s.rank, s.what) for s in critical_path(G) if s.kind == "op"]
    expect = [(r, f"{r}F0") for r in range(p - 1)]
    for i in range(m):
        expect += [(p - 1, f"{p - 1}F{i}"), (p - 1, f"{p - 1}BW{i}")]
    expect += [(r, f"{r}BW{m - 1}") for r in range(p - 2, -1, -1)]
    assert ops == expect
    # the path is busy from 0 to the makespan: (m + p - 1)(F + BW) = 33
    assert sum(s.end - s.start for s in critical_path(G) if s.kind == "op") == 33
    sl = {(o.rank, o.op): o.slack for o in op_slack(G)}
    assert all(sl[k] == 0 for k in expect)
    # rank 0's last warm-up forward ends at 4 but rank 1 runs 1F3 only after 1BW0 (8-10):
    # it can slip by 6; 0BW0 follows the gradient chain and has none
    assert sl[(0, "0F3")] == 6 and sl[(0, "0BW0")] == 0


@pytest.mark.parametrize("sem", ["data", "eager", "rendezvous"])
def test_slack_matches_resimulation(sem: str) -> None:
    prog = build_program("dualpipe", 8, 20)
    comm = CommModel(semantics=sem)
    costs = CostModel(**FIGURE_COSTS)
    tl = simulate(prog, costs, comm=comm)
    sl = op_slack(build_graph(tl, prog, comm=comm))
    pos = [o for o in sl if o.slack > 0]
    picked = pos[::max(1, len(pos) // 6)][:6] + [o for o in sl if o.slack == 0][::97][:2]
    assert len(picked) == 8
    for o in picked:
        span = next(s for s in tl.spans if s.rank == o.rank and s.index == o.index)
        kind = span.kind
        base = costs.cost(prog.ranks[o.rank][o.index].op)
        for extra, moved in ((o.slack, 0.0), (o.slack + 1, 1.0)):
            c = CostModel(**FIGURE_COSTS, overrides=[CostOverride(
                stage=span.stage, mb=span.mb, kind=kind, cost=base + extra)])
            t2 = simulate(prog, c, comm=comm)
            assert t2.makespan - tl.makespan == pytest.approx(moved), (o, extra)


@pytest.mark.parametrize("name,comm", [
    ("zb-1p", CommModel(semantics="eager", launch_cost=0.5)),
    ("dualpipe", CommModel(semantics="rendezvous", launch_cost=0.25,
                           comm_stream="per-peer")),
    ("dualpipe", CommModel(semantics="rendezvous", eager_threshold_bytes=1.5)),
], ids=["launch-cost", "launch-cost-stream", "eager-threshold"])
def test_graph_reproduces_launch_costs_and_mixed_eagerness(name, comm) -> None:
    """The host time a launch takes and which messages complete eagerly come from the
    run itself: the graph reproduces it (before, launches cost nothing in the graph and
    eagerness came from default message sizes)."""
    prog = build_program(name, 4, 8)
    costs = CostModel(**FIGURE_COSTS, stage_bytes={0: 1.0, 1: 2.0, 2: 1.0, 3: 2.0})
    link = LinkModel(latency=0.5)
    tl = simulate(prog, costs, link, comm)
    G = build_graph(tl, prog, link, comm)
    _assert_reproduces(tl, G)
    assert critical_path(G)[-1].end == tl.makespan


def test_critical_path_headline_and_runs_of_ops() -> None:
    from schedsim.analysis.critical import path_headline, segments

    prog = build_program("1f1b", 4, 8)
    tl = simulate(prog, CostModel(F=1, BW=2))
    path = critical_path(build_graph(tl, prog))
    assert path_headline(path, tl.makespan, 52, 64) == [
        "makespan 33 slots = 33 slots compute + 0 slots waiting along 22 ops on the path "
        "over 4 ranks; 52 of 64 ops have zero slack",
        "route (slots): 0F0@r0 -> 1F0@r1 -> 2F0@r2 -> r3: 16 ops 3F0..3BW7 [3,27] -> 2BW7@r2 -> "
        "1BW7@r1 -> 0BW7@r0"]
    segs = segments(path)
    assert [(g.rank, len(g.ops)) for g in segs] == [(0, 1), (1, 1), (2, 1), (3, 16), (2, 1),
                                                    (1, 1), (0, 1)]
    assert [v.what for v in segs[1].via if v.kind == "message"] == ["F mb0 0->1"]
    long = path_headline(path, tl.makespan, route_limit=4)[1]
    assert long == "route (slots): 0F0@r0 -> 1F0@r1 -> ... 3 more ... -> 1BW7@r1 -> 0BW7@r0"


def test_networkx_view_of_a_small_graph() -> None:
    """The graph as a networkx DiGraph (for small graphs): same nodes, edges, kinds and
    weights; its longest paths give the same times."""
    import networkx as nx

    prog = build_program("1f1b", 2, 3)
    tl = simulate(prog, CostModel(F=1, BW=2))
    G = build_graph(tl, prog)
    g = G.to_networkx()
    assert g.number_of_edges() == len(G.e.src) and set(g.nodes) == set(G.time)
    assert g.edges[("S", 1, 2), ("E", 1, 2)] == {"weight": 1.0, "kind": "compute"}
    t = {}
    for v in nx.topological_sort(g):
        t[v] = max((t[u] + d["weight"] for u, _, d in g.in_edges(v, data=True)), default=0.0)
    assert t == dict(G.time)

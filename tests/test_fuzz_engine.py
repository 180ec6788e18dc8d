"""Engine invariants on random programs (hypothesis): every generator, and random compute
orders (any topological order of a pipeline's op graph, split or fused backward, loop or
v placement), lowered by every comm policy; random costs (per kind and per stage), links
(latency, finite bandwidth, per-stage message sizes), semantics, comm streams and launch
costs.

Checked on every run: each compute op runs exactly once and lasts its cost; no two
spans overlap on a rank (one compute stream); a consumer starts no earlier than its
producer's end plus the link cost (latency + bytes / bandwidth) when the two ranks differ,
its end when they are the same; every message's times are ordered (posted <= transfer
start <= arrival <= completion, the transfer lasting at least its link cost, a
rendezvous transfer starting after the recv was posted); the run is deterministic;
the Timeline JSON round trip through a file (:meth:`Timeline.read_json`, which checks it)
is identical. For async lowering without comm streams or launch cost: makespan
data <= eager <= rendezvous (more constraints in a max-plus system).
"""
from __future__ import annotations

import math
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, reject, settings, strategies as st

from schedsim.errors import ScheduleError
from schedsim.generators import build_program, names
from schedsim.program.ir import Compute, Op, Placement, Schedule
from schedsim.program.lower import lower
from schedsim.program.routing import needs, producer_atoms
from schedsim.program.validate import validate_schedule
from schedsim.sim.costs import CommModel, CostModel, KindCosts, LinkModel
from schedsim.sim.simulate import simulate
from schedsim.timeline import Timeline

#: examples per test; SCHEDSIM_FUZZ_EXAMPLES raises it for a campaign outside CI
EXAMPLES = int(os.environ.get("SCHEDSIM_FUZZ_EXAMPLES", "100"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
EPS = 1e-9
CHUNKED = ("interleaved-1f1b", "looped-bfs", "interleaved-zb")
#: generators that fix their own comm order (a policy re-lowers their compute order)
OWN_COMM = ("dualpipe", "dualpipev", "1f1b-megatron-figure")

cost_st = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])


@st.composite
def programs(draw, policies=("async", "torch", "commit")):
    name = draw(st.sampled_from(names()))
    p = draw(st.integers(1, 5))
    m = draw(st.integers(1, 8))
    params = {"chunks": draw(st.integers(2, 3))} if name in CHUNKED else {}
    policy = draw(st.sampled_from(policies + ((None,) if name in OWN_COMM else ())))
    try:
        prog = build_program(name, p, m, policy, **params)
    except ScheduleError:       # a size the schedule does not support
        reject()
    return prog, policy


@st.composite
def random_orders(draw, policies=("async", "torch", "commit")):
    """A program from a random valid compute order: ops F, B, W (or BW) of every stage
    and microbatch, taken one at a time in a random topological order of their
    dependencies (:func:`schedsim.program.routing.needs`), each appended to its rank."""
    p = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["loop", "v"]))
    stages = 2 * p if kind == "v" else p * draw(st.integers(1, 2))
    m = draw(st.integers(1, 5))
    split = draw(st.booleans())
    pl = Placement(kind=kind, ranks=p, stages=stages)
    kinds = ("F", "B", "W") if split else ("F", "BW")
    todo = [Op(k, s, mb) for s in range(stages) for mb in range(m) for k in kinds]
    made: set = set()            # produced outputs (routing keys) and ops run
    rows: list[list[Op]] = [[] for _ in range(p)]
    while todo:
        ready = [o for o in todo if all(
            k in made for k in needs(o, stages)) and (o.kind != "W" or ("Bop", o.stage, o.mb)
                                                       in made)]
        o = ready[draw(st.integers(0, len(ready) - 1))]
        todo.remove(o)
        rows[pl.rank_of(o.stage, o.mb)].append(o)
        made.add(("F" if o.kind == "F" else "B", o.stage, o.mb))
        if o.kind == "B":
            made.add(("Bop", o.stage, o.mb))
    sched = Schedule(name="random", placement=pl, microbatches=m, ranks=rows)
    validate_schedule(sched)
    policy = draw(st.sampled_from(policies))
    return lower(sched, policy), policy


@st.composite
def models(draw, stages: int):
    """Random cost and link models for a program of ``stages`` stages."""
    over = {}
    if draw(st.booleans()):
        s = draw(st.integers(0, stages - 1))
        over[s] = KindCosts(F=draw(cost_st), B=draw(cost_st))
    costs = CostModel(F=draw(cost_st), B=draw(cost_st), W=draw(cost_st), stage=over,
                      message_bytes=draw(st.sampled_from([0.0, 10.0, 100.0])),
                      stage_bytes={0: 50.0} if draw(st.booleans()) else {})
    link = LinkModel(latency=draw(st.sampled_from([0.0, 0.25, 1.0])),
                     bandwidth=draw(st.sampled_from([math.inf, 100.0, 1000.0])))
    return costs, link


def _atoms(span):
    return [(p.kind, p.stage, p.mb) for p in span.parts] if span.parts else \
        [(span.kind, span.stage, span.mb)]


def check_invariants(prog, tl: Timeline, costs: CostModel, link: LinkModel) -> None:
    """The per-run invariants of the module docstring (deadlock-free runs)."""
    # each op exactly once, lasting its cost
    want = Counter(a for row in prog.ranks for i in row if isinstance(i, Compute)
                   for a in [(x.kind, x.stage, x.mb) for x in i.op.atoms()])
    got = Counter(a for s in tl.spans for a in _atoms(s))
    assert got == want
    for s in tl.spans:
        assert s.end - s.start == pytest.approx(costs.cost(prog.ranks[s.rank][s.index].op))
    # one compute stream per rank
    by_rank: dict[int, list] = {}
    for s in tl.spans:
        by_rank.setdefault(s.rank, []).append(s)
    for spans in by_rank.values():
        spans.sort(key=lambda s: (s.start, s.end))
        for a, b in zip(spans, spans[1:]):
            assert a.end <= b.start + EPS, (a, b)
    # consumer after producer (+ link cost across ranks)
    where = {a: s for s in tl.spans for a in _atoms(s)}
    S = tl.stages
    for s in tl.spans:
        for kind, stage, mb in _atoms(s):
            for key in needs(type("A", (), {"kind": kind, "stage": stage, "mb": mb}), S):
                prod = next((where[k] for k in producer_atoms(key) if k in where), None)
                assert prod is not None, key
                if prod is s:          # FB: the pair's own forward feeds its backward
                    continue
                lag = 0.0
                if prod.rank != s.rank:
                    lat, bw = link.params(prod.rank, s.rank)
                    lag = lat + costs.bytes_of(key[1]) / bw
                assert s.start >= prod.end + lag - EPS * max(1.0, s.start), (key, prod, s)
    # message times ordered
    for m in tl.messages:
        lat, bw = link.params(m.src, m.dst)
        cost = lat + m.bytes / bw
        if m.start is not None and m.arrival is not None:
            assert m.arrival >= m.start + cost - EPS * max(1.0, m.arrival)
        if m.send_posted is not None and m.start is not None:
            assert m.send_posted <= m.start + EPS
        if m.recv_done is not None:
            if m.arrival is not None:
                assert m.arrival <= m.recv_done + EPS
            if m.recv_posted is not None:
                assert m.recv_posted <= m.recv_done + EPS
        if m.send_done is not None and m.start is not None:
            assert m.start <= m.send_done + EPS
        if tl.semantics == "rendezvous" and m.start is not None and m.recv_posted is not None:
            assert m.recv_posted <= m.start + EPS


@SETTINGS
@given(data=st.data())
def test_engine_invariants_random_programs(data, tmp_path_factory) -> None:
    prog, _ = data.draw(st.one_of(programs(), random_orders()))
    costs, link = data.draw(models(prog.placement.stages))
    comm = CommModel(semantics=data.draw(st.sampled_from(["data", "eager", "rendezvous"])),
                     comm_stream=data.draw(st.sampled_from(["none", "per-peer", "per-rank"])),
                     launch_cost=data.draw(st.sampled_from([0.0, 0.1])))
    tl = simulate(prog, costs, link, comm, raise_on_deadlock=False)
    again = simulate(prog, costs, link, comm, raise_on_deadlock=False)
    assert again.to_json() == tl.to_json()                     # deterministic
    path = tmp_path_factory.mktemp("rt") / "t.json"
    tl.write_json(path)
    assert Timeline.read_json(path).to_json() == tl.to_json()  # checked, identical
    if tl.deadlock is None:
        check_invariants(prog, tl, costs, link)


@SETTINGS
@given(data=st.data())
def test_semantics_order_async(data) -> None:
    """Async lowering: makespan under data <= eager <= rendezvous, and none deadlocks."""
    prog, _ = data.draw(st.one_of(programs(policies=("async",)),
                                  random_orders(policies=("async",))))
    costs, link = data.draw(models(prog.placement.stages))
    mk = []
    for sem in ("data", "eager", "rendezvous"):
        tl = simulate(prog, costs, link, CommModel(semantics=sem))
        check_invariants(prog, tl, costs, link)
        mk.append(tl.makespan)
    assert mk[0] <= mk[1] + EPS * mk[1] and mk[1] <= mk[2] + EPS * mk[2], mk

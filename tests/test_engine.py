"""Engine semantics: closed forms, link model, eager vs rendezvous, comm streams,
deadlocks, and invariants that must hold for every schedule."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from schedsim import (
    CommModel,
    CostModel,
    DeadlockError,
    LinkModel,
    Op,
    Placement,
    Program,
    Schedule,
    build_program,
    lower,
    simulate,
)
from schedsim.program.tokens import parse_program_text
from schedsim.sim.costs import CostOverride, KindCosts

SEMANTICS = ["data", "eager", "rendezvous"]


def prog_from_text(text: str, ranks: int, stages: int, mbs: int,
                   placement: str = "loop") -> Program:
    return Program(placement=Placement(kind=placement, ranks=ranks, stages=stages),
                   microbatches=mbs, ranks=parse_program_text(text))


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (2, 5), (3, 3), (4, 8), (5, 2), (8, 16)])
@pytest.mark.parametrize("sem", SEMANTICS)
def test_closed_form(name: str, p: int, m: int, sem: str) -> None:
    """makespan = (m + p - 1)(F + BW); every rank idles (p - 1)(F + BW), so its bubble
    ratio is (p - 1) / (m + p - 1) (Narayanan et al. 2021, Section 2.2)."""
    F, BW = 1.0, 2.0
    tl = simulate(build_program(name, p, m), CostModel(F=F, BW=BW),
                  comm=CommModel(semantics=sem))
    assert tl.makespan == (m + p - 1) * (F + BW)
    for r in tl.per_rank:
        assert r.idle == (p - 1) * (F + BW)
        assert r.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))


def test_1f1b_scenario_numbers() -> None:
    tl = simulate(build_program("1f1b", 4, 8), CostModel(F=1, BW=2))
    assert tl.makespan == 33
    assert [r.bubble_ratio for r in tl.per_rank] == [pytest.approx(3 / 11)] * 4


def _forward_only(p: int, m: int) -> Schedule:
    return Schedule(placement=Placement(kind="loop", ranks=p, stages=p), microbatches=m,
                    ranks=[[Op("F", r, i) for i in range(m)] for r in range(p)])


@pytest.mark.parametrize("sem", SEMANTICS)
def test_latency(sem: str) -> None:
    """Forward-only, 2 ranks, F = 1, latency 0.5: rank 1 runs F(i) at 1.5 + i."""
    tl = simulate(lower(_forward_only(2, 3)), CostModel(F=1), LinkModel(latency=0.5),
                  CommModel(semantics=sem))
    starts = [s.start for s in tl.spans_of(1)]
    assert starts == [1.5, 2.5, 3.5] and tl.makespan == 4.5


@pytest.mark.parametrize("sem", SEMANTICS)
def test_bandwidth_serializes_link(sem: str) -> None:
    """2-byte messages on a 1 byte/slot link: transfers queue FIFO (occupancy 2 slots), so
    rank 1 gets activations at 3, 5, 7 although rank 0 produces them at 1, 2, 3."""
    costs = CostModel(F=1, message_bytes=2)
    tl = simulate(lower(_forward_only(2, 3)), costs, LinkModel(bandwidth=1.0),
                  CommModel(semantics=sem))
    assert [m.arrival for m in sorted(tl.messages, key=lambda m: m.mb)] == [3, 5, 7]
    assert [s.start for s in tl.spans_of(1)] == [3, 5, 7] and tl.makespan == 8


def test_per_link_override() -> None:
    link = LinkModel(latency=0, links=[{"src": 0, "dst": 1, "latency": 2}])
    tl = simulate(lower(_forward_only(3, 1)), CostModel(F=1), link)
    assert [s.start for s in sorted(tl.spans, key=lambda s: s.rank)] == [0, 3, 4]


RV_TEXT = """
rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 WAIT[0SEND_F1] 0F2 0SEND_F2
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1RECV_F1 WAIT[1RECV_F1] 1F1 1RECV_F2 WAIT[1RECV_F2] 1F2
"""


@pytest.mark.parametrize("sem,threshold,f2_start", [
    ("eager", None, 2), ("rendezvous", None, 6), ("rendezvous", 16, 2),
    ("rendezvous", 5, 6)])
def test_eager_vs_rendezvous(sem: str, threshold: float | None, f2_start: float) -> None:
    """Rank 0 waits for its send of mb 1. Eager: done once the bytes left (t=2).
    Rendezvous: only when rank 1 posts the recv, after its slow F0 (stage 1 F = 5), at 6.
    With eager_threshold_bytes >= the 10-byte message it is eager again."""
    costs = CostModel(F=1, message_bytes=10, stage={1: KindCosts(F=5)})
    tl = simulate(prog_from_text(RV_TEXT, 2, 2, 3), costs,
                  comm=CommModel(semantics=sem, eager_threshold_bytes=threshold))
    assert tl.find_span(0, "F", 2).start == f2_start
    assert tl.makespan == 16
    m1 = next(m for m in tl.messages if m.mb == 1)
    assert m1.send_posted == 2 and m1.recv_posted == 6


STREAM_TEXT = """
rank 0: 0RECV_B0 0F0 0SEND_F0 WAIT[0RECV_B0] 0BW0
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1BW0 1SEND_B0
"""


@pytest.mark.parametrize("stream", ["per-rank", "per-peer"])
def test_early_recv_blocks_later_send_on_shared_stream(stream: str) -> None:
    """On a shared comm stream rank 0's early recv of the gradient occupies the stream, so
    its later send of the activation never starts: deadlock. Without a shared stream the
    same program finishes."""
    prog = prog_from_text(STREAM_TEXT, 2, 2, 1)
    ok = simulate(prog, comm=CommModel(semantics="eager"))
    assert ok.makespan == 6
    with pytest.raises(DeadlockError) as e:
        simulate(prog, comm=CommModel(semantics="eager", comm_stream=stream))
    dl = e.value.timeline.deadlock
    assert {b.rank for b in dl.blocked} == {0, 1}
    assert "queued on rank 0's comm stream behind 0RECV_B0" in dl.message
    assert {(c.rank, c.peer) for c in dl.cycle} == {(0, 1), (1, 0)}


ISSUE_DEADLOCK = """
rank 0: 0F0 0SEND_F0 COMMIT 0F1 0SEND_F1 COMMIT 2RECV_F0 COMMIT 2F0 2SEND_F0 COMMIT 2RECV_F1 COMMIT 2F1 2SEND_F1 COMMIT
rank 1: 1RECV_F0 COMMIT 1F0 1SEND_F0 COMMIT 1RECV_F1 COMMIT 1F1 1SEND_F1 COMMIT 3RECV_F0 COMMIT 3F0 3RECV_F1 COMMIT 3F1
"""


def test_issue_deadlock_under_rendezvous() -> None:
    """Rank 0 waits at its second COMMIT for rank 1's 1RECV_F1, which rank 1 posts only
    after its own COMMIT, which waits for rank 0's 2RECV_F0."""
    prog = prog_from_text(ISSUE_DEADLOCK, 2, 4, 2)
    with pytest.raises(DeadlockError) as e:
        simulate(prog, comm=CommModel(semantics="rendezvous"))
    dl = e.value.timeline.deadlock
    steps = {(c.rank, c.index, c.instruction, c.waits_for, c.peer) for c in dl.cycle}
    assert steps == {(0, 5, "COMMIT", "1RECV_F1", 1), (1, 4, "COMMIT", "2RECV_F0", 0)}
    assert "rank 1 posts only at instr 5" in dl.message
    assert "rank 0 posts only at instr 6" in dl.message
    # what ran before the deadlock is kept
    assert [(s.rank, s.kind, s.stage, s.mb) for s in e.value.timeline.spans] == [
        (0, "F", 0, 0), (0, "F", 0, 1), (1, "F", 1, 0)]
    for sem in ("eager", "data"):
        assert simulate(prog, comm=CommModel(semantics=sem)).makespan == 5


def test_data_semantics_deadlock_in_schedule_order() -> None:
    """A compute order with a cross-rank cycle deadlocks even under data semantics."""
    sched = Schedule(placement=Placement(kind="loop", ranks=2, stages=2), microbatches=2,
                     ranks=[[Op("F", 0, 0), Op("BW", 0, 0), Op("F", 0, 1), Op("BW", 0, 1)],
                            [Op("F", 1, 1), Op("F", 1, 0), Op("BW", 1, 0), Op("BW", 1, 1)]])
    with pytest.raises(DeadlockError) as e:
        simulate(lower(sched))
    dl = e.value.timeline.deadlock
    assert {(c.rank, c.peer) for c in dl.cycle} == {(0, 1), (1, 0)}
    assert "has not run" in dl.message


def test_never_hangs_on_deadlock_without_raise() -> None:
    prog = prog_from_text(ISSUE_DEADLOCK, 2, 4, 2)
    tl = simulate(prog, comm=CommModel(semantics="rendezvous"), raise_on_deadlock=False)
    assert tl.deadlock is not None and tl.makespan == 2


def test_fb_cost_defaults_and_overrides() -> None:
    c = CostModel(F=1, B=2, W=3)
    fb = Op.fb(Op("F", 0, 1), Op("BW", 2, 0))
    assert c.cost(Op("BW", 0, 0)) == 5 and c.cost(fb) == 6
    c = CostModel(F=1, B=2, W=3, FB=4, stage={2: KindCosts(B=7)},
                  overrides=[CostOverride(stage=0, mb=1, kind="F", cost=9)])
    assert c.cost(fb) == 4
    assert c.cost(Op("BW", 2, 0)) == 10 and c.cost(Op("F", 0, 1)) == 9
    assert c.cost_fn()(Op("BW", 2, 0)) == 10


# -- invariants over random schedules ---------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["1f1b", "gpipe"]), p=st.integers(1, 5), m=st.integers(1, 9),
       F=st.integers(1, 4), B=st.integers(1, 4), W=st.integers(1, 4),
       lat=st.sampled_from([0.0, 0.5]))
def test_invariants_compute_only(name, p, m, F, B, W, lat) -> None:
    """For async-lowered schedules: eager == data (recvs are posted ahead, sends never
    block), rendezvous >= eager (more constraints in a max-plus system), spans never
    overlap on a rank and last exactly their cost, and each op runs once."""
    prog = build_program(name, p, m)
    costs = CostModel(F=F, B=B, W=W)
    link = LinkModel(latency=lat)
    tls = {s: simulate(prog, costs, link, CommModel(semantics=s)) for s in SEMANTICS}
    assert tls["eager"].makespan == tls["data"].makespan
    assert tls["rendezvous"].makespan >= tls["eager"].makespan
    for tl in tls.values():
        _check_spans(tl, prog, costs)


@settings(max_examples=10, deadline=None)
@given(half=st.integers(1, 4), extra=st.integers(0, 3), F=st.integers(1, 3),
       B=st.integers(1, 3), W=st.integers(1, 3))
def test_invariants_dualpipe(half, extra, F, B, W) -> None:
    """DualPipe's own commit batches: data <= eager <= rendezvous, no deadlock."""
    P = 2 * half
    M = 2 * P + 2 * extra
    prog = build_program("dualpipe", P, M)
    costs = CostModel(F=F, B=B, W=W)
    mk = [simulate(prog, costs, comm=CommModel(semantics=s)).makespan for s in SEMANTICS]
    assert mk[0] <= mk[1] <= mk[2]


def _check_spans(tl, prog, costs) -> None:
    by_rank: dict[int, list] = {}
    for s in tl.spans:
        by_rank.setdefault(s.rank, []).append(s)
    n_ops = sum(1 for row in prog.ranks for i in row if hasattr(i, "op"))
    assert len(tl.spans) == n_ops
    for r, spans in by_rank.items():
        spans.sort(key=lambda s: s.start)
        for a, b in zip(spans, spans[1:]):
            assert a.end <= b.start + 1e-9
        for s in spans:
            op = prog.ranks[r][s.index].op
            assert s.end - s.start == pytest.approx(costs.cost(op))


@pytest.mark.parametrize("strict", [False, True])
def test_launch_cost(strict: bool) -> None:
    """Launching a batch of posts keeps the host busy: rank 0 posts its send of F0 at 1.5
    and starts F1 only then; rank 1's first batch (both recvs) is posted at 0.5."""
    costs = CostModel(F=1, message_bytes=1 if strict else 0)
    link = LinkModel(bandwidth=1e12 if strict else float("inf"))
    tl = simulate(lower(_forward_only(2, 2)), costs, link,
                  CommModel(semantics="eager", launch_cost=0.5))
    assert [s.start for s in tl.spans_of(0)] == [0, pytest.approx(1.5)]
    assert [s.start for s in tl.spans_of(1)] == [pytest.approx(1.5), pytest.approx(3.0)]
    m0 = min(tl.messages, key=lambda m: m.mb)
    assert (m0.send_posted, m0.recv_posted) == (pytest.approx(1.5), 0.5)
    data = simulate(lower(_forward_only(2, 2)), costs, link,
                    CommModel(semantics="data", launch_cost=0.5))
    assert data.makespan == pytest.approx(3.0)     # no comm instructions: no launch cost

"""Inside one op: launch order, one hardware queue (``connections``) and compute slowed
by communication (``comm_slowdown``) in the two-stream scheduler
(:func:`schedsim.sim.overlap.schedule`), and Megatron's combined-1F1B launch order of an
FB pair (``overlap = "megatron"``, :mod:`schedsim.sim.combined`).

The one-queue rule is CUDA's: with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` kernels *start* in
the order the host launched them, whatever their stream (torch issue #143890, Megatron-LM
PRs #2719/#2730: the EP all-to-all overlap gains less; #6311 measured +3.7% instead of
+7.8%)."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.sim.overlap import COLLECTIVE, COMPUTE, Piece, schedule
from schedsim.sim.stage_costs import StageCosts
from schedsim.sim.stage_model import StageModel

matplotlib.use("Agg")


@st.composite
def _dags(draw) -> list[Piece]:
    n = draw(st.integers(1, 10))
    out = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        out.append(Piece(f"p{i}", draw(st.sampled_from([COMPUTE, COLLECTIVE])),
                         draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5])), tuple(sorted(deps))))
    return out


@settings(max_examples=150, deadline=None)
@given(_dags())
def test_event_pass_is_the_list_scheduler(pieces: list[Piece]) -> None:
    """The event-driven pass with no device option places every piece exactly where the
    list scheduler does (bounded random DAGs, empty pieces included); one queue >= in
    order; under a slowdown the compute total is unchanged, no piece runs shorter than its
    duration, and dependencies and one piece per stream at a time still hold. (A slowdown
    may *shorten* the op: greedy list scheduling is not monotone in durations, Graham's
    anomaly; see test_a_slowdown_can_shorten_a_list_schedule.)"""
    from schedsim.sim.overlap import _dispatch, levels

    a = schedule(pieces)
    start, end, queued = _dispatch(pieces, levels(pieces), False, False, 1.0)
    assert [p.start for p in a.pieces] == start and [p.end for p in a.pieces] == end
    assert queued == [None] * len(pieces)
    fifo = schedule(pieces, in_order=True)
    one = schedule(pieces, connections=1)
    assert one.cost >= fifo.cost - 1e-12
    # one queue: pieces start in program order
    starts = [p.start for p in one.pieces]
    assert starts == sorted(starts)
    slow = schedule(pieces, slowdown=1.5)
    assert slow.compute == a.compute
    for p, q in zip(pieces, slow.pieces):
        assert q.end - q.start >= p.duration - 1e-12
        assert all(q.start >= slow.pieces[d].end - 1e-12 for d in p.deps)
    for stream in (COMPUTE, COLLECTIVE):
        busy = sorted((q.start, q.end) for p, q in zip(pieces, slow.pieces)
                      if p.stream == stream and q.end > q.start)
        assert all(b[0] >= a_[1] - 1e-12 for a_, b in zip(busy, busy[1:]))


def test_a_slowdown_can_shorten_a_list_schedule() -> None:
    """Graham's timing anomaly (R. L. Graham, "Bounds on multiprocessing timing anomalies",
    SIAM J. Appl. Math. 17(2), 1969): longer pieces can give a shorter list schedule. Here,
    found by the property test above: without a slowdown the collective stream, free at
    1.5, takes the ready p8 (level 1.0) before the empty p2 (level 0.5) that p7 waits for,
    so p7 ends at 3.0; slowed by 1.5x, p1 ends at 1.5 and p5 at 1.75, p8 is not ready at
    1.5, p2 goes first and p7 ends at 2.5: the op costs 2.75 instead of 3.0."""
    def p(name, stream, d, deps=()):
        return Piece(name, stream, d, deps)
    pieces = [p("p0", COMPUTE, 0), p("p1", COMPUTE, 1.0), p("p2", COLLECTIVE, 0),
              p("p3", COLLECTIVE, 1.5), p("p4", COMPUTE, 0), p("p5", COMPUTE, 0.25),
              p("p6", COMPUTE, 0), p("p7", COMPUTE, 0.5, (2,)),
              p("p8", COLLECTIVE, 1.0, (0, 1, 5))]
    a, slow = schedule(pieces), schedule(pieces, slowdown=1.5)
    assert (a.cost, slow.cost) == (3.0, 2.75) and a.compute == slow.compute == 1.75
    assert (a.pieces[8].start, a.pieces[2].start, a.pieces[7].end) == (1.5, 2.5, 3.0)
    assert (slow.pieces[2].start, slow.pieces[8].start, slow.pieces[7].end) == (1.5, 1.75, 2.5)


def _moe(**kw) -> StageModel:
    """One MoE layer: attention and experts cost 1 (W 0.5) per phase; each all-to-all
    moves 16e6 bytes over 8 ranks at 16e6 bytes/unit: 7/8 x 1 = 0.875."""
    base = dict(layers=1, moe=True, ep=8, activation_bytes=16e6, overlap="megatron",
                attention={"F": 1, "B": 1, "W": 0.5}, mlp={"F": 1, "B": 1, "W": 0.5},
                links={"intra": {"bandwidth": 16e6, "latency": 0.0}})
    base.update(kw)
    return StageModel(**base)


def _timeline(c) -> list[tuple[int, str, str, float, float]]:
    return [(p.piece.which, p.piece.part, p.piece.name, p.start, p.end) for p in c.pieces]


def test_fb_pair_in_megatron_order_hand_timeline() -> None:
    """FB = F(mb i+w) with BW(mb i), one layer, Megatron's launch order
    (model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run): B combine, F
    attention, B experts (+ W), F dispatch, B dispatch, F experts, F combine, B attention
    (+ W). By hand, independent streams (connections 8): the backward's combine (0 -
    0.875) runs under the forward's attention (0 - 1); B experts 1 - 2 and its W 2 - 2.5
    run while the forward's dispatch (1 - 1.875) and the backward's dispatch (2 - 2.875)
    run; F experts: its input (F dispatch) ended at 1.875, the compute stream is free at
    2.5, so 2.5 - 3.5; F combine 3.5 - 4.375 under B attention
    (needs B dispatch, 2.875; compute free at 3.5) 3.5 - 4.5 and its W 4.5 - 5. The pair
    costs 5 = its compute; F + BW = 3.75 + 4.75 = 8.5.

    One hardware queue (connections 1): the F dispatch, ready at 1, is launched after
    B's expert W, which cannot start before 2 (the compute stream runs B experts): it is
    held until 2 (queued at 1), ends 2.875; the B dispatch follows it, 2.875 - 3.75; F
    experts 2.875 - 3.875; F combine 3.875 - 4.75; B attention (needs B dispatch, 3.75;
    compute free 3.875) 3.875 - 4.875; W 4.875 - 5.375. The pair costs 5.375: the overlap
    saves 3.125 instead of 3.5."""
    for conn, want_cost, want in (
            (8, 5.0, [(1, "B", "combine all-to-all", 0, 0.875), (0, "F", "attention", 0, 1),
                      (1, "B", "experts", 1, 2), (1, "W", "experts", 2, 2.5),
                      (0, "F", "dispatch all-to-all", 1, 1.875),
                      (1, "B", "dispatch all-to-all", 2, 2.875), (0, "F", "experts", 2.5, 3.5),
                      (0, "F", "combine all-to-all", 3.5, 4.375),
                      (1, "B", "attention", 3.5, 4.5), (1, "W", "attention", 4.5, 5)]),
            (1, 5.375, [(1, "B", "combine all-to-all", 0, 0.875), (0, "F", "attention", 0, 1),
                        (1, "B", "experts", 1, 2), (1, "W", "experts", 2, 2.5),
                        (0, "F", "dispatch all-to-all", 2, 2.875),
                        (1, "B", "dispatch all-to-all", 2.875, 3.75),
                        (0, "F", "experts", 2.875, 3.875),
                        (0, "F", "combine all-to-all", 3.875, 4.75),
                        (1, "B", "attention", 3.875, 4.875),
                        (1, "W", "attention", 4.875, 5.375)])):
        sc = StageCosts(_moe(), connections=conn)
        fb = sc.fb(None, None, "BW")
        assert fb.cost == pytest.approx(want_cost)
        got = _timeline(fb)
        assert [g[:3] for g in got] == [w[:3] for w in want]
        assert [g[3:] for g in got] == [pytest.approx(w[3:]) for w in want]
        assert sc.op("F").cost + sc.op("BW").cost == pytest.approx(8.5)
        queued = [p.queued for p in fb.pieces]
        assert queued == ([None] * 10 if conn == 8 else [None] * 4 + [1.0] + [None] * 5)
    # the gain: 3.5 on independent streams, 3.125 on one queue
    gain = {c: 8.5 - StageCosts(_moe(), connections=c).fb().cost for c in (1, 2, 32)}
    assert gain == pytest.approx({1: 3.125, 2: 3.5, 32: 3.5})


def test_delay_wgrad_moves_the_expert_w_behind_the_dispatch() -> None:
    """Megatron's delay_wgrad_compute: the expert W is launched after the forward's
    dispatch, so on one queue the dispatch no longer waits for it (FB back to 5, the
    independent-stream cost); on independent streams nothing changes (5)."""
    for conn in (1, 8):
        fb = StageCosts(_moe(delay_wgrad=True), connections=conn).fb()
        names = [(p.piece.part, p.piece.name) for p in fb.pieces]
        assert names.index(("F", "dispatch all-to-all")) < names.index(("W", "experts"))
        assert fb.cost == pytest.approx(5.0)
        assert all(p.queued is None for p in fb.pieces)


def test_comm_slowdown_hand_timeline() -> None:
    """comm_slowdown 1.5: compute runs at 2/3 speed while a collective runs. F alone (a
    chain) is unchanged (nothing overlaps); in the FB pair the forward's attention
    overlaps the backward's combine (0 - 0.875): 0.875 x 2/3 = 7/12 of its work done,
    the rest at full speed: it ends at 0.875 + 5/12 = 1.2917. A per-stage override
    slows only that stage (its rank)."""
    sc = StageCosts(_moe(comm_slowdown=1.5))
    assert sc.op("F").cost == pytest.approx(3.75)
    fb = sc.fb()
    att = next(p for p in fb.pieces if p.piece.part == "F" and p.piece.name == "attention")
    assert (att.start, att.end) == (0, pytest.approx(0.875 + (1 - 0.875 / 1.5)))
    assert fb.cost > StageCosts(_moe()).fb().cost
    per = StageCosts(_moe(stage={1: {"comm_slowdown": 1.5}}))
    assert per.fb(0, 0).cost == pytest.approx(5.0)
    assert per.fb(1, 1).cost == pytest.approx(fb.cost)


def test_connections_is_a_comm_key_and_a_flag(tmp_path) -> None:
    """[comm] connections and --connections reach the stage model; out of 1..32 is
    refused with one line and exit 2."""
    from typer.testing import CliRunner

    from schedsim.cli import app

    r = CliRunner()
    for c, want in (([], "makespan 33.12 slots"), (["--connections", "1"], "33.12 slots"),
                    (["--connections", "8"], "makespan 32 slots"),
                    (["--connections", "32"], "makespan 32 slots")):
        out = r.invoke(app, ["simulate", "schedules/1f1b-overlap-queue.toml", "-q", *c])
        assert out.exit_code == 0 and want in out.stdout, out.output
    f = tmp_path / "s.toml"          # the file's [comm] connections = 1 removed: default 8
    f.write_text(open("schedules/1f1b-overlap-queue.toml").read()
                 .replace("connections = 1", ""))
    out = r.invoke(app, ["simulate", str(f), "-q"])
    assert out.exit_code == 0 and "makespan 32 slots" in out.stdout
    out = r.invoke(app, ["simulate", "schedules/1f1b-overlap-queue.toml", "-q",
                         "--connections", "0"])
    assert out.exit_code == 2 and "connections" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_detail_draws_the_blocked_queue(tmp_path) -> None:
    """--detail under connections 1 draws one cross-hatched box per piece held by the
    queue (the forward's dispatch of every pair, 1 to 2 in the pair); none otherwise;
    the Timeline JSON's pieces carry ``queued``."""
    import json

    from typer.testing import CliRunner

    from schedsim.cli import app
    from schedsim.cli.common import build_scenario
    from schedsim.plot.gantt import gantt
    from schedsim.sim.pieces import attach_pieces
    from schedsim.sim.simulate import simulate

    for conn, n_pairs in ((1, 4), (8, 0)):
        sc = build_scenario(Path("schedules/1f1b-overlap-queue.toml"), connections=conn)
        tl = attach_pieces(simulate(sc.build_program(), sc.costs, sc.link, sc.comm),
                           sc.stage_costs())
        q = [p for p in tl.pieces if "queued" in p]
        assert len(q) == n_pairs        # 1f1b-overlap 2x4: 1 pair on rank 0, 3 on rank 1
        assert all(p["name"] == "dispatch all-to-all" and p["kind"] == "F"
                   and p["start"] - p["queued"] == pytest.approx(1.0) for p in q)
        fig = gantt(tl, detail=True)
        got = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "detail-queued"]
        assert sum(len(c.get_paths()) for c in got) == n_pairs
    out = tmp_path / "tl.json"
    r = CliRunner().invoke(app, ["simulate", "schedules/1f1b-overlap-queue.toml", "-q",
                                 "--connections", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert sum("queued" in p for p in json.loads(out.read_text())["pieces"]) == 4

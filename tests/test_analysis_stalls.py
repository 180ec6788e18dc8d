"""Stall attribution: every idle interval classified, tiling [0, makespan] with the spans,
with the cause the mechanism implies (DualPipe T10/T12 batch, 1F1B bubbles, rendezvous
sends, link queues, crossed blocking sends)."""
from __future__ import annotations

import pytest
from conftest import FIGURE_COSTS, SCHEDULES

from schedsim import CommModel, CostModel, LinkModel, build_program, load_scenario, simulate
from schedsim.analysis import CAUSES, attribute_stalls
from schedsim.program.tokens import parse_program_text
from schedsim.scenario import program_from_rows

FIG = CostModel(**FIGURE_COSTS)


def _check_tiling(tl, stalls) -> None:
    """On every rank, spans and stalls cover [0, makespan] without gap or overlap."""
    for r in range(tl.ranks):
        pieces = sorted([(s.start, s.end) for s in tl.spans if s.rank == r]
                        + [(s.start, s.end) for s in stalls if s.rank == r])
        t = 0.0
        for a, b in pieces:
            assert a == pytest.approx(t), (r, a, t)
            assert b > a
            t = b
        assert t == pytest.approx(tl.makespan)


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev", "1f1b", "gpipe", "zb-1p"])
@pytest.mark.parametrize("sem", ["data", "eager", "rendezvous"])
def test_stalls_tile_the_makespan(name: str, sem: str) -> None:
    prog = build_program(name, 4, 8)
    tl = simulate(prog, FIG, LinkModel(latency=0.25), CommModel(semantics=sem))
    st = attribute_stalls(tl, prog)
    _check_tiling(tl, st)
    assert {s.cause for s in st} <= set(CAUSES)
    idle = [sum(s.duration for s in st if s.rank == r) for r in range(tl.ranks)]
    assert idle == pytest.approx([r.idle for r in tl.per_rank])


def _rank5(sem: str):
    prog = build_program("dualpipe", 8, 20)
    tl = simulate(prog, FIG, comm=CommModel(semantics=sem))
    return [s for s in attribute_stalls(tl, prog) if s.rank == 5]


def test_dualpipe_rank5_eager_batch_held_by_unrelated_recv() -> None:
    st = _rank5("eager")
    s = next(s for s in st if s.start == 11)
    assert (s.end, s.cause, s.index, s.instruction, s.comms) == (12, "wait-batch", 28,
                                                                "COMMIT", ["5RECV_F3"])
    assert "the next op 5W0 does not need" in s.detail
    assert "rank 4 posted 4SEND_F3 only at 12 (instr 25), 1 after the data was ready" \
        in s.detail
    # warmup: the first op 2F10 waits for rank 6's 1F10
    w = st[0]
    assert (w.start, w.end, w.cause) == (0, 2, "warmup") and "1F10 on rank 6" in w.detail
    assert [(s.start, s.cause) for s in st] == [(0, "warmup"), (11, "wait-batch"),
                                               (46, "wait-recv"), (54, "wait-recv"),
                                               (58, "wait-recv")]


def test_dualpipe_rank5_rendezvous_batch_held_by_send_and_recv() -> None:
    s = next(s for s in _rank5("rendezvous") if s.start == 11)
    assert s.cause == "wait-batch" and s.comms == ["5SEND_B0", "5RECV_F3"]
    assert "5SEND_B0 (input gradient of stage 5 mb 0) was not accepted until rank 4 " \
           "posted 4RECV_B0 at 12 (instr 25)" in s.detail


def test_dualpipe_rank5_data_has_no_stall_at_t11() -> None:
    assert [(s.start, s.end) for s in _rank5("data")] == [(0, 2), (16, 17), (46, 47),
                                                          (54, 55), (58, 59)]


def test_1f1b_bubbles_are_warmup_wait_recv_cooldown() -> None:
    tl = simulate(build_program("1f1b", 4, 8), CostModel(F=1, BW=2))
    st = attribute_stalls(tl)
    r0 = [(s.start, s.end, s.cause) for s in st if s.rank == 0]
    assert r0 == [(4, 10, "wait-recv"), (24, 25, "wait-recv"), (27, 28, "wait-recv"),
                  (30, 31, "wait-recv")]
    assert "input gradient of stage 1 mb 0 from rank 1 (made by 1BW0 on rank 1, ended 10)" \
        in st[0].detail
    r3 = [(s.start, s.end, s.cause) for s in st if s.rank == 3]
    assert r3 == [(0, 3, "warmup"), (27, 33, "cooldown")]
    # per rank, idle = (p - 1)(F + BW) = 9
    assert [sum(s.duration for s in st if s.rank == r) for r in range(4)] == [9] * 4


def _prog(text: str, **kw):
    return program_from_rows(parse_program_text(text), "loop", **kw)


def test_wait_send_under_rendezvous_and_transfer_under_eager() -> None:
    # rank 0 blocks on its send of mb 1; rank 1 posts the recv only after 1BW0
    prog = _prog("""
rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 WAIT[0SEND_F1] 0RECV_B0 WAIT[0RECV_B0] 0BW0 0RECV_B1 WAIT[0RECV_B1] 0BW1
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1BW0 1SEND_B0 1RECV_F1 WAIT[1RECV_F1] 1F1 1BW1 1SEND_B1
""")
    tl = simulate(prog, CostModel(F=1, BW=2), comm=CommModel(semantics="rendezvous"))
    s = next(s for s in attribute_stalls(tl, prog) if s.rank == 0)
    assert (s.start, s.end, s.cause, s.instruction) == (2, 4, "wait-send",
                                                       "WAIT[0SEND_F1]")
    assert "not accepted until rank 1 posted 1RECV_F1 at 4 (instr 5)" in s.detail
    tl = simulate(prog, CostModel(F=1, BW=2, message_bytes=1), LinkModel(bandwidth=2),
                  CommModel(semantics="eager"))
    s = next(s for s in attribute_stalls(tl, prog) if s.rank == 0)
    assert (s.start, s.end, s.cause) == (2, 2.5, "transfer")


def test_head_of_line_on_a_slow_link() -> None:
    # GPipe, 2 ranks: rank 0's activations leave back to back on a link that takes 2 per
    # message, so each waits behind the previous one
    prog = build_program("gpipe", 2, 3)
    tl = simulate(prog, CostModel(F=1, BW=2, message_bytes=2), LinkModel(bandwidth=1),
                  CommModel(semantics="eager"))
    st = [s for s in attribute_stalls(tl, prog) if s.rank == 1]
    hol = [s for s in st if s.cause == "head-of-line"]
    assert hol, st
    assert "queued behind F mb0 0->1" in hol[0].detail


def test_crossed_sends_eager_stalls_name_the_waits() -> None:
    sc = load_scenario(SCHEDULES / "crossed-sends.toml")
    prog = sc.build_program()
    tl = simulate(prog, CostModel(F=1, BW=2, message_bytes=1), LinkModel(bandwidth=2),
                  CommModel(semantics="eager"))
    st = attribute_stalls(tl, prog)
    _check_tiling(tl, st)
    send_waits = [s for s in st if s.instruction in ("WAIT[2SEND_F0]", "WAIT[1SEND_F1]")]
    assert {(s.rank, s.cause) for s in send_waits} == {(0, "transfer"), (1, "transfer")}
    for s in st:
        if s.index >= 0:
            assert s.instruction.startswith("WAIT[") or s.instruction == "END"


def test_deadlocked_rank_gets_a_deadlock_stall() -> None:
    # rank 1 waits for both activations before its first op, but rank 0 sends the second
    # only after the backward of the first: deadlock under any semantics
    tl = simulate(_prog("""
rank 0: 0F0 0SEND_F0 0RECV_B0 WAIT[0RECV_B0] 0BW0 0F1 0SEND_F1 0RECV_B1 WAIT[0RECV_B1] 0BW1
rank 1: 1RECV_F0 1RECV_F1 WAIT[1RECV_F0+1RECV_F1] 1F0 1BW0 1SEND_B0 1F1 1BW1 1SEND_B1
"""), CostModel(F=1, BW=2), comm=CommModel(semantics="eager"), raise_on_deadlock=False)
    assert tl.deadlock is not None and tl.makespan == 1
    st = attribute_stalls(tl)
    assert [(s.rank, s.start, s.end, s.cause) for s in st] == [(1, 0, 1, "deadlock")]
    assert "WAIT[1RECV_F0+1RECV_F1]" in st[0].detail


def test_headline_totals_by_cause_and_names_the_longest() -> None:
    from schedsim.analysis.stalls import stalls_headline

    prog = build_program("dualpipe", 8, 20)
    tl = simulate(prog, FIG, comm=CommModel(semantics="rendezvous"))
    st = attribute_stalls(tl, prog)
    assert stalls_headline(st, tl, 5) == (
        "idle by cause (rank 5): wait-recv 3 slots, warmup 2 slots, wait-batch 1 slot = "
        "6 slots of 66 slots (9.1%) in 5 stalls; longest: rank 5 0-2 slots warmup")
    # all ranks: 6 idle per rank; the longest is the first of the ties in (rank, start)
    head = stalls_headline(st, tl)
    assert head.startswith("idle by cause (all ranks): ")
    assert "= 48 slots of 528 slots (9.1%)" in head
    longest = max(s.duration for s in st)
    assert head.endswith(next(f"rank {s.rank} {s.start:g}-{s.end:g} slots {s.cause}" for s in st
                              if s.duration == longest))


def test_stalls_cli_prints_the_headline_first_and_bounds_the_table() -> None:
    from typer.testing import CliRunner

    from schedsim.cli import app

    r = CliRunner().invoke(app, ["stalls", "-s", "1f1b", "-p", "8", "-m", "16",
                                 "--limit", "3"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("idle by cause (all ranks): ")
    tl = simulate(build_program("1f1b", 8, 16))
    n = len(attribute_stalls(tl))
    flat = " ".join(r.stdout.split())
    assert f"the 3 longest of {n} stalls shown" in flat
    rows = [ln for ln in lines if ln.startswith("│") and ln.split("│")[1].strip().isdigit()]
    assert len(rows) == 3
    r = CliRunner().invoke(app, ["stalls", "-s", "1f1b", "-p", "8", "-m", "16", "--all"])
    assert "longest of" not in r.stdout

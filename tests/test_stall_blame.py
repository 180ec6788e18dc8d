"""Stall blame (issue 9, item 5): every stall names the rank, the instruction and the peer
instruction that caused it; a transfer held by a comm stream names the rank that owns
the stream, the stream and the op at the head of its queue — often the *peer's* stream,
not the waiting rank's. Each situation is built on both sides (sender waits / receiver
waits)."""
from __future__ import annotations

import pytest

from schedsim import CommModel, CostModel, LinkModel, simulate
from schedsim.analysis.align import alignment
from schedsim.analysis.critical import critical_path
from schedsim.analysis.graph import build_graph
from schedsim.analysis.stalls import attribute_stalls
from schedsim.program.tokens import parse_program_text
from schedsim.scenario import program_from_rows

# 3 ranks, stages 0..5 (loop: rank r holds r and r+3), forward only, 2 microbatches
PEER = """rank 0: 0F0 0SEND_F0 0F1 3RECV_F0 0SEND_F1 WAIT[3RECV_F0] 3F0 3SEND_F0 3RECV_F1 WAIT[3RECV_F1] 3F1 3SEND_F1
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1SEND_F0 1RECV_F1 WAIT[1RECV_F1] 1F1 1SEND_F1 4RECV_F0 WAIT[4RECV_F0] 4F0 4SEND_F0 4RECV_F1 WAIT[4RECV_F1] 4F1 4SEND_F1
rank 2: 2RECV_F0 WAIT[2RECV_F0] 2F0 2SEND_F0 2RECV_F1 WAIT[2RECV_F1] 2F1 2SEND_F1 5RECV_F0 WAIT[5RECV_F0] 5F0 5RECV_F1 WAIT[5RECV_F1] 5F1
"""
# rank 0 waits for its own sends; rank 1's send to rank 2 crosses a slow link
SENDER = """rank 0: 0F0 0SEND_F0 WAIT[0SEND_F0] 0F1 0SEND_F1 WAIT[0SEND_F1] 3RECV_F0 WAIT[3RECV_F0] 3F0 3SEND_F0 3RECV_F1 WAIT[3RECV_F1] 3F1 3SEND_F1
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1SEND_F0 1RECV_F1 WAIT[1RECV_F1] 1F1 1SEND_F1 4RECV_F0 WAIT[4RECV_F0] 4F0 4SEND_F0 4RECV_F1 WAIT[4RECV_F1] 4F1 4SEND_F1
rank 2: 2RECV_F0 WAIT[2RECV_F0] 2F0 2SEND_F0 2RECV_F1 WAIT[2RECV_F1] 2F1 2SEND_F1 5RECV_F0 WAIT[5RECV_F0] 5F0 5RECV_F1 WAIT[5RECV_F1] 5F1
"""
SLOW_1_2 = LinkModel(links=[{"src": 1, "dst": 2, "bandwidth": 10}])
BYTES = CostModel(F=1, message_bytes=30)       # 3 time units on the slow link


def run(text: str, sem: str, stream: str, costs=CostModel(F=1), link=LinkModel()):
    prog = program_from_rows(parse_program_text(text), "loop", stages=6)
    tl = simulate(prog, costs, link, CommModel(semantics=sem, comm_stream=stream))
    return prog, tl


def stall(prog, tl, rank: int, start: float):
    st = [s for s in attribute_stalls(tl, prog) if s.rank == rank and s.start == start]
    assert len(st) == 1, [(s.rank, s.start, s.cause) for s in attribute_stalls(tl, prog)]
    return st[0]


@pytest.mark.parametrize("stream", ["per-rank", "per-peer"])
def test_receiver_held_by_the_senders_stream(stream) -> None:
    """Rank 1 waits for 1RECV_F1; the matching 0SEND_F1 sits on rank 0's stream behind
    3RECV_F0 (per-rank) — per-peer, rank 0's stream to rank 1 is free, so no blame."""
    prog, tl = run(PEER, "rendezvous", stream)
    s = stall(prog, tl, 1, 2.0) if stream == "per-rank" else None
    if stream == "per-peer":
        assert not [x for x in attribute_stalls(tl, prog) if x.cause == "head-of-line"]
        return
    assert (s.cause, s.end, s.index, s.instruction) == ("head-of-line", 3.0, 5,
                                                        "WAIT[1RECV_F1]")
    assert (s.peer, s.peer_index, s.peer_instruction) == (0, 3, "3RECV_F0")
    assert ("0SEND_F1 was posted at 2 (instr 4) but queued on rank 0's comm stream until 3, "
            "behind 3RECV_F0 (instr 3, active from 2, done 3)") in s.detail
    row = [r for r in alignment(tl) if (r.kind, r.mb, r.src, r.dst) == ("F", 1, 0, 1)][0]
    assert row.flags == ["queued"]
    assert row.queued_behind == ("rank 0's comm stream: 0SEND_F1 (instr 4) behind 3RECV_F0 "
                                 "(instr 3)")
    path = critical_path(build_graph(tl, prog))
    streams = [(st.rank, st.what) for st in path if st.kind == "stream"]
    assert (0, "0SEND_F1") in streams
    step = [st for st in path if st.kind == "stream" and st.what == "0SEND_F1"][0]
    assert "rank 0's comm stream starts 0SEND_F1 at 3, once 3RECV_F0 ahead of it" in \
        step.detail


def test_sender_held_by_the_receivers_stream() -> None:
    """Rank 0 waits for its 0SEND_F1 (rendezvous); rank 1 posted 1RECV_F1 at 2 but it
    sits on rank 1's stream behind 1SEND_F0, which crosses the slow link until 5."""
    prog, tl = run(SENDER, "rendezvous", "per-rank", BYTES, SLOW_1_2)
    s = stall(prog, tl, 0, 2.0)
    assert (s.cause, s.end, s.instruction) == ("head-of-line", 5.0, "WAIT[0SEND_F1]")
    assert (s.peer, s.peer_index, s.peer_instruction) == (1, 3, "1SEND_F0")
    assert "1RECV_F1 was posted at 2 (instr 4) but queued on rank 1's comm stream until 5, " \
           "behind 1SEND_F0 (instr 3, active from 2, done 5)" in s.detail


def test_receiver_held_by_its_own_stream() -> None:
    """Eager: the F1 data reached rank 1 at 2, but 1RECV_F1 became active only at 5,
    behind rank 1's own 1SEND_F0 on the slow link: the blame is rank 1's stream."""
    prog, tl = run(SENDER, "eager", "per-rank", BYTES, SLOW_1_2)
    s = stall(prog, tl, 1, 2.0)
    assert (s.cause, s.end, s.instruction) == ("head-of-line", 5.0, "WAIT[1RECV_F1]")
    assert (s.peer, s.peer_index, s.peer_instruction) == (1, 3, "1SEND_F0")
    assert "arrived at 2 but 1RECV_F1 was posted at 2 (instr 4) but queued on rank 1's " \
           "comm stream until 5" in s.detail


def test_wait_recv_names_the_senders_post() -> None:
    """Rank 0 waits for 3RECV_F0 until rank 2 posts 2SEND_F0 (instr 3) at 3."""
    prog, tl = run(PEER, "rendezvous", "none")
    s = stall(prog, tl, 0, 2.0)
    assert (s.cause, s.end, s.instruction) == ("wait-recv", 3.0, "WAIT[3RECV_F0]")
    assert (s.peer, s.peer_index, s.peer_instruction) == (2, 3, "2SEND_F0")


def test_wait_send_names_the_receivers_late_recv() -> None:
    """Rendezvous: rank 0's 0SEND_F1 is accepted only when rank 1, busy with a 4-long
    1F0, posts 1RECV_F1 (instr 3) at 6; and rank 1 first waited for rank 0's late send."""
    text = ("rank 0: 0F0 0F1 0SEND_F0 WAIT[0SEND_F0] 0SEND_F1 WAIT[0SEND_F1]\n"
            "rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1RECV_F1 WAIT[1RECV_F1] 1F1\n")
    prog = program_from_rows(parse_program_text(text), "loop", stages=2)
    tl = simulate(prog, CostModel(F=1, stage={1: {"F": 4}}),
                  comm=CommModel(semantics="rendezvous"))
    s = stall(prog, tl, 0, 2.0)     # after rank 0's last op: only waiting for its send
    assert (s.cause, s.end, s.instruction) == ("cooldown", 6.0, "WAIT[0SEND_F1]")
    assert (s.peer, s.peer_index, s.peer_instruction) == (1, 3, "1RECV_F1")
    assert "was not accepted until rank 1 posted 1RECV_F1 at 6 (instr 3)" in s.detail
    r = stall(prog, tl, 1, 0.0)
    assert (r.cause, r.end, r.peer, r.peer_index, r.peer_instruction) == \
        ("warmup", 2.0, 0, 2, "0SEND_F0")
    assert "rank 0 posted 0SEND_F0 only at 2 (instr 2), 1 after the data was ready" in r.detail


def test_link_queue_names_the_message_ahead() -> None:
    """Two sends on one slow link: the second transfer waits for the first."""
    text = ("rank 0: 0F0 0F1 0SEND_F0 0SEND_F1\n"
            "rank 1: 1RECV_F0 1RECV_F1 WAIT[1RECV_F0] 1F0 WAIT[1RECV_F1] 1F1\n")
    prog = program_from_rows(parse_program_text(text), "loop", stages=2)
    tl = simulate(prog, CostModel(F=1, message_bytes=30),
                  LinkModel(bandwidth=10), CommModel(semantics="eager"))
    s = stall(prog, tl, 1, 6.0)        # F1 starts at 5 behind F0 (2..5), arrives 8
    assert (s.cause, s.end) == ("head-of-line", 8.0)
    assert (s.peer, s.peer_index, s.peer_instruction) == (0, 2, "0SEND_F0")
    assert "queued behind F mb0 0->1 (started 2)" in s.detail


def test_deadlock_stall_names_the_rank_it_waits_for() -> None:
    from schedsim import build_program

    p = build_program("interleaved-1f1b", 4, 8, "commit")
    tl = simulate(p, CostModel(F=1, BW=2), comm=CommModel(semantics="rendezvous"),
                  raise_on_deadlock=False)
    dead = {s.rank: s for s in attribute_stalls(tl, p) if s.cause == "deadlock"}
    assert sorted(dead) == [1, 2, 3]      # rank 0 got stuck at the makespan itself
    for c in tl.deadlock.cycle:
        if c.rank not in dead:
            continue
        peer = [b for b in tl.deadlock.blocked if b.rank == c.peer][0]
        assert (dead[c.rank].peer, dead[c.rank].peer_index,
                dead[c.rank].peer_instruction) == (c.peer, peer.index, peer.instruction)


def test_transfer_names_the_other_side() -> None:
    """Eager, slow link: rank 0's WAIT on its send lasts while the bytes are on the wire
    (3 units); the peer instruction is rank 1's matching recv."""
    prog = program_from_rows(parse_program_text(
        "rank 0: 0F0 0SEND_F0 WAIT[0SEND_F0] 0F1 0SEND_F1 WAIT[0SEND_F1]\n"
        "rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1RECV_F1 WAIT[1RECV_F1] 1F1\n"), "loop", stages=2)
    tl = simulate(prog, CostModel(F=1, message_bytes=30), LinkModel(bandwidth=10),
                  CommModel(semantics="eager"))
    s = stall(prog, tl, 0, 1.0)
    assert (s.cause, s.end, s.instruction) == ("transfer", 4.0, "WAIT[0SEND_F0]")
    assert (s.peer, s.peer_index, s.peer_instruction) == (1, 0, "1RECV_F0")


def test_wait_batch_names_the_member_that_held_it() -> None:
    """Rank 0 commits its send with the recv of a gradient the next op (0F1) does not
    need: held until rank 1 posts 1SEND_B0 (instr 4) after 1F0 and 1BW0, at 4."""
    text = ("rank 0: 0F0 BATCH[0SEND_F0+0RECV_B0] COMMIT 0F1 0BW0 BATCH[0SEND_F1+0RECV_B1] "
            "COMMIT 0BW1\n"
            "rank 1: BATCH[1RECV_F0] COMMIT 1F0 1BW0 BATCH[1SEND_B0+1RECV_F1] COMMIT 1F1 1BW1 "
            "BATCH[1SEND_B1] COMMIT\n")
    prog = program_from_rows(parse_program_text(text), "loop", stages=2)
    tl = simulate(prog, CostModel(F=1, BW=2), comm=CommModel(semantics="rendezvous"))
    s = stall(prog, tl, 0, 1.0)
    assert (s.cause, s.end, s.index, s.comms) == ("wait-batch", 4.0, 2, ["0RECV_B0"])
    assert "which the next op 0F1 does not need" in s.detail
    assert (s.peer, s.peer_index, s.peer_instruction) == (1, 4, "1SEND_B0")

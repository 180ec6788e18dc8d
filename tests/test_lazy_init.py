"""Lazy communicator init (issue 9, item 4) and deadlock reports (item 6).

NCCL creates a 2-rank communicator at the first bare ``isend``/``irecv`` between two
ranks: a blocking rendezvous of both hosts. The issue's 3-rank program completes without
lazy init, deadlocks with it (a cycle of three inits) and completes again once rank 0
posts its two comms the other way round.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, DeadlockError, build_program, simulate
from schedsim.analysis.critical import critical_path
from schedsim.analysis.graph import build_graph
from schedsim.analysis.lint import lint
from schedsim.analysis.stalls import attribute_stalls
from schedsim.cli import app
from schedsim.program.tokens import parse_program_text
from schedsim.report.advice import format_deadlock
from schedsim.scenario import program_from_rows

runner = CliRunner()
RING = """rank 0: 0F0 3RECV_F0 0SEND_F0 WAIT[3RECV_F0+0SEND_F0] 3F0 3SEND_F0 WAIT[3SEND_F0]
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1SEND_F0 WAIT[1SEND_F0] 4RECV_F0 WAIT[4RECV_F0] 4F0 4SEND_F0 WAIT[4SEND_F0]
rank 2: 2RECV_F0 WAIT[2RECV_F0] 2F0 2SEND_F0 WAIT[2SEND_F0] 5RECV_F0 WAIT[5RECV_F0] 5F0
"""
SWAPPED = RING.replace("0F0 3RECV_F0 0SEND_F0", "0F0 0SEND_F0 3RECV_F0")
F1 = CostModel(F=1)


def prog(text: str):
    return program_from_rows(parse_program_text(text), "loop", stages=6)


def rdv(**kw) -> CommModel:
    return CommModel(semantics="rendezvous", **kw)


def test_issue_program_without_lazy_init_completes_in_6() -> None:
    assert simulate(prog(RING), F1, comm=rdv()).makespan == 6
    assert simulate(prog(SWAPPED), F1, comm=rdv()).makespan == 6


def test_issue_program_deadlocks_in_a_cycle_of_three_inits() -> None:
    with pytest.raises(DeadlockError) as e:
        simulate(prog(RING), F1, comm=rdv(lazy_init=True))
    d = e.value.timeline.deadlock
    assert [(c.rank, c.peer) for c in d.cycle] == [(0, 2), (2, 1), (1, 0)]
    assert [c.waits_for for c in d.cycle] == ["the communicator init of ranks 0-2",
                                              "the communicator init of ranks 2-1",
                                              "the communicator init of ranks 1-0"]
    # where each side reaches it: rank 0 at its 3RECV_F0 (instr 1), rank 2 joins at its
    # 2SEND_F0 (instr 3), ...
    assert [(c.index, c.instruction) for c in d.cycle] == [(1, "3RECV_F0"), (0, "2RECV_F0"),
                                                           (0, "1RECV_F0")]
    assert "which rank 2 joins only at instr 3 (2SEND_F0)" in d.message
    assert "which rank 0 joins only at instr 2 (0SEND_F0)" in d.message
    # the cycle once, one line per edge (as the CLI prints it)
    lines = format_deadlock(d).splitlines()
    assert lines[0].endswith("wait-for cycle:") and len(lines) == 5
    assert [x.split()[1] for x in lines[1:4]] == ["0", "2", "1"]
    assert lines[-1] == "Blocked ranks: 0, 1, 2."


def test_swapped_posts_complete_under_lazy_init_in_6() -> None:
    tl = simulate(prog(SWAPPED), F1, comm=rdv(lazy_init=True))
    assert tl.makespan == 6
    inits = [(w.rank, w.index, w.start, w.end, w.comms) for w in tl.waits if w.kind == "INIT"]
    # rank 1 waits at its first bare post (to rank 0) until rank 0 reaches 0SEND_F0 at 1;
    # rank 2 until rank 1 reaches 1SEND_F0 at 2; rank 0's 3RECV_F0 until 2SEND_F0 at 3
    assert inits == [(1, 0, 0.0, 1.0, ["1RECV_F0"]), (2, 0, 0.0, 2.0, ["2RECV_F0"]),
                     (0, 2, 1.0, 3.0, ["3RECV_F0"])]


def test_init_cost_is_paid_once_per_pair() -> None:
    """Each of the three pairs' inits costs 0.5 on the critical chain: 6 + 3 x 0.5."""
    tl = simulate(prog(SWAPPED), F1, comm=rdv(lazy_init=True, init_cost=0.5))
    assert tl.makespan == 7.5
    G = build_graph(tl, prog(SWAPPED), comm=rdv(lazy_init=True, init_cost=0.5))
    path = critical_path(G)
    assert [s.what for s in path if s.kind == "init"] == [
        "communicator init 0-1", "communicator init 1-2", "communicator init 0-2"]


def test_batched_launches_do_not_create_pair_communicators() -> None:
    """A BATCH uses the group communicator: DualPipe's commit programs run unchanged."""
    p = build_program("dualpipe", 4, 8)
    a = simulate(p, F1, comm=rdv())
    b = simulate(p, F1, comm=rdv(lazy_init=True, init_cost=5))
    assert a.makespan == b.makespan and not [w for w in b.waits if w.kind == "INIT"]


def test_a_peer_that_only_batches_never_joins() -> None:
    """Rank 0 isends on its own, rank 1 receives in a batch: NCCL hangs in the init."""
    text = "rank 0: 0F0 0SEND_F0 WAIT[0SEND_F0]\nrank 1: BATCH[1RECV_F0] COMMIT 1F0\n"
    p = program_from_rows(parse_program_text(text), "loop", stages=2)
    assert simulate(p, F1, comm=rdv()).makespan == 2
    with pytest.raises(DeadlockError, match="which rank 1 never joins: it posts nothing "
                                            "to rank 0 on its own, only in batches"):
        simulate(p, F1, comm=rdv(lazy_init=True))


def test_init_waits_are_stalls_naming_the_peer_instruction() -> None:
    tl = simulate(prog(SWAPPED), F1, comm=rdv(lazy_init=True))
    st = [s for s in attribute_stalls(tl, prog(SWAPPED)) if s.cause == "comm-init"]
    assert [(s.rank, s.start, s.end, s.index, s.peer, s.peer_index, s.peer_instruction)
            for s in st] == [(0, 1.0, 3.0, 2, 2, 3, "2SEND_F0")]
    assert "rank 2 reached its own first bare P2P with rank 0, 2SEND_F0 (instr 3)" in \
        st[0].detail


def test_lint_lists_first_touch_orders_and_flags_the_cycle() -> None:
    found = lint(prog(RING), None, lazy_init=True)
    orders = [f.message for f in found if f.rule == "init-order" and f.severity == "info"]
    assert orders == [
        "rank 0 creates its communicators (first bare P2P to each peer) in the order "
        "0-2 (instr 1), 0-1 (instr 2)",
        "rank 1 creates its communicators (first bare P2P to each peer) in the order "
        "1-0 (instr 0), 1-2 (instr 3)",
        "rank 2 creates its communicators (first bare P2P to each peer) in the order "
        "2-1 (instr 0), 2-0 (instr 3)"]
    cyc = [f for f in found if f.rule == "init-order" and f.severity == "warning"]
    assert len(cyc) == 1 and "0-2 (instr 1) before 0-1 (instr 2)" in cyc[0].message
    assert not [f for f in lint(prog(SWAPPED), None) if f.rule == "init-order"]
    assert [f.rule for f in lint(prog(RING), None)] == ["init-order"]   # no listing


def test_cli_lazy_init_flags(tmp_path: Path) -> None:
    ring, swapped = tmp_path / "ring.txt", tmp_path / "swapped.txt"
    ring.write_text(RING)
    swapped.write_text(SWAPPED)
    base = ["--stages", "6", "--semantics", "rendezvous", "--cost", "F=1"]
    r = runner.invoke(app, ["simulate", "--program", str(ring), *base, "-q"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["simulate", "--program", str(ring), *base, "--lazy-init"])
    assert r.exit_code == 3 and "communicator init of ranks 0-2" in r.stderr
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["simulate", "--program", str(swapped), *base, "--lazy-init",
                            "--init-cost", "0.5", "-q", "--json", str(out)])
    assert r.exit_code == 0 and json.loads(out.read_text())["makespan"] == 7.5


def test_ring_deadlock_is_reported_once_one_line_per_edge() -> None:
    """Interleaved 1F1B with DualPipe-style commits deadlocks in a cycle through all 4
    ranks under rendezvous: each edge appears once."""
    p = build_program("interleaved-1f1b", 4, 8, "commit")
    tl = simulate(p, CostModel(F=1, BW=2), comm=rdv(), raise_on_deadlock=False)
    lines = format_deadlock(tl.deadlock).splitlines()
    assert lines[0].endswith("wait-for cycle:")
    edges = lines[1:-1]
    assert len(edges) == 4 and [e.split()[1] for e in edges] == ["0", "3", "2", "1"]
    assert all(e.strip().startswith(f"rank {c.rank} waits at instr {c.index} (COMMIT)")
               for e, c in zip(edges, tl.deadlock.cycle))

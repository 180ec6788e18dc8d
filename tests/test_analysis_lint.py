"""Program lints, and the crossed-sends must-show: a two-rank interleaved program whose
blocking sends cross deadlocks under rendezvous (the cycle is reported), completes under
eager, and the lint names the crossing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIGURE_COSTS, SCHEDULES
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, build_program, load_scenario, simulate
from schedsim.analysis.lint import (
    crossed_orders,
    deadlock_findings,
    group_findings,
    late_sends,
    lint,
    rank_ranges,
    unrelated_recvs,
)
from schedsim.cli import app
from schedsim.program.tokens import parse_program_text
from schedsim.scenario import program_from_rows

FIG = CostModel(**FIGURE_COSTS)
runner = CliRunner()


def test_crossed_sends_rendezvous_deadlocks_eager_completes(tmp_path: Path) -> None:
    sc = load_scenario(SCHEDULES / "crossed-sends.toml")
    prog = sc.build_program()
    assert prog.placement.stages_of(0) == [0, 2] and prog.placement.stages_of(1) == [1, 3]
    tl = simulate(prog, sc.costs, comm=CommModel(semantics="rendezvous"),
                  raise_on_deadlock=False)
    cyc = [(c.rank, c.instruction, c.waits_for, c.peer) for c in tl.deadlock.cycle]
    assert sorted(cyc) == [(0, "WAIT[2SEND_F0]", "3RECV_F0", 1),
                           (1, "WAIT[1SEND_F1]", "2RECV_F1", 0)]
    ok = simulate(prog, sc.costs, comm=CommModel(semantics="eager"))
    assert ok.deadlock is None and len(ok.spans) == 16    # 4 stages x 2 mb x (F, BW)
    r = runner.invoke(app, ["simulate", str(SCHEDULES / "crossed-sends.toml")])
    assert r.exit_code == 3 and "rank 0 waits at instr 8 (WAIT[2SEND_F0])" in r.output
    r = runner.invoke(app, ["simulate", str(SCHEDULES / "crossed-sends.toml"),
                            "--semantics", "eager", "-q"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["stalls", str(SCHEDULES / "crossed-sends.toml"), "--semantics",
                            "eager", "--message-bytes", "1", "--bandwidth", "2",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    st = json.loads(out.read_text())
    assert {(s["rank"], s["instruction"], s["cause"]) for s in st
            if "SEND" in s["instruction"]} == {(0, "WAIT[2SEND_F0]", "transfer"),
                                               (1, "WAIT[1SEND_F1]", "transfer")}
    f = crossed_orders(prog)
    assert [(x.severity, x.rank, x.index) for x in f] == [
        ("stream-risk", 0, 3), ("deadlock", 0, 7), ("stream-risk", 0, 12),
        ("stream-risk", 0, 16), ("stream-risk", 0, 20)]
    assert "deadlocks under rendezvous" in f[1].message and "eager completes" in f[1].message
    # the first stream risk is real: with one comm stream per peer the rendezvous run
    # deadlocks there already, before the crossing of instr 7
    tl = simulate(prog, sc.costs, comm=CommModel(semantics="rendezvous",
                                                 comm_stream="per-peer"),
                  raise_on_deadlock=False)
    assert "rank 0 waits at instr 5 (WAIT[2RECV_F0])" in tl.deadlock.message


def _prog(text: str):
    return program_from_rows(parse_program_text(text), "loop")


def test_crossed_order_error_and_stream_risk() -> None:
    # both activations on link 0->1: rank 0 sends mb 0 then 1, rank 1 receives 1 then 0
    rows = parse_program_text("""
rank 0: 0F0 0F1 0SEND_F0 COMMIT 0SEND_F1 COMMIT
rank 1: 1RECV_F1 COMMIT 1RECV_F0 COMMIT 1F0 1F1
""")
    from schedsim.program.ir import Placement, Program

    prog = Program(placement=Placement(kind="loop", ranks=2, stages=2), microbatches=2,
                   ranks=rows)
    f = crossed_orders(prog)
    assert [(x.severity, x.rank) for x in f] == [("error", 0)]
    # opposite directions, each side in two batches, no wait between: a comm-stream risk
    prog = _prog("""
rank 0: 0F0 0SEND_F0 0RECV_B0 0F1 0SEND_F1 WAIT[0RECV_B0] 0BW0 0RECV_B1 WAIT[0RECV_B1] 0BW1
rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1RECV_F1 1BW0 1SEND_B0 WAIT[1RECV_F1] 1F1 1BW1 1SEND_B1
""")
    f = crossed_orders(prog)
    assert [(x.severity, x.rank, x.index) for x in f] == [("stream-risk", 0, 2)]
    c = CostModel(F=1, BW=2)
    assert simulate(prog, c, comm=CommModel(semantics="rendezvous")).deadlock is None
    tl = simulate(prog, c, comm=CommModel(semantics="rendezvous", comm_stream="per-peer"),
                  raise_on_deadlock=False)
    assert tl.deadlock is not None


def test_late_sends_in_dualpipe() -> None:
    prog = build_program("dualpipe", 8, 20)
    tl = simulate(prog, FIG, comm=CommModel(semantics="rendezvous"))
    f = late_sends(prog, tl)
    hit = next(x for x in f if x.rank == 4 and x.index == 25)
    assert hit.cost == 1 and "4SEND_F3 is posted after 3F14 (instr 24)" in hit.message
    assert "its data was made by 4F3 (instr 23)" in hit.message
    assert len(f) == 16 and sum(x.cost for x in f) == 18
    # statically (no timeline) every send posted after another compute is reported
    assert len(late_sends(prog)) >= len(f)


def test_unrelated_recv_holds_rank5_batch() -> None:
    prog = build_program("dualpipe", 8, 20)
    tl = simulate(prog, FIG, comm=CommModel(semantics="eager"))
    f = unrelated_recvs(prog, tl)
    hit = next(x for x in f if x.rank == 5)
    assert (hit.index, hit.cost) == (28, 1)
    assert "5RECV_F3 is batched before 5W0" in hit.message
    assert "rank 4 posted the send at 12 (instr 25)" in hit.message
    assert lint(prog, simulate(prog, FIG))[0].rule == "late-send"   # data: static rules


def test_lint_cli(tmp_path: Path) -> None:
    out = tmp_path / "l.json"
    # the scenario runs under rendezvous, where it deadlocks: the cycle is a finding of
    # its own (listed first), the static crossing that causes it follows; exit 3
    r = runner.invoke(app, ["lint", str(SCHEDULES / "crossed-sends.toml"), "--json",
                            str(out)])
    assert r.exit_code == 3, r.output
    d = json.loads(out.read_text())
    # then the crossing that deadlocks it, and four pairs of bare posts that cross on a
    # shared comm stream (each is its own launch; the stream run deadlocks on the first)
    assert [(x["rule"], x["severity"]) for x in d] == [("deadlock", "deadlock"),
                                                       ("crossed-order", "deadlock")] + \
        [("crossed-order", "stream-risk")] * 4
    assert "wait-for cycle rank 0 -> rank 1 -> rank 0" in d[0]["message"]
    r = runner.invoke(app, ["lint", str(SCHEDULES / "crossed-sends.toml"), "--semantics",
                            "eager", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert [(x["rule"], x["severity"]) for x in d] == [("crossed-order", "deadlock")] + \
        [("crossed-order", "stream-risk")] * 4
    r = runner.invoke(app, ["lint", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                            "--json", str(out)])
    assert r.exit_code == 0
    rules = {x["rule"] for x in json.loads(out.read_text())}
    assert rules == {"late-send", "unrelated-recv"}


# -- the run's deadlock is a finding -------------------------------------------------------
DEADLOCKING = [  # (flags, semantics, comm stream): interleaved 1F1B 4 x 8 deadlocks
    (["--comm-policy", "commit"], "rendezvous", "none"),  # a 4-rank cycle of commits
    ([], "eager", "per-rank"),                            # a 4-rank cycle of comm streams
]


@pytest.mark.parametrize("flags,sem,stream", DEADLOCKING, ids=["commit", "per-rank"])
def test_lint_reports_the_deadlock_of_its_run(flags, sem, stream, tmp_path: Path) -> None:
    """No pairwise crossing explains these cycles, so before the deadlock rule lint said
    "0 findings" (exit 0) under a title saying the run deadlocks."""
    prog = build_program("interleaved-1f1b", 4, 8,
                         "commit" if "commit" in flags else None)
    tl = simulate(prog, CostModel(F=1, BW=2),
                  comm=CommModel(semantics=sem, comm_stream=stream),
                  raise_on_deadlock=False)
    ring = [c.rank for c in tl.deadlock.cycle]
    assert sorted(ring) == [0, 1, 2, 3]
    f = lint(prog, tl)
    assert [(x.rule, x.severity) for x in f] == [("deadlock", "deadlock")]
    assert f == deadlock_findings(tl)
    assert (f[0].rank, f[0].index) == (tl.deadlock.cycle[0].rank,
                                       tl.deadlock.cycle[0].index)
    assert " -> ".join(f"rank {r}" for r in ring + ring[:1]) in f[0].message
    for c in tl.deadlock.cycle:                   # every step of the cycle is named
        assert f"rank {c.rank} at instr {c.index} ({c.instruction}) waits for " \
               f"{c.waits_for} (rank {c.peer})" in f[0].message
    out = tmp_path / "l.json"
    r = runner.invoke(app, ["lint", "-s", "interleaved-1f1b", "-p", "4", "-m", "8", *flags,
                            "--semantics", sem, "--comm-stream", stream, "--json", str(out)])
    assert r.exit_code == 3, r.output
    assert "1 finding: deadlock 1" in r.stdout
    assert "deadlocks, wait-for cycle" in r.stderr
    assert [x["rule"] for x in json.loads(out.read_text())] == ["deadlock"]
    assert lint(prog, simulate(prog, CostModel(F=1, BW=2),
                               comm=CommModel(semantics="eager"))) == []   # completes


@pytest.fixture
def wide(monkeypatch):
    """The CLI console 400 columns wide (no folding inside table cells)."""
    from schedsim.cli import common

    monkeypatch.setattr(common.console, "_width", 400)


def test_repeated_findings_group_into_one_row(tmp_path: Path, wide) -> None:
    """1F1B's async program crosses a RECV_B and a SEND_F on every 1F1B step of rank r
    (one per step: m - (p - 1 - r) on rank r): all one pattern, one row."""
    p, m = 8, 32
    prog = build_program("1f1b", p, m)
    f = crossed_orders(prog)
    per_rank = {r: sum(1 for x in f if x.rank == r) for r in range(p)}
    assert per_rank == {r: (m - (p - 1 - r) if r < p - 1 else 0) for r in range(p)}
    assert len(f) == (p - 1) * (m - p + 1) + (p - 1) * (p - 2) // 2 == 196
    groups = group_findings(f)
    assert len(groups) == 1
    g = groups[0]
    assert (g.rule, g.severity, g.count, g.ranks) == ("crossed-order", "stream-risk", 196,
                                                      list(range(p - 1)))
    assert g.pattern == "ranks r and r+1: RECV_B before SEND_F vs RECV_F before SEND_B"
    out = tmp_path / "l.json"
    r = runner.invoke(app, ["lint", "-s", "1f1b", "-p", str(p), "-m", str(m), "--json",
                            str(out)])
    assert r.exit_code == 0, r.output
    assert len(json.loads(out.read_text())) == 196          # --json keeps every finding
    rows = [ln for ln in r.stdout.splitlines() if "stream-risk" in ln]
    assert len(rows) == 1 and "196" in rows[0] and "0-6" in rows[0]
    assert "196 findings in 1 group: crossed-order 196 (--all: one row each)" in r.stdout
    assert "also rank 1 instr" in r.stdout                  # examples from other ranks
    r = runner.invoke(app, ["lint", "-s", "1f1b", "-p", str(p), "-m", str(m), "--all"])
    assert r.exit_code == 0, r.output
    assert sum(1 for ln in r.stdout.splitlines() if "stream-risk" in ln) == 196


def test_grouping_keeps_distinct_patterns_apart() -> None:
    prog = build_program("dualpipe", 8, 20)
    tl = simulate(prog, FIG, comm=CommModel(semantics="eager"))
    f = lint(prog, tl)
    groups = group_findings(f)
    assert sum(g.count for g in groups) == len(f)
    assert {(g.rule, g.pattern) for g in groups} == {
        (x.rule, x.pattern) for x in f}
    late = next(g for g in groups if g.rule == "late-send")
    assert late.pattern == "SEND_F posted after other compute"
    assert late.findings[0].cost == max(x.cost for x in late.findings)
    assert late.cost == sum(x.cost for x in f if x.rule == "late-send")


def test_rank_ranges() -> None:
    assert rank_ranges([7, 0, 1, 2, 5, 8, 2]) == "0-2, 5, 7-8"
    assert rank_ranges([3]) == "3" and rank_ranges([]) == ""

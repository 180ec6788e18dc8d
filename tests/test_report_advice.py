"""What schedsim tells a user beside the numbers: cost warnings, deadlock fixes, the -q
line, typo suggestions, install hints, and --help without noise."""
from __future__ import annotations

import re

import pytest
from conftest import SCHEDULES
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, LinkModel, build_program, load_scenario, simulate
from schedsim.cli import app
from schedsim.report.advice import (
    cost_warnings,
    deadlock_fixes,
    format_deadlock,
    given_costs,
    run_kinds,
)

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def kinds(name, **kw):
    return run_kinds(simulate(build_program(name, 4, 8, **kw), CostModel(), LinkModel(),
                              CommModel()))


# -- cost warnings -------------------------------------------------------------------------

def test_the_1f1b_cost_trap_warns_and_q_prints_the_result():
    r = run("simulate", "-s", "1f1b", "-p", 4, "-m", 8, "--cost", "F=1,B=2", "-q")
    assert r.exit_code == 0
    lines = r.output.strip().splitlines()
    # (m + p - 1)(F + B + W) = 11 * 4 = 44: the default W = 1 is silently added
    assert lines[-1] == "makespan 44 slots   bubble ratio 0.273 (idle / (ranks x makespan))"
    warn = [x for x in lines if x.startswith("warning:")]
    assert len(warn) == 1 and "BW = B + W = 2 + 1 (W's default) = 3" in warn[0]
    assert "write BW=2" in warn[0]
    r = run("simulate", "-s", "1f1b", "-p", 4, "-m", 8, "--cost", "F=1,BW=2", "-q")
    assert r.output.strip() == ("makespan 33 slots   bubble ratio 0.273 (idle / (ranks x "
                                "makespan))")


@pytest.mark.parametrize("name,kw,cost,expect", [
    ("1f1b", {}, dict(F=1, B=2), ["runs only full backwards (BW) and BW was not given"]),
    ("1f1b", {}, dict(F=1, W=2), ["(B's default) + 2"]),
    ("1f1b", {}, dict(F=2), ["no backward cost was given: BW = B + W = 1 + 1 = 2"]),
    ("1f1b", {}, dict(F=1, B=1, W=1), []),             # B + W meant as the full backward
    ("1f1b", {}, dict(F=1, BW=2), []),
    ("1f1b", {}, {}, []),                                # nothing given: the defaults
    ("zb-h1", {}, dict(F=1, BW=2), ["runs split backwards (B and W), which were not given"]),
    ("zb-h1", {}, dict(F=1, B=1, W=1), []),
    ("dualpipe", {}, dict(F=1, B=1, W=1, BW=2), ["FB was not given, so each costs its "
                                                 "parts' sum, F + BW = 3"]),
    ("dualpipe", {}, dict(F=1, B=1, W=1, BW=2, FB=3), []),
])
def test_cost_warning_rules(name, kw, cost, expect):
    got = cost_warnings(kinds(name, **kw), CostModel(**cost), name)
    assert len(got) == len(expect)
    for g, e in zip(got, expect):
        assert e in g


def test_no_default_cost_warning_on_a_workload_scenario():
    # --cost F=1 on a [workload] scenario: F costs 1 ms, B/W/BW keep their derived costs
    # (docs/workload.md), so the "defaults BW = 1 + 1" warning would be false
    from schedsim.cli.common import build_scenario

    path = SCHEDULES / "llama3-70b-h100.toml"
    sc = build_scenario(path, cost="F=1")
    tl = simulate(sc.build_program(), sc.costs, sc.link, sc.comm)
    spans = [s for r in range(tl.ranks) for s in tl.spans_of(r)]
    assert given_costs(sc.costs) == {"F"}
    assert all(s.duration == pytest.approx(1.0) for s in spans if s.kind == "F")
    # the derived full backward (ms): B + W of the stage model, not the defaults 1 + 1
    derived = load_scenario(path).costs
    bw = [s for s in spans if s.kind == "BW"]
    assert bw and all(s.duration == pytest.approx(derived.kind_cost("BW", s.stage, s.mb))
                      and s.duration > 30 for s in bw)
    assert cost_warnings(run_kinds(tl), sc.costs, tl.schedule) == []
    r = run("simulate", path, "--cost", "F=1", "-q")
    assert r.exit_code == 0 and "warning" not in r.output, r.output


def test_given_costs_come_from_the_file_the_flag_and_stage_tables(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[schedule]\nname = '1f1b'\nranks = 4\nmicrobatches = 8\n[costs]\nF = 1\n"
                 "[costs.stage.2]\nB = 3\n")
    assert given_costs(load_scenario(f).costs) == {"F", "B"}
    assert given_costs(load_scenario(SCHEDULES / "dualpipe-figure.toml").costs) == {
        "F", "B", "W", "BW", "FB"}
    from schedsim.cli.common import build_scenario

    sc = build_scenario(f, cost="W=2")
    assert given_costs(sc.costs) == {"F", "B", "W"} and sc.costs.W == 2
    assert given_costs(build_scenario(None, schedule="1f1b", ranks=4,
                                      microbatches=8).costs) == set()


# -- deadlocks -----------------------------------------------------------------------------

def test_per_peer_1f1b_deadlock_suggests_the_torch_policy():
    r = run("simulate", "-s", "1f1b", "-p", 4, "-m", 8, "--comm-stream", "per-peer",
            "--semantics", "rendezvous")
    assert r.exit_code == 3
    lines = r.output.strip().splitlines()
    assert lines[0] == ("error: deadlock: the program can never finish (instructions "
                        "count from 0); wait-for cycle:")
    edges = [x for x in lines if x.startswith("  rank ")]
    assert len(edges) == 2                                 # one edge per line
    assert lines[-1].startswith("fix: --comm-policy torch completes (makespan 33 slots)")
    # the fix is real: the suggested flags complete with that makespan
    r = run("simulate", "-s", "1f1b", "-p", 4, "-m", 8, "--comm-stream", "per-peer",
            "--semantics", "rendezvous", "--comm-policy", "torch", "-q")
    assert r.exit_code == 0 and "makespan 33 slots" in r.output


def test_eager_threshold_fix_and_budget():
    """crossed-sends (a hand-written program whose blocking sends cross) deadlocks under
    rendezvous; its compute order re-lowered with torch's policy completes, and so does
    the program itself once its 1000-byte messages go eagerly."""
    from schedsim.cli.common import build_scenario

    sc = build_scenario(SCHEDULES / "crossed-sends.toml", message_bytes=1000,
                        semantics="rendezvous")
    fixes = deadlock_fixes(sc, first_only=False)
    flags = [f.flags for f in fixes]
    assert flags[0] == "--comm-policy torch" and "--eager-threshold 1000" in flags
    eager = next(f for f in fixes if f.flags.startswith("--eager"))
    ok = build_scenario(SCHEDULES / "crossed-sends.toml", message_bytes=1000,
                        semantics="rendezvous", eager_threshold=1000)
    prog = ok.build_program()
    assert simulate(prog, ok.costs, ok.link, ok.comm).makespan == eager.makespan
    # no budget: nothing tried, nothing claimed
    assert deadlock_fixes(sc, budget_instructions=10) == []


def test_format_deadlock_keeps_other_messages():
    assert format_deadlock("something else") == "something else"
    tl = simulate(build_program("1f1b", 4, 8), CostModel(F=1, BW=2), LinkModel(),
                  CommModel(semantics="rendezvous", comm_stream="per-peer"),
                  raise_on_deadlock=False)
    text = format_deadlock(tl.deadlock)
    assert text.count("\n  rank ") == len(tl.deadlock.cycle)
    assert text.endswith("Blocked ranks: 0, 1, 2, 3.")


# -- typos, hints, help ----------------------------------------------------------------------

@pytest.mark.parametrize("args,hint", [
    (["-s", "1fb1"], "did you mean '1f1b'?"),
    (["-s", "dualpip"], "did you mean 'dualpipe'?"),
    (["-s", "1f1b", "--comm-policy", "troch"], "did you mean 'torch'?"),
    (["-s", "1f1b", "--semantics", "rendevous"], "did you mean 'rendezvous'?"),
    (["-s", "1f1b", "--comm-stream", "perpeer"], "did you mean 'per-peer'?"),
])
def test_typos_get_a_suggestion(args, hint):
    r = run("simulate", *args, "-p", 4, "-m", 8)
    assert r.exit_code == 2 and hint in r.output and "Traceback" not in r.output


def test_install_hint_for_checkout_and_wheel(monkeypatch, tmp_path):
    import schedsim.util.install as inst

    root = inst.source_root()
    assert root is not None and (root / "pyproject.toml").exists()
    monkeypatch.chdir(root)
    assert inst.install_hint("replay", "torch") == ("pip install -e '.[replay]' (or pip "
                                                    "install torch)")
    monkeypatch.chdir(tmp_path)
    assert inst.install_hint("report", "bokeh") == (f"pip install -e '{root}[report]' (or "
                                                    "pip install bokeh)")
    monkeypatch.setattr(inst, "source_root", lambda: None)
    assert inst.install_hint("replay", "torch") == ("pip install 'schedsim[replay]' (or pip "
                                                    "install torch)")


@pytest.mark.parametrize("cmd", ["simulate", "render", "report", "stalls", "compare"])
def test_help_has_no_bool_noise(cmd):
    r = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0
    assert "<bool>" not in r.output
    assert "--help" in r.output


def test_progress_is_silent_when_not_a_terminal():
    r = run("simulate", "-s", "1f1b", "-p", 16, "-m", 64, "-q")
    assert r.exit_code == 0
    assert r.output.strip().splitlines() == [re.sub(r"\s+$", "", r.output.strip())]

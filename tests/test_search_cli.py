"""``schedsim search``: output files that simulate, replay and torch run; per-stage costs
from a scenario; bad input (exit 2, one line, no output file); OR-Tools missing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("ortools")

from schedsim.cli import app
from schedsim.interop.schedule_files import load_schedule_file

runner = CliRunner()

SLOW_LAST = """\
[schedule]
ranks = 2
microbatches = 4

[costs]
F = 1
B = 1
W = 1

[costs.stage.1]
F = 1.5
B = 1.5
W = 1.5
"""


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_search_writes_a_schedule_that_simulate_runs(tmp_path: Path):
    sc = tmp_path / "slow.toml"
    sc.write_text(SLOW_LAST)
    out, res = tmp_path / "best.json", tmp_path / "result.json"
    r = run("search", sc, "--time-limit", "20", "--out", out, "--json", res)
    assert r.exit_code == 0, r.output
    assert "proven optimal" in r.stdout and "against the built-in schedules" in r.stdout
    d = json.loads(res.read_text())
    assert d["solver"]["optimal"] and d["mem_limit"] == [2.0, 2.0]
    rows = {b["schedule"]: b for b in d["baselines"]}
    assert d["makespan"] <= min(b["makespan"] for b in rows.values() if b["fits"])
    sched = load_schedule_file(out)
    assert sched.name == "search" and sched.microbatches == 4
    r2 = run("simulate", sc, "--schedule-file", out)
    assert r2.exit_code == 0, r2.output
    assert f"makespan {d['makespan']:g} " in r2.stdout


def test_torch_loads_the_csv(tmp_path: Path):
    pytest.importorskip("torch")
    import torch_ref

    from schedsim.program.tokens import format_op

    out = tmp_path / "best.csv"
    r = run("search", "-p", "2", "-m", "4", "--time-limit", "10", "--out", out, "-q")
    assert r.exit_code == 0, r.output
    sched = load_schedule_file(out)
    rt = torch_ref.runtime_on_mock_stages(2, 4, 1)
    rt._load_csv(str(out), format="compute_only")
    got = [[torch_ref.token(a) for a in rt.pipeline_order[k]] for k in range(2)]
    assert got == [[format_op(op) for op in row] for row in sched.ranks]


def test_result_replays_on_gloo_with_grad_check(tmp_path: Path):
    """The searched order (last stage 1.5x slower, 2 ranks) runs for real on gloo and its
    gradients match the single-process reference."""
    pytest.importorskip("torch")
    sc = tmp_path / "slow.toml"
    sc.write_text(SLOW_LAST)
    out = tmp_path / "best.json"
    r = run("search", sc, "--time-limit", "20", "--out", out, "-q")
    assert r.exit_code == 0, r.output
    p = subprocess.run([sys.executable, "-m", "schedsim", "replay", "--schedule-file",
                        str(out), "--check-grads", "--timeout", "90"],
                       capture_output=True, text=True, timeout=150, check=False)
    assert p.returncode == 0, p.stderr
    assert "passed" in p.stdout.lower()


@pytest.mark.parametrize("args,needle", [
    (("--out", "{tmp}/x.txt"), "--out writes .json"),
    (("--mem-limit", "0.5"), "below what any order needs"),
    (("--mem-limit", "a,1"), "bad --mem-limit"),
    (("--mem-limit", "nope"), "unknown schedule 'nope'"),
    (("--placement", "dual"), "unknown --placement 'dual'"),
    (("--backward", "both"), "unknown --backward 'both'"),
    (("--cost", "W=0"), "costs 0"),
    (("--time-limit", "0"), "--time-limit must be a finite number of seconds > 0"),
    (("--time-limit", "nan"), "--time-limit must be a finite number of seconds > 0"),
    (("--time-limit", "inf"), "--time-limit must be a finite number of seconds > 0"),
    (("--workers", "0"), "--workers must be in 1..256"),
    (("--workers", "1000000"), "--workers must be in 1..256"),
    (("--chunks", "0"), "--chunks must be >= 1"),
    (("--seed", str(2 ** 64)), "--seed must be in 0..2147483647"),
    (("--seed", "-1"), "--seed must be in 0..2147483647"),
    (("--comm-policy", "bogus"), "unknown --comm-policy 'bogus': expected one of async"),
    (("--cost", "F=1e30"), "bad cost value 'F=1e30': give a finite number from 0 to 1e+15"),
    (("--cost", "F=1e15,B=1e15,W=1e15"), "costs too large for the solver: one op costs up "
     "to 1e+15 and all ops in a row 2.4e+16"),
    (("-p", "5000"), "above the limit of 4,096 ranks"),
    (("--max", "instructions=1"), "above the limit of 1 instructions"),
    (("--chunks", "3", "--placement", "v"), "v placement has 2 chunks"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args, needle):
    args = [a.format(tmp=tmp_path) for a in args]
    out = tmp_path / "x.json"
    extra = [] if "--out" in args else ["--out", out]
    r = run("search", "-p", "2", "-m", "4", "--time-limit", "5", *args, *extra)
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_needs_ranks_and_microbatches():
    r = run("search", "-p", "2")
    assert r.exit_code == 2 and "needs --ranks and --microbatches" in r.output


def test_missing_ortools_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)
    r = run("search", "-p", "2", "-m", "4", "--time-limit", "5")
    assert r.exit_code == 2
    from schedsim.util.install import install_hint

    # a source checkout gets pip install -e '<checkout>[search]'; an installed wheel the
    # package name: the one rule of schedsim.util.install
    assert install_hint("search", "ortools") in r.output.replace("\n", "")
    assert "[search]" in r.output
    assert len(r.output.strip().splitlines()) == 1


#: each bounded search flag at the edges of what it takes: (flag, value, accepted)
FLAG_BOUNDS = [
    ("--workers", "1", True), ("--workers", "256", True), ("--workers", "257", False),
    ("--seed", "0", True), ("--seed", str(2 ** 31 - 1), True), ("--seed", str(2 ** 31), False),
    ("--chunks", "1", True), ("--chunks", "0", False),
    ("--time-limit", "1e-9", True), ("--time-limit", "-0.0", False),
    ("--cost", "F=1e12", True), ("--cost", "F=1e16", False),
]


@pytest.mark.parametrize("flag,value,accepted", FLAG_BOUNDS,
                         ids=[f"{f}={v}" for f, v, _ in FLAG_BOUNDS])
def test_every_search_flag_at_its_bounds(flag, value, accepted):
    """Inside the bound: the search runs (exit 0); one past it: one line, exit 2, before
    any work."""
    r = run("search", "-p", "2", "-m", "2", "--time-limit", "1", "-q",
            *([] if flag == "--time-limit" else []), flag, value)
    if accepted:
        assert r.exit_code == 0, r.output
        assert "best: makespan" in r.output
    else:
        assert r.exit_code == 2, r.output
        assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("error: ")


def test_a_million_ranks_is_refused_before_any_work():
    """``search -p 1000000 -m 8`` built until 6 GB before failing: now the limit refuses it
    before anything is built. A fresh wrapper process runs the CLI and reports that one
    child's peak resident memory (``RUSAGE_CHILDREN`` of a process that waited for it
    alone)."""
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run([sys.executable, '-m', 'schedsim', 'search', '-p', "
             "'1000000', '-m', '8'], capture_output=True, text=True)\n"
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "print(p.stdout + p.stderr)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    rc, kb = map(int, out.split("\n", 1)[0].split())
    assert rc == 2 and "above the limit of 4,096 ranks" in out
    assert kb / 1024 < 200, kb

"""The cost model against measured runs: the host cost (``[comm] host_cost``) in the
engine (closed form), and ``check-trace`` on the real torch traces shipped in
docs/examples/traces: the cost-model error with the costs fitted from the same trace
(contended: the run's own op times, receiver waits, launches and host time). Costs from
a separate run are measured by ``benchmarks/trace_errors.py`` (timing: not a unit test)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedsim import build_program
from schedsim.cli import app
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "docs" / "examples" / "traces"


def test_host_cost_closed_form():
    """1F1B, 2 ranks, 1 microbatch, F = 1, BW = 2, latency 0.5, launch 0.1, host cost
    0.25 before every instruction, rendezvous. Rank 0: RECV_B0 posted at 0.35, F0
    [0.6, 1.6], SEND_F0 posted 1.95; rank 1: RECV_F0 posted 0.35, the message moves
    1.95 -> 2.45, F0 [2.7, 3.7], BW0 [3.95, 5.95], SEND_B0 posted 6.3, arrives 6.8;
    rank 0's BW0 [7.05, 9.05]."""
    prog = build_program("1f1b", 2, 1)
    tl = simulate(prog, CostModel(F=1, B=1, W=1, BW=2), LinkModel(latency=0.5),
                  CommModel(semantics="rendezvous", launch_cost=0.1, host_cost=0.25))
    got = sorted((s.rank, s.kind, round(s.start, 9), round(s.end, 9)) for s in tl.spans)
    assert got == [(0, "BW", 7.05, 9.05), (0, "F", 0.6, 1.6), (1, "BW", 3.95, 5.95),
                   (1, "F", 2.7, 3.7)]
    one = simulate(build_program("gpipe", 1, 2), CostModel(F=1, B=1, W=1, BW=2),
                   LinkModel(), CommModel(semantics="rendezvous", host_cost=0.25))
    assert one.makespan == 6 + 4 * 0.25          # 4 instructions, each 0.25 before it


def test_bubble_breakdown_closed_form():
    """1F1B, 2 ranks, 1 microbatch, F = 1, BW = 2, latency 0.5, rendezvous. Rank 0: F0
    [0, 1], waits B0 [1, 5] of which the B message moves [4.5, 5]: transfer 0.5, waiting
    3.5, BW0 [5, 7], host 0. Rank 1: waits F0 [0, 1.5] (moving [1, 1.5]: 0.5 transfer,
    1 waiting), F0 and BW0 [1.5, 4.5], its END waits its send [4.5, 5] (moving: 0.5),
    then nothing until 7: host 2. Bubble 4 on both, predicted (itself) 4."""
    from schedsim.analysis.bubble import bubble_breakdown

    tl = simulate(build_program("1f1b", 2, 1), CostModel(F=1, B=1, W=1, BW=2),
                  LinkModel(latency=0.5), CommModel(semantics="rendezvous"))
    rows = bubble_breakdown(tl, tl)
    assert [(x["compute"], x["transfer"], x["waiting"], x["host"], x["bubble"],
             x["predicted_bubble"]) for x in rows] == [(3, 0.5, 3.5, 0, 4, 4),
                                                        (3, 1.0, 1.0, 2.0, 4, 4)]


def check(files, tmp_path, *extra):
    out = tmp_path / "e.json"
    r = runner.invoke(app, ["check-trace", *map(str, files), "--json", str(out), *extra])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


@pytest.mark.parametrize("name, median_step, measured, expect, lo, hi", [
    ("gpipe", 9, 10.2925, -0.039, -0.118, -0.011),
    ("interleaved-1f1b", 3, 28.4905, -0.013, -0.038, +0.075)])
def test_shipped_traces_within_10_percent_from_the_same_trace(name, median_step, measured,
                                                              expect, lo, hi, tmp_path):
    """Costs fitted from the trace itself, step by step (each of the 9 profiled steps,
    0.5 s apart, predicted from its own fit): the median step's makespan within 10%
    (measured: GPipe -3.9%, Interleaved1F1B -1.3%; the files are fixed, so these figures
    are exact; traces recorded at real-time priority, docs/traces.md), the headline of
    check-trace; the range over the steps is reported beside it. The cost file calibrate
    --from-timeline writes (of import-trace's median step) gives the same prediction."""
    files = sorted((TRACES / name).glob("rank*.json.gz"))
    e = check(files, tmp_path)
    assert e["semantics_error"]["makespan"] == pytest.approx(0.0, abs=1e-9)
    mk = e["cost_model_error"]["makespan"]
    assert abs(mk) <= 0.10 and mk == pytest.approx(expect, abs=0.001)
    steps = e["profiler_steps"]
    assert steps["steps"] == list(range(1, 10)) and steps["median_step"] == median_step
    assert e["makespan_measured"] == pytest.approx(measured)
    assert sorted(steps["makespans"])[4] == pytest.approx(measured)     # the median
    per = e["cost_model_error_steps"]
    assert per["per_step"][median_step - 1] == mk
    assert (per["min"], per["max"]) == (pytest.approx(lo, abs=0.001),
                                        pytest.approx(hi, abs=0.001))
    assert e["semantics_error_steps"]["max"] == pytest.approx(0.0, abs=1e-9)
    one = check(files, tmp_path, "--step", str(median_step))      # the same step alone
    assert one["cost_model_error"] == e["cost_model_error"] and "profiler_steps" not in one
    for x in e["bubble"]:           # the parts add up to the wall time, per rank
        parts = x["compute"] + x["transfer"] + x["waiting"] + x["host"]
        assert parts == pytest.approx(x["wall"]) and min(x["transfer"], x["waiting"]) >= 0
        assert x["predicted_bubble"] > 0
    tj, cf = tmp_path / "t.json", tmp_path / "c.toml"
    assert runner.invoke(app, ["import-trace", *map(str, files), "--json", str(tj)]
                         ).exit_code == 0
    r = runner.invoke(app, ["calibrate", "--from-timeline", str(tj), "--out", str(cf)])
    assert r.exit_code == 0, r.output
    assert "host_cost = " in cf.read_text()
    again = check(files, tmp_path, "--costs-file", str(cf))["cost_model_error"]["makespan"]
    assert again == pytest.approx(mk, abs=0.002)       # the file rounds to 6 digits


def test_contended_calibration_and_errors_over_steps(tmp_path):
    """replay --compare on CPU gloo calibrates contended by default: steps of the program
    itself, fitted like a measured timeline (host cost and receiver waits in the cost
    file, the spread over the calibration steps printed and written as comments); the
    cost-model error is reported over every measured step (--steps 3): median, min and
    max of the per-step errors, each (predicted - step) / step."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    sc = tmp_path / "s.toml"
    sc.write_text('[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n'
                  '[replay]\nhidden = 16\nseq = 4\ntimeout = 90\n')
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "schedsim", "replay", str(sc), "--compare",
                        "--steps", "3", "--warmup", "1", "--out-dir", str(out)],
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "calibration: 5 contended steps of the program; measured makespan" in text
    assert "calibration spread over the steps (ms, mean over stages): BW" in text
    assert "3 measured steps, makespans" in text
    costs = (out / "1f1b-costs.toml").read_text()
    assert costs.startswith("# schedsim calibrate --contended: 1f1b\n# calibration: 5 ")
    assert "\nhost_cost = " in costs and "receiver waits" in costs
    e = json.loads((out / "1f1b-errors.json").read_text())
    pred = json.loads((out / "1f1b-predicted.json").read_text())["makespan"]
    steps = json.loads((out / "1f1b-measured.json").read_text())["step_makespans"]
    per = [(pred - m) / m for m in steps]
    got = e["cost_model_error_steps"]
    assert got["per_step"] == pytest.approx(per)
    assert (got["min"], got["max"]) == (pytest.approx(min(per)), pytest.approx(max(per)))
    assert got["median"] == pytest.approx(sorted(per)[1])
    assert "cost-model error over the 3 measured steps (makespan): median" in text
    assert "link latency fitted to the steps' median makespan" in text


def test_contention_warning(monkeypatch):
    """More ranks than CPUs, or a load average above the CPUs the run leaves free (unless
    at a real-time priority): one warning saying why; neither: none."""
    import os

    from schedsim.replay.launch import contention

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert contention(2) == ""
    assert contention(4).startswith("4 ranks on 2 CPUs: ranks share cores")
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_OTHER)
    assert contention(2).startswith("load average 7.5 on 2 CPUs before starting 2 ranks")
    assert contention(2).endswith("(nice does not prevent it; as root, 'chrt -f 1 "
                                  "schedsim ...' does)")
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_FIFO)
    assert contention(2) == ""          # real-time ranks: the load cannot take the cores
    assert contention(4).startswith("4 ranks on 2 CPUs")


def test_contended_and_isolated_conflict(tmp_path):
    pytest.importorskip("torch")
    r = runner.invoke(app, ["calibrate", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "2", "--contended", "--isolated"])
    assert r.exit_code == 2 and "give one" in r.output
    r = runner.invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "2", "--contended"])
    assert r.exit_code == 2 and "go with --compare" in " ".join(r.output.split())

"""Traces and calibrations of several steps spread over time (docs/traces.md, "From a
separate run"): the median step's rule, import-trace and check-trace of the shipped
multi-step traces, the recorder's pause between steps and ``calibrate --spread``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.interop.kineto import import_steps, import_traces
from schedsim.interop.kineto_steps import median_index, median_step
from schedsim.replay.contended import SPREAD_REPEATS, SPREAD_S, pause_for

runner = CliRunner()
TRACES = Path(__file__).resolve().parents[1] / "docs" / "examples" / "traces"


def test_median_index():
    """The lower median of an even count, the first index on ties (as replay keeps)."""
    assert median_index([3.0, 1.0, 2.0]) == 2
    assert median_index([4.0, 1.0, 3.0, 2.0]) == 3          # 1 2 | 3 4: the lower, 2
    assert median_index([5.0, 5.0, 1.0]) == 0
    assert median_index([7.0]) == 0
    with pytest.raises(ValueError):
        median_index([])


def test_shipped_trace_imports_its_median_step():
    """The shipped GPipe trace holds 9 profiler steps: without --step the import is the
    median one (step 9, 10.29 ms), with every step's makespan and a note saying so; the
    same as --step 9."""
    files = sorted((TRACES / "gpipe").glob("rank*.json.gz"))
    steps = import_steps(files)
    assert list(steps) == list(range(1, 10)) and median_step(steps) == 9
    tl = import_traces(files)
    assert tl.makespan == pytest.approx(10.2925) == import_traces(files, step=9).makespan
    assert tl.step == 9
    assert tl.step_makespans == [steps[k].makespan for k in range(1, 10)]
    assert tl.import_notes[-1] == ("9 profiler steps (makespans 7.612 .. 12.84 ms): "
                                   "imported step 9, the median makespan; --step N for "
                                   "another")
    r = runner.invoke(app, ["import-trace", *map(str, files)])
    assert r.exit_code == 0 and "imported step 9, the median makespan" in r.output


def test_import_trace_takes_the_table_options():
    """``import-trace`` has -q and --format as every table command (it had neither): -q
    prints the lines without the per-rank table, --format csv its rows on stdout."""
    files = sorted((TRACES / "gpipe").glob("rank*.json.gz"))
    q = runner.invoke(app, ["import-trace", *map(str, files), "-q"])
    assert q.exit_code == 0 and "┃" not in q.stdout and "messages," in q.stdout
    r = runner.invoke(app, ["import-trace", *map(str, files), "--format", "csv"])
    tl = import_traces(files)
    assert r.exit_code == 0 and r.stdout.splitlines() == [
        "rank,busy,idle,bubble_ratio,first_start,last_end",    # exact values (repr)
        *(",".join(str(int(x)) if float(x).is_integer() else repr(float(x)) for x in (
            p.rank, p.busy, p.idle, p.bubble_ratio, p.first_start, p.last_end))
          for p in tl.per_rank)]


def test_check_trace_reports_every_step(tmp_path):
    """check-trace of a multi-step trace: the median step heads (its errors are the
    top-level ones), then the errors over every step, median and range, and each step's
    makespan and error."""
    files = sorted((TRACES / "interleaved-1f1b").glob("rank*.json.gz"))
    out = tmp_path / "e.json"
    r = runner.invoke(app, ["check-trace", *map(str, files), "--json", str(out)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert ("9 profiler steps: the errors below are of step 3, the median makespan, then "
            "over every step") in text
    assert ("over the 9 profiler steps (makespans 26.82 .. 34.08 ms, median step 3): "
            "cost-model error (makespan) median -1.3% [-3.8, +7.5]; semantics error median "
            "+0.0% [+0.0, +0.0]") in text
    assert "per step (N: measured makespan, cost-model error): 1: 27.92 -1.7%, 2:" in text
    e = json.loads(out.read_text())
    assert e["makespan_measured"] == pytest.approx(28.4905)
    assert e["cost_model_error_steps"]["median"] == e["cost_model_error"]["makespan"]


def test_spread_pause():
    """calibrate --contended's default: 21 steps over 5 s, 0.25 s before each step after
    the first; no pause for one step or no spread."""
    assert (SPREAD_S, SPREAD_REPEATS) == (5.0, 21)
    assert pause_for(5.0, 21) == 0.25
    assert pause_for(5.0, 1) == 0.0 and pause_for(0.0, 8) == 0.0


def test_spread_goes_with_contended(tmp_path):
    pytest.importorskip("torch")
    r = runner.invoke(app, ["calibrate", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "2", "--no-contended", "--spread", "1"])
    assert r.exit_code == 2 and "--spread spreads the contended calibration" in r.output
    tj = tmp_path / "t.json"
    import_traces(sorted((TRACES / "gpipe").glob("rank*.json.gz"))).write_json(tj)
    r = runner.invoke(app, ["calibrate", "--from-timeline", str(tj), "--spread", "1"])
    assert r.exit_code == 2 and "--spread cannot apply to --from-timeline" in r.output


def test_calibrate_spread_runs_steps_apart(tmp_path):
    """A real contended calibration (2 gloo ranks) of 3 steps spread over 0.6 s: the
    steps begin at least 0.3 s apart, and the calibration says over how long."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = tmp_path / "c.toml"
    p = subprocess.run([sys.executable, "-m", "schedsim", "calibrate", "--schedule", "1f1b",
                        "--ranks", "2", "--microbatches", "2", "--set", "hidden=16", "--set",
                        "seq=4", "--repeats", "3", "--spread", "0.6", "--timeout", "90",
                        "--out", str(out)], capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr
    assert "calibration: 3 contended steps of the program over " in " ".join(
        p.stdout.split())
    head = out.read_text().splitlines()[1]
    assert head.startswith("# calibration: 3 contended steps of the program over ")
    span = float(head.split(" over ")[1].split(" s;")[0])
    assert 0.6 <= span < 10


def test_recorder_pause(tmp_path):
    """tests/torch_traces.py with a pause: 3 profiled steps of GPipe, each beginning at
    least the pause after the previous one ended; check-trace reports all 3."""
    pytest.importorskip("torch")
    from torch_traces import record

    files = record(tmp_path, [("ScheduleGPipe", 4, 1, 3)], pause=0.3)["ScheduleGPipe"]
    ev = json.loads(files[0].read_text())["traceEvents"]
    st = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert len(st) == 3
    assert all(b[0] - a[0] >= 0.3e6 for a, b in zip(st, st[1:]))     # us
    r = runner.invoke(app, ["check-trace", *map(str, files)])
    assert r.exit_code == 0, r.output
    assert "over the 3 profiler steps" in " ".join(r.output.split())

"""Both errors of ``schedsim replay --compare`` on 2 gloo ranks, N runs per schedule.

For 1f1b, gpipe, interleaved-1f1b (2 chunks) and dualpipev, each with the workload of
``schedules/replay-1f1b.toml`` (8 microbatches; DualPipeV: its own scenario), runs
``schedsim replay --compare`` N times one after another and prints, per schedule, the
median (and range) of the semantics error and of the cost-model error (makespan signed,
mean and max op start error; % of the measured makespan), the cost-model makespan error
against every measured step of every run (``cost_model_error_steps``), with the
machine's load average before and after (the figures depend on what else runs: say so
when you quote them).

    python benchmarks/replay_errors.py [--runs 5] [--out DIR] [--isolated]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "1f1b": [str(ROOT / "schedules/replay-1f1b.toml")],
    "gpipe": [str(ROOT / "schedules/replay-1f1b.toml"), "--schedule", "gpipe"],
    "interleaved-1f1b": [str(ROOT / "schedules/replay-1f1b.toml"), "--schedule",
                         "interleaved-1f1b", "--chunks", "2"],
    "dualpipev": [str(ROOT / "schedules/replay-dualpipev.toml")],
}


def run_case(name: str, args: list[str], runs: int, out: Path, isolated: bool
             ) -> list[dict]:
    got = []
    for k in range(runs):
        d = out / f"{name}-{k}"
        cmd = [sys.executable, "-m", "schedsim", "replay", *args, "--compare", "--out-dir",
               str(d)] + (["--isolated"] if isolated else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(f"{name} run {k}: failed: {p.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        f = next(d.glob("*-errors.json"))
        got.append(json.loads(f.read_text()))
    return got


def pct(xs: list[float]) -> str:
    xs = [100 * x for x in xs]
    return f"{statistics.median(xs):+6.1f}% [{min(xs):+.1f}, {max(xs):+.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--isolated", action="store_true",
                    help="benchmark calibration, the ranks one at a time (default: "
                         "contended, steps of the program)")
    ap.add_argument("--only", nargs="*", default=list(CASES))
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="replay-errors-"))
    load0, t0 = os.getloadavg(), time.time()
    rows = {}
    for name in a.only:
        rows[name] = run_case(name, CASES[name], a.runs, out, a.isolated)
    load1 = os.getloadavg()
    print(f"{a.runs} runs per schedule, 2 gloo ranks, calibration "
          f"{'benchmarks, one rank at a time' if a.isolated else 'contended'}; "
          f"{time.time() - t0:.0f} s; load average {load0[0]:.1f} before, {load1[0]:.1f} "
          f"after on {os.cpu_count()} CPUs; outputs in {out}")
    print(f"{'schedule':18s} {'error':12s} {'makespan (median [range])':30s} "
          f"{'mean start':30s} {'max start':30s}")
    for name, errs in rows.items():
        for key, label in (("semantics_error", "semantics"), ("cost_model_error", "cost model")):
            if not errs:
                print(f"{name:18s} {label:12s} (no run succeeded)")
                continue
            v = [e[key] for e in errs]
            print(f"{name:18s} {label:12s} {pct([x['makespan'] for x in v]):30s} "
                  f"{pct([x['mean_start'] for x in v]):30s} "
                  f"{pct([x['max_start'] for x in v]):30s}")
        steps = [x for e in errs for x in e.get("cost_model_error_steps", {}).get(
            "per_step", [])]
        if steps:
            print(f"{name:18s} {'cost model, every measured step of every run':46s} "
                  f"{pct(steps)} ({len(steps)} steps)")


if __name__ == "__main__":
    main()

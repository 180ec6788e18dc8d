"""check-trace's cost-model error with costs from the same run and from a separate run.

Records K consecutive profiled steps of torch's pipelining schedules (2 gloo processes,
the workload of ``tests/torch_traces.py``) in one trace, fits costs to each step
(``calibrate --from-timeline``) and prints the makespan error of every step predicted
with every step's costs (``check-trace --step i --costs-file costs_j``: the diagonal is
the same run, the rest separate runs), with the machine's load average. The last
profiled step carries the profiler's teardown: read it with care.

    python benchmarks/trace_errors.py [--steps 3] [--schedules ScheduleInterleaved1F1B ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
SHAPES = {"ScheduleInterleaved1F1B": (8, 2), "ScheduleGPipe": (4, 1),
          "ScheduleInterleavedZeroBubble": (8, 2), "ScheduleLoopedBFS": (8, 2)}


def cli(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "schedsim", *args], capture_output=True,
                       text=True, timeout=300)
    if p.returncode:
        raise RuntimeError(p.stderr[-500:])
    return p.stdout


def main() -> None:
    from torch_traces import record

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--schedules", nargs="*", default=["ScheduleInterleaved1F1B",
                                                       "ScheduleGPipe"])
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="trace-errors-"))
    load0 = os.getloadavg()[0]
    files = record(out, [(s, *SHAPES[s], a.steps) for s in a.schedules], timeout=600)
    print(f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after recording, "
          f"{os.cpu_count()} CPUs; files in {out}")
    for s, fs in files.items():
        fs = [str(f) for f in fs]
        mk, costs = [], []
        for k in range(a.steps):
            tj, cf = out / f"{s}-{k}.json", out / f"{s}-{k}.toml"
            cli("import-trace", *fs, "--step", str(k), "--json", str(tj))
            cli("calibrate", "--from-timeline", str(tj), "--out", str(cf))
            mk.append(json.loads(tj.read_text())["makespan"])
            costs.append(cf)
        print(f"{s}: measured makespans " + ", ".join(f"{x:.4g}" for x in mk) + " ms")
        for i in range(a.steps):
            row = []
            for j, cf in enumerate(costs):
                ej = out / f"e{i}{j}.json"
                cli("check-trace", *fs, "--step", str(i), "--costs-file", str(cf),
                    "--json", str(ej))
                e = json.loads(ej.read_text())["cost_model_error"]["makespan"]
                row.append(f"{'[' if i == j else ' '}{100 * e:+6.1f}%{']' if i == j else ' '}")
            print(f"  step {i} predicted with the costs of steps 0..{a.steps - 1}: "
                  + " ".join(row))


if __name__ == "__main__":
    main()

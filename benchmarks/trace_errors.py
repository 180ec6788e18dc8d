"""check-trace's cost-model error with costs from the same run and from a separate run.

Records two separate runs (A, then B: each its own processes) of K consecutive profiled
steps of torch's pipelining schedules (2 gloo processes, the workload of
``tests/torch_traces.py``), imports every step but the last (it carries the profiler's
teardown) and predicts each of B's steps (what ``check-trace --step i --costs-file F``
does, :func:`schedsim.replay.check.two_errors`) with costs fitted:

- from the same step (``calibrate --from-timeline`` of B's step i itself);
- from one step of run A (each of A's steps in turn: a separate calibration run);
- from all of A's steps merged as the contended calibration merges its steps
  (:func:`schedsim.replay.contended.fit_steps`: op means, link latency fitted to the
  steps' median makespan).

Prints the median [range] of each, the steps' makespans and the load average (the
figures depend on what else runs: quote them with it).

    python benchmarks/trace_errors.py [--steps 5] [--schedules ScheduleGPipe ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
SHAPES = {"ScheduleInterleaved1F1B": (8, 2), "ScheduleGPipe": (4, 1),
          "ScheduleInterleavedZeroBubble": (8, 2), "ScheduleLoopedBFS": (8, 2)}


def pct(xs: list[float]) -> str:
    return f"{statistics.median(xs):+6.1f}% [{min(xs):+.1f}, {max(xs):+.1f}] ({len(xs)})"


def main() -> None:
    from torch_traces import record

    from schedsim.interop.kineto import import_traces
    from schedsim.replay.check import two_errors
    from schedsim.replay.contended import fit_steps
    from schedsim.replay.fit import fit_timeline, timeline_program

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--schedules", nargs="*", default=["ScheduleInterleaved1F1B",
                                                       "ScheduleGPipe"])
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="trace-errors-"))
    load0 = os.getloadavg()[0]
    runs = {t: record(out / t, [(s, *SHAPES[s], a.steps) for s in a.schedules],
                      timeout=900) for t in "AB"}
    print(f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after recording, "
          f"{os.cpu_count()} CPUs; two runs of {a.steps} profiled steps (the last "
          f"dropped); files in {out}")
    for s in a.schedules:
        tls = {t: [import_traces([str(f) for f in runs[t][s]], step=k)
                   for k in range(a.steps - 1)] for t in "AB"}
        prog = timeline_program(tls["A"][0])

        def err(fit, meas):
            model = None if fit is None else (fit.cost_model(), fit.link_model(),
                                              fit.comm_model("rendezvous"))
            return 100 * two_errors(meas, prog, model=model).to_dict()[
                "cost_model_error"]["makespan"]

        merged = fit_steps([json.loads(t.to_json()) for t in tls["A"]], prog).fit
        rows = {"same step": [err(None, t) for t in tls["B"]],
                "one step of run A": [err(fit_timeline(x, prog), t) for x in tls["A"]
                                      for t in tls["B"]],
                "run A's steps merged": [err(merged, t) for t in tls["B"]]}
        print(f"{s}: step makespans, run A " + ", ".join(
            f"{t.makespan:.4g}" for t in tls["A"]) + " ms; run B " + ", ".join(
            f"{t.makespan:.4g}" for t in tls["B"]) + " ms")
        for k, v in rows.items():
            print(f"  B's steps predicted from {k:22s} {pct(v)}")


if __name__ == "__main__":
    main()

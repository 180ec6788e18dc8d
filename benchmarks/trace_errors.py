"""check-trace's cost-model error with costs from the same run and from a separate run.

Records two separate runs (A, then B: each its own processes) of K profiled steps of
torch's pipelining schedules (2 gloo processes, the workload of ``tests/torch_traces.py``:
its warm-up steps first, the profiler's own warm-up step dropped), the steps ``--pause``
seconds apart (default 0.25: they sample the machine's speed over time; 0: one after
another), imports every step but the last (it carries the profiler's teardown) and
predicts each of B's steps (what ``check-trace --step i --costs-file F`` does,
:func:`schedsim.replay.check.two_errors`) with costs fitted:

- from the same step (``calibrate --from-timeline`` of B's step i itself);
- from one step of run A (each of A's steps in turn: a separate calibration run);
- from all of A's steps merged as the contended calibration merges its steps
  (:func:`schedsim.replay.contended.fit_steps`: each cost the median over the steps of
  the step's mean, link latency fitted to the steps' median makespan); also against B's
  median step;

and the shipped trace of the schedule (``docs/examples/traces``, several steps: its median
step, and the median over its steps of each step's error) with A's and B's merged costs:
``check-trace`` of the shipped trace from a separate calibration run.

Prints the median [range] of each, the steps' makespans and the load average (the
figures depend on what else runs: quote them with it). ``--realtime`` (root) records at
``SCHED_FIFO`` priority, so that other processes cannot take the ranks' cores
(docs/traces.md: why a separate run needs it on a shared machine).

    python benchmarks/trace_errors.py [--steps 21] [--pause 0.25] [--schedules ScheduleGPipe ...]
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]      # this tree first
SHAPES = {"ScheduleInterleaved1F1B": (8, 2), "ScheduleGPipe": (4, 1),
          "ScheduleInterleavedZeroBubble": (8, 2), "ScheduleLoopedBFS": (8, 2)}
SHIPPED = {"ScheduleInterleaved1F1B": "interleaved-1f1b", "ScheduleGPipe": "gpipe"}


def pct(xs: list[float]) -> str:
    return f"{statistics.median(xs):+6.1f}% [{min(xs):+.1f}, {max(xs):+.1f}] ({len(xs)})"


def error(fit, meas, prog) -> float:
    """The cost-model makespan error (%) of ``meas`` with ``fit``'s costs (None: its own)."""
    from schedsim.replay.check import two_errors

    model = None if fit is None else (fit.cost_model(), fit.link_model(),
                                      fit.comm_model("rendezvous"))
    return 100 * two_errors(meas, prog, model=model).to_dict()[
        "cost_model_error"]["makespan"]


def schedule_rows(s: str, files: dict[str, list[Path]], steps: int) -> list[str]:
    """The report lines of one schedule: runs A and B's steps 1 .. steps - 1."""
    from schedsim.interop.kineto import import_steps
    from schedsim.interop.kineto_steps import median_step
    from schedsim.replay.check import steps_errors
    from schedsim.replay.contended import fit_steps
    from schedsim.replay.fit import fit_timeline, timeline_program
    from schedsim.sim.simulate import simulate

    every = {t: import_steps([str(f) for f in files[t]]) for t in "AB"}
    tls = {t: [every[t][k] for k in range(1, steps)] for t in "AB"}
    prog = timeline_program(tls["A"][0])
    merged = {t: fit_steps([json.loads(x.to_json()) for x in tls[t]], prog).fit
              for t in "AB"}
    m = merged["A"]
    pred = simulate(prog, m.cost_model(), m.link_model(), m.comm_model("rendezvous"))
    med = statistics.median(x.makespan for x in tls["B"])
    rows = {"same step": [error(None, t, prog) for t in tls["B"]],
            "one step of run A": [error(fit_timeline(x, prog), t, prog) for x in tls["A"]
                                  for t in tls["B"]],
            "run A's steps merged": [error(m, t, prog) for t in tls["B"]]}
    meds = {t: statistics.median(x.makespan for x in tls[t]) for t in "AB"}
    out = [f"{s}: step makespans, run A " + ", ".join(f"{t.makespan:.4g}" for t in tls["A"])
           + " ms; run B " + ", ".join(f"{t.makespan:.4g}" for t in tls["B"]) + " ms",
           f"  run medians: A {meds['A']:.4g} ms, B {meds['B']:.4g} ms (B / A "
           f"{meds['B'] / meds['A']:.3f})"]
    out += [f"  B's steps predicted from {k:22s} {pct(v)}" for k, v in rows.items()]
    out.append(f"  B's median step ({med:.4g} ms) from run A's steps merged: "
               f"{100 * (pred.makespan - med) / med:+.1f}%")
    shipped = sorted((ROOT / "docs" / "examples" / "traces" / SHIPPED.get(s, "-")
                      ).glob("rank*.json.gz"))
    if shipped:
        st = import_steps([str(f) for f in shipped])
        tl = st[median_step(st)]

        def head(fit) -> str:     # check-trace's headline: the median step's error
            model = None if fit is None else (fit.cost_model(), fit.link_model(),
                                              fit.comm_model("rendezvous"))
            e = steps_errors(st, prog, model=model).to_dict()
            return f"{100 * e['cost_model_error']['makespan']:+.1f}%"

        out.append(f"  shipped trace ({len(st)} steps, median step {tl.makespan:.4g} ms) "
                   f"from its own costs {head(None)}, from run A's steps merged "
                   f"{head(merged['A'])}, from run B's {head(merged['B'])}")
    return out


def main() -> None:
    from torch_traces import record

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=21)
    ap.add_argument("--pause", type=float, default=0.25,
                    help="seconds between the profiled steps (tests/torch_traces.py; 0: one "
                         "after another)")
    ap.add_argument("--schedules", nargs="*", default=["ScheduleInterleaved1F1B",
                                                       "ScheduleGPipe"])
    ap.add_argument("--hidden", type=int, default=128,
                    help="the MLP's width (tests/torch_traces.py; the shipped traces: 128)")
    ap.add_argument("--realtime", action="store_true",
                    help="record at real-time priority (SCHED_FIFO 1, needs root): other "
                         "processes cannot take the ranks' cores")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("error: --steps must be at least 2 (the last step is dropped)")
    if a.realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            sys.exit("error: --realtime needs root (SCHED_FIFO): run without it")
    out = Path(tempfile.mkdtemp(prefix="trace-errors-"))
    load0 = os.getloadavg()[0]
    runs = {t: record(out / t, [(s, *SHAPES[s], a.steps) for s in a.schedules],
                      hidden=a.hidden, timeout=900, pause=a.pause) for t in "AB"}
    if a.realtime:      # the fits and simulations need no priority
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    print(f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after recording, "
          f"{os.cpu_count()} CPUs{', real-time priority' if a.realtime else ''}; two runs "
          f"of {a.steps} profiled steps {a.pause:g} s apart (the last dropped); files in "
          f"{out}")
    for s in a.schedules:
        print("\n".join(schedule_rows(s, {t: runs[t][s] for t in "AB"}, a.steps)))


if __name__ == "__main__":
    main()

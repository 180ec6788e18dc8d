"""The analysis commands end to end, as a user runs them, against ``simulate`` of the same
scenario: wall seconds, CPU seconds and peak memory of each command in its own process.

Default: 1F1B, 64 ranks x 1024 microbatches under rendezvous (131,072 ops, 129,024
messages) for ``critical-path``, ``query``, ``simulate --trace``, ``stalls``, ``align``
and ``lint``, and ``compare`` of every schedule at 64 x 256 (issue 12's sizes; its targets
are printed beside: <= 5 s and <= 600 MB for critical-path and query, <= 5 s for the
trace, <= 10 s for compare). Each command runs as ``python -m schedsim ...`` (startup
included) with its output discarded; the child's CPU time and peak RSS come from
``os.wait4``. ``simulate -q`` of the same scenario is the baseline of the ratio column.
The machine is shared: compare CPU seconds when wall time is noisy.

Usage: ``python benchmarks/bench_analysis_cli.py [--ranks 64] [--microbatches 1024]
[--compare-microbatches 256] [--only critical-path,query]``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

TARGETS = {"critical-path": "5 s, 600 MB", "query": "5 s, 600 MB",
           "simulate --trace": "5 s", "compare": "10 s"}


def run(args: list[str]) -> tuple[float, float, float, int]:
    """``(wall s, CPU s, peak MB, exit code)`` of ``python -m schedsim ARGS``."""
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "schedsim", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--compare-microbatches", type=int, default=256)
    ap.add_argument("--only", default="", help="comma-separated case names")
    a = ap.parse_args()
    p, m = a.ranks, a.microbatches
    scen = ["-s", "1f1b", "-p", str(p), "-m", str(m), "--semantics", "rendezvous"]
    trace = os.path.join(tempfile.mkdtemp(), "t.json")
    cases = [
        ("simulate -q", ["simulate", *scen, "-q"]),
        ("critical-path", ["critical-path", *scen]),
        ("query", ["query", *scen, "--effect", f"rank=0 BW mb={m - 1}",
                   "--cause", f"rank={p - 1} F mb=0"]),
        ("simulate --trace", ["simulate", *scen, "-q", "--trace", trace]),
        ("stalls", ["stalls", *scen]),
        ("align", ["align", *scen]),
        ("lint", ["lint", *scen]),
        ("compare", ["compare", "-p", str(p), "-m", str(a.compare_microbatches)]),
        ("compare -j 1", ["compare", "-p", str(p), "-m", str(a.compare_microbatches),
                          "-j", "1"]),
    ]
    only = {x for x in a.only.split(",") if x}
    print(f"1f1b {p} ranks x {m} microbatches, rendezvous; compare at {p} x "
          f"{a.compare_microbatches} (python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs)")
    print(f"{'command':<20}{'wall s':>8}{'CPU s':>8}{'peak MB':>9}{'x sim':>7}{'exit':>6}"
          f"  target")
    base = None
    for name, args in cases:
        if only and name not in only and name != "simulate -q":
            continue
        wall, cpu, peak, rc = run(args)
        base = base or cpu
        print(f"{name:<20}{wall:>8.2f}{cpu:>8.2f}{peak:>9.0f}{cpu / base:>7.2f}{rc:>6}"
              f"  {TARGETS.get(name, '')}")


if __name__ == "__main__":
    main()

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

``--against SRC`` also runs every command on another checkout (e.g. ``/work/main``, the
code before a change), alternating with this one, and prints the CPU ratio.

Usage: ``python benchmarks/bench_analysis_cli.py [--ranks 64] [--microbatches 1024]
[--compare-microbatches 256] [--only critical-path,query] [--against SRC]``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

TARGETS = {"critical-path": "5 s, 600 MB", "query": "5 s, 600 MB",
           "simulate --trace": "5 s", "compare": "10 s", "compare per rank": "10 s"}


#: run ``schedsim`` from the checkout in argv[1] (an editable install's import hook
#: would otherwise always load this one)
_FROM_SRC = (
    "import runpy, sys\n"
    "src = sys.argv.pop(1)\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
    "sys.path.insert(0, src)\n"
    "sys.argv[0] = 'schedsim'\n"
    "runpy.run_module('schedsim', run_name='__main__', alter_sys=True)\n")


def run(args: list[str], src: str | None = None) -> tuple[float, float, float, int]:
    """``(wall s, CPU s, peak MB, exit code)`` of ``python -m schedsim ARGS`` (from the
    checkout ``src`` when given)."""
    cmd = ([sys.executable, "-c", _FROM_SRC, src] if src else
           [sys.executable, "-m", "schedsim"])
    t = time.perf_counter()
    p = subprocess.Popen([*cmd, *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
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
    ap.add_argument("--against", default=None, help="another checkout to run alongside")
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
        ("compare per rank", ["compare", "-p", str(p), "-m", str(a.compare_microbatches),
                              "--per-rank-costs"]),
        ("compare -j 1", ["compare", "-p", str(p), "-m", str(a.compare_microbatches),
                          "-j", "1"]),
    ]
    only = {x for x in a.only.split(",") if x}
    print(f"1f1b {p} ranks x {m} microbatches, rendezvous; compare at {p} x "
          f"{a.compare_microbatches} (python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs)")
    print(f"{'command':<20}{'source':<8}{'wall s':>8}{'CPU s':>8}{'peak MB':>9}"
          f"{'x sim':>7}{'x before':>9}{'exit':>6}  target")
    base: dict[str | None, float] = {}
    for name, args in cases:
        if only and name not in only and name != "simulate -q":
            continue
        before = None
        for src in ([a.against] if a.against else []) + [None]:
            wall, cpu, peak, rc = run(args, src)
            base.setdefault(src, cpu)
            vs = "" if src or before is None else f"{cpu / before:.2f}"
            print(f"{name:<20}{'before' if src else 'this':<8}{wall:>8.2f}{cpu:>8.2f}"
                  f"{peak:>9.0f}{cpu / base[src]:>7.2f}{vs:>9}{rc:>6}  "
                  f"{TARGETS.get(name, '') if not src else ''}")
            before = cpu if src else before


if __name__ == "__main__":
    main()

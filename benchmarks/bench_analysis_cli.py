"""The analysis commands end to end, as a user runs them, against ``simulate`` of the same
scenario.

Default: 1F1B, 64 ranks x 256 microbatches (32,256 messages; its async program has 14,112
crossed-order findings). Each command runs in-process through the typer app (imports
excluded) with its output captured; prints seconds, the ratio to ``simulate -q`` and the
bytes printed, side by side. Before the bounded/grouped tables, ``align`` took 55 s and
printed 13.6 MB, ``lint`` 23 s and 18.8 MB (one table row per message / finding).

Usage: ``python benchmarks/bench_analysis_cli.py [--schedule 1f1b] [--ranks 64]
[--microbatches 256]``.
"""
from __future__ import annotations

import argparse
import time

from typer.testing import CliRunner

from schedsim.cli import app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=256)
    a = ap.parse_args()
    scen = ["-s", a.schedule, "-p", str(a.ranks), "-m", str(a.microbatches)]
    runner = CliRunner()
    cases = [("simulate -q (baseline)", ["simulate", *scen, "-q"]),
             ("align", ["align", *scen]),
             ("align --flagged", ["align", *scen, "--flagged"]),
             ("lint", ["lint", *scen]),
             ("stalls --rank 0", ["stalls", *scen, "--rank", "0"])]
    print(f"{a.schedule} {a.ranks} ranks x {a.microbatches} microbatches")
    print(f"{'command':<26}{'seconds':>10}{'x simulate':>12}{'bytes out':>12}{'exit':>6}")
    base = None
    for name, args in cases:
        t = time.perf_counter()
        r = runner.invoke(app, args)
        dt = time.perf_counter() - t
        base = base or dt
        print(f"{name:<26}{dt:>10.2f}{dt / base:>12.2f}{len(r.stdout.encode()):>12}"
              f"{r.exit_code:>6}")


if __name__ == "__main__":
    main()

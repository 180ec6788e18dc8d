"""Zero-bubble generators: planning time vs simulating the planned schedule.

For each generator and size, prints the time to build the schedule (the authors' heuristics
re-implemented in schedsim.generators), the time to lower + simulate it under data
semantics (the baseline, run side by side in the same process), and their ratio. A
generator much slower than simulating its own output is a hot spot.

Usage: ``python benchmarks/bench_zerobubble.py [--sizes 8x24,16x64,32x128]``
"""
from __future__ import annotations

import argparse
import time

from schedsim import CommModel, CostModel, generate, lower, simulate

NAMES = ("zb-h1", "zb-h2", "zb-1p", "zb-2p", "zbv", "v-half", "v-min")


def best_of(fn, repeat: int = 3) -> tuple[object, float]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8x24,16x64,32x128",
                    help="comma-separated RANKSxMICROBATCHES")
    args = ap.parse_args()
    costs, comm = CostModel(F=1, B=1, W=1), CommModel(semantics="data")
    print(f"{'schedule':8} {'p':>3} {'m':>4} {'ops':>6} {'plan s':>8} {'simulate s':>10} "
          f"{'plan/sim':>8}")
    for size in args.sizes.split(","):
        p, m = (int(x) for x in size.lower().split("x"))
        for name in NAMES:
            sched, t_plan = best_of(lambda: generate(name, p, m))
            _, t_sim = best_of(lambda: simulate(lower(sched), costs, comm=comm))
            print(f"{name:8} {p:3d} {m:4d} {sched.num_ops():6d} {t_plan:8.3f} "
                  f"{t_sim:10.3f} {t_plan / t_sim:8.2f}")


if __name__ == "__main__":
    main()

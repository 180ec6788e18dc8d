"""``schedsim plan``'s speed: candidates simulated per minute at 16 to 64 GPUs, and the
speed-up from 1 to 2 workers on the Dask executor (the figures in benchmarks/NOTES.md).

Each case is a model on a GPU count with a sweep; every legal candidate of it is
simulated (no pruning: :func:`schedsim.plan.model.evaluate` on each, as the executors
run it), once cold (every program generated) and once warm (the programs cached, as a
long sweep reuses them across TP, recompute and ZeRO). Reported: candidates, seconds,
candidates per minute (wall, and per CPU-minute of this process: on a shared machine
the wall clock measures the other jobs too), in this process and on a local Dask cluster
of 1 and 2 workers (its start-up timed apart; tasks batched as the planner batches them,
:func:`schedsim.plan.driver._batches`).

Usage: ``python benchmarks/bench_plan.py [--case 8b-16|70b-64|all] [--json out.json]
[--no-dask]``. The machine's load changes every figure: say so when quoting them.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from schedsim.plan import PlanSpace
from schedsim.plan.candidates import _programs, enumerate_candidates
from schedsim.plan.driver import resolve
from schedsim.plan.driver import _batches
from schedsim.plan.model import evaluate, evaluate_batch

CASES = {
    "8b-16": dict(model="llama3.1-8b", gpus=16, gpu="h100-sxm", seq=4096,
                  global_batch_size=128, tp=[1, 2, 4], pp=[1, 2, 4],
                  schedules=["1f1b", "interleaved-1f1b", "zb-h1", "dualpipev"],
                  recompute=["none", "selective", "full"], zero=[0, 1]),
    "70b-64": dict(model="llama3.1-70b", gpus=64, gpu="h100-sxm", seq=8192,
                   global_batch_size=128, tp=[4, 8], pp=[2, 4, 8],
                   schedules=["1f1b", "interleaved-1f1b", "zb-h1", "dualpipev"],
                   recompute=["none", "selective", "full"], zero=[1, 2]),
}


def tasks(case: dict) -> list[tuple]:
    res = resolve(PlanSpace(**case))
    return [(lg.candidate, lg.workload, None, "data", {}, res.mem_limit_bytes)
            for lg in enumerate_candidates(res).legal]


def local(work: list[tuple]) -> dict:
    """Wall and CPU seconds of simulating ``work`` in this process, cold then warm (the
    CPU figure is what an unshared core would take: the machine is shared)."""
    _programs.clear()
    out: dict = {"candidates": len(work)}
    for label in ("cold", "warm"):
        t, c = time.perf_counter(), time.process_time()
        for w in work:
            evaluate(w)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        out.update({f"{label}_s": wall, f"{label}_cpu_s": cpu,
                    f"{label}_per_min": 60 * len(work) / wall,
                    f"{label}_per_cpu_min": 60 * len(work) / cpu})
    return out


def dask(work: list[tuple], jobs: int) -> dict:
    from schedsim.plan.executors import DaskExecutor

    t = time.perf_counter()
    with DaskExecutor(jobs=jobs) as ex:
        start = time.perf_counter() - t
        out = {}
        for label in ("cold", "warm"):
            t = time.perf_counter()
            got = sum(len(rows) for _, rows in
                      ex.map_unordered(evaluate_batch, _batches(work, jobs)))
            dt = time.perf_counter() - t
            out[f"{label}_s"], out[f"{label}_per_min"] = dt, 60 * got / dt
    return {"workers": jobs, "startup_s": start, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="all", choices=[*CASES, "all"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-dask", action="store_true")
    a = ap.parse_args()
    out = {"load_average": os.getloadavg()[0]}
    for name in (CASES if a.case == "all" else [a.case]):
        work = tasks(CASES[name])
        row = {"local": local(work)}
        lo = row["local"]
        print(f"{name}: {len(work)} candidates; this process: cold "
              f"{lo['cold_per_min']:.0f}/min ({lo['cold_per_cpu_min']:.0f} per CPU-minute), "
              f"warm {lo['warm_per_min']:.0f}/min ({lo['warm_per_cpu_min']:.0f} per "
              f"CPU-minute)", flush=True)
        if not a.no_dask:
            for j in (1, 2):
                row[f"dask{j}"] = d = dask(work, j)
                print(f"  dask, {j} worker(s): start-up {d['startup_s']:.1f} s, cold "
                      f"{d['cold_per_min']:.0f}/min, warm {d['warm_per_min']:.0f}/min",
                      flush=True)
            row["dask_speedup_warm"] = (row["dask2"]["warm_per_min"]
                                        / row["dask1"]["warm_per_min"])
            print(f"  speed-up 1 -> 2 workers (warm): {row['dask_speedup_warm']:.2f}x")
        out[name] = row
    print(f"load average at the start: {out['load_average']:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

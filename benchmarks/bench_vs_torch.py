"""schedsim against torch's own pipeline simulator, on the same lowered program; and how
schedsim's cost per instruction scales.

Part 1 (issue 12). For torch 2.x's ``ScheduleInterleaved1F1B`` at pp8 v2 m32, pp32 v4
m256 and pp64 v4 m512: build the schedule on mock stages, lower it with torch's own
``_add_send_recv``, dump its compute+comms CSV, load that CSV into schedsim
(``read_torch_csv_program``), then time, in alternating rounds in this one process:

- torch's ``_simulate_comms_compute`` vs ``schedsim.simulate`` (rendezvous, F=B=W=1) on
  that program (schedsim's numba kernels are loaded first with ``warm_up()``, and the
  load time is printed: a search or a benchmark pays it once per process);
- torch's ``_PipelineScheduleRuntime._load_csv(format="compute_comms")`` vs
  ``read_torch_csv_program`` of the same file.

Medians of CPU and wall time and the per-round ratios (torch / schedsim) are printed.

Part 2 (``--scaling``): microseconds per instruction of generate, lower, simulate under
each semantics, Timeline JSON and Perfetto trace, and peak RSS per instruction, for 1F1B
on 16 ranks at 10^4, 10^5 and 10^6 instructions, each size in a fresh process.

Absolute times depend on the machine and its load (the project machine is shared by
several people: compare the ratios, measured side by side).

numpy asks the kernel for transparent huge pages on arrays of 4 MB and more; where the
kernel's THP ``defrag`` setting is ``madvise`` (this machine, Ubuntu's default) and memory
is fragmented, a fresh large allocation can stall 0.1-0.3 s in page compaction, which
numpy itself documents (``NUMPY_MADVISE_HUGEPAGE``). Such stalls landed on schedsim's
second or first round at pp64 and on neither simulator's work, so this script sets
``NUMPY_MADVISE_HUGEPAGE=0`` unless the environment already sets it (set it to 1 to see
them). torch's simulator allocates no numpy arrays; a single CLI run showed no
difference either way (1F1B 64x2048: 0.85-0.89 s wall with and without). Usage::

    python benchmarks/bench_vs_torch.py [--rounds 5] [--sizes 8:2:32,32:4:256,64:4:512]
    python benchmarks/bench_vs_torch.py --scaling
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")   # before numpy loads: see above


def timed(fn: Callable, *args: Any) -> tuple[Any, float, float]:
    """``(result, CPU seconds, wall seconds)`` of ``fn(*args)``."""
    c, w = time.process_time(), time.perf_counter()
    out = fn(*args)
    return out, time.process_time() - c, time.perf_counter() - w


def _on_mock_stages(cls_name: str, p: int, v: int, m: int) -> Any:
    """torch's schedule class ``cls_name`` built on ``v`` mock stages of a ``p``-rank,
    ``p * v``-stage pipeline with ``m`` microbatches (its logging and warnings muted)."""
    import logging
    import warnings
    from unittest import mock

    import torch.distributed.pipelining.schedules as S
    from torch.distributed.pipelining import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, p, None
    stage.num_stages = p * v
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(S, cls_name)([stage] * v, m)
    finally:
        logging.disable(logging.NOTSET)


def torch_program(p: int, v: int, m: int, folder: Path) -> tuple[dict, Path, Callable]:
    """torch's Interleaved1F1B on mock stages, lowered by ``_add_send_recv`` and dumped
    as a compute+comms CSV: ``(actions per rank, csv path, stage_to_rank)``."""
    import torch.distributed.pipelining.schedules as S

    sch = _on_mock_stages("ScheduleInterleaved1F1B", p, v, m)
    order = {r: [a for a in sch.pipeline_order[r] if a is not None]
             for r in sch.pipeline_order}

    def stage_to_rank(s: int) -> int:
        return s % p

    comms = S._add_send_recv(order, stage_to_rank=stage_to_rank, num_stages=p * v)
    path = folder / f"interleaved_pp{p}_v{v}_m{m}.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for r in sorted(comms):
            w.writerow(comms[r])
    return comms, path, stage_to_rank


def torch_runtime(p: int, v: int, m: int) -> Any:
    """A bare ``_PipelineScheduleRuntime`` on mock stages, to call ``_load_csv`` on."""
    return _on_mock_stages("_PipelineScheduleRuntime", p, v, m)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def versus(p: int, v: int, m: int, rounds: int, folder: Path) -> dict:
    import torch.distributed.pipelining.schedules as S

    from schedsim import CommModel, CostModel, simulate
    from schedsim.interop.torch_format import read_torch_csv_program

    comms, path, s2r = torch_program(p, v, m, folder)
    prog = read_torch_csv_program(path)
    costs, comm = CostModel(F=1, B=1, W=1), CommModel(semantics="rendezvous")
    n = prog.num_instructions()
    res: dict[str, list[float]] = {k: [] for k in (
        "torch_sim_cpu", "torch_sim_wall", "ss_sim_cpu", "ss_sim_wall", "torch_load_cpu",
        "torch_load_wall", "ss_load_cpu", "ss_load_wall")}
    makespan = None
    for _ in range(rounds):          # alternate: torch, schedsim, torch, schedsim ...
        _, c, w = timed(S._simulate_comms_compute, comms, s2r, p * v)
        res["torch_sim_cpu"].append(c)
        res["torch_sim_wall"].append(w)
        tl, c, w = timed(simulate, prog, costs, None, comm)
        res["ss_sim_cpu"].append(c)
        res["ss_sim_wall"].append(w)
        makespan = tl.makespan
        rt = torch_runtime(p, v, m)
        _, c, w = timed(rt._load_csv, str(path), "compute_comms")
        res["torch_load_cpu"].append(c)
        res["torch_load_wall"].append(w)
        _, c, w = timed(read_torch_csv_program, path)
        res["ss_load_cpu"].append(c)
        res["ss_load_wall"].append(w)
    out = {"size": f"pp{p} v{v} m{m}", "instructions": n, "makespan": makespan}
    out.update({k: med(x) for k, x in res.items()})
    for what in ("sim", "load"):
        for clock in ("cpu", "wall"):
            ratios = [a / b for a, b in zip(res[f"torch_{what}_{clock}"],
                                            res[f"ss_{what}_{clock}"])]
            out[f"{what}_ratio_{clock}"] = med(ratios)
            out[f"{what}_ratios_{clock}"] = [round(r, 1) for r in ratios]
    return out


def part1(args: argparse.Namespace) -> None:
    from schedsim.sim.fast import numba_available
    from schedsim.sim.simulate import warm_up

    _, c, w = timed(warm_up)
    print(f"numba {'available' if numba_available() else 'NOT available'}; kernels loaded "
          f"in {w:.2f} s wall ({c:.2f} s CPU), once per process")
    print("(times on a shared machine: absolute values vary with its load; the ratios are "
          "measured side by side in this process)")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for spec in args.sizes.split(","):
            p, v, m = (int(x) for x in spec.split(":"))
            r = versus(p, v, m, args.rounds, Path(d))
            rows.append(r)
            print(f"\n{r['size']}: {r['instructions']:,} schedsim instructions, makespan "
                  f"{r['makespan']:g}, median of {args.rounds} alternating rounds")
            print(f"  simulate  torch {r['torch_sim_cpu']:.4f} s CPU ({r['torch_sim_wall']:.4f} "
                  f"wall)   schedsim {r['ss_sim_cpu']:.4f} s CPU ({r['ss_sim_wall']:.4f} "
                  f"wall)   ratio {r['sim_ratio_cpu']:.1f}x CPU, {r['sim_ratio_wall']:.1f}x wall;"
                  f" per round (CPU) {r['sim_ratios_cpu']}")
            print(f"  load CSV  torch {r['torch_load_cpu']:.4f} s CPU ({r['torch_load_wall']:.4f}"
                  f" wall)   schedsim {r['ss_load_cpu']:.4f} s CPU ({r['ss_load_wall']:.4f} "
                  f"wall)   ratio {r['load_ratio_cpu']:.1f}x CPU, {r['load_ratio_wall']:.1f}x "
                  f"wall; per round (CPU) {r['load_ratios_cpu']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


# -- scaling ---------------------------------------------------------------------------
def one_size(m: int, ranks: int) -> dict:
    """Run in a fresh process: per-phase seconds for 1F1B ``ranks`` x ``m``."""
    import resource

    from schedsim import CommModel, CostModel, generate, lower, simulate
    from schedsim.interop.perfetto import write_trace
    from schedsim.sim.simulate import warm_up
    from schedsim.util.gc import no_gc

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    warm_up()
    d = Path(tempfile.mkdtemp())
    small = simulate(lower(generate("1f1b", 2, 2), "async"))   # imports, first calls
    small.to_json()
    write_trace(d / "w.json", [small])
    base = rss()
    out: dict[str, Any] = {}
    with no_gc():
        sched, out["generate"], _ = timed(generate, "1f1b", ranks, m)
        prog, out["lower"], _ = timed(lower, sched, "async")
        out["instructions"] = prog.num_instructions()
        costs = CostModel(F=1, BW=2)
        for sem in ("data", "eager", "rendezvous"):
            tl, out[f"simulate {sem}"], _ = timed(simulate, prog, costs, None,
                                                  CommModel(semantics=sem))
        out["rss_simulate_mb"] = rss() - base
        text, out["JSON"], _ = timed(tl.to_json)
        del text
        _, out["trace"], _ = timed(write_trace, d / "t.json", [tl])
    out["peak_rss_mb"] = rss() - base
    return out


def part2(args: argparse.Namespace) -> None:
    print("1F1B, 16 ranks, async lowering, F=1 BW=2; microseconds of CPU per instruction "
          "(each size in a fresh process, numba kernels loaded first; shared machine)")
    rows = []
    for m in (80, 800, 8000):
        code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import bench_vs_torch as b; print(json.dumps(b.one_size({m}, 16)))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ}, check=True)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    phases = ["generate", "lower", "simulate data", "simulate eager", "simulate rendezvous",
              "JSON", "trace"]
    print(f"{'instructions':>14} " + " ".join(f"{p:>14}" for p in phases)
          + f" {'RSS/instr sim':>14} {'with JSON+trace':>16}")
    for r in rows:
        n = r["instructions"]
        print(f"{n:>14,} " + " ".join(f"{1e6 * r[p] / n:>14.3f}" for p in phases)
              + f" {r['rss_simulate_mb'] * 2 ** 20 / n:>12.0f} B"
              + f" {r['peak_rss_mb'] * 2 ** 20 / n:>14.0f} B")
    print("(peak RSS growth over a warmed-up process, per instruction: through the three "
          "simulations, then including the Timeline JSON and the Perfetto trace)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8:2:32,32:4:256,64:4:512",
                    help="comma-separated P:V:M (ranks, chunks, microbatches)")
    ap.add_argument("--scaling", action="store_true", help="the scaling table instead")
    ap.add_argument("--json", help="also write the figures as JSON")
    a = ap.parse_args()
    part2(a) if a.scaling else part1(a)


if __name__ == "__main__":
    main()

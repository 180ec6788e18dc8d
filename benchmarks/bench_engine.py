"""Engine speed: 1F1B, 64 ranks x 2048 microbatches, async lowering, rendezvous semantics.

Prints the program size, the time of each phase of ``simulate`` (compile: comm checks and
the compiled arrays; run: the discrete-event loop; timeline: the summary, and the span,
message and wait objects built from the arrays), for each executor of the kernels
(``python``: CPython over lists; ``numba``: compiled, when installed), the instructions
per second, and two baselines run side by side in the same process:

- ``floor``: a bare Python loop that only dispatches on the type of every instruction
  once (the least any pure-Python executor must pay), and
- ``data``: the same program under ``data`` semantics (comm instructions ignored).

Each phase is timed best-of-N (wall and CPU): the machine's speed varies with whatever
else runs on it (the project machine is shared). Usage:
``python benchmarks/bench_engine.py [--ranks 64] [--microbatches 2048] [--repeats 3]``.
"""
from __future__ import annotations

import argparse
import gc
import os
import time

from schedsim import CommModel, CostModel, LinkModel, build_program
from schedsim.program.ir import Commit, Compute, Post, Wait
from schedsim.sim.compile import compile_program
from schedsim.sim.engine import build_timeline, run
from schedsim.sim.fast import numba_available
from schedsim.sim.simulate import warm_up
from schedsim.util.gc import no_gc


def floor_loop(rows) -> int:
    n = 0
    for row in rows:
        for ins in row:
            t = type(ins)
            if t is Compute or t is Post or t is Wait or t is Commit:
                n += 1
    return n


def timed(fn, *args):
    """``(result, wall seconds, CPU seconds)`` of ``fn(*args)``."""
    t, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t, time.process_time() - c


def timeline_objects(cp, st, comm, unit):
    tl = build_timeline(cp, st, comm, unit)
    len(tl.spans)           # build the span, message and wait objects
    return tl


def phases(prog, sem: str, repeats: int) -> tuple[list[float], list[float], float]:
    """Best-of-``repeats`` wall and CPU seconds of compile, run and timeline."""
    costs, link, comm = CostModel(F=1, BW=2), LinkModel(), CommModel(semantics=sem)
    wall, cpu = [float("inf")] * 3, [float("inf")] * 3
    for _ in range(repeats):
        with no_gc():
            cp, w0, c0 = timed(compile_program, prog, costs, link, comm)
            st, w1, c1 = timed(run, cp)
            tl, w2, c2 = timed(timeline_objects, cp, st, comm, costs.unit)
        assert tl.deadlock is None
        wall = [min(a, b) for a, b in zip(wall, (w0, w1, w2))]
        cpu = [min(a, b) for a, b in zip(cpu, (c0, c1, c2))]
        makespan = tl.makespan
        del cp, st, tl
    return wall, cpu, makespan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3, help="best of N runs per phase")
    a = ap.parse_args()
    prog, t_build, _ = timed(build_program, "1f1b", a.ranks, a.microbatches)
    n = prog.num_instructions()
    rows = prog.flat().rows()
    gc.collect()
    gc.freeze()   # the program is long-lived: keep it out of later collections
    _, t_floor, _ = timed(floor_loop, rows)
    print(f"1f1b, {a.ranks} ranks x {a.microbatches} microbatches: {n:,} instructions "
          f"(generate + lower {t_build:.2f} s); best of {a.repeats}, seconds; shared "
          f"machine: compare the rows")
    print(f"{'':>32} {'compile':>8} {'run':>8} {'timeline':>9} {'total':>8} "
          f"{'instr/s':>11} {'x floor':>8}")
    engines = ["python"] + (["numba"] if numba_available() else [])
    totals = {}
    for engine in engines:
        os.environ["SCHEDSIM_ENGINE"] = engine
        if engine == "numba":
            _, w, _ = timed(warm_up)
            print(f"{'(numba kernels loaded in':>32} {w:.2f} s, once per process)")
        for sem in ("rendezvous", "data"):
            wall, cpu, mk = phases(prog, sem, a.repeats)
            totals[(engine, sem)] = (sum(wall), sum(cpu), mk)
            for what, v in (("wall", wall), ("cpu", cpu)):
                total = sum(v)
                label = f"{engine} {sem}{' (baseline)' if sem == 'data' else ''} {what}"
                print(f"{label:>32} {v[0]:8.2f} {v[1]:8.2f} {v[2]:9.2f} {total:8.2f} "
                      f"{n / total:11,.0f} {total / t_floor:8.1f}")
    os.environ.pop("SCHEDSIM_ENGINE", None)
    print(f"{'floor (type dispatch)':>32} {'':>8} {t_floor:8.2f} {'':>9} {t_floor:8.2f} "
          f"{n / t_floor:11,.0f} {1.0:8.1f}")
    for engine in engines:
        wall, cpu, mk = totals[(engine, "rendezvous")]
        print(f"{engine}: makespan {mk:g} (closed form {(a.microbatches + a.ranks - 1) * 3:g});"
              f" rendezvous simulate {wall:.2f} s wall, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()

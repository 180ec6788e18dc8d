"""Engine speed: 1F1B, 64 ranks x 2048 microbatches, async lowering, rendezvous semantics.

Prints the program size, the time of each phase of ``simulate`` (compile: static checks
and flattening; run: the discrete-event loop; timeline: building spans/messages), the
instructions per second, and two baselines run side by side in the same process:

- ``floor``: a bare Python loop that only dispatches on the type of every instruction
  once (the least any pure-Python executor must pay), and
- ``data``: the same program under ``data`` semantics (comm instructions ignored).

Target (issue 2): ``simulate`` under rendezvous in under 3 s on one core of the project
machine. Usage: ``python benchmarks/bench_engine.py [--ranks 64] [--microbatches 2048]``.
"""
from __future__ import annotations

import argparse
import gc
import time

from schedsim import CommModel, CostModel, LinkModel, build_program
from schedsim.compile import compile_program
from schedsim.engine import build_timeline, run
from schedsim.io import no_gc
from schedsim.ir import Commit, Compute, Post, Wait


def floor_loop(prog) -> int:
    n = 0
    for row in prog.ranks:
        for ins in row:
            t = type(ins)
            if t is Compute or t is Post or t is Wait or t is Commit:
                n += 1
    return n


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def phases(prog, sem: str) -> tuple[float, float, float, float]:
    costs, link, comm = CostModel(F=1, BW=2), LinkModel(), CommModel(semantics=sem)
    with no_gc():
        cp, t_compile = timed(compile_program, prog, costs, link, comm)
        st, t_run = timed(run, cp)
        tl, t_tl = timed(build_timeline, cp, st, comm, costs.unit)
    assert tl.deadlock is None
    return t_compile, t_run, t_tl, tl.makespan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=2048)
    a = ap.parse_args()
    prog, t_build = timed(build_program, "1f1b", a.ranks, a.microbatches)
    n = prog.num_instructions()
    gc.collect()
    gc.freeze()   # the program is long-lived: keep it out of later collections
    _, t_floor = timed(floor_loop, prog)
    c, r, tl, mk = phases(prog, "rendezvous")
    total = c + r + tl
    dc, dr, dtl, dmk = phases(prog, "data")
    print(f"1f1b, {a.ranks} ranks x {a.microbatches} microbatches: {n:,} instructions "
          f"(generate + lower {t_build:.2f} s)")
    print(f"{'':>22} {'compile':>8} {'run':>8} {'timeline':>9} {'total':>8} "
          f"{'instr/s':>11} {'x floor':>8}")
    print(f"{'rendezvous':>22} {c:8.2f} {r:8.2f} {tl:9.2f} {total:8.2f} "
          f"{n / total:11,.0f} {total / t_floor:8.1f}")
    dt = dc + dr + dtl
    print(f"{'data (baseline)':>22} {dc:8.2f} {dr:8.2f} {dtl:9.2f} {dt:8.2f} "
          f"{n / dt:11,.0f} {dt / t_floor:8.1f}")
    print(f"{'floor (type dispatch)':>22} {'':>8} {t_floor:8.2f} {'':>9} {t_floor:8.2f} "
          f"{n / t_floor:11,.0f} {1.0:8.1f}")
    print(f"makespan {mk:g} (closed form {(a.microbatches + a.ranks - 1) * 3:g}); "
          f"rendezvous simulate {total:.2f} s vs target 3 s: "
          f"{'MET' if total < 3 else 'NOT MET'}")


if __name__ == "__main__":
    main()

"""``simulate`` of a built program, and its generation, at 16 ranks: this tree against
another copy of schedsim (issue 26's one program form: before it, DualPipe(V) and the
``torch``/``megatron`` policies emitted object rows that every ``simulate`` converted to
arrays and validated again).

    python benchmarks/bench_program_form.py --base DIR [--reps 5]

``DIR`` holds the other copy's ``schedsim`` package (e.g. ``git archive ff5555c schedsim |
tar -x -C DIR``). Both run in child processes started from this one, alternately, case by
case, so the two columns share the machine's load; each figure is the best of ``--reps``
CPU times (``time.process_time``) in seconds, the program built once before timing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

#: (generator, ranks, microbatches, comm policy, generator parameters)
CASES = [("dualpipev", 16, 64, None, {}), ("dualpipev", 16, 512, None, {}),
         ("dualpipe", 16, 64, None, {}),
         ("1f1b", 16, 64, "torch", {}), ("interleaved-1f1b", 16, 64, "torch", {"chunks": 2}),
         ("1f1b", 16, 64, "megatron", {})]

CHILD = """
import json, sys, time
from schedsim import build_program, simulate
from schedsim.sim.costs import CommModel, CostModel
name, p, m, pol, kw, reps = json.loads(sys.argv[1])
costs, comm = CostModel(F=1, B=1, W=1, BW=2), CommModel(semantics="rendezvous")
simulate(build_program(name, 2, 4, pol, **kw), costs, comm=comm)       # warm the kernels
gen, sim = [], []
for _ in range(reps):
    t = time.process_time()
    prog = build_program(name, p, m, pol, **kw)
    gen.append(time.process_time() - t)
    t = time.process_time()
    tl = simulate(prog, costs, comm=comm)
    sim.append(time.process_time() - t)
print(json.dumps({"n": prog.num_instructions(), "gen": min(gen), "sim": min(sim),
                  "makespan": tl.makespan}))
"""


def run(root: Path, case: tuple, reps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([*case, reps])],
                         env=env, capture_output=True, text=True, check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the other copy's root")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    print("| case | instructions | simulate before | after | generate before | after |")
    print("|---|---|---|---|---|---|")
    for case in CASES:
        b, h = run(a.base, case, a.reps), run(here, case, a.reps)
        assert b["makespan"] == h["makespan"], (case, b, h)
        name, p, m, pol, kw = case
        label = f"{name}{' chunks=2' if kw else ''} {p} x {m}, {pol or 'own comm'}"
        print(f"| {label} | {h['n']:,} | {b['sim']:.3f} s | {h['sim']:.3f} s | "
              f"{b['gen']:.3f} s | {h['gen']:.3f} s |")


if __name__ == "__main__":
    main()

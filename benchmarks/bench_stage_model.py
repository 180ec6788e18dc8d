"""Stage-model overhead: simulate DualPipe with costs derived by a ``[model]`` against the
same costs typed in ``[costs]``, side by side in one process (best of N, wall seconds),
plus the time to derive the costs and to attach the pieces to the timeline.

The derived costs go through :meth:`CostModel.cost_fn`'s per-kind fast path unless stages
differ, so the simulation itself should cost the same; deriving is per (kind, stage) and
memoised. Usage: ``python benchmarks/bench_stage_model.py [--ranks 16] [--microbatches
128] [--repeats 3]``.
"""
from __future__ import annotations

import argparse
import time

from schedsim.program.ir import Op
from schedsim.scenario import parse_scenario
from schedsim.sim.pieces import attach_pieces
from schedsim.sim.simulate import simulate

MODEL = {"layers": 4, "moe": True, "ep": 16, "topk": 4, "activation_bytes": 14.7e6,
         "overlap": "fb", "attention": {"F": 1.5, "B": 1.5, "W": 1.0},
         "mlp": {"F": 2.0, "B": 2.0, "W": 1.5},
         "links": {"intra": {"bandwidth": 160e6, "latency": 0.005},
                   "inter": {"bandwidth": 50e6, "latency": 0.02}}}


def best(fn, repeats: int) -> tuple[float, object]:
    out, t = None, float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - t0)
    return t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    sched = {"name": "dualpipe", "ranks": a.ranks, "microbatches": a.microbatches}
    def derive():
        sc = parse_scenario({"schedule": sched, "model": MODEL})
        sc.stage_costs().table()         # derive every kind (memoised afterwards)
        return sc

    t_derive, derived = best(derive, a.repeats)
    c = derived.costs
    typed_costs = {k: c.cost(Op(k, 0, 0)) for k in ("F", "B", "W", "BW")}
    typed_costs["FB"] = c.cost(Op.fb(Op("F", 0, 0), Op("BW", 0, 1)))
    typed_costs["message_bytes"] = c.bytes_of(0)
    typed = parse_scenario({"schedule": sched, "costs": typed_costs})
    prog = typed.build_program()
    t_typed = t_model = float("inf")
    for _ in range(a.repeats):       # interleaved, so both see the same machine load
        t, tl_t = best(lambda: simulate(prog, typed.costs), 1)
        t_typed = min(t_typed, t)
        t, tl_m = best(lambda: simulate(prog, derived.costs), 1)
        t_model = min(t_model, t)
    assert tl_t.makespan == tl_m.makespan
    t_pieces, _ = best(lambda: attach_pieces(tl_m, derived.stage_costs()), a.repeats)
    n = sum(len(r) for r in prog.ranks)
    print(f"dualpipe {a.ranks} x {a.microbatches}: {n} instructions, makespan "
          f"{tl_m.makespan:.1f}")
    print(f"simulate, typed costs   {t_typed:.3f} s")
    print(f"simulate, derived costs {t_model:.3f} s  (ratio {t_model / t_typed:.2f})")
    print(f"parse + derive [model]  {t_derive:.4f} s")
    print(f"attach pieces           {t_pieces:.3f} s  ({len(tl_m.pieces)} pieces)")


if __name__ == "__main__":
    main()

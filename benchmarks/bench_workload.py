"""Workload overhead: simulate a schedule with costs derived from a ``[workload]`` (model
config + GPU → costs in ms, links, bytes) against the same program with the same costs
typed per stage (so both runs simulate the same thing), side by side in one process
(interleaved, best of N, wall seconds). Reported separately:
deriving the models (:func:`schedsim.workload.derive.derive`), the simulation with the
derived costs, and reading the step's numbers and bytes per rank from the run
(:func:`schedsim.workload.run.result_of`).

The target (issue 24): deriving costs adds under 10% to ``simulate`` at 64 ranks x 512
microbatches. Usage: ``python benchmarks/bench_workload.py [--ranks 64]
[--microbatches 512] [--schedule 1f1b] [--repeats 3]``.
"""
from __future__ import annotations

import argparse

from bench_stage_model import best        # best of N wall seconds (benchmarks/ on the path)
from schedsim.generators import build_program
from schedsim.sim.costs import CommModel, CostModel, KindCosts
from schedsim.sim.simulate import simulate_run, warm_up
from schedsim.workload import Workload, derive
from schedsim.workload.run import result_of


def workload(ranks: int, microbatches: int, chunks: int = 1) -> Workload:
    """Llama 3.1 405B (126 layers) on ``ranks`` pipeline ranks x ``chunks``, TP 8, DP 1,
    the layers spread as evenly as they go (the first stages one more)."""
    base, extra = divmod(126, ranks * chunks)
    layout = [base + (s < extra) for s in range(ranks * chunks)]
    return Workload(model="llama3.1-405b", gpu="h100-sxm", seq=8192, tp=8, pp=ranks, dp=1,
                    global_batch_size=microbatches, layout=layout, recompute="full",
                    chunks=chunks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=512)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    warm_up()
    w = workload(a.ranks, a.microbatches)
    prog = build_program(a.schedule, a.ranks, a.microbatches)
    if prog.placement.stages != w.stages:                  # a V schedule: 2 per rank
        w = workload(a.ranks, a.microbatches, prog.placement.stages // a.ranks)
    comm = CommModel(semantics="rendezvous")
    # the baseline: the same numbers typed per stage (the same simulation, nothing derived)
    d0 = derive(w, prog.placement)
    plain = CostModel(unit="ms", message_bytes=d0.costs.message_bytes, stage={
        s: KindCosts(**{k: d0.costs.kind_cost(k, s, 0) for k in ("F", "B", "W", "BW")})
        for s in range(prog.placement.stages)})
    link = d0.link.model_copy()
    simulate_run(prog, plain, link, comm)                     # compile caches warm
    t_plain = t_derive = t_sim = t_result = float("inf")
    for _ in range(a.repeats):          # interleaved, best of each: the machine is shared
        # fresh models each time, as for the derived ones (no cache keyed on them helps)
        t, _ = best(lambda: simulate_run(prog, plain.model_copy(), link.model_copy(), comm),
                    1)
        t_plain = min(t_plain, t)
        t, d = best(lambda: derive(w, prog.placement), 1)
        t_derive = min(t_derive, t)
        t, run = best(lambda: simulate_run(prog, d.costs, d.link, comm), 1)
        t_sim = min(t_sim, t)
        t, res = best(lambda: result_of(d, *run), 1)
        t_result = min(t_result, t)
    n = prog.num_instructions()
    print(f"{a.schedule} {a.ranks} ranks x {a.microbatches} microbatches, {n:,} instructions")
    print(f"simulate, the same costs typed    {t_plain:8.3f} s")
    print(f"derive the workload's models      {t_derive:8.3f} s")
    print(f"simulate, derived costs           {t_sim:8.3f} s")
    print(f"step numbers + bytes per rank     {t_result:8.3f} s")
    added = (t_derive + t_sim - t_plain) / t_plain
    print(f"deriving adds {added * 100:+.1f}% to simulate (target < 10%): the derivation "
          f"{t_derive / t_plain * 100:.1f}%, the simulation with derived costs "
          f"{(t_sim - t_plain) / t_plain * 100:+.1f}%; with the step's numbers and bytes "
          f"{(t_derive + t_sim + t_result - t_plain) / t_plain * 100:+.1f}%")
    print(res.line())


if __name__ == "__main__":
    main()

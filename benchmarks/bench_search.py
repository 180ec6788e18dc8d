"""Schedule search against the zero-bubble authors' ILP, the built-in schedules and its own
solver order (the numbers in docs/search.md).

Three parts (``--part``):

- ``ilp``: the cases the authors ran their ILP on (p=4, m in {8,16,24}; p=8, m=8; costs
  F=B=W=1, F=1/B=2/W=1, F=B=W=1 with comm 0.1 per hop; memory limits p and 2p
  activations). Their results (CBC, their settings, our run of their code; provenance in
  the data file) come from ``tests/data/zb_ilp_authors.json``: their order is re-timed by
  our engine (data semantics, latency = their comm cost) to get its makespan, beside their
  own objective (the longest stage span). Ours: ``schedsim search`` with data semantics
  and ``--time-limit`` seconds (default 60) per case.
- ``slow``: p=8, m=24, F=B=W=1 with the last stage 1.5x slower, at 1F1B's memory (its peak
  on every rank, and its per-rank peaks), against every built-in schedule.
- ``rendezvous``: rendezvous semantics, link latency 0.5, each comm policy: the solver
  order's simulated makespan against the same order after the refinement alone, the full
  search and the best fitting built-in.

Usage: ``python benchmarks/bench_search.py [--part ilp|slow|rendezvous|all]
[--time-limit 60] [--json results.json]``. The machine's load changes the wall times (the
solver's budget is wall-clock); say so when quoting them.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from schedsim.analysis.memory import MemoryModel
from schedsim.analysis.metrics import stage_spans
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.program.lower import lower
from schedsim.search import SearchSettings, search
from schedsim.sim.costs import CommModel, CostModel, KindCosts, LinkModel
from schedsim.sim.simulate import simulate

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "zb_ilp_authors.json"


def their_timeline(case: dict):
    """The authors' ILP order, timed by our engine (data semantics)."""
    p, m = case["p"], case["m"]
    rows = [[Op(tok[0], s, int(tok[1:])) for tok in case["orders"][s].split()]
            for s in range(p)]
    sched = Schedule(name="zb-ilp", placement=Placement(kind="loop", ranks=p, stages=p),
                     microbatches=m, ranks=rows)
    c = case["costs"]
    return simulate(lower(sched), CostModel(F=c["F"], B=c["B"], W=c["W"]),
                    LinkModel(latency=c["comm"]), CommModel())


def part_ilp(time_limit: float, seed: int) -> list[dict]:
    data = json.loads(DATA.read_text())
    out = []
    print("| p | m | costs | limit | theirs: makespan (span obj.) | CBC | ours: makespan "
          "(span) | bound | proven | our s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in data["cases"]:
        c = case["costs"]
        tl = their_timeline(case)
        st = SearchSettings(ranks=case["p"], microbatches=case["m"],
                            costs=CostModel(F=c["F"], B=c["B"], W=c["W"]),
                            link=LinkModel(latency=c["comm"]), memory=MemoryModel(),
                            limit=float(case["mem_limit_activations"]),
                            time_limit=time_limit, seed=seed)
        t = time.perf_counter()
        res = search(st)
        wall = time.perf_counter() - t
        s = res.solver
        row = {"p": case["p"], "m": case["m"], "cost_set": case["cost_set"],
               "limit": case["mem_limit_activations"], "their_makespan": tl.makespan,
               "their_objective_span": case["objective_span"],
               "their_cbc": case["cbc_result"], "their_seconds": case["cbc_wall_seconds"],
               "ours": res.makespan, "our_span": max(stage_spans(res.timeline)),
               "bound": s.bound if s else None, "optimal": bool(s and s.optimal),
               "seconds": wall, "ok": res.makespan <= tl.makespan + 1e-9}
        out.append(row)
        cbc = ("optimal" if case["cbc_proven_optimal"] else "time limit") + \
            f" {case['cbc_wall_seconds']:.0f} s"
        print(f"| {row['p']} | {row['m']} | {case['cost_set']} | {row['limit']} | "
              f"{tl.makespan:g} ({case['objective_span']:g}) | {cbc} | "
              f"{res.makespan:g} ({row['our_span']:g}) | {row['bound']:g} | "
              f"{'yes' if row['optimal'] else 'no'} | {wall:.1f} |", flush=True)
    n_ok = sum(r["ok"] for r in out)
    n_opt = sum(r["optimal"] for r in out)
    print(f"\nours <= theirs in {n_ok}/{len(out)} cases; proven optimal in {n_opt}/{len(out)}; "
          f"strictly better in {sum(r['ours'] < r['their_makespan'] - 1e-9 for r in out)}")
    return out


def _slow_costs(p: int) -> CostModel:
    return CostModel(F=1, B=1, W=1, stage={p - 1: KindCosts(F=1.5, B=1.5, W=1.5)})


def part_slow(time_limit: float, seed: int) -> list[dict]:
    p, m = 8, 24
    out = []
    for limit, label in ((None, "1F1B's peak on every rank"), ("1f1b", "1F1B's per-rank peaks")):
        st = SearchSettings(ranks=p, microbatches=m, costs=_slow_costs(p), limit=limit,
                            time_limit=time_limit, seed=seed)
        res = search(st)
        s = res.solver
        print(f"\np={p}, m={m}, F=B=W=1, last stage x1.5, memory limit: {label} "
              f"({res.limit[0]:g}..{res.limit[-1]:g})")
        print(f"search: {res.makespan:g} (solver {s.makespan:g}, bound {s.bound:g}, "
              f"{'proven optimal' if s.optimal else 'not proven'}; {s.wall:.1f} s)")
        print("| schedule | makespan | bubble | peak | fits |")
        print("|---|---|---|---|---|")
        print(f"| search | {res.makespan:g} | {res.bubble:.3f} | {max(res.peak):g} | yes |")
        for b in sorted(res.baselines.rows, key=lambda b: b.makespan or 1e18):
            print(f"| {b.label} | {b.makespan:g} | {b.bubble:.3f} | {max(b.peak):g} | "
                  f"{'yes' if b.fits else 'no'} |")
        fit = [b.makespan for b in res.baselines.rows if b.fits and b.makespan is not None]
        out.append({"limit": label, "search": res.makespan, "bound": s.bound,
                    "optimal": s.optimal, "best_fitting_builtin": min(fit),
                    "rows": [b.to_dict() for b in res.baselines.rows]})
    return out


def part_rendezvous(time_limit: float, seed: int) -> list[dict]:
    """Per case: the solver's order (optimal in the data model) simulated under rendezvous,
    the same order after the refinement alone (local search from it, ``time_limit``
    seconds), the full search (refinement from the best start) and the best built-in
    that fits."""
    from schedsim.search.refine import Evaluator, refine

    out = []
    print("\n| p | m | costs | policy | solver order: model / simulated | refined from it | "
          "search | best fitting built-in |")
    print("|---|---|---|---|---|---|---|---|")
    link, comm = LinkModel(latency=0.5), CommModel(semantics="rendezvous")
    for p, m, cost in ((4, 8, (1, 1, 1)), (4, 8, (1, 2, 1)), (4, 16, (1, 1, 1)),
                       (8, 16, (1, 1, 1))):
        for policy in ("async", "torch", "commit"):
            costs = CostModel(F=cost[0], B=cost[1], W=cost[2])
            st = SearchSettings(ranks=p, microbatches=m, costs=costs, link=link, comm=comm,
                                policy=policy, time_limit=time_limit, seed=seed)
            res = search(st)
            sol = res.solver
            pb = _problem(st)
            ev = Evaluator(pb, costs, link, comm, policy)
            ref = refine(pb, sol.order, ev, time.perf_counter() + time_limit / 2, seed=seed)
            fit = [(b.makespan, b.label) for b in res.baselines.rows
                   if b.fits and b.makespan is not None]
            best = min(fit)
            row = {"p": p, "m": m, "costs": cost, "policy": policy,
                   "solver_model": sol.makespan, "solver_sim": res.solver_sim_makespan,
                   "refined_from_solver": ref.evaluation.makespan,
                   "refine_evals": ref.evals, "search": res.makespan,
                   "search_start": res.start_label, "best_builtin": best[0],
                   "best_builtin_name": best[1]}
            out.append(row)
            print(f"| {p} | {m} | F={cost[0]},B={cost[1]},W={cost[2]} | {policy} | "
                  f"{sol.makespan:g} / {res.solver_sim_makespan:g} | "
                  f"{ref.evaluation.makespan:g} ({ref.evals} sims) | {res.makespan:g} | "
                  f"{best[0]:g} ({best[1]}) |", flush=True)
    return out


def _problem(st: SearchSettings):
    from schedsim.search.problem import build_problem

    return build_problem(st.make_placement(), st.microbatches, st.costs, st.link, st.memory,
                         st.resolve_limit(), st.fused)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=("ilp", "slow", "rendezvous", "all"))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = {}
    if a.part in ("ilp", "all"):
        res["ilp"] = part_ilp(a.time_limit, a.seed)
    if a.part in ("slow", "all"):
        res["slow"] = part_slow(a.time_limit, a.seed)
    if a.part in ("rendezvous", "all"):
        res["rendezvous"] = part_rendezvous(a.time_limit, a.seed)
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

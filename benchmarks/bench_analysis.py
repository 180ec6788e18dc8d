"""Analysis speed against the simulation it explains.

DualPipe (default 16 ranks x 128 microbatches) at the README figure's costs under
rendezvous semantics: times ``simulate`` (the baseline), then each analysis on its
timeline, and prints each one's time and its ratio to the simulation, side by side:
stall attribution, send/recv alignment, lints, the dependency graph (networkx), critical
path, slack, and one counterfactual query (two simulations plus a graph).

Usage: ``python benchmarks/bench_analysis.py [--schedule dualpipe] [--ranks 16]
[--microbatches 128] [--semantics rendezvous]``.
"""
from __future__ import annotations

import argparse
import time

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis.align import alignment
from schedsim.analysis.critical import critical_path, op_slack
from schedsim.analysis.graph import build_graph
from schedsim.analysis.lint import lint
from schedsim.analysis.query import answer
from schedsim.analysis.select import select
from schedsim.analysis.stalls import attribute_stalls


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="dualpipe")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=128)
    ap.add_argument("--semantics", default="rendezvous")
    a = ap.parse_args()
    costs = CostModel(F=1, B=1, W=1, BW=2, FB=3)
    link, comm = LinkModel(), CommModel(semantics=a.semantics)
    prog = build_program(a.schedule, a.ranks, a.microbatches)
    tl, t_sim = timed(simulate, prog, costs, link, comm)
    print(f"{a.schedule} {a.ranks} ranks x {a.microbatches} microbatches, {a.semantics}: "
          f"{prog.num_instructions()} instructions, {len(tl.spans)} ops, "
          f"{len(tl.messages)} messages, makespan {tl.makespan:g}")
    print(f"{'phase':<28}{'seconds':>10}{'x simulate':>12}")
    print(f"{'simulate (baseline)':<28}{t_sim:>10.3f}{1.0:>12.2f}")
    rows = []
    st, t = timed(attribute_stalls, tl, prog)
    rows.append((f"stalls ({len(st)})", t))
    al, t = timed(alignment, tl)
    rows.append((f"alignment ({len(al)})", t))
    fs, t = timed(lint, prog, tl)
    rows.append((f"lint ({len(fs)} findings)", t))
    G, t = timed(build_graph, tl, prog, link, comm)
    rows.append((f"graph ({G.g.number_of_nodes()} nodes)", t))
    cp, t = timed(critical_path, G)
    rows.append((f"critical path ({len(cp)} steps)", t))
    _, t = timed(op_slack, G)
    rows.append(("slack", t))
    last = max(tl.spans, key=lambda s: s.end)
    first = min((s for s in tl.spans if s.rank == 0), key=lambda s: s.start)
    eff = select(prog, f"rank={last.rank} index={last.index}")
    cause = select(prog, f"rank=0 index={first.index}")
    _, t = timed(answer, prog, eff, [cause], costs, link, comm)
    rows.append(("query (1 cause)", t))
    for name, t in rows:
        print(f"{name:<28}{t:>10.3f}{t / t_sim:>12.2f}")


if __name__ == "__main__":
    main()

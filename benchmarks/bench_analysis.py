"""Analysis speed against the simulation it explains, phase by phase, in one process.

1F1B (default 64 ranks x 1024 microbatches) under rendezvous semantics: times
``simulate`` (the baseline), then each analysis of its timeline, and prints each one's
CPU seconds and its ratio to the simulation, side by side: the dependency graph (edges
from the compiled program, the topological order, the forward pass), critical path,
slack (the backward pass), one counterfactual query (two simulations plus a graph), stall
attribution, send/recv alignment, and the Perfetto trace (streamed to a temporary file).

Usage: ``python benchmarks/bench_analysis.py [--schedule 1f1b] [--ranks 64]
[--microbatches 1024] [--semantics rendezvous]``.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import numpy as np

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis._graph_edges import build_edges
from schedsim.analysis._longest_path import PassEdges, run_order
from schedsim.analysis._simulated import simulate_compiled
from schedsim.analysis.align import alignment
from schedsim.analysis.critical import critical_path, slack_values
from schedsim.analysis.graph import DepGraph
from schedsim.analysis.query import answer
from schedsim.analysis.select import select
from schedsim.analysis.stalls import attribute_stalls
from schedsim.interop.perfetto import write_trace


def timed(fn, *args, **kw):
    t = time.process_time()
    out = fn(*args, **kw)
    return out, time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--semantics", default="rendezvous")
    a = ap.parse_args()
    costs = CostModel(F=1, B=1, W=1, BW=2, FB=3)
    link, comm = LinkModel(), CommModel(semantics=a.semantics)
    prog = build_program(a.schedule, a.ranks, a.microbatches)
    tl, t_sim = timed(simulate, prog, costs, link, comm)
    print(f"{a.schedule} {a.ranks} ranks x {a.microbatches} microbatches, {a.semantics}: "
          f"{prog.num_instructions()} instructions, {len(tl.spans)} ops, "
          f"{len(tl.messages)} messages, makespan {tl.makespan:g}")
    print(f"{'phase (CPU seconds)':<34}{'seconds':>10}{'x simulate':>12}")
    print(f"{'simulate (baseline)':<34}{t_sim:>10.3f}{1.0:>12.2f}")
    rows = []
    (tl2, gi), t = timed(simulate_compiled, prog, costs, link, comm)
    rows.append(("simulate + graph input", t))
    e, t = timed(build_edges, tl2, gi, link, comm)
    rows.append((f"graph edges ({len(e.src)})", t))
    order, t = timed(run_order, e.t_run, e.src, e.dst)
    rows.append((f"topological order ({e.lay.n} nodes)", t))
    pe, t = timed(PassEdges.of, order, e.src, e.dst, e.weight)
    rows.append(("edges in pass order", t))
    times, t = timed(pe.forward, np.zeros(e.lay.n))
    rows.append(("forward pass (node times)", t))
    G = DepGraph(e, tl2, prog, times, pe)
    path, t = timed(critical_path, G)
    rows.append((f"critical path ({len(path)} steps)", t))
    _, t = timed(slack_values, G)
    rows.append(("slack (backward pass)", t))
    del G, e, pe, tl2
    last = max(tl.spans, key=lambda s: s.end)
    first = min((s for s in tl.spans if s.rank == a.ranks - 1), key=lambda s: s.start)
    eff = select(prog, f"rank={last.rank} index={last.index}")
    cause = select(prog, f"rank={first.rank} index={first.index}")
    _, t = timed(answer, prog, eff, [cause], costs, link, comm)
    rows.append(("query (1 cause, last op)", t))
    st, t = timed(attribute_stalls, tl, prog)
    rows.append((f"stalls ({len(st)})", t))
    al, t = timed(alignment, tl)
    rows.append((f"alignment ({len(al)})", t))
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    _, t = timed(write_trace, path, [tl])
    rows.append((f"trace ({os.path.getsize(path) >> 20} MB)", t))
    for name, t in rows:
        print(f"{name:<34}{t:>10.3f}{t / t_sim:>12.2f}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()

"""Gantt PNG speed (issue 12's target: 1F1B 64 ranks x 1024 microbatches under rendezvous,
131,072 spans, PNG in <= 5 s).

    python benchmarks/bench_gantt.py [--ranks 64] [--microbatches 1024] [--rounds 3]

Simulates once, then times, in alternating rounds in one process, the figure schedsim
draws (boxes as one PolyCollection per band, ``schedsim.plot.gantt``) against the previous
way (one matplotlib Rectangle patch per span in a PatchCollection, same figure size and
dpi, no labels), each built and saved to PNG. Prints the medians (wall and CPU) and the
per-round ratios.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.plot import gantt, save_figure
from schedsim.plot.style import KIND_COLORS, shade


def baseline(tl, size_in, dpi) -> Figure:
    """The pre-issue-12 drawing: one Rectangle per span (FB halves as two)."""
    fig = Figure(figsize=size_in, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    n = tl.ranks
    rects, colors = [], []
    for s in tl.spans:
        parts = s.parts or [s]
        h = 0.86 / len(parts)
        for j, p in enumerate(parts):
            rects.append(Rectangle((s.start, n - 1 - s.rank + 0.07 + (len(parts) - 1 - j) * h),
                                   s.end - s.start, h))
            colors.append(shade(KIND_COLORS.get(p.kind, "#999999"), p.chunk, 2))
    ax.add_collection(PatchCollection(rects, facecolors=colors, edgecolors="white",
                                      linewidths=0.0))
    ax.set_xlim(0, tl.makespan)
    ax.set_ylim(0, n)
    ax.set_title("baseline")
    return fig


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tl = simulate(build_program("1f1b", a.ranks, a.microbatches), CostModel(F=1, BW=2),
                  LinkModel(), CommModel(semantics="rendezvous"))
    print(f"1f1b {a.ranks} x {a.microbatches} rendezvous: {len(tl.spans):,} spans, "
          f"makespan {tl.makespan:g}")
    out = Path(tempfile.mkdtemp())
    new, old = [], []
    size = None
    for _ in range(a.rounds):
        def ours():
            nonlocal size
            fig = gantt(tl)
            size = (fig.get_size_inches(), fig.dpi)
            save_figure(fig, out / "new.png")
        new.append(timed(ours))
        old.append(timed(lambda: save_figure(baseline(tl, *size), out / "old.png")))
    for name, xs in (("schedsim.plot.gantt", new), ("one patch per span", old)):
        print(f"{name:22s} wall {statistics.median(x[0] for x in xs):6.2f} s   "
              f"cpu {statistics.median(x[1] for x in xs):6.2f} s")
    print("per-round ratio (baseline / ours, wall): "
          + ", ".join(f"{o[0] / n[0]:.1f}x" for n, o in zip(new, old)))
    print(f"figure {size[0][0] * size[1]:.0f} x {size[0][1] * size[1]:.0f} px")


if __name__ == "__main__":
    main()

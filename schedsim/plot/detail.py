"""Inside the ops of a Gantt chart: compute and collective pieces (``gantt(detail=True)``,
``schedsim simulate --gantt FILE --detail``).

Drawn over each op box of a timeline that has ``pieces``
(:mod:`schedsim.sim.pieces`):

- the bottom :data:`LANE` of the box is the rank's **collective stream**: a light band
  under the op, and one bar per collective coloured by what it is (all-reduce,
  all-gather, reduce-scatter, all-to-all; :data:`COLL_COLORS`);
- above it, thin white lines separate the op's **compute pieces** (attention, MLP or
  experts, per layer and Domino half; only between pieces at least
  :data:`SPLIT_MIN_PX` pixels wide), and the stretches inside the op where the compute
  stream has nothing to run — it waits for a collective: the *exposed* collective time —
  are hatched over the op's colour (:data:`EXPOSED_HATCH`).

Under one hardware queue (``[comm] connections = 1``) the time a piece waited behind the
head of the queue (ready, its stream free, but an earlier-launched kernel not yet
started) is cross-hatched in orange on its stream (:data:`QUEUED_COLOR`, gid
``detail-queued``).

Measured timelines (a TP replay) carry collective pieces only (per TP rank; those of TP
rank 0 are drawn). Collections have gids ``detail-lane``, ``detail-collectives``,
``detail-splits`` and ``detail-exposed`` (what the tests count).
"""
from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.patches import Patch, Rectangle

from schedsim.sim.pieces import pieces_of
from schedsim.timeline import Timeline

#: fraction of the op box's height given to the collective lane (at its bottom)
LANE = 0.34
#: colour per collective
COLL_COLORS = {"all-reduce": "#2b2b2b", "all-gather": "#17becf",
               "reduce-scatter": "#e377c2", "all-to-all": "#d62728"}
LANE_COLOR = "#e9e9e9"
EXPOSED_HATCH = "////"
EXPOSED_COLOR = "#1a1a1a"
QUEUED_COLOR = "#ff7f0e"
QUEUED_HATCH = "xxxx"
#: narrowest piece (pixels) that keeps its white separators: a split line between two
#: compute pieces is drawn only when both are at least this wide, and a collective bar
#: thinner gets no white edge (at 20+ layers a piece is a pixel or less and the white lines hid the fill)
SPLIT_MIN_PX = 4.0


def _free(span: tuple[float, float], busy: list[tuple[float, float]]
          ) -> list[tuple[float, float]]:
    """Sub-intervals of ``span`` covered by none of ``busy``."""
    out, t = [], span[0]
    for a, b in sorted(busy):
        if a > t + 1e-12:
            out.append((t, min(a, span[1])))
        t = max(t, b)
    if span[1] > t + 1e-12:
        out.append((t, span[1]))
    return [(a, b) for a, b in out if b > a]


def split_lines_shown(widths: list[float], px_per_unit: float | None) -> bool:
    """Whether pieces of these ``widths`` (time units) at ``px_per_unit`` pixels per unit
    get white separators: when the narrowest is at least :data:`SPLIT_MIN_PX` pixels
    (always when ``px_per_unit`` is None)."""
    return px_per_unit is None or not widths or min(widths) * px_per_unit >= SPLIT_MIN_PX


def draw_detail(ax: Axes, tl: Timeline, pad: float, px_per_unit: float | None = None
                ) -> list[Any]:
    """Draw the pieces of ``tl`` on the Gantt axes ``ax`` (rank 0 on top, boxes inset by
    ``pad`` of the row; ``px_per_unit``: the axes' pixels per time unit, for
    :func:`split_lines_shown`). Returns the legend handles of what was drawn (none when
    ``tl`` has no pieces)."""
    recs = [p for p in pieces_of(tl) if p.get("tp_rank", 0) == 0]
    if not recs:
        return []
    n = tl.ranks
    h = (1 - 2 * pad) * LANE
    by_op: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for p in recs:
        by_op.setdefault((p["rank"], p["index"]), []).append(p)
    spans = {(s.rank, s.index): s for s in tl.spans}
    lanes, bars, colors, splits, exposed, queued = [], [], [], [], [], []
    edge_w: list[float] = []
    used: set[str] = set()
    for key, ps in by_op.items():
        s = spans.get(key)
        if s is None:
            continue
        y0 = n - 1 - s.rank + pad
        lanes.append(Rectangle((s.start, y0), s.end - s.start, h))
        comp = sorted((p["start"], p["end"]) for p in ps if p["stream"] == "compute")
        for p in ps:
            if p["stream"] == "collective" and p["end"] > p["start"]:
                bars.append(Rectangle((p["start"], y0), p["end"] - p["start"], h))
                colors.append(COLL_COLORS.get(p.get("collective") or "", "#888888"))
                edge_w.append(0.3 if split_lines_shown([p["end"] - p["start"]], px_per_unit)
                              else 0.0)
                used.add(p.get("collective") or "collective")
        top = y0 + h
        for p in ps:                    # waited behind the head of the one hardware queue
            if p.get("queued") is not None and p["start"] > p["queued"]:
                lo, hi = (y0, h) if p["stream"] == "collective" else (top, n - s.rank - pad - top)
                queued.append(Rectangle((p["queued"], lo), p["start"] - p["queued"], hi))
        for (pa, pb), (a, b) in zip(comp, comp[1:]):
            if s.start < a < s.end and split_lines_shown([pb - pa, b - a], px_per_unit):
                splits.append([(a, top), (a, n - s.rank - pad)])
        if comp:
            for a, b in _free((s.start, s.end), comp):
                exposed.append(Rectangle((a, top), b - a, n - s.rank - pad - top))
    for gid, rects, kw in (
            ("detail-lane", lanes, dict(facecolors=LANE_COLOR, edgecolors="none")),
            ("detail-collectives", bars, dict(facecolors=colors, edgecolors="white",
                                              linewidths=edge_w)),
            ("detail-exposed", exposed, dict(facecolors="none", edgecolors=EXPOSED_COLOR,
                                             hatch=EXPOSED_HATCH, linewidths=0.0)),
            ("detail-queued", queued, dict(facecolors="none", edgecolors=QUEUED_COLOR,
                                           hatch=QUEUED_HATCH, linewidths=0.8))):
        if rects:
            pc = PatchCollection(rects, zorder=3.6, **kw)
            pc.set_gid(gid)
            ax.add_collection(pc)
    if splits:
        lc = LineCollection(splits, colors="white", linewidths=0.6, zorder=3.7)
        lc.set_gid("detail-splits")
        ax.add_collection(lc)
    handles: list[Any] = [Patch(facecolor=COLL_COLORS[k], label=k) for k in COLL_COLORS
                          if k in used]
    if exposed:
        handles.append(Patch(facecolor="#9aa8c7", edgecolor=EXPOSED_COLOR,
                             hatch=EXPOSED_HATCH, linewidth=0.0,
                             label="compute waits for a collective (exposed)"))
    if queued:
        handles.append(Patch(facecolor="none", edgecolor=QUEUED_COLOR, hatch=QUEUED_HATCH,
                             label="waits behind the one hardware queue (connections = 1)"))
    return handles

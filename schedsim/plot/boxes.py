"""Compute spans as numpy arrays, and drawing them as one ``PolyCollection``.

A timeline of 1F1B on 64 ranks x 1024 microbatches has 131,072 spans; one matplotlib patch
per span took 18 s. Here the spans become arrays once (:func:`span_boxes`) and every
drawing step is vectorised: colours by table lookup, the rectangles as one ``(N, 4, 2)``
vertex array in a single :class:`~matplotlib.collections.PolyCollection`.

Drawing model (what the tests count): every compute span is **one box**; an ``FB``
span's box is drawn as its **two halves** (forward part on top, backward part below), plus
one outline in the collection with gid ``"fb-outline"``. So the ``"ops"`` collection holds
``spans + FB spans`` paths and the distinct ``(row, start, end)`` boxes number exactly the
compute spans.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba

from schedsim.plot.layout import label_px
from schedsim.plot.style import KIND_COLORS, shade, text_color
from schedsim.timeline import Timeline

#: kinds in colour-table order; unknown kinds get the last (grey) entry
KINDS = ("F", "B", "W", "BW")
#: vertical padding of a box inside its row (fraction of the row height)
PAD = 0.07


@dataclass
class Boxes:
    """One entry per drawn box (an FB span gives two: ``part`` 0 forward, 1 backward).

    Arrays of length N: ``x0``, ``x1`` (start, end), ``rank``, ``part``, ``nparts``
    (1, or 2 for an FB half), ``kind`` (index into :data:`KINDS`, ``len(KINDS)`` for
    others), ``chunk``, ``mb``, ``stage``, ``span`` (index into ``timeline.spans``)."""

    x0: np.ndarray
    x1: np.ndarray
    rank: np.ndarray
    part: np.ndarray
    nparts: np.ndarray
    kind: np.ndarray
    chunk: np.ndarray
    mb: np.ndarray
    stage: np.ndarray
    span: np.ndarray

    def __len__(self) -> int:
        return int(self.x0.size)

    def select(self, keep: np.ndarray) -> "Boxes":
        """The boxes where the boolean (or index) array ``keep`` selects."""
        return Boxes(**{k: getattr(self, k)[keep] for k in self.__dataclass_fields__})


def span_boxes(tl: Timeline) -> Boxes:
    """The boxes of every compute span of ``tl`` (FB spans as their two halves)."""
    code = {k: i for i, k in enumerate(KINDS)}
    other = len(KINDS)
    spans = tl.spans
    i64 = np.int64
    # plain spans: one pass per field (fast attribute reads), FB spans below
    single = [i for i, s in enumerate(spans) if not s.parts]
    ss = [spans[i] for i in single]
    cols = {
        "x0": np.fromiter((s.start for s in ss), float, len(ss)),
        "x1": np.fromiter((s.end for s in ss), float, len(ss)),
        "rank": np.fromiter((s.rank for s in ss), i64, len(ss)),
        "part": np.zeros(len(ss), i64),
        "nparts": np.ones(len(ss), i64),
        "kind": np.fromiter((code.get(s.kind, other) for s in ss), i64, len(ss)),
        "chunk": np.fromiter((s.chunk for s in ss), i64, len(ss)),
        "mb": np.fromiter((s.mb for s in ss), i64, len(ss)),
        "stage": np.fromiter((s.stage for s in ss), i64, len(ss)),
        "span": np.asarray(single, i64),
    }
    multi = [(i, j, len(s.parts), s, p) for i, s in enumerate(spans) if s.parts
             for j, p in enumerate(s.parts)]
    if multi:
        extra = {
            "x0": [s.start for _, _, _, s, _ in multi], "x1": [s.end for _, _, _, s, _ in multi],
            "rank": [s.rank for _, _, _, s, _ in multi], "part": [j for _, j, _, _, _ in multi],
            "nparts": [n for _, _, n, _, _ in multi],
            "kind": [code.get(p.kind, other) for *_, p in multi],
            "chunk": [p.chunk for *_, p in multi], "mb": [p.mb for *_, p in multi],
            "stage": [p.stage for *_, p in multi], "span": [i for i, *_ in multi],
        }
        cols = {k: np.concatenate([v, np.asarray(extra[k], v.dtype)]) for k, v in cols.items()}
        order = np.argsort(cols["span"], kind="stable")
        cols = {k: v[order] for k, v in cols.items()}
    return Boxes(**cols)


def color_table(nchunks: int) -> np.ndarray:
    """RGBA per (kind, chunk): ``table[kind * nchunks + chunk]``; later chunks lighter
    (:func:`~schedsim.plot.style.shade`); the last kind row is grey (unknown kinds)."""
    out = []
    for k in (*KINDS, None):
        base = KIND_COLORS.get(k, "#999999") if k else "#999999"
        out += [to_rgba(shade(base, c, nchunks)) for c in range(nchunks)]
    return np.asarray(out)


def box_colors(bx: Boxes, nchunks: int) -> np.ndarray:
    """RGBA (N, 4) of every box."""
    return color_table(nchunks)[bx.kind * nchunks + np.minimum(bx.chunk, nchunks - 1)]


def box_geometry(bx: Boxes, n: int, lo: float = PAD, hi: float = 1 - PAD
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(y0, h)`` per box: rank r's row is ``[n-1-r, n-r]`` (rank 0 on top); the box
    fills ``[lo, hi]`` of it, an FB half half of that (forward half on top)."""
    h = (hi - lo) / bx.nparts
    y0 = (n - 1 - bx.rank) + lo + (bx.nparts - 1 - bx.part) * h
    return y0, h


def rect_verts(x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, h: np.ndarray
               ) -> np.ndarray:
    """``(N, 4, 2)`` corner arrays of axis-aligned rectangles."""
    y1 = y0 + h
    return np.stack([np.stack([x0, y0], -1), np.stack([x1, y0], -1),
                     np.stack([x1, y1], -1), np.stack([x0, y1], -1)], axis=1)


def in_window(bx: Boxes, t0: float, t1: float) -> np.ndarray:
    """Boolean mask of the boxes that overlap the time window ``[t0, t1]``."""
    return (bx.x1 >= t0) & (bx.x0 <= t1)


def draw_boxes(ax: Axes, bx: Boxes, n: int, colors: np.ndarray, *, lo: float = PAD,
               hi: float = 1 - PAD, edgecolors: object = "white", linewidths: object = 0.5,
               gid: str = "ops", zorder: float = 3) -> PolyCollection:
    """Draw ``bx`` on ``ax`` as one collection (gid ``gid``) and return it."""
    y0, h = box_geometry(bx, n, lo, hi)
    pc = PolyCollection(rect_verts(bx.x0, bx.x1, y0, h), closed=True, facecolors=colors,
                        edgecolors=edgecolors, linewidths=linewidths, zorder=zorder)
    pc.set_gid(gid)
    ax.add_collection(pc, autolim=False)    # limits are set by the caller
    return pc


def draw_chunk_hatches(ax: Axes, bx: Boxes, n: int, nchunks: int, *, lo: float = PAD,
                       hi: float = 1 - PAD) -> int:
    """Hatch the boxes of every chunk after the first, one collection per chunk (gid
    ``chunk-<c>``), when the figure has 3 or more chunks
    (:func:`~schedsim.plot.style.chunk_hatch`); returns how many boxes were hatched."""
    from schedsim.plot.style import CHUNK_HATCH_COLOR, chunk_hatch

    done = 0
    y0, h = box_geometry(bx, n, lo, hi)
    for c in range(1, nchunks):
        hatch = chunk_hatch(c, nchunks)
        sel = np.flatnonzero(bx.chunk == c)
        if not hatch or not len(sel):
            continue
        pc = PolyCollection(rect_verts(bx.x0[sel], bx.x1[sel], y0[sel], h[sel]),
                            closed=True, facecolors="none", edgecolors=[CHUNK_HATCH_COLOR],
                            linewidths=0.0, hatch=hatch, zorder=3.2)
        pc.set_gid(f"chunk-{c}")
        ax.add_collection(pc, autolim=False)
        done += len(sel)
    return done


def draw_fb_outlines(ax: Axes, bx: Boxes, n: int, *, lo: float = PAD, hi: float = 1 - PAD,
                     linewidth: float = 0.8) -> int:
    """One dark outline around each FB span (both halves); returns how many."""
    first = (bx.nparts > 1) & (bx.part == 0)
    if not first.any():
        return 0
    x0, x1 = bx.x0[first], bx.x1[first]
    y0 = (n - 1 - bx.rank[first]) + lo
    pc = PolyCollection(rect_verts(x0, x1, y0, np.full(x0.shape, hi - lo)), closed=True,
                        facecolors="none", edgecolors="#222222", linewidths=linewidth,
                        zorder=3.5)
    pc.set_gid("fb-outline")
    ax.add_collection(pc, autolim=False)
    return int(first.sum())


def draw_labels(ax: Axes, bx: Boxes, n: int, colors: np.ndarray, *, px_per_unit: float,
                row_px: float, window: tuple[float, float], lo: float = PAD,
                hi: float = 1 - PAD, fontsize: float = 6.5, max_labels: int = 8000) -> int:
    """Microbatch numbers inside the boxes where they fit; returns how many were drawn.

    Fit is judged by the longest number of all boxes, so boxes of one size are either all
    labelled or none is (no "only mb < 10 labelled" patterns); a box is labelled in the
    band (``window``) that holds its centre."""
    if not len(bx):
        return 0
    dpi = ax.figure.dpi
    digits = len(str(int(bx.mb.max())))
    need = label_px(digits, dpi, fontsize)
    line = 0.95 * fontsize * dpi / 72
    y0, h = box_geometry(bx, n, lo, hi)
    mid = (bx.x0 + bx.x1) / 2
    ok = (((bx.x1 - bx.x0) * px_per_unit >= need) & (h * row_px >= line)
          & (mid >= window[0]) & (mid < window[1]))
    idx = np.flatnonzero(ok)[:max_labels]
    for i in idx:
        ax.text(mid[i], y0[i] + h[i] / 2, str(int(bx.mb[i])), ha="center", va="center",
                fontsize=fontsize, color=text_color(colors[i]), zorder=4)
    return int(idx.size) + _fb_labels(ax, bx, n, colors, ok, px_per_unit, row_px, window,
                                      lo, hi, fontsize, max_labels - int(idx.size))


def _fb_labels(ax: Axes, bx: Boxes, n: int, colors: np.ndarray, done: np.ndarray,
               px_per_unit: float, row_px: float, window: tuple[float, float], lo: float,
               hi: float, fontsize: float, room: int) -> int:
    """An FB span too low for a number in each half (an overlay's half-row) gets one
    label ``F/B`` (the forward's and the backward's microbatch) across the whole box,
    where that fits; returns how many."""
    dpi = ax.figure.dpi
    first = np.flatnonzero((bx.nparts == 2) & (bx.part == 0) & ~done)
    first = first[first + 1 < len(bx)]
    first = first[(bx.span[first + 1] == bx.span[first]) & ~done[first + 1]]
    if not len(first) or room <= 0:
        return 0
    digits = len(str(int(bx.mb.max())))
    mid = (bx.x0[first] + bx.x1[first]) / 2
    fits = (((bx.x1[first] - bx.x0[first]) * px_per_unit >= label_px(2 * digits + 1, dpi,
                                                                      fontsize))
            & ((hi - lo) * row_px >= 0.95 * fontsize * dpi / 72)
            & (mid >= window[0]) & (mid < window[1]))
    idx = first[fits][:room]
    y = (n - 1 - bx.rank[idx]) + (lo + hi) / 2
    for i, yy in zip(idx, y):
        ax.text((bx.x0[i] + bx.x1[i]) / 2, yy, f"{int(bx.mb[i])}/{int(bx.mb[i + 1])}",
                ha="center", va="center", fontsize=fontsize, color=text_color(colors[i]),
                zorder=4, gid="fb-label")
    return int(idx.size)

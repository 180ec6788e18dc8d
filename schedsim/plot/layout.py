"""Figure sizing: every picture fits a page.

A Gantt-like figure is at most :data:`MAX_WIDTH_PX` wide at :data:`DPI`. A timeline too
long to show its microbatch numbers in one band is **wrapped** into several bands (each
band is the same ranks over the next stretch of time), as long as the bands stay within
:data:`MAX_HEIGHT_PX`; otherwise it is drawn in one band, **scaled** to the width, and
the numbers are left out where they do not fit. Rows get a height that keeps the rank
labels readable from 2 to 64 (and more) ranks.

All sizes are in pixels at the figure's dpi; :func:`plan` turns a timeline's shape into a
:class:`Layout` (inches, bands, band edges).
"""
from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np

#: default resolution of every figure (dots per inch)
DPI = 150.0
#: widest figure, in pixels at :data:`DPI`
MAX_WIDTH_PX = 2000
#: narrowest Gantt figure, in pixels
MIN_WIDTH_PX = 1100
#: tallest stack of bands, in pixels (a single band may be taller when the ranks need it)
MAX_HEIGHT_PX = 2300
#: most bands a timeline is wrapped into
MAX_BANDS = 6
#: pixels left of the plot (rank labels) and right of it
LEFT_PX, RIGHT_PX = 80, 30
#: the font size (points) of microbatch numbers and how wide one digit is (in em)
LABEL_PT, DIGIT_EM = 6.5, 0.62


def row_px(n: int) -> float:
    """Height in pixels of one rank row: 34 px up to 26 ranks, then shrinking so that the
    rows take about 900 px, never below 12 px (rank labels stay 5.5 pt or larger)."""
    return float(min(34.0, max(12.0, 900.0 / max(n, 1))))


def label_px(digits: int, dpi: float = DPI, fontsize: float = LABEL_PT) -> float:
    """Width in pixels a microbatch number of ``digits`` digits needs inside a box (with
    a margin, so that neighbouring numbers never touch)."""
    return DIGIT_EM * fontsize * dpi / 72 * digits + 7


@dataclass(frozen=True)
class Layout:
    """How a timeline is laid out: ``width``/``band_height`` in inches at ``dpi``;
    ``edges`` are the ``bands + 1`` band boundaries in time (``edges[0] = 0``,
    ``edges[-1]`` = the end of the time axis); ``px_per_unit``: pixels per time unit."""

    width: float
    band_height: float
    dpi: float
    edges: tuple[float, ...]
    px_per_unit: float
    row_px: float

    @property
    def bands(self) -> int:
        return len(self.edges) - 1


def typical_duration(durations: np.ndarray) -> float:
    """The op duration the layout makes readable: the 25th percentile of the nonzero
    durations (so a few tiny ops do not force a huge figure), 1.0 when there are none."""
    d = durations[durations > 0]
    return float(np.percentile(d, 25)) if d.size else 1.0


def plan(span_t: float, n_rows: int, durations: np.ndarray, digits: int, *,
         dpi: float = DPI, extra_px: float = 0.0, row: float | None = None,
         integral: bool = False, wrap: bool = True, width: float | None = None
         ) -> Layout:
    """Plan a figure for a time axis of length ``span_t`` and ``n_rows`` rank rows.

    ``durations``: op durations (to judge where microbatch numbers of ``digits`` digits
    fit); ``extra_px``: height per band besides the rows (time axis, memory panel);
    ``integral``: band edges on whole slots; ``wrap``: allow several bands; ``width``:
    force the width (inches; no wrapping). Returns a :class:`Layout`.
    """
    span_t = max(span_t, 1e-9)
    rp = row if row is not None else row_px(n_rows)
    band_px = n_rows * rp + extra_px
    max_plot = MAX_WIDTH_PX - LEFT_PX - RIGHT_PX
    if width is not None:
        plot_w = width * dpi - LEFT_PX - RIGHT_PX
        return Layout(width, band_px / dpi, dpi, (0.0, span_t), plot_w / span_t, rp)
    want = label_px(digits, dpi) / typical_duration(durations) * span_t
    bands = max(1, math.ceil(want / max_plot))
    fit = max(1, min(MAX_BANDS, int(MAX_HEIGHT_PX // max(band_px + 60, 1))))
    if bands > fit or not wrap:
        bands = 1
    if bands == 1:
        plot_w = min(max_plot, max(MIN_WIDTH_PX - LEFT_PX - RIGHT_PX, want))
        edges = (0.0, span_t)
    else:
        plot_w = max_plot
        step = span_t / bands
        if integral:
            step = float(math.ceil(step))
        edges = tuple(min(span_t, k * step) for k in range(bands)) + (span_t,)
    return Layout((plot_w + LEFT_PX + RIGHT_PX) / dpi, band_px / dpi, dpi, edges,
                  plot_w / (edges[1] - edges[0]), rp)


def wrap_title(text: str, width_in: float, fontsize: float = 10.0) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize`` points
    (existing line breaks kept), so that no title is clipped."""
    chars = max(20, int(width_in * 72 / (0.56 * fontsize)))
    out: list[str] = []
    for line in text.split("\n"):
        # break after "; ", " — " or ", " where possible, inside a phrase only if needed
        pieces = re.split(r"(?<=; )|(?<=— )|(?<=, )", line)
        cur = ""
        for piece in pieces:
            if cur and len(cur) + len(piece.rstrip()) > chars:
                out.append(cur.rstrip())
                cur = ""
            cur += piece
            while len(cur.rstrip()) > chars:
                head, *rest = textwrap.wrap(cur, chars, break_on_hyphens=False)
                out.append(head)
                cur = cur[len(head):].lstrip()
        out.append(cur.rstrip())
    return "\n".join(out)


def fit_title(ax: Any, text: str, fontsize: float = 10.0, width_in: float | None = None,
              **kw: Any) -> Any:
    """Set ``ax``'s title to ``text`` wrapped (:func:`wrap_title`) narrowly enough that
    the drawn title lies inside the figure: a title is centred on its axes, which need
    not be centred on the figure (the rank labels on the left), so a title as wide as the
    figure was clipped at one edge. The figure's layout engine (constrained) runs
    before each measure, as it will when drawn. The wrap width starts at ``width_in``
    (inches; default the figure's width) and shrinks by 15% until the title's box, as
    the renderer measures it, fits (at most 10 tries; the last is kept). User text is measured literally
    (:func:`schedsim.util.text.literal_text`). ``kw``: more ``set_title`` arguments.
    Returns the title."""
    from schedsim.util.text import literal_text

    fig = ax.figure
    width = fig.get_figwidth() if width_in is None else width_in
    for _ in range(10):
        t = ax.set_title(wrap_title(text, width, fontsize), fontsize=fontsize, **kw)
        literal_text(fig)                # measured as drawn: no mathtext, escapes shown
        engine = fig.get_layout_engine()
        if engine is not None:          # constrained layout moves the axes when drawn
            engine.execute(fig)
        box = t.get_window_extent()      # the figure's own renderer, at its dpi
        if box.x0 >= 0 and box.x1 <= fig.bbox.width:
            break
        width *= 0.85
    return t

"""Message arrows on a Gantt chart: one ``quiver`` for all of them, heads sized in pixels
so they read at any rank count, thinned (with a note) when there are too many to see."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.text import Text

from schedsim.analysis._index import message_consumer, rank_atom_index, recv_token
from schedsim.plot.boxes import PAD
from schedsim.plot.style import ARROW_READY, ARROW_WAITED
from schedsim.timeline import Message, Span, Timeline
from schedsim.util.units import fmt_time

#: most arrows drawn in one band; beyond it only the messages a receiver waited for are
#: drawn, and beyond that every k-th of those (the legend says so)
MAX_ARROWS = 600
#: outline colour of highlighted messages' producer and consumer boxes
HIGHLIGHT = "#111111"


def receiver_waited(tl: Timeline) -> list[bool]:
    """Per message: whether its receiver was blocked waiting for it.

    True when a blocking wait of the receiving rank names the message's recv (``WAIT``,
    ``COMMIT``, ``END``, or ``DATA`` under data semantics) and the message completed after
    the rank started waiting. Timelines without wait records (e.g. measured ones) give
    False for every message.
    """
    waits: dict[tuple[int, str], list[float]] = {}
    for w in tl.waits:
        for tok in w.comms:
            waits.setdefault((w.rank, tok), []).append(w.start)
    out = []
    for m in tl.messages:
        done = m.recv_done if m.recv_done is not None else m.arrival
        starts = waits.get((m.dst, recv_token(m)), ())
        out.append(done is not None and any(done > s + 1e-12 for s in starts))
    return out


@dataclass
class Arrows:
    """Every message as an arrow: from the transfer start on the sender's row edge to the
    consuming op's start on the receiver's row edge. Arrays of length M: ``x0, y0, x1,
    y1``, ``waited`` (bool), ``key`` (index into ``timeline.messages``)."""

    x0: np.ndarray
    y0: np.ndarray
    x1: np.ndarray
    y1: np.ndarray
    waited: np.ndarray
    key: np.ndarray


def message_arrows(tl: Timeline) -> Arrows:
    """The arrows of ``tl``'s messages (messages without times are left out)."""
    n = tl.ranks
    idx = rank_atom_index(tl)
    rows = []
    for i, (m, w) in enumerate(zip(tl.messages, receiver_waited(tl))):
        x0 = m.start if m.start is not None else m.send_done
        cons = message_consumer(m, idx)
        x1 = cons.start if cons is not None else (m.recv_done if m.recv_done is not None
                                                   else m.arrival)
        if x0 is None or x1 is None:
            continue
        ys, yd = n - 1 - m.src, n - 1 - m.dst
        down = yd < ys
        rows.append((x0, ys + (PAD if down else 1 - PAD), x1, yd + (1 - PAD if down else PAD),
                     w, i))
    if not rows:
        z = np.zeros(0)
        return Arrows(z, z, z, z, np.zeros(0, bool), np.zeros(0, np.int64))
    c = list(zip(*rows))
    return Arrows(*(np.asarray(v, float) for v in c[:4]), np.asarray(c[4], bool),
                  np.asarray(c[5], np.int64))


def thin(ar: Arrows, window: tuple[float, float], limit: int = MAX_ARROWS
         ) -> tuple[np.ndarray, str | None]:
    """Indices of the arrows to draw in ``window`` and a note when some were left out:
    all when at most ``limit`` fall in it; else those whose receiver waited; if still too
    many, every k-th of those."""
    t0, t1 = window
    inside = np.flatnonzero((np.maximum(ar.x0, ar.x1) >= t0) & (np.minimum(ar.x0, ar.x1) <= t1))
    if inside.size <= limit:
        return inside, None
    waited = inside[ar.waited[inside]]
    if waited.size <= limit:
        return waited, (f"arrows: only the {waited.size} of {inside.size} messages the "
                        f"receiver waited for")
    k = -(-waited.size // limit)
    nth = {2: "2nd", 3: "3rd"}.get(k, f"{k}th")
    return waited[::k], (f"arrows: every {nth} of the {waited.size} messages the receiver "
                         f"waited for (of {inside.size})")


def draw_arrows(ax: Axes, ar: Arrows, keep: np.ndarray, *, px_per_unit: float,
                row_px: float) -> dict[str, int]:
    """Draw the arrows ``keep`` selects as one quiver per colour (gid ``"arrows"``);
    returns ``{"waited": n, "ready": n}``. Heads and shafts are sized in pixels; a
    dense chart gets thinner shafts."""
    counts: dict[str, int] = {}
    dense = keep.size > 150 or row_px < 20
    for key, color, sel in (("ready", ARROW_READY, ~ar.waited[keep]),
                            ("waited", ARROW_WAITED, ar.waited[keep])):
        k = keep[sel]
        if not k.size:
            continue
        counts[key] = int(k.size)
        q = ax.quiver(ar.x0[k], ar.y0[k], ar.x1[k] - ar.x0[k], ar.y1[k] - ar.y0[k],
                      angles="xy", scale_units="xy", scale=1, units="dots",
                      width=0.9 if dense else 1.5, headwidth=6 if dense else 5.5,
                      headlength=7 if dense else 6.5, headaxislength=6 if dense else 5.5,
                      color=color, alpha=0.8, zorder=6, minlength=0.5)
        q.set_gid("arrows")
    return counts


@dataclass(frozen=True)
class HighlightView:
    """How the highlighted messages are shown: ``integral`` (unit slots: times read as
    ``T<n>``), the axes' height ``px_h`` and width ``px_w`` in pixels (None: unknown),
    and the shown time ``window`` (None: ``0..makespan``)."""

    integral: bool
    px_h: float
    window: tuple[float, float] | None = None
    px_w: float | None = None


def draw_highlight(ax: Axes, tl: Timeline, idx: dict, k: int, m: Message,
                   p0: tuple[float, float], p1: tuple[float, float], waited: bool,
                   cons: Span | None, view: HighlightView) -> None:
    """A highlighted message: producer and consumer boxes outlined, a bold arrow, and a
    label above the chart joined to the arrow by a thin line.

    The label is placed in axes coordinates, just right of the consumer's start but
    shifted left (and its font shrunk, down to 5 pt) so that it lies inside the shown
    time window (``view``: :class:`HighlightView`) of an axes ``px_w`` pixels wide: a label
    placed in data coordinates outside the window (an offset of 4% of a long run's
    makespan past a short window) made constrained layout reserve room for it until the
    axes collapsed. Its leader line ends at the arrow's middle, clamped into the window."""
    integral, px_h, window, px_w = view.integral, view.px_h, view.window, view.px_w
    n = tl.ranks
    x0, x1 = p0[0], p1[0]
    prod = idx.get((m.src, "F" if m.kind == "F" else "B", m.stage, m.mb))
    if prod is None and m.kind == "B":
        prod = idx.get((m.src, "BW", m.stage, m.mb))
    for sp in (prod, cons):
        if sp is not None:
            ax.add_patch(Rectangle((sp.start, n - 1 - sp.rank + PAD / 2), sp.end - sp.start,
                                   1 - PAD, facecolor="none", edgecolor=HIGHLIGHT,
                                   linewidth=2.4, zorder=7, gid="highlight-box"))
    ax.add_patch(FancyArrowPatch(p0, p1, arrowstyle="-|>", mutation_scale=16,
                                 color=HIGHLIGHT, linewidth=2.6, zorder=8,
                                 shrinkA=0, shrinkB=0, gid="highlight"))
    what = "activation" if m.kind == "F" else "input grad"
    if integral and float(x0).is_integer() and float(x1).is_integer():
        when = f"sent at the end of T{int(x0) - 1}, used at T{int(x1)}"
    else:
        when = f"sent t={fmt_time(x0)}, used t={fmt_time(x1)}"
    wait = "receiver waited" if waited else "data was ready"
    t0, t1 = window if window is not None else (0.0, max(tl.makespan, 1e-9))
    span = max(t1 - t0, 1e-9)
    mid = min(max((p0[0] + p1[0]) / 2, t0), t1)
    ann = ax.annotate(f"{what} of mb {m.mb}: rank {m.src} → rank {m.dst}, {when} ({wait})",
                      xy=(mid, (p0[1] + p1[1]) / 2), xycoords="data",
                      xytext=(0.0, 1.0 + (3 + 19 * k) * ax.figure.dpi / 72 / px_h),
                      textcoords="axes fraction", fontsize=8, va="bottom",
                      ha="left", zorder=9, annotation_clip=False,
                      bbox=dict(boxstyle="round,pad=0.25", fc="#fff8e1", ec=HIGHLIGHT,
                                lw=1.0),
                      arrowprops=dict(arrowstyle="-", color=HIGHLIGHT, lw=0.8,
                                      linestyle=(0, (3, 2)), shrinkA=0, shrinkB=2))
    place_label(ann, (x1 - t0) / span + 0.02, px_w)


def label_width_px(ann: Any) -> float:
    """The drawn width in pixels of annotation ``ann``'s text with its box (its leader
    line left out), as the figure's renderer measures it."""
    fig = ann.figure
    pad = ann.get_bbox_patch().get_boxstyle().pad * ann.get_fontsize() * fig.dpi / 72
    return float(Text.get_window_extent(ann).width + 2 * pad + 2)


def place_label(ann: Any, want: float, px_w: float | None) -> None:
    """Put annotation ``ann`` (``ha="left"``, x in axes fraction) at axes fraction
    ``want`` or as far right of it as keeps the whole label inside the axes ``px_w``
    pixels wide (default: the axes' current width); a label wider than 98% of the axes
    gets a smaller font (not under 5 pt) first."""
    ax = ann.axes
    if px_w is None:
        px_w = ax.get_window_extent().width
    px_w = max(float(px_w), 1.0)
    w = label_width_px(ann)
    while w > 0.98 * px_w and ann.get_fontsize() > 5:
        ann.set_fontsize(max(5.0, ann.get_fontsize() * px_w * 0.98 / w))
        w = label_width_px(ann)
    frac = min(max(want, 0.0), max(1.0 - w / px_w, 0.0))
    ann.set_position((frac, ann.get_position()[1]))


def draw_highlights(ax: Axes, tl: Timeline, ar: Arrows,
                    hl: set[tuple[str, int, int, int]], integral: bool, px_h: float,
                    window: tuple[float, float] | None = None, px_w: float | None = None
                    ) -> None:
    """Draw the highlighted messages ``(kind, src, dst, mb)`` (see :func:`draw_highlight`;
    ``window``, ``px_w``: the shown time range and the axes' width in pixels), labels
    stacked in time order."""
    idx = rank_atom_index(tl)
    found = []
    for j, i in enumerate(ar.key):
        m = tl.messages[int(i)]
        if (m.kind, m.src, m.dst, m.mb) in hl:
            found.append((ar.x0[j], m.src, m, (ar.x0[j], ar.y0[j]), (ar.x1[j], ar.y1[j]),
                          bool(ar.waited[j]), message_consumer(m, idx)))
    found.sort(key=lambda f: (f[0], f[1]))
    for k, (_, _, m, p0, p1, waited, cons) in enumerate(found):
        draw_highlight(ax, tl, idx, k, m, p0, p1, waited, cons,
                       HighlightView(integral, px_h, window, px_w))

"""Where the ranks of a deadlocked run are stuck, on its Gantt chart: a red bar at the
time each blocked rank stopped and the instruction it waits at, its label right of the
bar, in time the chart adds after the run's end for it (:func:`with_stuck_room`)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from schedsim.plot.boxes import PAD
from schedsim.plot.style import ARROW_WAITED

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from schedsim.plot.layout import Layout
    from schedsim.timeline import Timeline


def rank_fontsize(px_row: float, dpi: float) -> float:
    """Points for the rank labels (and a deadlock's) of rows ``px_row`` pixels high."""
    return max(5.5, min(9.0, px_row * 0.45 * 72 / dpi))


def _stuck_text(b: Any) -> str:
    return f"stuck at {b.instruction} (instr {b.index})"


def _label_px(text: str, fontsize: float, dpi: float) -> float:
    """About how many pixels ``text`` and a space each side take at ``fontsize`` points
    (0.6 em a character)."""
    return (len(text) + 2) * 0.6 * fontsize * dpi / 72.0


def stuck_room(tl: Timeline, width_px: float, span: float, fontsize: float, dpi: float
               ) -> float:
    """Time units to add after the end of a deadlocked ``tl``'s chart (``span`` long,
    ``width_px`` wide) so that the longest "stuck at" label fits right of its bar, off
    the ops; 0 without a deadlock or when the label would take half the width."""
    if tl.deadlock is None or not tl.deadlock.blocked:
        return 0.0
    label_px = max(_label_px(_stuck_text(b), fontsize, dpi) for b in tl.deadlock.blocked)
    if label_px >= 0.5 * width_px:
        return 0.0
    return label_px * span / (width_px - label_px)


def draw_stuck(ax: Axes, tl: Timeline, ranks: Sequence[int], n: int,
                window: tuple[float, float], fontsize: float, px_x: float) -> int:
    """Where each blocked rank of a deadlocked ``tl`` is stuck: a red bar at the time it
    blocked and the instruction it waits at (gids ``deadlock``, ``deadlock-label``),
    right of the bar where it fits in the window (``px_x``: pixels a time unit), else
    left of it; returns how many ranks were marked."""
    row = {r: i for i, r in enumerate(ranks)}
    done = 0
    t0, t1 = window
    dpi = ax.figure.dpi
    for b in (tl.deadlock.blocked if tl.deadlock is not None else []):
        if b.rank not in row or not t0 <= b.since <= t1:
            continue
        y = n - 1 - row[b.rank]
        ax.plot([b.since, b.since], [y + PAD, y + 1 - PAD], color=ARROW_WAITED, lw=2.4,
                solid_capstyle="butt", zorder=6, gid="deadlock")
        text = _stuck_text(b)
        width = _label_px(text, fontsize, dpi) / max(px_x, 1e-9)
        right = b.since + width > t1
        ax.text(b.since, y + 0.5, f"{' ' if not right else ''}{text}{' ' if right else ''}",
                ha="right" if right else "left",
                va="center", fontsize=fontsize, color=ARROW_WAITED, zorder=6,
                clip_on=True, gid="deadlock-label",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                      "alpha": 0.85})
        done += 1
    return done


def with_stuck_room(lay: "Layout", tl: "Timeline", margin_px: float) -> "Layout":
    """``lay`` (one band) with its end moved right by :func:`stuck_room` of ``tl``
    (``margin_px``: the pixels of the figure's width not in the axes)."""
    e0, e1 = lay.edges[0], lay.edges[-1]
    room = stuck_room(tl, lay.width * lay.dpi - margin_px, e1 - e0,
                      rank_fontsize(lay.row_px, lay.dpi), lay.dpi)
    return replace(lay, edges=(e0, e1 + room))

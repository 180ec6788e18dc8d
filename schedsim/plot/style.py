"""Colours, hatches, titles and time axes shared by every schedsim figure."""
from __future__ import annotations

import colorsys
import math
from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.colors import to_rgb

from schedsim.timeline import Timeline
from schedsim.util.units import fmt_bubble, with_unit

#: base colour per compute kind (colour-blind-safe palette); FB is drawn as its two parts
KIND_COLORS = {
    "F": "#4C72B0",   # blue
    "B": "#55A868",   # green
    "W": "#DD8452",   # orange
    "BW": "#8172B3",  # purple
}
KIND_NAMES = {"F": "F (forward)", "B": "B (input grad)", "W": "W (weight grad)",
              "BW": "BW (full backward)"}
#: background of the rows: idle time shows as this grey
IDLE_COLOR = "#f4f4f4"

#: (hatch, colour) per stall cause of :func:`schedsim.analysis.stalls.attribute_stalls`;
#: unknown causes get :data:`OTHER_STALL`
STALL_STYLES = {
    "warmup": ("//", "#9e9e9e"),
    "cooldown": ("\\\\", "#9e9e9e"),
    "wait-recv": ("xx", "#d62728"),
    "wait-send": ("..", "#e377c2"),
    "wait-batch": ("++", "#bcbd22"),
    "head-of-line": ("oo", "#17becf"),
    "transfer": ("||", "#1f77b4"),
    "deadlock": ("xxxx", "#000000"),
    "host": ("--", "#8c564b"),
}
OTHER_STALL = ("--", "#7f7f7f")
#: arrow colours: the receiver had to wait for the message, or the data was there first
ARROW_WAITED = "#d62728"
ARROW_READY = "#555555"


def stall_style(cause: str) -> tuple[str, str]:
    """``(hatch, colour)`` for a stall cause."""
    return STALL_STYLES.get(cause, OTHER_STALL)


def shade(color: str, chunk: int, chunks: int = 2) -> tuple[float, float, float]:
    """Colour for a chunk/direction: chunk 0 as is, later chunks progressively lighter.

    ``chunks`` is the number of chunks in the figure. Two chunks: one step of 0.24 in
    lightness. Three or more: steps within 0.22 of the base lightness (at most 0.76), so
    every chunk keeps its kind's hue (light F and light BW stay blue and purple); the
    chunks are told apart by their hatching too (:func:`chunk_hatch`).
    """
    r, g, b = to_rgb(color)
    h, l_, s = colorsys.rgb_to_hls(r, g, b)
    if chunks <= 2:
        l_ = min(0.85, l_ + 0.24 * chunk)
    else:
        l_ = min(0.76, l_ + 0.22 * min(chunk, chunks - 1) / (chunks - 1))
    return colorsys.hls_to_rgb(h, l_, s)


#: hatch per chunk in a figure with 3 or more chunks (chunk 0 plain)
CHUNK_HATCHES = ("", "////", "....", "xxxx", "\\\\\\\\", "++++", "oooo", "----")
#: colour of the chunk hatching (dark, translucent: reads on every kind's shades)
CHUNK_HATCH_COLOR = (0.0, 0.0, 0.0, 0.38)


def chunk_hatch(chunk: int, chunks: int) -> str:
    """The hatch of ``chunk`` in a figure of ``chunks`` chunks: none below 3 chunks
    (lightness alone tells two apart), else :data:`CHUNK_HATCHES` (cycled)."""
    if chunks < 3 or chunk <= 0:
        return ""
    return CHUNK_HATCHES[1 + (chunk - 1) % (len(CHUNK_HATCHES) - 1)]


def chunk_handles(kinds: Sequence[str], chunks: Sequence[int], nchunks: int,
                  word: str = "chunk") -> list:
    """Legend entries for the chunks (``word``: chunk or direction) of a figure: below 3
    chunks one grey shade per chunk; from 3 on one entry per kind and chunk, in the
    kind's shade with the chunk's hatch (these replace the kinds' own entries:
    :func:`per_kind_chunks`), each marked with its kind (``legend_row``) so that the
    legend gives every kind a row and every chunk a column."""
    from matplotlib.patches import Patch

    if not per_kind_chunks(nchunks):
        return [Patch(facecolor=shade("#666666", c, nchunks), label=f"{word} {c}")
                for c in chunks]
    out = []
    for k in kinds:
        if k not in KIND_COLORS:
            continue
        for c in chunks:
            p = Patch(facecolor=shade(KIND_COLORS[k], c, nchunks),
                      hatch=chunk_hatch(c, nchunks), edgecolor=CHUNK_HATCH_COLOR, linewidth=0,
                      label=f"{KIND_NAMES[k]}, {word} {c}" if c == min(chunks) else
                      f"{k} {word} {c}")
            p.legend_row = k        # one legend row per kind (plot.gantt.legend_grid)
            out.append(p)
    return out


def per_kind_chunks(nchunks: int) -> bool:
    """Whether a legend of ``nchunks`` chunks has one entry per kind and chunk (3 or
    more) instead of one per kind and one grey shade per chunk."""
    return nchunks >= 3


def text_color(rgb: Sequence[float]) -> str:
    """Black or white, whichever reads better on ``rgb`` (relative luminance)."""
    r, g, b = rgb[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def is_integral(tl: Timeline) -> bool:
    """True when every span starts and ends on a whole number (slot diagrams)."""
    return all(float(s.start).is_integer() and float(s.end).is_integer() for s in tl.spans)


def unit_label(tl: Timeline, value: float) -> str:
    """``value`` with the timeline's unit (``66 slots``, ``12.5 ms``;
    :func:`schedsim.util.units.with_unit`)."""
    return with_unit(value, tl.unit)


def default_title(tl: Timeline) -> str:
    """Schedule, ranks, microbatches, semantics, makespan and bubble ratio; for a
    deadlocked run, the blocked ranks instead of a makespan."""
    stream = "" if tl.comm_stream == "none" else f", {tl.comm_stream} stream"
    how = (f"measured on {tl.semantics}" if tl.source == "measured"
           else f"{tl.semantics} semantics")
    head = f"{tl.schedule}: {tl.ranks} ranks, {tl.microbatches} microbatches, {how}{stream}"
    if tl.deadlock is not None:         # no makespan: what ran before the program hung
        blocked = ", ".join(str(b.rank) for b in tl.deadlock.blocked)
        return f"{head} — DEADLOCK (blocked ranks {blocked}); what ran before it"
    return (f"{head} — makespan {unit_label(tl, tl.makespan)}, bubble "
            f"{fmt_bubble(tl.bubble_ratio())}")


def _nice_step(raw: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, ... at least ``raw``."""
    base = 1
    while True:
        for m in (1, 2, 5, 10, 20, 25, 50):
            if base * m >= raw:
                return base * m
        base *= 100


def time_axis(ax: Axes, tl: Timeline, window: float | tuple[float, float], integral: bool,
              *, labels: bool = True, fontsize: float = 7.0, px: float | None = None
              ) -> None:
    """The time axis of ``window`` (``(t0, t1)``, or its length from 0): slot labels
    ``T0, T1, ...`` centred on each slot when the times are whole numbers and the window
    holds at most 2000 slots, a label every ~55 px (``px``: the axes width in pixels,
    default from the figure), grid lines per slot while slots are 6 px or wider; else a
    plain time axis in the unit."""
    t0, t1 = (0.0, float(window)) if not isinstance(window, tuple) else window
    span = max(t1 - t0, 1e-9)
    if px is None:
        px = ax.figure.get_figwidth() * ax.figure.dpi * 0.85
    if integral and span <= 2000:
        first, last = int(math.floor(t0)), int(math.ceil(t1))
        step = _nice_step(span / max(2.0, px / 55))
        ticks = [t for t in range((first // step) * step, last, step) if t >= first]
        ax.set_xticks([t + 0.5 for t in ticks],
                      [f"T{t}" for t in ticks] if labels else [], fontsize=fontsize)
        minor = range(first, last + 1) if px / span >= 6 else ticks
        ax.set_xticks(list(minor), minor=True)
        ax.grid(axis="x", which="minor", color="#d9d9d9", linewidth=0.4)
        ax.tick_params(axis="x", which="both", length=0)
        if labels:
            ax.set_xlabel("time slot (1 slot = 1 unit of cost)", fontsize=8)
    else:
        ax.grid(axis="x", which="major", color="#d9d9d9", linewidth=0.4)
        ax.tick_params(axis="x", labelsize=fontsize)
        if not labels:
            ax.tick_params(axis="x", labelbottom=False)
        else:
            ax.set_xlabel(f"time ({tl.unit})", fontsize=8)
    ax.set_axisbelow(True)

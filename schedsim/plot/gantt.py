"""The Gantt chart: one row per rank, one box per compute span, optional message arrows,
stall hatching and memory panel.

Drawing model (what the tests count): every compute span is **one box** in the
``PatchCollection`` with gid ``"ops"``; an ``FB`` span's box is drawn as its **two
halves** (forward part on top, backward part below), i.e. two rectangles sharing the
span's x-extent and row, plus one outline in the collection with gid ``"fb-outline"``.
So ``len(ops paths) == spans + FB spans`` and the number of distinct
``(row, start, end)`` boxes equals the number of compute spans.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from schedsim.analysis._index import message_consumer, rank_atom_index, recv_token
from schedsim.analysis.stalls import stalls_of
from schedsim.plot.style import (
    ARROW_READY,
    ARROW_WAITED,
    IDLE_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    default_title,
    fmt_time,
    is_integral,
    shade,
    stall_style,
    text_color,
    time_axis,
)
from schedsim.timeline import Message, Span, Timeline

#: vertical padding of a box inside its row (fraction of the row height)
PAD = 0.07
#: above this many messages, arrows are drawn as plain lines (no heads) for speed
MAX_ARROW_HEADS = 1500
#: outline colour of highlighted messages' producer and consumer boxes
HIGHLIGHT = "#111111"


@dataclass
class GanttInfo:
    """What :func:`draw_gantt` drew (used to build legends)."""

    kinds: set[str] = field(default_factory=set)
    chunks: set[int] = field(default_factory=set)
    has_fb: bool = False
    stall_causes: list[str] = field(default_factory=list)
    arrows: dict[str, int] = field(default_factory=dict)
    labels: int = 0


def _atoms(span: Span) -> list[tuple[str, int, int, int]]:
    """``(kind, chunk, mb, stage)`` of each drawn half (FB: forward part, backward part)."""
    if span.parts:
        return [(p.kind, p.chunk, p.mb, p.stage) for p in span.parts]
    return [(span.kind, span.chunk, span.mb, span.stage)]


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


def get_stalls(tl: Timeline, stalls: Any) -> list[Any]:
    """Normalise a ``stalls`` argument (:func:`schedsim.analysis.stalls.stalls_of`)."""
    return stalls_of(tl, stalls)


def draw_gantt(ax: Axes, tl: Timeline, *, px_size: tuple[float, float],
               label_mb: bool = True, arrows: bool = False,
               highlight: Iterable[tuple[str, int, int, int]] = (),
               stalls: Sequence[Any] = (), xmax: float | None = None,
               time_labels: bool = True) -> GanttInfo:
    """Draw ``tl`` as a Gantt chart on ``ax`` (rank 0 on top).

    ``px_size`` is the axes' approximate size in pixels (for deciding where microbatch
    numbers fit). ``highlight``: messages ``(kind, src, dst, mb)`` whose arrows are drawn
    bold and annotated (implies arrows for them). ``stalls``: objects with ``rank, start,
    end, cause`` drawn hatched by cause. Returns what was drawn (:class:`GanttInfo`).
    """
    info = GanttInfo()
    n = tl.ranks
    span_t = max(xmax if xmax is not None else tl.makespan, 1e-9)
    integral = is_integral(tl)
    chunks = sorted({c for s in tl.spans for _, c, _, _ in _atoms(s)}) or [0]
    nchunks = max(chunks) + 1
    px_x = px_size[0] / span_t
    px_row = px_size[1] / max(n, 1)
    dpi = ax.figure.dpi
    fontsize = max(4.5, min(9.0, px_row * 0.30 * 72 / dpi))
    char_px = 0.62 * fontsize * dpi / 72
    line_px = 1.15 * fontsize * dpi / 72
    min_w = min((s.end - s.start for s in tl.spans if s.end > s.start), default=1.0)
    edge = 0.5 if min_w * px_x >= 4 else 0.0

    label_len = len(str(max((s.mb for s in tl.spans), default=0)))
    rects, colors, fb_rects = [], [], []
    for s in tl.spans:
        y0 = n - 1 - s.rank
        width = s.end - s.start
        parts = _atoms(s)
        h = (1 - 2 * PAD) / len(parts)
        info.has_fb |= len(parts) > 1
        for j, (kind, chunk, mb, _stage) in enumerate(parts):
            info.kinds.add(kind)
            info.chunks.add(chunk)
            # FB: part 0 (forward) on top, part 1 (backward) below
            yb = y0 + PAD + (len(parts) - 1 - j) * h
            color = shade(KIND_COLORS.get(kind, "#999999"), chunk, nchunks)
            rects.append(Rectangle((s.start, yb), width, h))
            colors.append(color)
            if label_mb:
                text = str(mb)
                # judge by the longest label, so that boxes of one size are all labelled
                # or none is (no "only mb < 10 labelled" patterns)
                if (width * px_x >= char_px * label_len + 3
                        and h * px_row >= line_px):
                    ax.text(s.start + width / 2, yb + h / 2, text, ha="center",
                            va="center", fontsize=fontsize, color=text_color(color),
                            zorder=4)
                    info.labels += 1
        if len(parts) > 1:
            fb_rects.append(Rectangle((s.start, y0 + PAD), width, 1 - 2 * PAD))
    ops = PatchCollection(rects, facecolors=colors, edgecolors="white", linewidths=edge,
                          zorder=3)
    ops.set_gid("ops")
    ax.add_collection(ops)
    if fb_rects:
        outline = PatchCollection(fb_rects, facecolors="none", edgecolors="#222222",
                                  linewidths=0.8 if edge else 0.4, zorder=3.5)
        outline.set_gid("fb-outline")
        ax.add_collection(outline)

    if stalls:
        by_cause: dict[str, list[Rectangle]] = {}
        for st in stalls:
            if st.end <= st.start:
                continue
            y0 = n - 1 - st.rank
            by_cause.setdefault(st.cause, []).append(
                Rectangle((st.start, y0 + PAD), st.end - st.start, 1 - 2 * PAD))
        for cause, rs in by_cause.items():
            hatch, color = stall_style(cause)
            pc = PatchCollection(rs, facecolors="none", edgecolors=color, linewidths=0.0,
                                 hatch=hatch, zorder=2)
            pc.set_gid(f"stall-{cause}")
            ax.add_collection(pc)
        info.stall_causes = list(by_cause)

    hl = set(highlight)
    if arrows or hl:
        _draw_arrows(ax, tl, arrows, hl, integral, info, px_size[1])

    ax.set_xlim(0, span_t)
    ax.set_ylim(0, n)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)],
                  fontsize=max(4.5, min(9.0, px_row * 0.45 * 72 / dpi)))
    ax.tick_params(axis="y", length=0)
    time_axis(ax, tl, span_t, integral, labels=time_labels)
    ax.set_facecolor(IDLE_COLOR)
    for sp in ax.spines.values():
        sp.set_visible(False)
    return info


def _draw_arrows(ax: Axes, tl: Timeline, all_arrows: bool,
                 hl: set[tuple[str, int, int, int]], integral: bool,
                 info: GanttInfo, px_h: float) -> None:
    n = tl.ranks
    idx = rank_atom_index(tl)
    waited = receiver_waited(tl)
    todo = [(m, w) for m, w in zip(tl.messages, waited)
            if all_arrows or (m.kind, m.src, m.dst, m.mb) in hl]
    heads = len(todo) <= MAX_ARROW_HEADS
    plain: list[tuple[list[tuple[float, float]], str]] = []
    highlighted: list[tuple] = []
    for m, w in todo:
        x0 = m.start if m.start is not None else m.send_done
        cons = message_consumer(m, idx)
        x1 = cons.start if cons is not None else (m.recv_done if m.recv_done is not None
                                                   else m.arrival)
        if x0 is None or x1 is None:
            continue
        ys, yd = n - 1 - m.src, n - 1 - m.dst
        down = yd < ys
        p0 = (x0, ys + (PAD if down else 1 - PAD))
        p1 = (x1, yd + (1 - PAD if down else PAD))
        color = ARROW_WAITED if w else ARROW_READY
        key = "waited" if w else "ready"
        info.arrows[key] = info.arrows.get(key, 0) + 1
        if (m.kind, m.src, m.dst, m.mb) in hl:
            highlighted.append((m, p0, p1, color, x0, x1, cons))
        elif heads:
            ax.add_patch(FancyArrowPatch(p0, p1, arrowstyle="-|>", mutation_scale=6,
                                         color=color, linewidth=0.6, alpha=0.75,
                                         zorder=6, shrinkA=0, shrinkB=0, gid="arrow"))
        else:
            plain.append(([p0, p1], color))
    if plain:
        lc = LineCollection([p for p, _ in plain], colors=[c for _, c in plain],
                            linewidths=0.4, alpha=0.6, zorder=6)
        lc.set_gid("arrows")
        ax.add_collection(lc)
    highlighted.sort(key=lambda h: (h[4], h[0].src))
    for k, (m, p0, p1, color, x0, x1, cons) in enumerate(highlighted):
        _draw_highlight(ax, tl, idx, k, m, p0, p1, color, x0, x1, cons, integral, px_h)


def _draw_highlight(ax: Axes, tl: Timeline, idx: dict, k: int, m: Message,
                    p0: tuple[float, float], p1: tuple[float, float], color: str,
                    x0: float, x1: float, cons: Span | None, integral: bool,
                    px_h: float) -> None:
    """A highlighted message: producer and consumer boxes outlined, a bold arrow, and a
    label above the chart joined to the arrow by a thin line."""
    n = tl.ranks
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
    wait = "receiver waited" if color == ARROW_WAITED else "data was ready"
    ax.annotate(f"{what} of mb {m.mb}: rank {m.src} → rank {m.dst}, {when} ({wait})",
                xy=((p0[0] + p1[0]) / 2, (p0[1] + p1[1]) / 2), xycoords="data",
                xytext=(x1 + 0.04 * tl.makespan, 1.0 + (3 + 19 * k) * ax.figure.dpi / 72 / px_h),
                textcoords=("data", "axes fraction"), fontsize=8, va="bottom",
                ha="left", zorder=9, annotation_clip=False,
                bbox=dict(boxstyle="round,pad=0.25", fc="#fff8e1", ec=HIGHLIGHT, lw=1.0),
                arrowprops=dict(arrowstyle="-", color=HIGHLIGHT, lw=0.8,
                                linestyle=(0, (3, 2)), shrinkA=0, shrinkB=2))


def legend_handles(info: GanttInfo, tl: Timeline) -> list[Any]:
    """Legend entries for what :func:`draw_gantt` drew."""
    handles: list[Any] = [Patch(facecolor=KIND_COLORS[k], label=KIND_NAMES[k])
                          for k in ("F", "B", "W", "BW") if k in info.kinds]
    if info.has_fb:
        handles.append(Patch(facecolor="white", edgecolor="#222222",
                             label="FB: F (top) + backward (bottom)"))
    if len(info.chunks) > 1:
        word = "direction" if tl.placement == "dual" else "chunk"
        nch = max(info.chunks) + 1
        for c in sorted(info.chunks):
            handles.append(Patch(facecolor=shade("#666666", c, nch), label=f"{word} {c}"))
    for cause in info.stall_causes:
        hatch, color = stall_style(cause)
        handles.append(Patch(facecolor=IDLE_COLOR, edgecolor=color, hatch=hatch,
                             linewidth=0, label=f"stall: {cause}"))
    if info.arrows.get("waited"):
        handles.append(Line2D([], [], color=ARROW_WAITED, lw=1.5,
                              label="message: receiver waited"))
    if info.arrows.get("ready"):
        handles.append(Line2D([], [], color=ARROW_READY, lw=1.5,
                              label="message: data was ready"))
    handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#bbbbbb", label="idle"))
    return handles


def row_major(handles: list[Any], ncol: int) -> list[Any]:
    """Reorder legend entries so that matplotlib's column-first layout reads row by
    row."""
    rows = -(-len(handles) // ncol)
    grid = [handles[i:i + ncol] for i in range(0, len(handles), ncol)]
    return [grid[r][c] for c in range(ncol) for r in range(rows) if c < len(grid[r])]


def legend_columns(count: int, width: float) -> int:
    """Columns for a legend of ``count`` entries under a ``width``-inch figure, balanced
    so that every row holds about as many entries."""
    most = max(1, int(width / 2.0))
    rows = -(-count // most)
    return max(1, -(-count // rows))


def auto_width(tl: Timeline) -> float:
    """Figure width in inches: ~0.3 in per slot (or per op of the busiest rank when the
    times are not whole numbers), between 8 and 28."""
    if is_integral(tl):
        w = 0.3 * tl.makespan + 1.5
    else:
        per_rank = [0] * max(tl.ranks, 1)
        for s in tl.spans:
            per_rank[s.rank] += 1
        w = 0.3 * max(per_rank) + 1.5
    return min(28.0, max(8.0, w))


def row_height(n: int) -> float:
    """Height in inches of the rank rows of one Gantt axes."""
    return min(22.0, max(1.4, 0.36 * n + 0.4))


def gantt(tl: Timeline, *, title: str | None = None, width: float | None = None,
          dpi: float = 110, label_mb: bool = True, arrows: bool = False,
          highlight: Iterable[tuple[str, int, int, int]] = (), stalls: Any = None,
          memory: Any = None, legend: bool = True, detail: bool = False) -> Figure:
    """Gantt chart of a timeline; returns the Figure (nothing shown or saved).

    - rows per rank (rank 0 on top); a colour per kind (:data:`KIND_COLORS`), later
      chunks/directions lighter; ``FB`` as two halves (forward on top) with a dark outline;
      microbatch numbers where they fit (``label_mb``);
    - ``T0, T1, ...`` slot labels when all times are whole numbers, else a time axis in
      the timeline's unit;
    - ``arrows``: one arrow per message from the transfer start on the sender to the start
      of the consuming op on the receiver, red when the receiver had to wait
      (:func:`receiver_waited`), grey when the data was there first; ``highlight``: a list
      of ``(kind, src, dst, mb)`` messages drawn bold and annotated;
    - ``stalls``: True to hatch the analysis' stalls
      (:func:`schedsim.analysis.stalls.attribute_stalls`) by cause, or a list of stalls;
    - ``memory``: True or a :class:`~schedsim.analysis.memory.MemoryModel` (or preset name) to add
      an activation-memory panel per rank below, on the same time axis;
    - ``detail``: draw each op's compute and collective pieces (a timeline with
      ``pieces``, see :mod:`schedsim.plot.detail`);
    - title: schedule, ranks, microbatches, semantics, makespan and bubble ratio.

    Size: ~0.3 in per slot (8 to 28 in wide), ~0.36 in per rank, ``dpi`` 110.
    """
    from schedsim.plot.memory import draw_memory, memory_height, resolve_model

    n = tl.ranks
    width = width or auto_width(tl)
    gh = row_height(n)
    mh = memory_height(n) if memory else 0.0
    highlight = list(highlight)
    fig = Figure(figsize=(width, gh + mh + 1.1 + 0.3 * len(highlight)), dpi=dpi,
                 layout="constrained")
    if memory:
        ax, axm = fig.subplots(2, 1, sharex=True, height_ratios=[gh, mh])
    else:
        ax, axm = fig.add_subplot(), None
    info = draw_gantt(ax, tl, px_size=(width * dpi * 0.88, gh * dpi * 0.92),
                      label_mb=label_mb, arrows=arrows, highlight=highlight,
                      stalls=get_stalls(tl, stalls), time_labels=axm is None)
    if axm is not None:
        draw_memory(axm, tl, resolve_model(memory), xmax=tl.makespan)
        time_axis(axm, tl, max(tl.makespan, 1e-9), is_integral(tl))
    # highlighted messages' labels sit between the chart and its title
    ax.set_title(title if title is not None else default_title(tl), fontsize=10,
                 pad=6 + 19 * len(set(highlight)))
    extra: list[Any] = []
    if detail:
        from schedsim.plot.detail import draw_detail

        extra = draw_detail(ax, tl, PAD)
    if legend:
        handles = legend_handles(info, tl) + extra
        ncol = legend_columns(len(handles), width)
        fig.legend(handles=row_major(handles, ncol), loc="outside lower center", ncol=ncol,
                   fontsize=8, frameon=False)
    return fig

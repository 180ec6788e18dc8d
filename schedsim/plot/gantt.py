"""The Gantt chart: one row per rank, one box per compute span, optional message arrows,
stall hatching and memory panel; long timelines wrap into bands (:mod:`.layout`).

Every band draws its boxes as one ``PolyCollection`` (gid ``"ops"``, :mod:`.boxes`), so
1F1B on 64 ranks x 1024 microbatches (131,072 spans) draws in about a second.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from schedsim.analysis.stalls import stalls_of
from schedsim.plot.arrows import (
    Arrows,
    draw_arrows,
    draw_highlights,
    message_arrows,
    receiver_waited,
    thin,
)
from schedsim.plot.boxes import (
    KINDS,
    PAD,
    Boxes,
    box_colors,
    draw_boxes,
    draw_chunk_hatches,
    draw_fb_outlines,
    draw_labels,
    in_window,
    rect_verts,
    span_boxes,
)
from schedsim.plot.layout import DPI, LEFT_PX, RIGHT_PX, Layout, fit_title, plan
from schedsim.plot.stuck import draw_stuck, rank_fontsize, with_stuck_room
from schedsim.plot.style import (
    ARROW_READY,
    ARROW_WAITED,
    IDLE_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    chunk_handles,
    default_title,
    per_kind_chunks,
    stall_style,
    time_axis,
)
from schedsim.timeline import Timeline
from schedsim.util.text import literal_text
from schedsim.util.units import fmt_time, with_unit

__all__ = ["GanttInfo", "draw_gantt", "gantt", "receiver_waited", "legend_handles",
           "legend_columns", "legend_grid", "row_major", "get_stalls", "boxes_integral"]

#: pixels per band for the time axis and its label
AXIS_PX = 42


@dataclass
class GanttInfo:
    """What :func:`draw_gantt` drew (used to build legends and notes)."""

    kinds: set[str] = field(default_factory=set)
    chunks: set[int] = field(default_factory=set)
    has_fb: bool = False
    stall_causes: list[str] = field(default_factory=list)
    arrows: dict[str, int] = field(default_factory=dict)
    labels: int = 0
    notes: list[str] = field(default_factory=list)
    stuck: int = 0
    nchunks: int = 1

    def merge(self, other: "GanttInfo") -> None:
        self.stuck = max(self.stuck, other.stuck)
        self.nchunks = max(self.nchunks, other.nchunks)
        self.kinds |= other.kinds
        self.chunks |= other.chunks
        self.has_fb |= other.has_fb
        self.stall_causes += [c for c in other.stall_causes if c not in self.stall_causes]
        for k, v in other.arrows.items():
            self.arrows[k] = self.arrows.get(k, 0) + v
        self.labels += other.labels
        self.notes += [x for x in other.notes if x not in self.notes]


def get_stalls(tl: Timeline, stalls: Any) -> list[Any]:
    """Normalise a ``stalls`` argument (:func:`schedsim.analysis.stalls.stalls_of`)."""
    return stalls_of(tl, stalls)


def boxes_integral(bx: Boxes) -> bool:
    """True when every box starts and ends on a whole number (a slot diagram)."""
    return bool(np.all(np.mod(bx.x0, 1) == 0) and np.all(np.mod(bx.x1, 1) == 0))


def _nchunks(bx: Boxes) -> int:
    return int(bx.chunk.max()) + 1 if len(bx) else 1


@dataclass(frozen=True)
class _Stall:
    rank: int
    start: float
    end: float
    cause: str


def _rows_of(bx: Boxes, stalls: Sequence[Any], ranks: Sequence[int]
             ) -> tuple[Boxes, list[Any]]:
    """The boxes and stalls of ``ranks`` only, each moved to its row (``ranks[i]`` is
    drawn in row ``i``)."""
    row = {r: i for i, r in enumerate(ranks)}
    lookup = np.full(int(bx.rank.max(initial=0)) + 1, -1, np.int64)
    for r, i in row.items():
        if r < lookup.size:
            lookup[r] = i
    sel = bx.select(lookup[bx.rank] >= 0) if len(bx) else bx
    sel = replace(sel, rank=lookup[sel.rank])
    return sel, [_Stall(row[st.rank], st.start, st.end, st.cause) for st in stalls
                 if st.rank in row]


@dataclass(frozen=True)
class Band:
    """What one axes of a Gantt chart shows. ``px_size``: the axes' size in pixels (where
    microbatch numbers fit, how dense arrows are); ``window``: the time range (default
    ``(0, xmax or makespan)``); ``ranks``: only these ranks, in this order (no arrows
    then); ``nchunks``: shade and hatch chunks as for this many (several charts of one
    figure alike); ``time_labels``: label the time axis; ``integral``: a slot axis
    (``T0, T1, ...``) or a plain one (None: slots when every box is on whole numbers;
    several charts of one time axis alike)."""

    px_size: tuple[float, float]
    window: tuple[float, float] | None = None
    xmax: float | None = None
    ranks: Sequence[int] | None = None
    nchunks: int | None = None
    time_labels: bool = True
    integral: bool | None = None


def draw_gantt(ax: Axes, tl: Timeline, band: Band, *, label_mb: bool = True,
               arrows: bool = False, highlight: Iterable[tuple[str, int, int, int]] = (),
               stalls: Sequence[Any] = (), boxes: Boxes | None = None,
               arrow_data: Arrows | None = None) -> GanttInfo:
    """Draw ``tl`` as a Gantt chart on ``ax`` (rank 0 on top), over ``band``.

    ``highlight``: messages ``(kind, src, dst, mb)`` drawn bold and annotated.
    ``stalls``: objects with ``rank, start, end, cause`` hatched by cause.
    ``boxes``/``arrow_data``: precomputed :func:`span_boxes` / :func:`message_arrows`
    (several bands share them). A deadlocked run marks where each blocked rank is stuck.
    Returns what was drawn (:class:`GanttInfo`).
    """
    px_size, window, xmax, ranks = band.px_size, band.window, band.xmax, band.ranks
    info = GanttInfo()
    shown = list(ranks) if ranks is not None else list(range(tl.ranks))
    n = len(shown)
    bx_all = boxes if boxes is not None else span_boxes(tl)
    if ranks is not None:
        bx_all, stalls = _rows_of(bx_all, stalls, shown)
        arrows, highlight = False, ()
    end = max(xmax if xmax is not None else tl.makespan, 1e-9)
    px_row = px_size[1] / max(n, 1)
    fs = rank_fontsize(px_row, ax.figure.dpi)
    t0, t1 = window if window is not None else (0.0, end)
    integral = boxes_integral(bx_all) if band.integral is None else band.integral
    nch = max(band.nchunks or 1, _nchunks(bx_all))
    info.nchunks = nch
    px_x = px_size[0] / max(t1 - t0, 1e-9)
    bx = bx_all.select(in_window(bx_all, t0, t1))
    colors = box_colors(bx, nch)
    thin_edges = len(bx) and float(np.min(bx.x1 - bx.x0, initial=np.inf)) * px_x < 4
    draw_boxes(ax, bx, n, colors, linewidths=0.0 if thin_edges else 0.5)
    draw_chunk_hatches(ax, bx, n, nch)
    info.has_fb = draw_fb_outlines(ax, bx, n, linewidth=0.4 if thin_edges else 0.8) > 0
    info.kinds = {KINDS[k] for k in np.unique(bx_all.kind) if k < len(KINDS)}
    info.chunks = {int(c) for c in np.unique(bx_all.chunk)}
    if label_mb:
        info.labels = draw_labels(ax, bx, n, colors, px_per_unit=px_x, row_px=px_row,
                                  window=(t0, t1))
    if stalls:
        info.stall_causes = _draw_stalls(ax, stalls, n, (t0, t1))
    hl = set(highlight)
    if arrows or hl:
        ar = arrow_data if arrow_data is not None else message_arrows(tl)
        if arrows:
            keep, note = thin(ar, (t0, t1))
            info.arrows = draw_arrows(ax, ar, keep, px_per_unit=px_x, row_px=px_row)
            if note:
                info.notes.append(note)
        if hl:
            draw_highlights(ax, tl, ar, hl, integral, px_size[1])
    ax.set_xlim(t0, t1)
    ax.set_ylim(0, n)
    step = max(1, int(np.ceil(11.0 / max(px_row, 1e-9))))     # a label every >= 11 px
    ax.set_yticks([n - 1 - r + 0.5 for r in range(0, n, step)],
                  [f"rank {shown[r]}" for r in range(0, n, step)], fontsize=fs)
    if tl.deadlock is not None:
        info.stuck = draw_stuck(ax, tl, shown, n, (t0, t1), fs, px_x)
    ax.tick_params(axis="y", length=0)
    time_axis(ax, tl, (t0, t1), integral, labels=band.time_labels, px=px_size[0])
    ax.set_facecolor(IDLE_COLOR)
    for sp in ax.spines.values():
        sp.set_visible(False)
    return info


def _draw_stalls(ax: Axes, stalls: Sequence[Any], n: int, window: tuple[float, float]
                 ) -> list[str]:
    """Hatch every stall in ``window`` by cause, one collection per cause (gid
    ``stall-<cause>``); returns the causes drawn, in order of appearance."""
    by_cause: dict[str, list[tuple[float, float, int]]] = {}
    for st in stalls:
        if st.end > st.start and st.end >= window[0] and st.start <= window[1]:
            by_cause.setdefault(st.cause, []).append((st.start, st.end, st.rank))
    for cause, rows in by_cause.items():
        a = np.asarray(rows, float)
        y0 = (n - 1 - a[:, 2]) + PAD
        hatch, color = stall_style(cause)
        pc = PolyCollection(rect_verts(a[:, 0], a[:, 1], y0, np.full(len(a), 1 - 2 * PAD)),
                            closed=True, facecolors="none", edgecolors=color,
                            linewidths=0.0, hatch=hatch, zorder=2)
        pc.set_gid(f"stall-{cause}")
        ax.add_collection(pc, autolim=False)
    return list(by_cause)


def legend_handles(info: GanttInfo, tl: Timeline) -> list[Any]:
    """Legend entries for what :func:`draw_gantt` drew."""
    nch = max(max(info.chunks, default=0) + 1, info.nchunks)
    handles: list[Any] = [] if len(info.chunks) > 1 and per_kind_chunks(nch) else \
        [Patch(facecolor=KIND_COLORS[k], label=KIND_NAMES[k])
         for k in ("F", "B", "W", "BW") if k in info.kinds]
    if info.has_fb:
        handles.append(Patch(facecolor="white", edgecolor="#222222",
                             label="FB: F (top) + backward (bottom)"))
    if len(info.chunks) > 1:
        word = "direction" if tl.placement == "dual" else "chunk"
        handles += chunk_handles([k for k in KINDS if k in info.kinds], sorted(info.chunks),
                                 nch, word)
    for cause in info.stall_causes:
        hatch, color = stall_style(cause)
        handles.append(Patch(facecolor=IDLE_COLOR, edgecolor=color, hatch=hatch,
                             linewidth=0, label=f"stall: {cause}"))
    if info.stuck:
        handles.append(Line2D([], [], color=ARROW_WAITED, lw=2.4,
                              label="deadlock: where the rank is stuck"))
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


def _entry_inches(h: Any) -> float:
    """About how wide a legend entry is at 8 pt: 0.062 in a character, plus the swatch
    (an empty filler: nothing)."""
    return 0.062 * len(h.get_label()) + 0.6 if h.get_label() else 0.0


def _fits(entries: list[Any], ncol: int, width: float) -> bool:
    """Whether ``entries`` laid row by row in ``ncol`` columns fit ``width`` inches."""
    sizes = [_entry_inches(h) for h in entries]
    return sum(max(sizes[c::ncol], default=0.0) for c in range(ncol)) <= width - 0.3


def legend_grid(handles: list[Any], width: float) -> tuple[list[Any], int]:
    """``(entries row by row, columns)`` of a legend of ``handles`` under a
    ``width``-inch figure. Per-kind chunk entries (``legend_row``:
    :func:`~schedsim.plot.style.chunk_handles`) make a grid: each kind starts a row and
    chunk ``c`` stands in column ``c`` (a kind's row continues on the next line when all
    chunks do not fit, empty fillers padding it), then the other entries row by row;
    else as many balanced columns as the longest entries allow."""
    groups: list[list[Any]] = []
    for h in handles:
        row = getattr(h, "legend_row", None)
        if row is not None and groups and getattr(groups[-1][0], "legend_row", None) == row:
            groups[-1].append(h)
        else:
            groups.append([h])
    rows = [g for g in groups if getattr(g[0], "legend_row", None) is not None]
    rest = [h for g in groups if getattr(g[0], "legend_row", None) is None for h in g]
    if rows:
        most = max(len(r) for r in rows)
        for ncol in range(most, 0, -1):
            entries: list[Any] = []
            for r in rows:
                entries += r + [_filler() for _ in range(-len(r) % ncol)]
            entries += rest
            if _fits(entries, ncol, width) or ncol == 1:
                return entries, ncol
    ncol = 1
    for k in range(min(legend_columns(len(handles), width), len(handles)), 0, -1):
        if _fits(handles, k, width):
            ncol = k
            break
    return handles, ncol


def _filler() -> Any:
    """An empty legend entry (no swatch, no text): pads a kind's row of chunks."""
    from matplotlib.patches import Patch

    return Patch(facecolor="none", edgecolor="none", linewidth=0, label="")


def add_legend(fig: Figure, handles: list[Any], width: float, notes: Sequence[str] = ()
               ) -> None:
    """The legend under the figure, row by row (:func:`legend_grid`: a row per kind and a
    column per chunk when the entries are per kind and chunk), with ``notes`` (e.g.
    thinned arrows) as a title line, in as many columns as fit within ``width`` inches."""
    entries, ncol = legend_grid(handles, width)
    leg = fig.legend(handles=row_major(entries, ncol), loc="outside lower center", ncol=ncol,
                     fontsize=8, frameon=False)
    if notes:
        leg.set_title("; ".join(notes), prop={"size": 7.5})
        leg._legend_box.align = "center"   # noqa: SLF001 - title above the entries


def _layout(tl: Timeline, bx: Boxes, dpi: float, memory: bool, width: float | None,
            wrap: bool, window: tuple[float, float], n: int) -> Layout:
    """The layout of the time ``window`` of ``tl`` on ``n`` rows (band edges in the
    timeline's time)."""
    from schedsim.plot.memory import memory_px

    digits = len(str(int(bx.mb.max()))) if len(bx) else 1
    t0, t1 = window
    lay = plan(max(t1 - t0, 1e-9), n, bx.x1 - bx.x0, digits, dpi=dpi,
               extra_px=AXIS_PX + (memory_px(n) if memory else 0.0),
               integral=boxes_integral(bx), wrap=wrap, width=width)
    return replace(lay, edges=tuple(t0 + e for e in lay.edges)) if t0 else lay


def _title(tl: Timeline, title: str | None, window: tuple[float, float] | None,
           ranks: Sequence[int] | None, bands: int) -> str:
    """The chart's title: ``title`` or :func:`default_title`, with the time window, the
    ranks shown and the bands it wrapped into."""
    head = title if title is not None else default_title(tl)
    if window is not None:
        head += f" — time {fmt_time(window[0])} to {fmt_time(window[1])}"
    if ranks is not None:
        head += f" — ranks {', '.join(map(str, ranks))}"
    return head + (f" (wrapped into {bands} bands)" if bands > 1 else "")


def _window_ranks(tl: Timeline, window: Any, ranks: Any, arrows: bool,
                  highlight: list) -> tuple[tuple[float, float], list[int] | None]:
    """Check ``gantt``'s ``window`` and ``ranks`` (ScenarioError naming what is wrong)."""
    from schedsim.errors import ScenarioError

    t0, t1 = (0.0, max(tl.makespan, 1e-9)) if window is None else map(float, window)
    if not 0 <= t0 < t1:
        raise ScenarioError(f"time window {t0:g}:{t1:g}: give 0 <= start < end")
    if t0 >= tl.makespan and tl.makespan > 0:
        raise ScenarioError(f"time window {t0:g}:{t1:g} starts after the run's end "
                            f"({with_unit(tl.makespan, tl.unit)})")
    shown = None
    if ranks is not None:
        shown = [int(r) for r in ranks]
        bad = [r for r in shown if not 0 <= r < tl.ranks]
        if bad or not shown or len(set(shown)) != len(shown):
            raise ScenarioError(f"ranks {shown}: give distinct ranks from 0 to "
                                f"{tl.ranks - 1}")
        if arrows or highlight:
            raise ScenarioError("a subset of ranks is drawn without message arrows and "
                                "op pieces: drop the arrows/highlight/detail or the rank "
                                "subset")
    return (t0, t1), shown


def check_highlight(tl: Timeline, highlight: Iterable[tuple[str, int, int, int]]) -> list:
    """``highlight`` as a list, each message ``(kind, src, dst, mb)`` checked: one that
    ``tl`` does not have (it would be drawn as nothing) raises :class:`ScenarioError`
    naming it as ``KIND:SRC:DST:MB`` and the nearest messages the timeline has (fewest
    differences: kind 1, each rank and microbatch by its distance; at most 3)."""
    from schedsim.errors import ScenarioError

    highlight = list(highlight)
    want = list(dict.fromkeys(highlight))
    if not want:
        return highlight
    have = {(m.kind, m.src, m.dst, m.mb) for m in tl.messages}
    for h in want:
        if h in have:
            continue
        name = ":".join(map(str, h))
        if not have:
            raise ScenarioError(f"highlight {name}: the timeline has no messages (no P2P "
                                f"was recorded); drop the highlight")
        kind, src, dst, mb = h

        def dist(k: tuple[str, int, int, int]) -> tuple:
            return ((k[0] != kind) + abs(k[1] - src) + abs(k[2] - dst) + abs(k[3] - mb), k)

        near = ", ".join(":".join(map(str, k)) for k in sorted(have, key=dist)[:3])
        raise ScenarioError(f"highlight {name}: the timeline has no {kind} message of mb "
                            f"{mb} from rank {src} to {dst} (KIND:SRC:DST:MB); the nearest "
                            f"it has: {near}")
    return highlight


@dataclass(frozen=True)
class GanttOptions:
    """The options of :func:`gantt`, each described there."""

    title: str | None = None
    width: float | None = None
    dpi: float = DPI
    label_mb: bool = True
    arrows: bool = False
    highlight: Iterable[tuple[str, int, int, int]] = ()
    stalls: Any = None
    memory: Any = None
    legend: bool = True
    wrap: bool = True
    detail: bool = False
    window: tuple[float, float] | None = None
    ranks: Sequence[int] | None = None


def _detail_band(ax: Any, tl: Timeline, win: tuple[float, float], n: int) -> list:
    """Draw each op's compute and collective pieces in one band's axes ``ax`` (time
    window ``win``, ``n`` rank rows); the legend handles they add
    (:func:`schedsim.plot.detail.draw_detail`)."""
    from schedsim.plot.detail import draw_detail

    extra = draw_detail(ax, tl, PAD)
    ax.set_xlim(*win)
    ax.set_ylim(0, n)
    return extra


def gantt(tl: Timeline, options: GanttOptions | None = None, **kw: Any) -> Figure:
    """Gantt chart of a timeline; returns the Figure (nothing shown or saved). The
    options: an :class:`GanttOptions` and/or its fields as keywords (these win);
    TypeError for a keyword it does not have.

    - rows per rank (rank 0 on top); a colour per kind (:data:`KIND_COLORS`), later
      chunks/directions lighter; ``FB`` as two halves (forward on top) with a dark outline;
      microbatch numbers where they fit (``label_mb``);
    - ``T0, T1, ...`` slot labels when all times are whole numbers, else a time axis in
      the timeline's unit;
    - ``arrows``: one arrow per message from the transfer start on the sender to the start
      of the consuming op on the receiver, red when the receiver had to wait
      (:func:`receiver_waited`), grey when the data was there first; more than
      :data:`~schedsim.plot.arrows.MAX_ARROWS` in a band are thinned (the legend says
      how); ``highlight``: ``(kind, src, dst, mb)`` messages drawn bold and annotated
      (one the timeline does not have: ScenarioError, :func:`check_highlight`);
    - ``stalls``: True to hatch the analysis' stalls
      (:func:`schedsim.analysis.stalls.attribute_stalls`) by cause, or a list of stalls;
    - ``memory``: True or a :class:`~schedsim.analysis.memory.MemoryModel` (or preset
      name) to add an activation-memory panel under each band (:mod:`.memory`);
    - ``detail``: draw each op's compute and collective pieces (a timeline with
      ``pieces``, see :mod:`schedsim.plot.detail`) in every band;
    - ``window``: only the time range ``(start, end)``; ``ranks``: only these ranks, in
      this order (no arrows); a deadlocked run: a red bar where each rank is stuck;
    - title: schedule, ranks, microbatches, semantics, makespan and bubble ratio.

    Size (:mod:`.layout`): at most 2000 px wide at ``dpi`` 150; a timeline too long for
    its microbatch numbers wraps into up to 6 bands (``wrap=False``: never), or is
    scaled when the bands would be too tall. ``width`` (inches) forces one band.
    """
    from schedsim.plot.memory import draw_memory, memory_curves_of, resolve_model

    o = replace(options or GanttOptions(), **kw)
    memory = o.memory
    bx = span_boxes(tl)
    highlight = check_highlight(tl, o.highlight)
    win_t, shown = _window_ranks(tl, o.window, o.ranks, o.arrows or o.detail, highlight)
    sub = bx if shown is None else _rows_of(bx, (), shown)[0]
    n = tl.ranks if shown is None else len(shown)
    lay = _layout(tl, sub.select(in_window(sub, *win_t)), o.dpi, bool(memory), o.width,
                  o.wrap and not highlight, win_t, n)
    if tl.deadlock is not None and o.window is None and lay.bands == 1:
        lay = with_stuck_room(lay, tl, LEFT_PX + RIGHT_PX)
    mem_h = (lay.band_height * lay.dpi - n * lay.row_px - AXIS_PX) / lay.dpi if memory else 0
    gh = n * lay.row_px / lay.dpi
    fig = Figure(figsize=(lay.width, lay.bands * (lay.band_height + 0.15)
                          + (0.55 + 0.3 * len(highlight)) + 0.7),
                 dpi=lay.dpi, layout="constrained")
    ratios = [gh, mem_h] * lay.bands if memory else [gh] * lay.bands
    axes = fig.subplots(len(ratios), 1, height_ratios=ratios, squeeze=False)[:, 0]
    ar = message_arrows(tl) if (o.arrows or highlight) else None
    st = get_stalls(tl, o.stalls)
    model = resolve_model(memory) if memory else None
    curves = memory_curves_of(tl, model) if memory else None
    plot_w = lay.width * lay.dpi - LEFT_PX - RIGHT_PX
    info = GanttInfo()
    extra: list[Any] = []
    for b in range(lay.bands):
        win = (lay.edges[b], lay.edges[b + 1])
        ax = axes[2 * b] if memory else axes[b]
        info.merge(draw_gantt(ax, tl, Band((plot_w, gh * lay.dpi), win, ranks=shown,
                                           time_labels=not memory),
                              label_mb=o.label_mb, arrows=o.arrows,
                              highlight=highlight if b == 0 else (), stalls=st, boxes=bx,
                              arrow_data=ar))
        if o.detail:
            extra = _detail_band(ax, tl, win, n) or extra
        if memory:
            axm = axes[2 * b + 1]
            draw_memory(axm, tl, model, window=win, legend=b == 0, curves=curves,
                        ranks=shown)
            time_axis(axm, tl, win, boxes_integral(bx), px=plot_w)
    head = _title(tl, o.title, win_t if o.window is not None else None, shown, lay.bands)
    fit_title(axes[0], head, 10, lay.width - 0.4, pad=6 + 19 * len(set(highlight)))
    if o.legend:
        add_legend(fig, legend_handles(info, tl) + extra, lay.width, info.notes)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)

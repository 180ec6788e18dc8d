"""Overlay of two timelines of the same ops (predicted vs measured, two semantics, two
schedules with the same ops), and a stack of several Gantt charts on one time axis.

The overlay's errors follow :mod:`schedsim.analysis.accuracy` (the first timeline is the
prediction, the second the reference: makespan error ``(first - second) / second``);
:class:`OpError` and :func:`op_start_errors` are re-exported from there."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from schedsim.analysis.accuracy import OpError, op_start_errors, prediction_error
from schedsim.errors import ScenarioError
from schedsim.plot.boxes import (
    KINDS,
    box_colors,
    draw_boxes,
    draw_chunk_hatches,
    draw_labels,
    in_window,
    span_boxes,
)
from schedsim.plot.gantt import (
    Band,
    GanttInfo,
    add_legend,
    boxes_integral,
    draw_gantt,
    legend_handles,
)
from schedsim.plot.layout import DPI, LEFT_PX, RIGHT_PX, plan, wrap_title
from schedsim.plot.style import (
    IDLE_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    chunk_handles,
    default_title,
    per_kind_chunks,
    time_axis,
)
from schedsim.timeline import Timeline
from schedsim.util.text import literal_text
from schedsim.util.units import fmt_delta, fmt_time, unit_text

__all__ = ["overlay", "gantt_stack", "error_summary", "op_start_errors", "OpError",
           "write_overlay", "default_threshold", "MOVED"]

#: outline colour of ops whose start moved by more than the threshold
MOVED = "#d62728"
#: each half-row's box inside its rank row: upper (first timeline), lower (second)
UPPER, LOWER = (0.52, 0.94), (0.06, 0.48)


def error_summary(a: Timeline, b: Timeline, errors: Sequence[OpError],
                  tol: float = 1e-9, names: Sequence[str] = ("predicted", "measured")
                  ) -> str:
    """Two lines: the makespan error and the per-op start error of ``a`` (the prediction)
    against ``b`` (the reference), as defined in :mod:`schedsim.analysis.accuracy`:
    makespan error ``a - b`` and ``(a - b) / b`` in %; start error ``mean |start_a -
    start_b|`` and as % of ``b``'s makespan, the largest signed ``start_a - start_b``.
    ``names`` label the two timelines (``tol``: a smaller start difference is no move).
    """
    na, nb = names
    u = f" {unit_text(a.unit)}"
    dm = a.makespan - b.makespan
    text = (f"makespan {na} {fmt_time(a.makespan)} vs {nb} {fmt_time(b.makespan)}{u}: "
            f"error {fmt_delta(dm)}{u}")
    if not errors or b.makespan <= 0:
        return text + f"\nop start error: {len(errors)} ops"
    pe = prediction_error(a, b, tol, list(errors))
    text += (f", {pe.makespan_error_pct:+.1f}% of {nb}\nop start error: mean |{na} - {nb}| "
             f"{fmt_time(pe.mean_start_error)}{u}, {pe.mean_start_error_pct:.1f}% of {nb} makespan")
    if pe.moved:
        text += (f"; max {fmt_delta(pe.max_start_error)} ({pe.worst_op}); {pe.moved}/{pe.ops} ops "
                 "moved")
    else:
        text += f"; all {pe.ops} ops start at the same time"
    return text


def default_threshold(a: Timeline, b: Timeline) -> float:
    """How far an op's start may move before the overlay marks it: any move between two
    simulated timelines; 5% of the reference's makespan when either was measured (a
    measured start always differs a little)."""
    if "measured" in (a.source, b.source):
        return 0.05 * b.makespan
    return 0.0


def _threshold_label(thr: float, b: Timeline, nb: str) -> str:
    if thr <= 0:
        return "start moved (by any amount)"
    unit = f" {unit_text(b.unit, thr)}"
    pct = f" = {100 * thr / b.makespan:.3g}% of {nb} makespan" if b.makespan > 0 else ""
    return f"start moved > {fmt_time(thr)}{unit}{pct}"


def overlay(a: Timeline, b: Timeline, *, names: Sequence[str] | None = None,
            title: str | None = None, width: float | None = None, dpi: float = DPI,
            tol: float | None = None, threshold: float | None = None,
            label_mb: bool = True) -> Figure:
    """Two timelines of the same ops on one figure: per rank the **upper half-row** is
    ``a`` (e.g. the prediction), the **lower half-row** ``b`` (the reference, e.g. the
    measurement). Every op whose start differs between the two by more than
    ``threshold`` (time unit; default :func:`default_threshold`; ``tol`` is its old name)
    is outlined in red in both half-rows, and the legend states the threshold. The
    half-rows are named in the title, in the legend and (when rows are tall enough)
    beside every row; microbatch numbers are drawn where they fit. The title carries the
    makespan error and the per-op start error of ``a`` against ``b``
    (:func:`error_summary`), wrapped to the figure width. Sizing as :func:`gantt` (wraps
    into bands). ``names`` default to each timeline's semantics or source.

    Raises :class:`ScenarioError` if the timelines do not hold the same ops.
    """
    errors = op_start_errors(a, b)
    na, nb = names or (_name(a), _name(b))
    if na == nb:
        na, nb = f"{na} (1)", f"{nb} (2)"
    thr = threshold if threshold is not None else (tol if tol is not None
                                                   else default_threshold(a, b))
    eps = max(thr, 1e-9 * max(b.makespan, 1.0))
    moved = {(e.rank, e.kind, e.stage, e.mb) for e in errors if abs(e.delta) > eps}
    n = a.ranks
    ba, bb = span_boxes(a), span_boxes(b)
    integral = boxes_integral(ba) and boxes_integral(bb)
    span_t = max(a.makespan, b.makespan, 1e-9)
    digits = len(str(int(max(ba.mb.max(initial=0), bb.mb.max(initial=0)))))
    row = float(min(48.0, max(20.0, 1400.0 / max(n, 1))))
    lay = plan(span_t, n, np.concatenate([ba.x1 - ba.x0, bb.x1 - bb.x0]), digits, dpi=dpi,
               extra_px=42, row=row, integral=integral, width=width)
    fig = Figure(figsize=(lay.width, lay.bands * (lay.band_height + 0.15) + 1.6),
                 dpi=lay.dpi, layout="constrained")
    axes = fig.subplots(lay.bands, 1, squeeze=False)[:, 0]
    nch = max(int(ba.chunk.max(initial=0)), int(bb.chunk.max(initial=0))) + 1
    plot_w = lay.width * lay.dpi - LEFT_PX - RIGHT_PX
    for k, ax in enumerate(axes):
        win = (lay.edges[k], lay.edges[k + 1])
        for bx, (lo, hi), tl in ((ba, UPPER, a), (bb, LOWER, b)):
            sel = bx.select(in_window(bx, *win))
            cols = box_colors(sel, nch)
            bad = _moved_mask(tl, sel, moved)
            draw_boxes(ax, sel, n, cols, lo=lo, hi=hi,
                       edgecolors=np.where(bad[:, None], np.asarray([to_rgba(MOVED)]),
                                           np.asarray([to_rgba("white")])),
                       linewidths=np.where(bad, 1.3, 0.3),
                       gid="ops" if tl is b else "ops-upper")
            draw_chunk_hatches(ax, sel, n, nch, lo=lo, hi=hi)
            if label_mb:
                draw_labels(ax, sel, n, cols, px_per_unit=plot_w / (win[1] - win[0]),
                            row_px=row, window=win, lo=lo, hi=hi)
        _rows(ax, n, win, row, (na, nb))
        time_axis(ax, a, win, integral, px=plot_w)
    head = title if title is not None else (
        f"{a.schedule}: {na} (upper half-rows) vs {nb} (lower half-rows), {n} ranks, "
        f"{a.microbatches} microbatches")
    if lay.bands > 1:
        head += f" (wrapped into {lay.bands} bands)"
    axes[0].set_title(wrap_title(head + "\n" + error_summary(a, b, errors, eps, (na, nb)),
                                 lay.width - 0.4), fontsize=10)
    kinds = {KINDS[k] for bx in (ba, bb) for k in np.unique(bx.kind) if k < len(KINDS)}
    handles: list[Any] = [] if nch > 1 and per_kind_chunks(nch) else \
        [Patch(facecolor=KIND_COLORS[k], label=KIND_NAMES[k]) for k in KINDS if k in kinds]
    chunks = sorted({int(c) for bx in (ba, bb) for c in np.unique(bx.chunk)})
    if nch > 1:
        word = "direction" if a.placement == "dual" else "chunk"
        handles += chunk_handles([k for k in KINDS if k in kinds], chunks, nch, word)
    handles += [Patch(facecolor="#cccccc", label=f"upper half-row: {na}"),
                Patch(facecolor="#888888", label=f"lower half-row: {nb}"),
                Patch(facecolor="white", edgecolor=MOVED, linewidth=1.3,
                      label=f"{_threshold_label(thr, b, nb)}: {len(moved)} ops")]
    add_legend(fig, handles, lay.width)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)


def _moved_mask(tl: Timeline, bx: Any, moved: set[tuple[int, str, int, int]]) -> np.ndarray:
    """Per box: whether its span holds an op in ``moved`` (an FB span: either part)."""
    if not moved or not len(bx):
        return np.zeros(len(bx), bool)
    bad_spans = {i for i, s in enumerate(tl.spans)
                 if any((s.rank, p.kind, p.stage, p.mb) in moved for p in (s.parts or [s]))}
    return np.fromiter((int(i) in bad_spans for i in bx.span), bool, len(bx))


def _rows(ax: Any, n: int, win: tuple[float, float], row_px: float,
          names: tuple[str, str]) -> None:
    """Rank labels, row separators, idle background and, when a half-row is at least 15
    px tall, the half-rows' names on the right."""
    ax.set_xlim(*win)
    ax.set_ylim(0, n)
    step = max(1, int(np.ceil(11.0 / row_px)))
    ax.set_yticks([n - 1 - r + 0.5 for r in range(0, n, step)],
                  [f"rank {r}" for r in range(0, n, step)],
                  fontsize=max(5.5, min(9.0, row_px * 0.3 * 72 / ax.figure.dpi)))
    ax.tick_params(axis="y", length=0)
    ax.hlines(range(1, n), *win, colors="#bbbbbb", linewidth=0.6, zorder=2)
    ax.set_facecolor(IDLE_COLOR)
    if row_px / 2 >= 15:
        right = ax.secondary_yaxis("right")
        ys = [y for r in range(n) for y in (n - 1 - r + 0.73, n - 1 - r + 0.27)]
        right.set_yticks(ys, [names[0], names[1]] * n, fontsize=6, color="#444444")
        right.tick_params(length=0)
        for sp in right.spines.values():
            sp.set_visible(False)
    for sp in ax.spines.values():
        sp.set_visible(False)


def _name(tl: Timeline) -> str:
    return tl.semantics if tl.source == "simulated" else tl.source


def gantt_stack(timelines: Sequence[Timeline], *, titles: Sequence[str] | None = None,
                width: float | None = None, dpi: float = DPI, label_mb: bool = True,
                shared_time: bool = True, suptitle: str | None = None,
                memory: Any = None) -> Figure:
    """Several Gantt charts stacked on one figure (one per timeline, same time scale when
    ``shared_time``), e.g. 1F1B vs ZB-H1 vs ZB-V vs DualPipeV; at most 2000 px wide (never
    wrapped). Each panel's title is :func:`default_title` unless ``titles`` are given.
    ``memory``: True or a memory model (:func:`schedsim.plot.resolve_model`) for an
    activation-memory panel under each chart, on the same time axis. Returns the
    Figure."""
    from schedsim.plot.memory import draw_memory, resolve_model
    from schedsim.plot.style import time_axis

    tls = list(timelines)
    if not tls:
        raise ScenarioError("gantt_stack needs at least one timeline")
    span_t = max(t.makespan for t in tls)
    bxs = [span_boxes(t) for t in tls]
    durs = np.concatenate([bx.x1 - bx.x0 for bx in bxs])
    digits = len(str(max(int(bx.mb.max(initial=0)) for bx in bxs)))
    lay = plan(span_t, max(t.ranks for t in tls), durs, digits, dpi=dpi, wrap=False,
               width=width)
    heights = [t.ranks * min(lay.row_px, 26) / lay.dpi + 0.55 for t in tls]
    model = resolve_model(memory) if memory is not None and memory is not False else None
    ratios = [h for h in heights for h in ((h, 1.3) if model is not None else (h,))]
    fig = Figure(figsize=(lay.width, sum(ratios) + 1.0), dpi=lay.dpi, layout="constrained")
    axes = fig.subplots(len(ratios), 1, height_ratios=ratios, squeeze=False)[:, 0]
    union: dict[str, Any] = {}
    info = GanttInfo()
    plot_w = lay.width * lay.dpi - LEFT_PX - RIGHT_PX
    step = 2 if model is not None else 1
    nch = max(int(bx.chunk.max(initial=0)) + 1 for bx in bxs)    # one shading for all
    # one kind of time axis for all (slots only when every chart's boxes are on slots)
    integral = all(boxes_integral(bx) for bx in bxs) if shared_time else None
    for i, (ax, tl) in enumerate(zip(axes[::step], tls)):
        xmax = span_t if shared_time else tl.makespan
        px = (plot_w * xmax / span_t if not shared_time else plot_w,
              (heights[i] - 0.55) * lay.dpi)
        got = draw_gantt(ax, tl, Band(px, xmax=xmax, nchunks=nch, time_labels=model is None,
                                      integral=integral), label_mb=label_mb, boxes=bxs[i])
        if model is not None:
            axm = axes[2 * i + 1]
            draw_memory(axm, tl, model, xmax=xmax, legend=True)
            time_axis(axm, tl, (0.0, xmax), boxes_integral(bxs[i]) if integral is None
                      else integral, px=plot_w)
        info.merge(got)
        ax.set_title(wrap_title(titles[i] if titles else default_title(tl), lay.width, 9),
                     fontsize=9, loc="left")
        for h in legend_handles(got, tl):
            if nch > 2:     # one entry per kind and chunk: a direction is a chunk here
                h.set_label(h.get_label().replace("direction", "chunk"))
            union.setdefault(h.get_label(), h)
    if suptitle:
        fig.suptitle(wrap_title(suptitle, lay.width, 11), fontsize=11)
    order = [("F (", "F chunk", "F direction"), ("B (", "B chunk", "B direction"),
             ("W (", "W chunk", "W direction"), ("BW (", "BW chunk", "BW direction"),
             ("FB",), ("chunk",), ("direction",), ("stall",), ("message",), ("idle",)]
    labels = set(union)
    for lab in [x for x in labels if x.startswith("direction ")]:
        twin = lab.replace("direction", "chunk", 1)    # the same shade: one entry for both
        if twin in union:
            union[twin].set_label(f"{twin} / {lab}")
            del union[lab]
    ordered = sorted(union.values(), key=lambda h: (next(
        (i for i, o in enumerate(order) if h.get_label().startswith(o)), len(order)),
        h.get_label()))
    add_legend(fig, ordered, lay.width, info.notes)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)


def write_overlay(predicted: Timeline, measured: Timeline, path: str | Path,
                  title: str | None = None, width: float | None = None,
                  tol_frac: float = 0.05) -> None:
    """Overlay figure (upper half-row: predicted, lower: measured), via
    :func:`schedsim.plot.overlay`; ops starting more than ``tol_frac`` of the measured
    makespan away from their prediction are outlined (the legend says so). ``width`` in
    inches (default: sized by the layout)."""
    from schedsim.plot.figure import save_figure

    fig = overlay(predicted, measured, names=("predicted", "measured"),
                  title=title, width=width, threshold=tol_frac * measured.makespan)
    save_figure(fig, path)

"""Overlay of two timelines of the same ops (predicted vs measured, two semantics, two
schedules with the same ops), and a stack of several Gantt charts on one time axis.

The overlay's errors follow :mod:`schedsim.analysis.accuracy` (the first timeline is the
prediction, the second the reference: makespan error ``(first - second) / second``);
:class:`OpError` and :func:`op_start_errors` are re-exported from there."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from schedsim.analysis.accuracy import OpError, op_start_errors, prediction_error
from schedsim.errors import ScenarioError
from schedsim.plot.gantt import (
    auto_width,
    draw_gantt,
    legend_columns,
    legend_handles,
    row_height,
    row_major,
)
from schedsim.plot.style import (
    IDLE_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    default_title,
    fmt_time,
    is_integral,
    shade,
    time_axis,
)
from schedsim.timeline import Timeline
from schedsim.util.text import literal_text


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
    u = f" {a.unit}{'s' if a.unit == 'slot' else ''}"
    dm = a.makespan - b.makespan
    text = (f"makespan {na} {fmt_time(a.makespan)} vs {nb} {fmt_time(b.makespan)}{u}: "
            f"error {dm:+.4g}{u}")
    if not errors or b.makespan <= 0:
        return text + f"\nop start error: {len(errors)} ops"
    pe = prediction_error(a, b, tol, list(errors))
    text += (f", {pe.makespan_error_pct:+.1f}% of {nb}\nop start error: mean |{na} - {nb}| "
             f"{pe.mean_start_error:.3g}{u}, {pe.mean_start_error_pct:.1f}% of {nb} makespan")
    if pe.moved:
        text += (f"; max {pe.max_start_error:+.4g} ({pe.worst_op}); {pe.moved}/{pe.ops} ops "
                 "moved")
    else:
        text += f"; all {pe.ops} ops start at the same time"
    return text


def overlay(a: Timeline, b: Timeline, *, names: Sequence[str] | None = None,
            title: str | None = None, width: float | None = None, dpi: float = 110,
            tol: float = 1e-9) -> Figure:
    """Two timelines of the same ops on one figure: per rank the upper half-row is ``a``,
    the lower half-row ``b``; ops of ``b`` that start more than ``tol`` away from their
    start in ``a`` are outlined in red. The title carries the makespan error and the
    per-op start error of ``a`` against ``b`` (``b`` is the reference, e.g. the
    measurement: :func:`error_summary`).

    ``names`` default to each timeline's ``source`` and semantics. Raises
    :class:`ScenarioError` if the timelines do not hold the same ops.
    """
    errors = op_start_errors(a, b)
    na, nb = names or (_name(a), _name(b))
    if na == nb:
        na, nb = f"{na} (1)", f"{nb} (2)"
    moved = {(e.rank, e.kind, e.stage, e.mb) for e in errors if abs(e.delta) > tol}
    n = a.ranks
    span_t = max(a.makespan, b.makespan, 1e-9)
    width = width or max(auto_width(a), auto_width(b))
    gh = min(22.0, max(1.6, 0.55 * n + 0.4))
    fig = Figure(figsize=(width, gh + 1.3), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    chunks = {p.chunk for t in (a, b) for s in t.spans for p in (s.parts or [s])}
    nch = max(chunks, default=0) + 1
    rects, colors, edges, widths = [], [], [], []
    kinds: set[str] = set()
    for half, tl in ((0, a), (1, b)):
        for s in tl.spans:
            parts = s.parts or [s]
            row_lo = n - 1 - s.rank + (0.06 if half else 0.52)
            h = 0.42 / len(parts)
            bad = half == 1 and any((s.rank, p.kind, p.stage, p.mb) in moved for p in parts)
            for j, p in enumerate(parts):
                kinds.add(p.kind)
                rects.append(Rectangle((s.start, row_lo + (len(parts) - 1 - j) * h),
                                       s.end - s.start, h))
                colors.append(shade(KIND_COLORS.get(p.kind, "#999999"), p.chunk, nch))
                edges.append("#d62728" if bad else "white")
                widths.append(1.2 if bad else 0.3)
    pc = PatchCollection(rects, facecolors=colors, edgecolors=edges, linewidths=widths,
                         zorder=3)
    pc.set_gid("ops")
    ax.add_collection(pc)
    ax.set_xlim(0, span_t)
    ax.set_ylim(0, n)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)],
                  fontsize=max(5.0, min(9.0, 300.0 / n)))
    ax.tick_params(axis="y", length=0)
    ax.hlines(range(1, n), 0, span_t, colors="#bbbbbb", linewidth=0.6, zorder=2)
    time_axis(ax, a, span_t, is_integral(a) and is_integral(b))
    ax.set_facecolor(IDLE_COLOR)
    head = title if title is not None else (
        f"{a.schedule}: {na} (upper half-row) vs {nb} (lower half-row), {n} ranks, "
        f"{a.microbatches} microbatches")
    ax.set_title(head + "\n" + error_summary(a, b, errors, tol, (na, nb)), fontsize=10)
    handles: list[Any] = [Patch(facecolor=KIND_COLORS[k], label=KIND_NAMES[k])
                          for k in ("F", "B", "W", "BW") if k in kinds]
    if nch > 1:
        word = "direction" if a.placement == "dual" else "chunk"
        handles += [Patch(facecolor=shade("#666666", c, nch), label=f"{word} {c}")
                    for c in sorted(chunks)]
    handles.append(Patch(facecolor="white", edgecolor="#d62728", linewidth=1.2,
                         label=f"starts at a different time in {nb}"))
    ncol = legend_columns(len(handles), width)
    fig.legend(handles=row_major(handles, ncol), loc="outside lower center", ncol=ncol,
               fontsize=8, frameon=False)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)


def _name(tl: Timeline) -> str:
    return tl.semantics if tl.source == "simulated" else tl.source


def compare(timelines: Sequence[Timeline], *, titles: Sequence[str] | None = None,
            width: float | None = None, dpi: float = 110, label_mb: bool = True,
            shared_time: bool = True, suptitle: str | None = None) -> Figure:
    """Several Gantt charts stacked on one figure (one per timeline, same time scale when
    ``shared_time``), e.g. 1F1B vs ZB-H1 vs ZB-V vs DualPipeV. Each panel's title is
    :func:`default_title` unless ``titles`` are given. Returns the Figure."""
    tls = list(timelines)
    if not tls:
        raise ScenarioError("compare needs at least one timeline")
    span_t = max(t.makespan for t in tls)
    width = width or max(auto_width(t) for t in tls)
    heights = [row_height(t.ranks) + 0.45 for t in tls]
    fig = Figure(figsize=(width, sum(heights) + 0.9), dpi=dpi, layout="constrained")
    axes = fig.subplots(len(tls), 1, height_ratios=heights, squeeze=False)[:, 0]
    union: dict[str, Any] = {}
    for i, (ax, tl) in enumerate(zip(axes, tls)):
        xmax = span_t if shared_time else tl.makespan
        info = draw_gantt(ax, tl, px_size=(width * dpi * 0.9, (heights[i] - 0.45) * dpi * 0.9),
                          label_mb=label_mb, xmax=xmax)
        ax.set_title(titles[i] if titles else default_title(tl), fontsize=9, loc="left")
        for h in legend_handles(info, tl):
            union.setdefault(h.get_label(), h)
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    ncol = legend_columns(len(union), width)
    order = ["F (", "B (", "W (", "BW (", "FB", "chunk", "direction", "stall", "message",
             "idle"]
    ordered = sorted(union.values(), key=lambda h: next(
        (i for i, o in enumerate(order) if h.get_label().startswith(o)), len(order)))
    fig.legend(handles=row_major(ordered, ncol), loc="outside lower center",
               ncol=ncol, fontsize=8, frameon=False)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)


def write_overlay(predicted: Timeline, measured: Timeline, path: str | Path,
                  title: str | None = None, width: float = 12.0, tol_frac: float = 0.05
                  ) -> None:
    """Overlay figure (upper half-row: predicted, lower: measured), via
    :func:`schedsim.plot.overlay`; measured ops starting more than ``tol_frac`` of the
    measured makespan away from their prediction are outlined. ``width`` in inches."""
    from schedsim.plot.figure import save_figure

    fig = overlay(predicted, measured, names=("predicted", "measured"),
                  title=title, width=width, tol=tol_frac * measured.makespan)
    save_figure(fig, path)

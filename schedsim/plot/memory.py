"""Activation-memory figures: a panel under each Gantt band and a stand-alone memory plot.

Memory comes from :func:`schedsim.analysis.memory.memory_curves`, in **microbatches'
worth of activations**: 1 is what one microbatch leaves on one rank's 1/P share of the
model (``M_B`` in the zero-bubble paper; see :mod:`schedsim.analysis.memory`). A timeline
of a workload (:mod:`schedsim.workload`) is drawn in **GiB** instead: each rank's whole
memory (static bytes and activations) against the GPU's HBM (a dashed line).

Up to :data:`MAX_LINES` ranks every rank is a line. With more, lines would hide each other
(8 lines already did), so the panel shows the **min-max band over all ranks** (shaded)
and lines for a few **selected ranks**: rank 0, the rank with the highest peak and the
last rank (or the ranks given).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from schedsim.analysis.memory import MemoryModel, memory_curves
from schedsim.errors import ScenarioError
from schedsim.plot.layout import DPI, MAX_WIDTH_PX, wrap_title
from schedsim.plot.style import is_integral, time_axis
from schedsim.timeline import Timeline
from schedsim.util.text import literal_text
from schedsim.util.units import GIB, fmt_gib, fmt_time

#: up to this many ranks every rank is drawn as a line
MAX_LINES = 4
#: the unit, as every memory figure and ``schedsim memory`` states it
UNIT = "microbatches' worth"
YLABEL = f"activations\n({UNIT})"
GIB_YLABEL = "memory per rank\n(GiB)"
#: the label where the reserved peaks are drawn beside the allocated curves
GIB_RESERVED_YLABEL = "allocated per rank\n(GiB)"
BAND_COLOR = "#9ecae1"

Curves = list[tuple[np.ndarray, np.ndarray]]


def resolve_model(memory: Any) -> MemoryModel:
    """The memory model a figure option names: True/None (the default ``zb``), a preset
    name (``zb``, ``inflight``), a scenario ``[memory]`` table or a model
    (:meth:`MemoryModel.from_spec`). Raises :class:`ScenarioError` for anything else."""
    return MemoryModel.from_spec(memory)


def memory_px(n: int) -> float:
    """Height in pixels of the memory panel under an n-rank Gantt band."""
    return 190.0 if n <= 16 else 230.0


def in_gib(tl: Timeline) -> bool:
    """Whether ``tl``'s memory is drawn in GiB: it carries a workload's byte model
    (:func:`schedsim.analysis.memory.workload_memory`); else in microbatches' worth."""
    wl = getattr(tl, "workload", None)
    return isinstance(wl, dict) and bool(wl.get("stage_bytes"))


def memory_curves_of(tl: Timeline, model: MemoryModel | None = None) -> Curves:
    """Per rank ``(times, levels)`` arrays of the step function: the level after all
    events at each distinct time. (At one instant frees come before allocations, so the
    level after the instant is also the highest within it: peaks are kept, and the
    zero-width dips a step line would draw there are not.) With a workload
    (:func:`in_gib`): the rank's whole memory in GiB (static bytes, receive buffers and
    activations, by the workload's byte model; ``model`` is not used)."""
    if in_gib(tl):
        from schedsim.analysis.memory import workload_memory

        pairs = []
        for m in workload_memory(tl) or ():
            ts, lv = (np.asarray(x, float) for x in m.curve)
            pairs.append((np.append(0.0, ts), (m.static + np.append(0.0, lv)) / 2 ** 30))
    else:
        pairs = [(np.asarray([t for t, _ in c], float), np.asarray([v for _, v in c], float))
                 for c in memory_curves(tl, model)]
    out = []
    for ts, vs in pairs:
        last = np.append(ts[1:] != ts[:-1], True)
        out.append((ts[last], vs[last]))
    return out


def selected_ranks(peaks: Sequence[float]) -> list[int]:
    """The ranks drawn as lines: all up to :data:`MAX_LINES`, else rank 0, the (first)
    rank with the highest peak, the middle rank and the last rank."""
    n = len(peaks)
    if n <= MAX_LINES:
        return list(range(n))
    return sorted({0, int(np.argmax(peaks)), n // 2, n - 1})


def envelope(curves: Curves, end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(times, lo, hi)``: the lowest and highest level over all ranks on each interval
    ``[times[i], times[i+1])`` (step function, one pass per rank)."""
    times = np.unique(np.concatenate([c[0] for c in curves] + [np.asarray([0.0, end])]))
    lo = np.full(times.shape, np.inf)
    hi = np.full(times.shape, -np.inf)
    for ts, vs in curves:
        pos = np.searchsorted(ts, times, side="right") - 1
        lvl = np.where(pos >= 0, vs[np.clip(pos, 0, None)], 0.0)
        np.minimum(lo, lvl, out=lo)
        np.maximum(hi, lvl, out=hi)
    return times, lo, hi


def _reserved_gib(tl: Timeline) -> list[float] | None:
    """The caching allocator's reserved peak per rank in GiB (the Timeline's
    ``workload.peak_reserved_bytes``), or None where the run has none (``allocator =
    "none"``, a typed cost model)."""
    w = tl.workload if isinstance(tl.workload, dict) else None
    rp = w.get("peak_reserved_bytes") if w else None
    return [float(b) / 2 ** 30 for b in rp] if rp else None


def _colors(k: int) -> list[Any]:
    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(k)]


def draw_memory(ax: Axes, tl: Timeline, model: MemoryModel | None = None, *,
                xmax: float | None = None, legend: bool = True,
                peaks_in_legend: bool = True, window: tuple[float, float] | None = None,
                curves: Curves | None = None, ranks: Sequence[int] | None = None
                ) -> list[float]:
    """Activation memory over time on ``ax``; returns the peak per rank.

    Lines for :func:`selected_ranks` (or ``ranks``), labelled with their peaks; with more
    ranks than lines, the min-max band over all ranks behind them. ``window``: the time
    range shown (default ``(0, xmax or makespan)``); ``curves``: precomputed
    :func:`memory_curves_of`.
    """
    curves = curves if curves is not None else memory_curves_of(tl, model)
    peaks = [float(vs.max()) for _, vs in curves]
    end = max(xmax if xmax is not None else tl.makespan, 1e-9)
    t0, t1 = window if window is not None else (0.0, end)
    n = len(curves)
    show = list(ranks) if ranks is not None else selected_ranks(peaks)
    if len(show) < n:
        times, lo, hi = envelope(curves, end)
        ax.fill_between(times, lo, hi, step="post", color=BAND_COLOR, alpha=0.55,
                        linewidth=0, label=f"min-max over all {n} ranks", zorder=1)
    styles = ["-", "--", "-.", ":"]
    gib = in_gib(tl)
    reserved = _reserved_gib(tl) if gib else None
    for j, (r, color) in enumerate(zip(show, _colors(len(show)))):
        ts, vs = curves[r]
        peak = fmt_gib(peaks[r] * GIB) if gib else fmt_time(peaks[r])
        if reserved is not None:
            peak += f", reserved {fmt_gib(reserved[r] * GIB)}"
        ax.step(np.append(ts, end), np.append(vs, vs[-1]), where="post", color=color,
                linewidth=1.6 if j == 0 else 1.3, linestyle=styles[j % 4], zorder=2,
                label=f"rank {r}" + (f" (peak {peak})" if peaks_in_legend else ""))
    top = max(peaks)
    if reserved is not None:
        # the caching allocator's reserved peak (what torch reports, what runs out): the
        # highest as a dotted line; each drawn rank's own in its legend label
        worst = max(range(len(reserved)), key=reserved.__getitem__)
        ax.axhline(reserved[worst], color="0.35", linestyle=(0, (1, 1.5)), linewidth=1.0,
                   zorder=3, label=f"reserved peak {fmt_gib(reserved[worst] * GIB)} (rank {worst})")
        top = max(top, reserved[worst])
    if gib:
        hbm = float(tl.workload["hbm_bytes"]) / 2 ** 30          # type: ignore[attr-defined]
        ax.axhline(hbm, color="#c0392b", linestyle=(0, (4, 2)), linewidth=1.0, zorder=3,
                   label=f"HBM {fmt_gib(hbm * GIB)}")
        top = max(top, hbm)
    ax.set_ylabel((GIB_RESERVED_YLABEL if reserved is not None else GIB_YLABEL) if gib
                  else YLABEL, fontsize=7.5)
    low = min(0.0, min(float(vs.min()) for _, vs in curves))
    ax.set_ylim(low, max(top, low + 1e-9) * 1.1)
    ax.set_xlim(t0, t1)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", color="#e3e3e3", linewidth=0.4)
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return peaks


def memory_plot(timelines: Timeline | Sequence[Timeline], model: Any = None, *,
                titles: Sequence[str] | None = None, dpi: float = DPI,
                ranks: Sequence[int] | None = None) -> Figure:
    """Activation memory over time, one panel per timeline (small multiples, shared y
    axis), at most 2000 px wide; each panel as :func:`draw_memory` (``ranks``: the ranks
    drawn as lines, default :func:`selected_ranks`). Each panel's title gives the schedule
    and the highest peak (and which rank). Returns the Figure.
    """
    tls = [timelines] if isinstance(timelines, Timeline) else list(timelines)
    if not tls:
        raise ScenarioError("memory_plot needs at least one timeline")
    mm = resolve_model(model)
    k = len(tls)
    cols = min(k, 4)
    rows = -(-k // cols)
    width = min(MAX_WIDTH_PX / dpi, 3.6 * cols + 1.6)
    fig = Figure(figsize=(width, 3.2 * rows + 0.6), dpi=dpi, layout="constrained")
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
    for i, ax in enumerate(axes):
        if i >= k:
            ax.set_visible(False)
            continue
        tl = tls[i]
        peaks = draw_memory(ax, tl, mm, legend=False, ranks=ranks)
        worst = max(range(len(peaks)), key=lambda r: peaks[r])
        name = titles[i] if titles else tl.schedule
        peak = fmt_gib(peaks[worst] * GIB) if in_gib(tl) else fmt_time(peaks[worst])
        ax.set_title(wrap_title(f"{name}: peak {peak} on rank {worst}",
                                width / cols, 9), fontsize=9)
        time_axis(ax, tl, max(tl.makespan, 1e-9), is_integral(tl), fontsize=6,
                  px=width / cols * dpi * 0.8)
        ax.grid(False, axis="x", which="minor")
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.22),
                  ncol=2, frameon=False)
        if i % cols:
            ax.set_ylabel("")
    top = max(ax.get_ylim()[1] for ax in axes[:k])
    axes[0].set_ylim(top=top)
    what = ("memory per rank in GiB (parameters, gradients, optimizer states, buffers and "
            "activations of the workload)" if all(in_gib(t) for t in tls) else
            f"activation memory per rank ({_model_name(mm)} model; 1 = one microbatch's "
            f"activations on one rank's 1/P of the model)")
    fig.suptitle(wrap_title(what, width), fontsize=10)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)


def _model_name(mm: MemoryModel) -> str:
    from schedsim.analysis.memory import PRESETS

    for name, d in PRESETS.items():
        if all(getattr(mm, key) == v for key, v in d.items()):
            return name
    return "custom"

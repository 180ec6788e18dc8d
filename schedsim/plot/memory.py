"""Activation-memory figures: a panel under the Gantt and a stand-alone memory plot.

Memory comes from :func:`schedsim.analysis.memory.memory_curves` (unit ``M_B``: the activations one
microbatch leaves on one rank's 1/P share of the model; see :mod:`schedsim.analysis.memory`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure

from schedsim.analysis.memory import MemoryModel, memory_curves
from schedsim.errors import ScenarioError
from schedsim.plot.style import fmt_time, is_integral, time_axis
from schedsim.timeline import Timeline
from schedsim.util.text import literal_text

#: up to this many ranks the memory panel draws one line per rank, above it a heat map
MAX_LINES = 16
YLABEL = "activations (M_B)"


def resolve_model(memory: Any) -> MemoryModel:
    """The memory model a figure option names: True/None (the default ``zb``), a preset
    name (``zb``, ``inflight``), a scenario ``[memory]`` table or a model
    (:meth:`MemoryModel.from_spec`). Raises :class:`ScenarioError` for anything else."""
    return MemoryModel.from_spec(memory)


def memory_height(n: int) -> float:
    """Height in inches of the memory panel under an n-rank Gantt."""
    return min(6.0, max(1.6, 0.12 * n + 1.2))


def _rank_colors(n: int) -> list[Any]:
    if n <= 10:
        cmap = colormaps["tab10"]
        return [cmap(i) for i in range(n)]
    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1)) for i in range(n)]


def draw_memory(ax: Axes, tl: Timeline, model: MemoryModel | None = None, *,
                xmax: float | None = None, legend: bool = True,
                peaks_in_legend: bool = True) -> list[float]:
    """Activation memory per rank over time on ``ax``; returns the peak per rank.

    Up to :data:`MAX_LINES` ranks: one step line per rank (legend gives each peak);
    more: a heat map with one row per rank (rank 0 on top, like the Gantt) and a
    colour bar.
    """
    curves = memory_curves(tl, model)
    peaks = [max(v for _, v in c) for c in curves]
    end = max(xmax if xmax is not None else tl.makespan, 1e-9)
    n = tl.ranks
    if n <= MAX_LINES:
        for r, (c, color) in enumerate(zip(curves, _rank_colors(n))):
            xs = [t for t, _ in c] + [end]
            ys = [v for _, v in c] + [c[-1][1]]
            ax.step(xs, ys, where="post", color=color, linewidth=1.2,
                    label=f"rank {r}" + (f" (peak {fmt_time(peaks[r])})"
                                         if peaks_in_legend else ""))
        ax.set_ylabel(YLABEL, fontsize=8)
        low = min(0.0, min(v for c in curves for _, v in c))
        ax.set_ylim(low, max(max(peaks), low + 1e-9) * 1.08)
        if legend:
            ax.legend(fontsize=6.5, ncol=2 if n > 4 else 1, loc="upper left",
                      bbox_to_anchor=(1.0, 1.0), frameon=False)
    else:
        times = np.unique(np.array([t for c in curves for t, _ in c] + [0.0, end]))
        grid = np.zeros((n, len(times) - 1))
        for r, c in enumerate(curves):
            ts = np.array([t for t, _ in c])
            vs = np.array([v for _, v in c])
            # level in force on [times[i], times[i+1]): last event at or before times[i]
            pos = np.searchsorted(ts, times[:-1], side="right") - 1
            grid[n - 1 - r] = vs[np.clip(pos, 0, None)]
        mesh: QuadMesh = ax.pcolormesh(times, np.arange(n + 1), grid, cmap="magma_r",
                                       shading="flat")
        ax.set_yticks([n - 1 - r + 0.5 for r in range(0, n, max(1, n // 16))],
                      [f"rank {r}" for r in range(0, n, max(1, n // 16))], fontsize=6)
        cb = ax.figure.colorbar(mesh, ax=ax, pad=0.005, fraction=0.02)
        cb.set_label(YLABEL, fontsize=7)
        cb.ax.tick_params(labelsize=6)
    ax.set_xlim(0, end)
    ax.tick_params(axis="y", labelsize=7)
    return peaks


def memory_plot(timelines: Timeline | Sequence[Timeline], model: Any = None, *,
                titles: Sequence[str] | None = None, dpi: float = 110) -> Figure:
    """Activation memory per rank over time, one panel per timeline (shared y axis).

    ``model``: as for :func:`resolve_model` (default ``zb``). Each panel's title gives
    the schedule and the highest peak (and which rank). Returns the Figure.
    """
    tls = [timelines] if isinstance(timelines, Timeline) else list(timelines)
    if not tls:
        raise ScenarioError("memory_plot needs at least one timeline")
    mm = resolve_model(model)
    k = len(tls)
    n_max = max(t.ranks for t in tls)
    fig = Figure(figsize=(min(30.0, 4.6 * k + 1.4), 3.8 + (0.6 if n_max > MAX_LINES else 0)),
                 dpi=dpi, layout="constrained")
    axes = fig.subplots(1, k, sharey=n_max <= MAX_LINES, squeeze=False)[0]
    top = 0.0
    for i, (ax, tl) in enumerate(zip(axes, tls)):
        peaks = draw_memory(ax, tl, mm, legend=i == k - 1, peaks_in_legend=k == 1)
        top = max(top, ax.get_ylim()[1])
        worst = max(range(len(peaks)), key=lambda r: peaks[r])
        name = titles[i] if titles else tl.schedule
        ax.set_title(f"{name}: peak {fmt_time(peaks[worst])} on rank {worst}", fontsize=9)
        time_axis(ax, tl, max(tl.makespan, 1e-9), is_integral(tl) and tl.makespan <= 80,
                  fontsize=6)
        if is_integral(tl) and tl.makespan <= 80:
            # only every 10th slot label: panels are narrow
            ax.set_xticks([t + 0.5 for t in range(0, int(tl.makespan), 10)],
                          [f"T{t}" for t in range(0, int(tl.makespan), 10)], fontsize=6)
        if i:
            ax.set_ylabel("")
    if n_max <= MAX_LINES:
        axes[0].set_ylim(top=top)     # shared y axis: room for the highest peak
    fig.suptitle(f"activation memory per rank ({_model_name(mm)} model)", fontsize=10)
    return literal_text(fig)     # user text is drawn as is (schedsim.util.text)


def _model_name(mm: MemoryModel) -> str:
    from schedsim.analysis.memory import PRESETS

    for name, d in PRESETS.items():
        if all(getattr(mm, key) == v for key, v in d.items()):
            return name
    return "custom"

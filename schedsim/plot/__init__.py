"""Figures of timelines (matplotlib; PNG, SVG or PDF by file extension).

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot: nothing
global is touched, nothing is shown, so notebooks and scripts compose them freely;
:func:`save_figure` writes one atomically.

- :func:`gantt` — the Gantt chart (arrows, stalls, memory panel: see its docstring);
- :func:`compare` — several Gantt charts stacked on one time axis;
- :func:`overlay` — two timelines of the same ops, with start and makespan errors;
- :func:`memory_plot` — activation memory per rank, one panel per timeline.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .gantt import (GanttInfo, consumer_index, draw_gantt, gantt, message_consumer,
                    receiver_waited)
from .memory import draw_memory, memory_plot, resolve_model
from .overlay import OpError, compare, error_summary, op_start_errors, overlay
from .style import KIND_COLORS, KIND_NAMES, STALL_STYLES, default_title, shade

FORMATS = (".png", ".svg", ".pdf")


def save_figure(fig: Figure, path: str | Path) -> None:
    """Save ``fig`` (format from the extension: .png, .svg, .pdf) atomically.

    Raises :class:`~schedsim.errors.ScenarioError` for another extension (nothing is
    written).
    """
    from ..errors import ScenarioError
    from ..io import atomic_path

    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ScenarioError(f"{path}: unsupported figure format {path.suffix!r} (use .png, "
                            ".svg or .pdf)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix[1:].lower())


__all__ = [
    "gantt", "compare", "overlay", "memory_plot", "save_figure", "draw_gantt",
    "draw_memory", "resolve_model", "op_start_errors", "error_summary", "OpError",
    "GanttInfo", "consumer_index", "message_consumer", "receiver_waited", "KIND_COLORS",
    "KIND_NAMES", "STALL_STYLES", "default_title", "shade", "FORMATS",
]

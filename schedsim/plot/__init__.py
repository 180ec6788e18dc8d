"""Figures of timelines (matplotlib; PNG, SVG or PDF by file extension).

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot: nothing
global is touched, nothing is shown, so notebooks and scripts compose them freely;
:func:`save_figure` writes one atomically.

- :func:`gantt` — the Gantt chart (arrows, stalls, memory panel: see its docstring);
- :func:`gantt_stack` — several Gantt charts stacked on one time axis (``compare``: its
  earlier name, kept as an alias of it);
- :func:`overlay` — two timelines of the same ops, with start and makespan errors;
- :func:`memory_plot` — activation memory per rank, one panel per timeline.

Every figure fits a page: at most 2000 px wide at 150 dpi; long timelines wrap into bands
(:mod:`schedsim.plot.layout`); boxes are drawn as one ``PolyCollection`` per band
(:mod:`schedsim.plot.boxes`).
"""
from __future__ import annotations

from schedsim.plot.figure import FORMATS, save_figure
from schedsim.plot.gantt import Band, GanttInfo, GanttOptions, draw_gantt, gantt, receiver_waited
from schedsim.plot.memory import draw_memory, memory_plot, resolve_model
from schedsim.plot.overlay import (
    OpError,
    default_threshold,
    error_summary,
    gantt_stack,
    op_start_errors,
    overlay,
)
from schedsim.timeline import Timeline
from schedsim.timeline_view import PNG_VIEW
from schedsim.plot.style import (
    KIND_COLORS,
    KIND_NAMES,
    STALL_STYLES,
    default_title,
    shade,
)



def _png(tl: "Timeline") -> bytes:
    """The Gantt chart of ``tl`` as PNG bytes (a notebook's view of a Timeline)."""
    import io

    buf = io.BytesIO()
    gantt(tl).savefig(buf, format="png")
    return buf.getvalue()


PNG_VIEW[0] = _png

#: the earlier public name of :func:`gantt_stack` (docs/python-api.md), kept for scripts
compare = gantt_stack

__all__ = [
    "gantt", "gantt_stack", "compare", "overlay", "memory_plot", "save_figure", "draw_gantt",
    "draw_memory", "resolve_model", "op_start_errors", "error_summary", "OpError",
    "GanttInfo", "GanttOptions", "Band", "receiver_waited", "default_threshold", "KIND_COLORS",
    "KIND_NAMES", "STALL_STYLES", "default_title", "shade", "FORMATS",
]

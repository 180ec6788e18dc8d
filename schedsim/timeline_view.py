"""How a :class:`~schedsim.timeline.Timeline` shows in a notebook: a short ``repr``, an
HTML summary and, once :mod:`schedsim.plot` is imported (it sets :data:`PNG_VIEW`; the
model does not import the layer above it), its Gantt chart."""
from __future__ import annotations

from typing import Any, Callable

from schedsim.util.units import fmt_bubble, fmt_time, with_unit

#: the function drawing a Timeline as PNG bytes (set by :mod:`schedsim.plot`)
PNG_VIEW: list[Callable[[Any], bytes] | None] = [None]


class NotebookViews:
    """The notebook views of a Timeline (a mixin of :class:`~schedsim.timeline.Timeline`)."""

    def __repr__(self: Any) -> str:
        how = (f"measured on {self.semantics}" if self.source == "measured"
               else f"{self.semantics} semantics")
        end = ("DEADLOCK" if self.deadlock is not None else
               f"makespan {with_unit(self.makespan, self.unit)}, bubble "
               f"{fmt_bubble(self.bubble_ratio())}")
        return (f"<Timeline {self.schedule}: {self.ranks} ranks x {self.microbatches} "
                f"microbatches, {how}, {end}>")

    __str__ = __repr__

    def _repr_html_(self: Any) -> str:
        """The summary and the per-rank table as HTML (text escaped)."""
        from html import escape

        rows = "".join(f"<tr><td>{r.rank}</td><td>{fmt_time(r.busy)}</td>"
                       f"<td>{fmt_time(r.idle)}</td>"
                       f"<td>{fmt_bubble(r.bubble_ratio)}</td></tr>" for r in self.per_rank)
        return (f"<p><b>{escape(repr(self)[1:-1])}</b></p><table><tr><th>rank</th>"
                f"<th>busy</th><th>idle</th><th>bubble ratio</th></tr>{rows}</table>")

    def _repr_png_(self: Any) -> bytes | None:
        """The Gantt chart as PNG bytes, once :mod:`schedsim.plot` (or
        :mod:`schedsim.api`) is imported (it registers the drawing); else None."""
        return None if PNG_VIEW[0] is None else PNG_VIEW[0](self)

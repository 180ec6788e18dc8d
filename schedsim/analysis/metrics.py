"""Bubble metrics of a timeline, both as one record.

- **makespan-based bubble ratio** (:meth:`Timeline.bubble_ratio`): total idle time over
  ``ranks x makespan``; every rank counts from 0 to the makespan.
- **span-based bubble rate** (:func:`schedsim.analysis.metrics.bubble_rate_paper`; Qi et al.,
  "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 5.3): ``(S - C) / S`` with ``S``
  the longest rank span (first op start to last op end) and ``C`` the busiest rank's
  compute time. Schedules whose later stages start late (ZB-H2, ZB-V) score lower here
  than with the makespan-based ratio.
"""
from __future__ import annotations

from schedsim.timeline import Timeline


def stage_spans(tl: Timeline) -> list[float]:
    """Per rank, ``last op end - first op start`` (0 for a rank without ops), in the
    timeline's unit."""
    out = []
    for r in tl.per_rank:
        if r.first_start is None or r.last_end is None:
            out.append(0.0)
        else:
            out.append(r.last_end - r.first_start)
    return out


def bubble_rate_paper(tl: Timeline) -> float:
    """The paper's bubble rate ``(S - C) / S``: ``S`` the longest rank span
    (:func:`stage_spans`), ``C`` the compute time of the busiest rank (``m x chunks x
    (F+B+W)`` with uniform costs). 0 for an empty timeline."""
    spans = stage_spans(tl)
    longest = max(spans, default=0.0)
    if longest <= 0:
        return 0.0
    busy = max((r.busy for r in tl.per_rank), default=0.0)
    return (longest - busy) / longest


def bubble_metrics(tl: Timeline) -> dict:
    """``{"makespan", "bubble_ratio", "span", "span_bubble_rate", "idle": [per rank]}``
    (times in the timeline's unit)."""
    return {"makespan": tl.makespan, "bubble_ratio": tl.bubble_ratio(),
            "span": max(stage_spans(tl), default=0.0),
            "span_bubble_rate": bubble_rate_paper(tl),
            "idle": [r.idle for r in tl.per_rank]}

"""Bubble metrics of a timeline, both as one record.

- **makespan-based bubble ratio** (:meth:`Timeline.bubble_ratio`): total idle time over
  ``ranks x makespan``; every rank counts from 0 to the makespan.
- **span-based bubble rate** (:func:`schedsim.metrics.bubble_rate_paper`; Qi et al.,
  "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 5.3): ``(S - C) / S`` with ``S``
  the longest rank span (first op start to last op end) and ``C`` the busiest rank's
  compute time. Schedules whose later stages start late (ZB-H2, ZB-V) score lower here
  than with the makespan-based ratio.
"""
from __future__ import annotations

from ..metrics import bubble_rate_paper, stage_spans
from ..timeline import Timeline


def bubble_metrics(tl: Timeline) -> dict:
    """``{"makespan", "bubble_ratio", "span", "span_bubble_rate", "idle": [per rank]}``
    (times in the timeline's unit)."""
    return {"makespan": tl.makespan, "bubble_ratio": tl.bubble_ratio(),
            "span": max(stage_spans(tl), default=0.0),
            "span_bubble_rate": bubble_rate_paper(tl),
            "idle": [r.idle for r in tl.per_rank]}

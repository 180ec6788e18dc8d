"""Span-based schedule metrics, as the zero-bubble paper reports them.

Source: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 5.3: a
schedule's *cost* is its longest stage span (a rank's first op start to its last op end),
and its bubble rate is ``(cost - m(T_F + T_B + T_W)) / cost``. Unlike the makespan-based
ratio of :meth:`Timeline.bubble_ratio`, this ignores the time a late stage waits before its
first op (the "parallelogram" of ZB-H2, ZB-2p and ZB-V).
"""
from __future__ import annotations

from .timeline import Timeline


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

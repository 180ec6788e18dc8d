"""The one Timeline assembler every executor uses, and the records it takes: a run's
header (:class:`TimelineHeader`) and, for the measured executors, the span columns of
op objects (:class:`SpanColumns`). The simulator passes its own arrays
(:func:`schedsim.sim.engine.build_timeline`); replay and trace import pass op columns
(:func:`timeline_from_columns`). docs/architecture.md, "One Timeline assembler"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, NamedTuple, Sequence

import numpy as np

from schedsim.timeline import (
    Message,
    Part,
    Span,
    Timeline,
    WaitRecord,
    infer_transfers,
    summarize_spans,
)

if TYPE_CHECKING:
    from schedsim.program.ir import Op, Placement


@dataclass(frozen=True)
class TimelineHeader:
    """What a Timeline says of its run besides its records: the ``placement`` (ranks,
    stages, kind), the schedule ``name``, ``microbatches``, the comm ``semantics`` (or the
    backend that ran it), the time ``unit``, ``source``, ``comm_stream`` and the program's
    ``params``."""

    placement: "Placement"
    name: str
    microbatches: int
    semantics: str
    unit: str
    source: Literal["simulated", "measured"] = "simulated"
    comm_stream: str = "none"
    params: dict[str, Any] | None = None


class SpanColumns(NamedTuple):
    """Spans as parallel columns, one entry per compute op that ran: ``rank`` (int),
    ``op`` (an :class:`~schedsim.program.ir.Op`, ``FB`` included), ``start``/``end``
    (floats in the unit) and ``index`` (the instruction position in the rank's
    program)."""

    rank: Sequence[int]
    op: Sequence["Op"]
    start: Sequence[float]
    end: Sequence[float]
    index: Sequence[int]


def assemble_timeline(head: TimelineHeader, span_rank: Sequence[int] | np.ndarray,
                      span_start: Sequence[float] | np.ndarray,
                      span_end: Sequence[float] | np.ndarray, *,
                      spans: Iterable[Span] = (), messages: Iterable[Message] = (),
                      waits: Iterable[WaitRecord] = (),
                      build: Callable[[], dict[str, Any]] | None = None,
                      span_kinds: Callable[[], set[tuple[str, tuple[str, ...]]]] | None = None,
                      **extra: Any) -> Timeline:
    """The one constructor of an executor's :class:`Timeline`: header fields from
    ``head``, the summary by :func:`summarize_spans` over the span columns
    ``span_rank``/``span_start``/``span_end`` (in the order of ``spans``), and the span,
    message and wait lists either eager (``spans``, ``messages``, ``waits``: validated) or
    deferred (``build()`` returns them as a dict when first needed, and ``span_kinds()``
    answers :meth:`Timeline.span_kinds` without them; see :meth:`Timeline.deferred`;
    nothing validated: the simulator's arrays are trusted). ``extra`` fields are stored on
    the Timeline (JSON extra fields). Raises ValueError as :func:`summarize_spans`."""
    pl = head.placement
    makespan, per_rank = summarize_spans(pl.ranks, span_rank, span_start, span_end)
    fields = {"schedule": head.name, "ranks": pl.ranks, "stages": pl.stages,
              "microbatches": head.microbatches, "semantics": head.semantics,
              "comm_stream": head.comm_stream, "unit": head.unit, "source": head.source,
              "placement": pl.kind, "makespan": makespan, "per_rank": per_rank,
              "params": dict(head.params or {})}
    if build is not None:
        return Timeline.deferred(build, span_kinds, **fields, deadlock=None, **extra)
    return Timeline(**fields, spans=list(spans), messages=list(messages), waits=list(waits),
                    **extra)


def timeline_from_columns(head: TimelineHeader, cols: SpanColumns,
                          messages: Iterable[Message] = (), waits: Iterable[WaitRecord] = (),
                          *, order: Literal["given", "rank-start"] = "given",
                          **extra: Any) -> Timeline:
    """A :class:`Timeline` from columns of op objects: the builder of the measured
    executors (replay, trace import); :func:`assemble_timeline` makes the Timeline.

    An ``FB`` op's parts become its span's ``parts``; the chunk of every span and part
    comes from ``head.placement``. ``messages`` and ``waits`` are taken as they are
    (``Message(kind, src, dst, mb, stage, ...)`` positionally builds one from columns); a
    measured run's unobservable transfer times are filled (:func:`infer_transfers`).
    ``order="rank-start"`` sorts the spans by ``(rank, start)`` (stable); ``"given"``
    keeps the input order. ``extra`` fields are stored on the Timeline (JSON extra
    fields, e.g. ``backend``, ``posts``, ``missing_ranks``).

    Raises ValueError if the span columns differ in length.
    """
    n = len(cols.op)
    if not all(len(c) == n for c in cols):
        raise ValueError("timeline_from_columns: the span columns differ in length")
    ix = list(range(n))
    if order == "rank-start":
        ix.sort(key=lambda k: (cols.rank[k], cols.start[k]))
    rank = [cols.rank[k] for k in ix]
    start = [cols.start[k] for k in ix]
    end = [cols.end[k] for k in ix]
    chunk_of = head.placement.chunk_fn()
    spans = []
    for k, r, a, b in zip(ix, rank, start, end):
        op = cols.op[k]
        parts = ([Part(p.kind, p.mb, chunk_of(p.stage, p.mb), p.stage) for p in op.parts]
                 if op.parts else None)
        spans.append(Span(r, op.kind, op.mb, chunk_of(op.stage, op.mb), op.stage, a, b,
                          cols.index[k], parts))
    messages = list(messages)
    if head.source == "measured":
        infer_transfers(messages)
    return assemble_timeline(head, rank, start, end, spans=spans, messages=messages,
                             waits=waits, **extra)

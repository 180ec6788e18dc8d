"""Timeline: what an executor (simulator or real replay) produces, and its JSON contract.

JSON (stable; extend only compatibly)::

    {"schedule", "ranks", "stages", "microbatches", "semantics", "comm_stream", "unit",
     "source": "simulated"|"measured", "makespan",
     "per_rank": [{"rank", "busy", "idle", "bubble_ratio", "first_start", "last_end"}],
     "spans":    [{"rank", "kind", "mb", "chunk", "stage", "start", "end", "index",
                   "parts": null | [{"kind", "mb", "chunk", "stage"}, ...]}],
     "messages": [{"kind": "F"|"B", "src", "dst", "mb", "stage", "bytes", "send_posted",
                   "recv_posted", "start", "arrival", "send_done", "recv_done",
                   "send_index", "recv_index", "send_active", "recv_active"}],
     "waits":    [{"rank", "index", "kind", "start", "end", "comms"}],
     "deadlock": null | {"message", "blocked": [...], "cycle": [...]}}

Times are in ``unit``. ``index`` fields are instruction positions in the rank's program.
A span's ``mb``/``chunk``/``stage`` are its forward part's for ``FB``. A message's
``stage`` is the stage that produced it. ``waits`` has one record per blocking instruction
(``COMMIT``, ``WAIT``, ``END`` = the implicit wait for outstanding ops at program end,
``DATA`` = a compute op waiting for its inputs under ``data`` semantics, ``INIT`` = a
bare post blocked in a lazy communicator init, ``comms`` naming that post).
``send_active``/``recv_active`` (added with the comm-stream stall blame; None in older
files and where not recorded) are when each side reached the head of its comm stream.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Iterable, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from schedsim.timeline_view import NotebookViews
from schedsim.program.vocab import GroupSemantics
from schedsim.util.lazy import LazyFields

#: the records of a Timeline JSON refuse keys they do not have (read_json names the key)
_STRICT = ConfigDict(extra="forbid")


@dataclass(slots=True)
class Part:
    """One half of an ``FB`` span."""

    __pydantic_config__ = _STRICT

    kind: str
    mb: int
    chunk: int
    stage: int


@dataclass(slots=True)
class Span:
    """One compute op executed on ``rank`` from ``start`` to ``end``."""

    __pydantic_config__ = _STRICT

    rank: int
    kind: str
    mb: int
    chunk: int
    stage: int
    start: float
    end: float
    index: int = -1
    parts: list[Part] | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class Message:
    """One P2P message: when each side posted, when it moved, when each side completed.

    The one definition of its times (in the timeline's unit), for simulated and measured
    timelines alike:

    - ``send_posted`` / ``recv_posted``: when the side's post instruction is done on its
      rank's host, i.e. the *end* of launching the batch (bare post or ``BATCH``) that
      holds it (a bare post or a ``BATCH``). Simulator: the post time after
      ``CommModel.launch_cost``
      (:mod:`schedsim.sim.engine`); replay: the end of the ``batch_isend_irecv`` call
      (:mod:`schedsim.replay.executor`; the data may arrive while that call still
      runs, so a measured ``recv_done`` can precede ``send_posted``); imported trace: the
      end of the post range. With
      a comm stream the op may become active later than that, queued behind the stream's
      earlier batches. Under ``data`` semantics (no post instructions) ``send_posted`` is
      when the send became active (its producer ended) and ``recv_posted`` is None; also
      None for measured timelines that did not record it;
    - ``start`` / ``arrival``: when the transfer began / its last byte arrived. Measured
      timelines (replay, imported traces) cannot observe them; the builder
      (:func:`schedsim.timeline_build.timeline_from_columns`) sets them from what they
      can: ``start`` = when both sides had posted (gloo and NCCL move the bytes only
      then; :func:`effective_posts`), ``arrival`` = ``recv_done`` (exact when the
      receiver was blocked on it, an upper bound otherwise); None when a side was not
      recorded. So a measured side's time from post to done splits into *waiting for
      the peer* (post to ``start``) and *transferring* (``start`` to done);
    - ``send_done`` / ``recv_done``: when each side completed (measured: when the wait
      for it returned);
    - ``send_active`` / ``recv_active``: when each side became active, i.e. reached the
      head of its rank's comm stream (the post time without a comm stream; later when
      the op was queued behind earlier launches on the stream). None when not recorded
      (measured timelines) or never reached (deadlock); under ``data`` semantics
      ``send_active`` is when the producer ended.
    """

    __pydantic_config__ = _STRICT

    kind: str
    src: int
    dst: int
    mb: int
    stage: int
    bytes: float = 0.0
    send_posted: float | None = None
    recv_posted: float | None = None
    start: float | None = None
    arrival: float | None = None
    send_done: float | None = None
    recv_done: float | None = None
    send_index: int = -1
    recv_index: int = -1
    send_active: float | None = None
    recv_active: float | None = None
    #: a skip edge's consuming stage (None, not written to JSON: the chain's neighbour)
    to_stage: Annotated[int | None, Field(exclude_if=lambda v: v is None)] = None

    @property
    def key(self) -> tuple:
        """The message key, with ``to_stage`` on a skip edge (:mod:`schedsim.program.routing`)."""
        k = (self.kind, self.stage, self.mb)
        return k if self.to_stage is None else (*k, self.to_stage)

    def label(self) -> str:
        return f"{self.kind} mb{self.mb} {self.src}->{self.dst}"


@dataclass(slots=True)
class WaitRecord:
    """A blocking instruction: the rank reached it at ``start`` and went on at ``end``."""

    __pydantic_config__ = _STRICT

    rank: int
    index: int
    kind: str
    start: float
    end: float
    comms: list[str] = field(default_factory=list)


class RankSummary(BaseModel):
    """Per-rank totals. ``idle = makespan - busy``; ``bubble_ratio = idle / makespan``."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    rank: int
    busy: float
    idle: float
    bubble_ratio: float
    first_start: float | None = None
    last_end: float | None = None


class BlockedRank(BaseModel):
    """A rank that can never go on: where it is stuck and what it waits for."""

    model_config = ConfigDict(defer_build=True)

    rank: int
    index: int
    instruction: str
    since: float
    waiting_for: list[str]


class CycleStep(BaseModel):
    """One edge of the wait-for cycle: ``rank`` (stuck at ``instruction``) waits for
    ``waits_for`` (an op of ``peer``), which ``peer`` cannot reach because of ``because``."""

    model_config = ConfigDict(defer_build=True)

    rank: int
    index: int
    instruction: str
    waits_for: str
    peer: int
    because: str


class Deadlock(BaseModel):
    model_config = ConfigDict(defer_build=True)

    message: str
    blocked: list[BlockedRank]
    cycle: list[CycleStep]


class Timeline(NotebookViews, LazyFields):
    """Spans, messages and waits of one execution, with summary statistics.

    A simulated timeline builds its ``spans``, ``messages`` and ``waits`` lists on first
    use (:class:`~schedsim.util.lazy.LazyFields`): reading the summary of a large run
    costs no object per op.
    """

    model_config = ConfigDict(extra="allow", defer_build=True)
    _lazy_fields: ClassVar[tuple[str, ...]] = ("spans", "messages", "waits")

    schedule: str
    ranks: int
    stages: int
    microbatches: int
    semantics: str
    comm_stream: str = "none"
    #: ``CommModel.group_semantics`` of the run (not written to JSON when independent)
    group_semantics: Annotated[GroupSemantics, Field(
        exclude_if=lambda v: v == "independent")] = "independent"
    unit: str = "slot"
    source: Literal["simulated", "measured"] = "simulated"
    placement: str = "loop"
    makespan: float
    per_rank: list[RankSummary]
    spans: list[Span]
    messages: list[Message] = Field(default_factory=list)
    waits: list[WaitRecord] = Field(default_factory=list)
    deadlock: Deadlock | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    #: ``(rank, instruction index, sentence)`` of each silent swap (:mod:`schedsim.sim.
    #: identity`) of the run; not in the JSON (``schedsim lint`` finds them again)
    findings: list[tuple[int, int, str]] = Field(default_factory=list, exclude=True)

    @staticmethod
    def summarize(ranks: int, spans: list[Span]) -> tuple[float, list[RankSummary]]:
        """Makespan and per-rank summary of span objects (:func:`summarize_spans` over
        their columns)."""
        return summarize_spans(ranks, [s.rank for s in spans], [s.start for s in spans],
                               [s.end for s in spans])

    def bubble_ratio(self) -> float:
        """Makespan-based bubble ratio over all ranks: total idle / (ranks x makespan)."""
        if self.makespan <= 0:
            return 0.0
        return sum(r.idle for r in self.per_rank) / (self.ranks * self.makespan)

    def find_span(self, rank: int, kind: str, mb: int, stage: int | None = None) -> Span:
        """The span of ``kind`` for ``mb`` on ``rank`` (an FB span matches by its parts).

        Raises KeyError if there is none.
        """
        for s in self.spans:
            if s.rank != rank:
                continue
            parts = s.parts or [s]
            for p in parts:
                if p.kind == kind and p.mb == mb and (stage is None or p.stage == stage):
                    return s
        raise KeyError(f"no {kind} of mb {mb} on rank {rank}")

    def spans_of(self, rank: int) -> list[Span]:
        return sorted((s for s in self.spans if s.rank == rank), key=lambda s: s.start)

    @classmethod
    def deferred(cls, build: Callable[[], dict[str, Any]],
                 span_kinds: Callable[[], set[tuple[str, tuple[str, ...]]]] | None = None,
                 **fields: Any) -> "Timeline":
        """A timeline whose ``spans``, ``messages`` and ``waits`` are made by ``build()``
        (returning them as a dict) when first needed; ``span_kinds`` answers
        :meth:`span_kinds` without building them; ``fields`` are the others, taken as
        valid (not validated)."""
        # every field given: model_construct then resolves no default (slow for factories)
        tl = cls.model_construct(**{"spans": [], "messages": [], "waits": [], **fields})
        tl._defer((build, span_kinds))
        return tl

    def _build_lazy(self, state: Any) -> dict[str, Any]:
        return state[0]()

    def span_kinds(self) -> set[tuple[str, tuple[str, ...]]]:
        """``(kind, kinds of its parts)`` of every kind of span that ran (``("FB",
        ("F", "BW"))`` for an overlapped pair, ``("F", ())`` for a forward), without
        building the span objects of a deferred timeline."""
        state = self._lazy
        if state is not None and state[1] is not None:
            return state[1]()
        return {(s.kind, tuple(p.kind for p in s.parts) if s.parts else ()) for s in self.spans}

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    def write_json(self, path: str | Path) -> None:
        """Write the JSON atomically (no partial file on failure)."""
        from schedsim.util.files import atomic_write_text

        atomic_write_text(path, self.to_json())

    @classmethod
    def read_json(cls, path: str | Path) -> "Timeline":
        """Read a Timeline JSON file and check it
        (:func:`schedsim.timeline_check.check_timeline`): a file that
        is not one, or one whose values cannot be drawn or analysed, is refused with one
        line naming the file and the first bad value: an unknown key (top level or in a
        record) with the nearest known one, a ``per_rank`` row its spans contradict by
        its rank and field. Raises
        :class:`~schedsim.errors.ScenarioError` (or a subclass: InputError, LimitError)."""
        from pydantic import ValidationError

        from schedsim.errors import ScenarioError
        from schedsim.timeline_check import check_timeline, first_error, unknown_top_level_key
        from schedsim.util.inputs import loading, read_input_text

        with loading(path, "timeline JSON"):
            text = read_input_text(path, "timeline JSON")
            try:
                tl = cls.model_validate_json(text, strict=True)
            except ValidationError as e:
                more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
                # a misspelt key first: 'makspan' is why 'makespan' is missing
                key = unknown_top_level_key(text, cls)
                why = f"top level: {key}" if key else f"{first_error(e, cls)}{more}"
                raise ScenarioError(f"{path}: not a schedsim timeline JSON: {why}") from None
            check_timeline(tl, path)
            return tl


def summarize_spans(ranks: int, rank: Sequence[int] | np.ndarray,
                    start: Sequence[float] | np.ndarray,
                    end: Sequence[float] | np.ndarray) -> tuple[float, list[RankSummary]]:
    """The one summary of a timeline: makespan (end of the last span, 0 without spans)
    and per rank ``busy`` (sum of span durations, added in the given order), ``idle =
    makespan - busy``, ``bubble_ratio = idle / makespan`` and the first start / last end
    (None for a rank without spans).

    Spans are given as parallel columns of length ``n`` (lists or numpy arrays): ``rank``
    (int in ``[0, ranks)``), ``start``/``end`` (float, the timeline's unit). Runs in
    numpy; the sums are those of a Python loop over the spans in order (``np.bincount``
    adds its weights in input order), so a simulated and a measured timeline summarise
    the same spans to the same bits. Infinite times give inf/nan sums (callers report).

    Raises ValueError if the columns differ in length or a rank is out of range.
    """
    r = np.asarray(rank)
    if r.dtype.kind not in "iu":
        r = np.asarray(rank, dtype=np.int64)
    a = np.asarray(start, dtype=np.float64)
    b = np.asarray(end, dtype=np.float64)
    if not (len(r) == len(a) == len(b)):
        raise ValueError("summarize_spans: the span columns differ in length")
    first = np.full(ranks, np.inf)
    last = np.full(ranks, -np.inf)
    busy = np.zeros(ranks)
    if len(r):
        if r.min() < 0 or r.max() >= ranks:
            raise ValueError(f"summarize_spans: a span's rank is outside 0..{ranks - 1}")
        grouped = len(r) == 1 or bool(np.all(r[1:] >= r[:-1]))
        if not grouped:                                          # group by rank
            with np.errstate(invalid="ignore", over="ignore"):
                busy = np.bincount(r.astype(np.int64), weights=b - a, minlength=ranks)
            order = np.argsort(r, kind="stable")
            r, a, b = r[order], a[order], b[order]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        if grouped:
            busy = _rank_sums(r, a, b, starts, ranks)
        first[r[starts]] = np.fmin.reduceat(a, starts)     # fmin/fmax: a NaN time is
        last[r[starts]] = np.fmax.reduceat(b, starts)      # skipped, as by `<` in a loop
    makespan = max(float(last.max()), 0.0) if len(a) else 0.0
    rows = []
    for k, (bk, fk, lk) in enumerate(zip(busy.tolist(), first.tolist(), last.tolist())):
        idle = makespan - bk
        rows.append(RankSummary.model_construct(
            rank=k, busy=bk, idle=idle, bubble_ratio=idle / makespan if makespan > 0 else 0.0,
            first_start=fk if fk < math.inf else None,
            last_end=lk if lk > -math.inf else None))
    return makespan, rows


def _rank_sums(r: np.ndarray, a: np.ndarray, b: np.ndarray, starts: np.ndarray,
               ranks: int) -> np.ndarray:
    """Per rank, the sum of ``b - a`` over its spans in order, of spans grouped by rank
    (rank ``r[s]``'s are ``starts`` s to the next): the bits of ``np.bincount`` (0.0 plus
    each in turn) by a sequential ``np.cumsum`` per rank, without the two arrays of the
    spans' size that ``bincount`` needs (an int64 rank and the weights: 40 MB at 2.5 M
    spans, the peak of a large run's Timeline)."""
    out = np.zeros(ranks)
    ends = np.append(starts[1:], len(r)).tolist()
    with np.errstate(invalid="ignore", over="ignore"):
        for s, e in zip(starts.tolist(), ends):
            w = np.empty(e - s + 1)
            w[0] = 0.0
            np.subtract(b[s:e], a[s:e], out=w[1:])
            out[int(r[s])] = np.cumsum(w)[-1]
    return out


def _sides(m: Message) -> tuple[tuple[int, int, float | None], ...]:
    return ((m.src, m.send_index, m.send_posted), (m.dst, m.recv_index, m.recv_posted))


def effective_posts(messages: Iterable[Message]) -> dict[tuple[int, int], float]:
    """``(rank, instruction index) -> time`` by which each launch of a measured run had
    posted its ops: its recorded post (the end of the launch), or earlier when one of its
    messages completed (either side) before that: under rendezvous, which gloo and NCCL
    follow (docs/traces.md), no side completes before both sides posted, and a launch
    issues its ops as it starts, so the rest of the launch was host time (a descheduled
    host, profiler overhead). Used for the transfer split (:func:`infer_transfers`),
    ``calibrate --exact`` and the dependency graph of a measured run."""
    posted: dict[tuple[int, int], float] = {}
    bound: dict[tuple[int, int], float] = {}
    for m in messages:
        done = [t for t in (m.recv_done, m.send_done) if t is not None]
        for r, i, t in _sides(m):
            if t is None or i < 0:
                continue
            k = (r, i)
            posted[k] = max(t, posted.get(k, t))
            if done:
                bound[k] = min(min(done), bound.get(k, math.inf))
    return {k: min(t, bound.get(k, math.inf)) for k, t in posted.items()}


def infer_transfers(messages: list[Message]) -> None:
    """Fill measured messages' unobservable ``start``/``arrival`` (left as they are when
    set; the rule in :class:`Message`): ``start`` = when both sides had posted
    (:func:`effective_posts`), ``arrival`` = ``recv_done``. Nothing for a message whose
    posts or ``recv_done`` are unknown."""
    eff = effective_posts(messages)
    for m in messages:
        if m.start is not None or m.recv_done is None:
            continue
        sides = [eff.get((r, i), t) for r, i, t in _sides(m)]
        if None in sides:
            continue
        m.start = max(sides)
        m.arrival = max(m.start, m.recv_done)

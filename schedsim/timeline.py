"""Timeline: what an executor (simulator or real replay) produces, and its JSON contract.

JSON (stable; extend only compatibly)::

    {"schedule", "ranks", "stages", "microbatches", "semantics", "comm_stream", "unit",
     "source": "simulated"|"measured", "makespan",
     "per_rank": [{"rank", "busy", "idle", "bubble_ratio", "first_start", "last_end"}],
     "spans":    [{"rank", "kind", "mb", "chunk", "stage", "start", "end", "index",
                   "parts": null | [{"kind", "mb", "chunk", "stage"}, ...]}],
     "messages": [{"kind": "F"|"B", "src", "dst", "mb", "stage", "bytes", "send_posted",
                   "recv_posted", "start", "arrival", "send_done", "recv_done",
                   "send_index", "recv_index"}],
     "waits":    [{"rank", "index", "kind", "start", "end", "comms"}],
     "deadlock": null | {"message", "blocked": [...], "cycle": [...]}}

Times are in ``unit``. ``index`` fields are instruction positions in the rank's program.
A span's ``mb``/``chunk``/``stage`` are its forward part's for ``FB``. A message's
``stage`` is the stage that produced it. ``waits`` has one record per blocking instruction
(``COMMIT``, ``WAIT``, ``END`` = the implicit wait for outstanding ops at program end,
``DATA`` = a compute op waiting for its inputs under ``data`` semantics).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    - ``start`` / ``arrival``: when the transfer began / its last byte arrived (None in
      measured timelines: not observable);
    - ``send_done`` / ``recv_done``: when each side completed (measured: the end of the
      first wait that covers it).
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

    rank: int
    busy: float
    idle: float
    bubble_ratio: float
    first_start: float | None = None
    last_end: float | None = None


class BlockedRank(BaseModel):
    """A rank that can never go on: where it is stuck and what it waits for."""

    rank: int
    index: int
    instruction: str
    since: float
    waiting_for: list[str]


class CycleStep(BaseModel):
    """One edge of the wait-for cycle: ``rank`` (stuck at ``instruction``) waits for
    ``waits_for`` (an op of ``peer``), which ``peer`` cannot reach because of ``because``."""

    rank: int
    index: int
    instruction: str
    waits_for: str
    peer: int
    because: str


class Deadlock(BaseModel):
    message: str
    blocked: list[BlockedRank]
    cycle: list[CycleStep]


class Timeline(BaseModel):
    """Spans, messages and waits of one execution, with summary statistics."""

    model_config = ConfigDict(extra="allow")

    schedule: str
    ranks: int
    stages: int
    microbatches: int
    semantics: str
    comm_stream: str = "none"
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

    @staticmethod
    def summarize(ranks: int, spans: list[Span]) -> tuple[float, list[RankSummary]]:
        """Makespan (end of the last span) and per-rank busy/idle/bubble ratio."""
        inf = float("inf")
        busy = [0.0] * ranks
        first = [inf] * ranks
        last = [-inf] * ranks
        for s in spans:
            r, a, b = s.rank, s.start, s.end
            busy[r] += b - a
            if a < first[r]:
                first[r] = a
            if b > last[r]:
                last[r] = b
        makespan = max(max(last), 0.0) if spans else 0.0
        rows = []
        for r in range(ranks):
            idle = makespan - busy[r]
            rows.append(RankSummary(rank=r, busy=busy[r], idle=idle,
                                    bubble_ratio=idle / makespan if makespan > 0 else 0.0,
                                    first_start=first[r] if first[r] < inf else None,
                                    last_end=last[r] if last[r] > -inf else None))
        return makespan, rows

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

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    def write_json(self, path: str | Path) -> None:
        """Write the JSON atomically (no partial file on failure)."""
        from schedsim.util.files import atomic_write_text

        atomic_write_text(path, self.to_json())

    @classmethod
    def read_json(cls, path: str | Path) -> "Timeline":
        """Read a Timeline JSON file and check it (:func:`check_timeline`): a file that
        is not one, or one whose values cannot be drawn or analysed, is refused with one
        line naming the file and the first bad value. Raises
        :class:`~schedsim.errors.ScenarioError` (or a subclass: InputError, LimitError)."""
        from pydantic import ValidationError

        from schedsim.errors import ScenarioError
        from schedsim.util.inputs import loading, read_input_text
        from schedsim.util.text import clip

        with loading(path, "timeline JSON"):
            text = read_input_text(path, "timeline JSON")
            try:
                tl = cls.model_validate_json(text)
            except ValidationError as e:
                err = e.errors()[0]
                loc = clip(".".join(str(x) for x in err["loc"])) or "top level"
                more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
                raise ScenarioError(f"{path}: not a schedsim timeline JSON: {loc}: "
                                    f"{err['msg']}{more}") from None
            check_timeline(tl, path)
            return tl


#: kinds a span, part, message and wait record may have
SPAN_KINDS = frozenset(("F", "B", "W", "BW", "FB"))
WAIT_KINDS = frozenset(("COMMIT", "WAIT", "END", "DATA"))
#: characters a name (schedule, semantics, unit, ...) of a loaded timeline may have
MAX_NAME = 200


def check_timeline(tl: Timeline, source: object = "timeline") -> None:
    """Refuse a loaded timeline whose values are out of range or inconsistent, so
    analyses and figures never see them: ranks within 1 .. the ``ranks`` limit, records
    within the ``instructions`` limit, one ``per_rank`` row per rank, finite times
    (makespan >= 0; a span within 0 <= start <= end <= makespan), span and record ranks
    below ``ranks``, stages below ``stages``, known kinds, names of at most
    :data:`MAX_NAME` characters. Raises :class:`~schedsim.errors.ScenarioError` naming
    ``source`` and the first bad value."""
    import math

    from schedsim.errors import ScenarioError
    from schedsim.util.limits import check
    from schedsim.util.text import clip

    def bad(what: str) -> ScenarioError:
        return ScenarioError(f"{source}: not a valid timeline: {what}")

    P, S = tl.ranks, tl.stages
    if P < 1 or S < 1 or tl.microbatches < 0:
        raise bad(f"ranks {P}, stages {S}, microbatches {tl.microbatches}: need ranks >= 1, "
                  f"stages >= 1")
    check("ranks", P, f"{source} with {P:,} ranks")
    n = len(tl.spans) + len(tl.messages) + len(tl.waits)
    check("instructions", n, f"{source} with {n:,} spans, messages and waits")
    for name in ("schedule", "semantics", "comm_stream", "unit", "placement"):
        if len(getattr(tl, name)) > MAX_NAME:
            raise bad(f"{name} has {len(getattr(tl, name)):,} characters (at most "
                      f"{MAX_NAME})")
    if not (math.isfinite(tl.makespan) and tl.makespan >= 0):
        raise bad(f"makespan {tl.makespan!r}: must be a finite number >= 0")
    if len(tl.per_rank) != P or any(
            not math.isfinite(x) for r in tl.per_rank for x in
            (r.busy, r.idle, r.bubble_ratio, r.first_start or 0.0, r.last_end or 0.0)):
        raise bad(f"per_rank must have one row of finite numbers per rank ({P})")
    tol = 1e-9 * max(1.0, tl.makespan)
    for i, sp in enumerate(tl.spans):
        if not (0 <= sp.rank < P and 0 <= sp.stage < S and sp.mb >= 0 and sp.chunk >= 0):
            raise bad(f"spans[{i}] has rank {sp.rank}, stage {sp.stage}, mb {sp.mb}: need "
                      f"0 <= rank < {P}, 0 <= stage < {S}, mb >= 0")
        if sp.kind not in SPAN_KINDS or any(
                p.kind not in SPAN_KINDS or not 0 <= p.stage < S or p.mb < 0
                for p in sp.parts or ()):
            raise bad(f"spans[{i}] has an unknown kind or part (kinds: F, B, W, BW, FB)")
        if not (0 <= sp.start <= sp.end <= tl.makespan + tol):
            raise bad(f"spans[{i}] runs from {sp.start!r} to {sp.end!r}: need 0 <= start "
                      f"<= end <= makespan ({tl.makespan!r})")
    for i, m in enumerate(tl.messages):
        times = (m.send_posted, m.recv_posted, m.start, m.arrival, m.send_done, m.recv_done)
        if not (0 <= m.src < P and 0 <= m.dst < P and 0 <= m.stage < S and m.mb >= 0
                and m.kind in ("F", "B") and math.isfinite(m.bytes) and m.bytes >= 0
                and all(t is None or math.isfinite(t) for t in times)):
            raise bad(f"messages[{i}] ({clip(str(m.kind), 8)} mb {m.mb} {m.src}->{m.dst}) "
                      f"has a rank, stage, kind, size or time out of range")
    for i, w in enumerate(tl.waits):
        if not (0 <= w.rank < P and w.kind in WAIT_KINDS and math.isfinite(w.start)
                and math.isfinite(w.end) and w.start <= w.end):
            raise bad(f"waits[{i}] has a rank, kind or time out of range")
    if tl.deadlock is not None and any(not 0 <= b.rank < P for b in tl.deadlock.blocked):
        raise bad(f"deadlock names a rank outside 0..{P - 1}")

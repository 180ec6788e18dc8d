"""Checks of a Timeline read from a file (:meth:`schedsim.timeline.Timeline.read_json`):
values a hand-edited, truncated or hostile Timeline JSON may hold that no analysis or
figure could use — out-of-range ranks and stages, times that are not finite or not
ordered, unknown kinds, overlong names, and malformed extra fields (``posts``,
``pieces``, ``program``, ...), unknown keys (with the nearest known one), a ``per_rank``
summary its spans contradict — are refused with one line naming the file and the first
bad value. Duck-typed on the Timeline (no import of :mod:`schedsim.timeline`, which
imports this module)."""
from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schedsim.program.routing import MESSAGE_KINDS


#: pydantic's error types of an unknown key (a model's, a dataclass's)
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")


def first_error(e: Any, model: Any = None) -> str:
    """``loc: msg`` of a pydantic ValidationError's first error (the key clipped); an
    unknown key of a record of ``model`` (a class whose fields are records, e.g. the
    Timeline) as ``loc: unknown key 'k' (did you mean ...?): expected one of ...``."""
    from schedsim.util.text import clip

    err = e.errors()[0]
    loc = err["loc"]
    where = clip(".".join(str(x) for x in loc)) or "top level"
    if err["type"] in _UNKNOWN_KEY and model is not None and loc:
        keys = _keys_at(model, loc[:-1])
        if keys:
            where = clip(".".join(str(x) for x in loc[:-1])) or "top level"
            return f"{where}: {unknown_key(str(loc[-1]), keys)}"
    return f"{where}: {err['msg']}"


def unknown_key(key: str, keys: Any) -> str:
    """``unknown key 'k' (did you mean 'x'?): expected one of a, b, ...`` (the key
    clipped) for a record whose keys are ``keys``."""
    from schedsim.util.suggest import did_you_mean
    from schedsim.util.text import clip

    return (f"unknown key {clip(repr(key), 40)}{did_you_mean(key, keys)}: expected one of "
            f"{', '.join(keys)}")


def _fields(cls: Any) -> dict[str, Any]:
    """``{name: annotation}`` of a pydantic model or a dataclass (``{}`` for another
    type)."""
    import dataclasses
    import typing

    if isinstance(getattr(cls, "model_fields", None), dict):
        return {n: f.annotation for n, f in cls.model_fields.items()}
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        return {f.name: hints.get(f.name) for f in dataclasses.fields(cls)}
    return {}


def _record_type(ann: Any) -> Any:
    """The record class inside an annotation (``list[Span] | None`` -> ``Span``)."""
    import typing

    if _fields(ann):
        return ann
    for a in typing.get_args(ann):
        t = _record_type(a)
        if t is not None:
            return t
    return None


def _keys_at(model: Any, loc: tuple) -> list[str]:
    """The keys of the record at ``loc`` (a pydantic error location, list indices
    included) under ``model``; ``[]`` where there is no record class."""
    cls = model
    for seg in loc:
        if isinstance(seg, int):
            continue
        cls = _record_type(_fields(cls).get(seg))
        if cls is None:
            return []
    return list(_fields(cls))


def unknown_top_level_key(text: str, model: Any) -> str | None:
    """``unknown key ...`` for the first top-level key of the JSON ``text`` that neither
    ``model`` (the Timeline) nor :class:`_Extras` has, or None (also for text that is not
    a JSON object). For a file the model refused: a required key spelled wrong
    (``makspan``) is then named with its suggestion, not only as missing."""
    import json

    try:
        data = json.loads(text)
    except (ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(data, dict):
        return None
    keys = top_level_keys(model)
    bad = next((k for k in data if k not in keys), None)
    return None if bad is None else unknown_key(bad, keys)


def top_level_keys(model: Any) -> list[str]:
    """Every top-level key a Timeline JSON may have: the fields of ``model`` (the
    Timeline) and the extra fields schedsim writes (:class:`_Extras`)."""
    return [*model.model_fields, *_Extras.model_fields]


#: kinds a span, part, message and wait record may have
SPAN_KINDS = frozenset(("F", "B", "W", "BW", "FB"))
WAIT_KINDS = frozenset(("COMMIT", "WAIT", "END", "DATA"))
#: characters a name (schedule, semantics, unit, ...) of a loaded timeline may have
MAX_NAME = 200


def check_timeline(tl: Any, source: object = "timeline") -> None:
    """Refuse a loaded timeline whose values are out of range or inconsistent, so
    analyses and figures never see them: ranks within 1 .. the ``ranks`` limit, records
    within the ``instructions`` limit, one ``per_rank`` row per rank, finite times
    (makespan >= 0; a span within 0 <= start <= end <= makespan), span and record ranks
    below ``ranks``, stages below ``stages``, known kinds, names of at most
    :data:`MAX_NAME` characters. Raises :class:`~schedsim.errors.ScenarioError` naming
    ``source`` and the first bad value."""
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
        if (n := len(getattr(tl, name))) > MAX_NAME:
            raise bad(f"{name} has {n:,} characters (at most {MAX_NAME})")
    _check_names(tl, bad)
    if not (math.isfinite(tl.makespan) and tl.makespan >= 0):
        raise bad(f"makespan {tl.makespan!r}: must be a finite number >= 0")
    if len(tl.per_rank) != P or any(
            not math.isfinite(x) for r in tl.per_rank for x in
            (r.busy, r.idle, r.bubble_ratio, r.first_start or 0.0, r.last_end or 0.0)):
        raise bad(f"per_rank must have one row of finite numbers per rank ({P})")
    tol = 1e-9 * max(1.0, tl.makespan)
    M = tl.microbatches or None          # 0: not recorded (old files); else mb < M
    ran: set[tuple[str, int, int]] = set()      # each op runs once: (kind, stage, mb)
    for i, sp in enumerate(tl.spans):
        for key in ([(p.kind, p.stage, p.mb) for p in sp.parts] if sp.parts
                    else [(sp.kind, sp.stage, sp.mb)]):
            if key in ran:
                raise bad(f"spans[{i}] runs {key[0]} of stage {key[1]} mb {key[2]} a second "
                          f"time: each op runs once in a timeline")
            ran.add(key)
        if M is not None and (sp.mb >= M or any(p.mb >= M for p in sp.parts or ())):
            raise bad(f"spans[{i}] has mb {sp.mb}: the timeline has {M} microbatches")
        # a chunk is a rank's index of a stage it holds: below the stage count (the
        # pictures keep a colour per chunk)
        if not (0 <= sp.rank < P and 0 <= sp.stage < S and sp.mb >= 0 and 0 <= sp.chunk < S):
            raise bad(f"spans[{i}] has rank {sp.rank}, stage {sp.stage}, chunk {sp.chunk}, "
                      f"mb {sp.mb}: need 0 <= rank < {P}, 0 <= stage < {S}, "
                      f"0 <= chunk < {S}, mb >= 0")
        if sp.kind not in SPAN_KINDS or any(
                p.kind not in SPAN_KINDS or not 0 <= p.stage < S or p.mb < 0
                or not 0 <= p.chunk < S for p in sp.parts or ()):
            raise bad(f"spans[{i}] has an unknown kind or part (kinds: F, B, W, BW, FB)")
        if (sp.kind == "FB") != bool(sp.parts) or any(p.kind == "FB" for p in sp.parts or ()):
            raise bad(f"spans[{i}] is {sp.kind} with {len(sp.parts or ())} parts: an FB span "
                      f"carries its forward and backward parts (kinds F, B, W, BW), and only "
                      f"an FB span has parts")
        if not (0 <= sp.start <= sp.end <= tl.makespan + tol):
            raise bad(f"spans[{i}] runs from {sp.start!r} to {sp.end!r}: need 0 <= start "
                      f"<= end <= makespan ({tl.makespan!r})")
    for i, m in enumerate(tl.messages):
        times = (m.send_posted, m.recv_posted, m.start, m.arrival, m.send_done, m.recv_done)
        if not (0 <= m.src < P and 0 <= m.dst < P and 0 <= m.stage < S and m.mb >= 0
                and m.kind in MESSAGE_KINDS and math.isfinite(m.bytes) and m.bytes >= 0
                and all(t is None or math.isfinite(t) for t in times)):
            raise bad(f"messages[{i}] ({clip(str(m.kind), 8)} mb {m.mb} {m.src}->{m.dst}) "
                      f"has a rank, stage, kind, size or time out of range")
    for i, w in enumerate(tl.waits):
        if not (0 <= w.rank < P and w.kind in WAIT_KINDS and math.isfinite(w.start)
                and math.isfinite(w.end) and w.start <= w.end):
            raise bad(f"waits[{i}] has a rank, kind or time out of range")
    if tl.deadlock is not None and any(not 0 <= b.rank < P for b in tl.deadlock.blocked):
        raise bad(f"deadlock names a rank outside 0..{P - 1}")
    _check_summary(tl, bad, tol)
    _check_extras(tl, bad)


def _check_summary(tl: Any, bad: Any, tol: float) -> None:
    """``makespan`` and ``per_rank`` are the summary of the spans (the one rule,
    ``Timeline.summarize``): a file whose summary was edited, or whose spans were, would
    give figures and tables that disagree. Raises ``bad(...)`` naming the rank and the
    field, the file's value and the spans'. ``tol``: the slack of a time (a sum of span
    durations in another order differs in its last bits)."""
    makespan, rows = type(tl).summarize(tl.ranks, tl.spans)
    if abs(makespan - tl.makespan) > tol:
        raise bad(f"makespan is {tl.makespan!r} but the spans end at {makespan!r}: the "
                  f"makespan is the end of the last span")
    for i, (got, want) in enumerate(zip(tl.per_rank, rows)):
        for name in ("rank", "busy", "idle", "bubble_ratio", "first_start", "last_end"):
            a, b = getattr(got, name), getattr(want, name)
            slack = 1e-9 if name == "bubble_ratio" else tol
            if (a is None) != (b is None) or (a is not None and abs(a - b) > slack):
                raise bad(f"per_rank[{i}] (rank {i}) has {name} {a!r} but its spans give "
                          f"{b!r}: per_rank is the summary of the spans (busy: their "
                          f"durations, idle: makespan - busy); fix it or the spans")


#: what a measured timeline's ``semantics`` holds: the backend that ran it (``gloo``,
#: ``nccl``, ``cpu:gloo,cuda:nccl``) or ``trace``
_BACKEND = re.compile(r"[a-z][a-z0-9_]*(:[a-z0-9_]+)?(,[a-z][a-z0-9_]*(:[a-z0-9_]+)?)*")


def _check_names(tl: Any, bad: Any) -> None:
    """The named fields hold names schedsim knows: ``comm_stream`` and ``placement`` one
    of theirs, a simulated timeline's ``semantics`` one of the engine's, a measured one's
    a backend name. Raises ``bad(...)`` naming the field, its value and the choices."""
    from schedsim.program.ir import PLACEMENTS
    from schedsim.program.vocab import COMM_STREAMS, SEMANTICS
    from schedsim.util.text import clip

    for name, ok in (("comm_stream", COMM_STREAMS), ("placement", PLACEMENTS)):
        if getattr(tl, name) not in ok:
            raise bad(f"unknown {name} {clip(repr(getattr(tl, name)), 40)}: expected one of "
                      f"{', '.join(ok)}")
    sem = tl.semantics
    if tl.source == "simulated" and sem not in SEMANTICS:
        raise bad(f"unknown semantics {clip(repr(sem), 40)} of a simulated timeline: "
                  f"expected one of {', '.join(SEMANTICS)}")
    if tl.source == "measured" and not _BACKEND.fullmatch(sem):
        raise bad(f"semantics {clip(repr(sem), 40)} of a measured timeline: expected the "
                  f"backend that ran it (gloo, nccl, ...) or trace")


_FINITE = ConfigDict(allow_inf_nan=False, defer_build=True)


class _PostRecord(BaseModel):     # one launch of a measured run (extra field ``posts``)
    model_config = _FINITE
    rank: int = Field(ge=0)
    index: int = Field(ge=0)
    last_index: int = Field(ge=0)
    start: float
    end: float


class _PieceRecord(BaseModel):    # one piece inside an op (``pieces``, schedsim.sim.pieces)
    model_config = _FINITE
    rank: int = Field(ge=0)
    index: int
    stream: Literal["compute", "collective"]
    name: str = Field(default="", max_length=MAX_NAME)
    mb: int | None = None
    collective: str | None = Field(default=None, max_length=MAX_NAME)
    start: float
    end: float
    tp_rank: int | None = Field(default=0, ge=0)


class _WorkloadRecord(BaseModel):  # a simulated step's numbers (``workload``, schedsim.workload)
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", strict=True,
                              defer_build=True)
    step_ms: float = Field(ge=0)
    makespan_ms: float = Field(ge=0)
    step_boundary_ms: float = Field(ge=0)
    tokens_per_step: int = Field(ge=0)
    tokens_per_s_per_gpu: float = Field(ge=0)
    model_flops_per_step: float = Field(ge=0)
    mfu: float = Field(ge=0)
    peak_flops: float = Field(gt=0)
    peak_memory_bytes: list[float]
    hbm_bytes: float = Field(gt=0)
    fits: bool
    gpu: str = Field(max_length=MAX_NAME)
    model: str = Field(max_length=MAX_NAME)
    gpus: int = Field(ge=1)
    stage_bytes: list[list[float]] = Field(default_factory=list)
    static_bytes: list[float] = Field(default_factory=list)
    recv_bytes: list[float] = Field(default_factory=list)
    stage_held: list[list[float]] | None = None
    peak_reserved_bytes: list[float] | None = None


class _Extras(BaseModel):
    """The extra top-level fields schedsim writes (the only ones a Timeline JSON may have
    beyond the Timeline's own; an unknown key is refused, with a suggestion): what
    analyses, figures and commands read, and what a measured run records. Writers:
    ``posts``, ``program``, ``backend``, ``world_size``, ``device``, ``clock``,
    ``clock_offsets_ns``, ``tp``, ``tp_comm``, ``grad_check``, ``step``,
    ``step_makespans`` (replay: schedsim.replay.timing, schedsim.replay.worker);
    ``trace_source``, ``p2p``, ``import_notes``, ``missing_ranks``, ``step``,
    ``step_makespans`` (import-trace: schedsim.interop.kineto, kineto_steps,
    kineto_pieces, ops_timeline); ``pieces`` (schedsim.sim.pieces, replay under TP);
    ``workload`` (schedsim.workload.run)."""

    model_config = ConfigDict(allow_inf_nan=False, defer_build=True, extra="forbid")
    posts: list[_PostRecord] | None = None
    pieces: list[_PieceRecord] | None = None
    missing_ranks: list[int] | None = None
    import_notes: list[str] | None = None
    p2p: dict[str, int] | None = None
    trace_source: str | None = Field(default=None, max_length=MAX_NAME)
    program: dict[str, Any] | None = None
    workload: _WorkloadRecord | None = None
    backend: str | None = Field(default=None, max_length=MAX_NAME)
    world_size: int | None = Field(default=None, ge=1)
    device: str | None = Field(default=None, max_length=MAX_NAME)
    clock: str | None = Field(default=None, max_length=MAX_NAME)
    clock_offsets_ns: list[float] | None = None
    tp: int | None = Field(default=None, ge=1)
    tp_comm: str | None = Field(default=None, max_length=MAX_NAME)
    grad_check: dict[str, Any] | None = None    # (its errors may be inf: not checked)
    step: int | None = Field(default=None, ge=0)
    step_makespans: list[Annotated[float, Field(ge=0)]] | None = None


def _check_extras(tl: Any, bad: Any) -> None:
    """The extra fields (:class:`_Extras`): no other top-level key, types, finite times,
    ranks below ``tl.ranks``, and a ``program`` that validates with the timeline's
    placement."""
    from pydantic import ValidationError

    from schedsim.errors import SchedsimError
    from schedsim.util.text import clip

    extra = tl.model_extra or {}
    key = next((k for k in extra if k not in _Extras.model_fields), None)
    if key is not None:
        raise bad(f"top level: {unknown_key(key, top_level_keys(type(tl)))}")
    try:
        ex = _Extras.model_validate(extra)
    except ValidationError as e:
        raise bad(first_error(e)) from None
    P = tl.ranks
    ranks = ([p.rank for p in ex.posts or ()] + [p.rank for p in ex.pieces or ()]
             + list(ex.missing_ranks or ()))
    if any(not 0 <= r < P for r in ranks):
        raise bad(f"posts, pieces or missing_ranks name a rank outside 0..{P - 1}")
    wl = ex.workload
    if wl is not None and (
            tl.unit != "ms" or any(len(v) != P or any(b < 0 for b in v) for v in (
                wl.peak_memory_bytes, wl.static_bytes or [0] * P, wl.recv_bytes or [0] * P))
            or (wl.stage_bytes and (len(wl.stage_bytes) != tl.stages or any(
                len(row) != 3 or any(b < 0 for b in row) for row in wl.stage_bytes)))):
        raise bad(f"workload: needs the unit ms (got {clip(tl.unit, 20)}), "
                  f"peak_memory_bytes, static_bytes and recv_bytes of one number >= 0 per "
                  f"rank ({P}) and stage_bytes of three per stage ({tl.stages})")
    if wl is not None:
        _check_workload_numbers(tl, wl, bad)
    if ex.program is not None:
        from schedsim.program.ir import Program

        try:
            prog = Program.model_validate(ex.program)
        except (ValidationError, SchedsimError) as e:
            first = str(e).splitlines()
            raise bad(f"program: {clip(first[-1] if first else '', 200)}") from None
        if prog.placement.ranks != P or prog.placement.stages != tl.stages:
            raise bad(f"program has {prog.placement.ranks} ranks and "
                      f"{prog.placement.stages} stages, the timeline {P} and {tl.stages}")


def _check_workload_numbers(tl: Any, wl: Any, bad: Any) -> None:
    """A ``workload`` object's derived numbers against what they derive from (the rules
    of :func:`schedsim.workload.run.result_of`): ``makespan_ms`` is the timeline's
    makespan, ``step_ms`` = makespan_ms + step_boundary_ms, ``tokens_per_s_per_gpu`` =
    tokens_per_step / step s / gpus, ``mfu`` = model_flops_per_step / (step s x gpus x
    peak_flops), ``fits`` = the worst (reserved where recorded) peak within
    ``hbm_bytes``. Raises ``bad(...)`` naming the field, its value and the one its inputs
    give: a report or table would print the edited figure beside the inputs it
    contradicts."""
    step = wl.makespan_ms + wl.step_boundary_ms
    worst = max(wl.peak_reserved_bytes or wl.peak_memory_bytes, default=0.0)
    s = step / 1e3
    checks = (("makespan_ms", wl.makespan_ms, tl.makespan, "the timeline's makespan"),
              ("step_ms", wl.step_ms, step, "makespan_ms + step_boundary_ms"),
              ("tokens_per_s_per_gpu", wl.tokens_per_s_per_gpu,
               wl.tokens_per_step / s / wl.gpus if step > 0 else 0.0,
               "tokens_per_step / step s / gpus"),
              ("mfu", wl.mfu, wl.model_flops_per_step / (s * wl.gpus * wl.peak_flops)
               if step > 0 else 0.0, "model_flops_per_step / (step s x gpus x peak_flops)"))
    for name, got, want, rule in checks:
        if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
            raise bad(f"workload: {name} is {got!r} but {rule} gives {want!r}; fix it or "
                      f"the numbers it derives from")
    if wl.fits != (worst <= wl.hbm_bytes):
        raise bad(f"workload: fits is {wl.fits} but the worst peak ({worst!r} bytes) is "
                  f"{'within' if worst <= wl.hbm_bytes else 'above'} hbm_bytes "
                  f"({wl.hbm_bytes!r})")

"""Activation and parameter memory per rank.

Unit: the activations one microbatch leaves on *one rank's share of the model when each
rank holds 1/P of it* (``M_B`` in the zero-bubble paper). A stage of a placement with S
stages on P ranks is P/S of that share, so with ``scale="auto"`` every delta is multiplied
by ``ranks / stages`` (1 for 1F1B and DualPipe, 1/2 for interleaved with 2 chunks, ZB-V
and DualPipeV) — exactly how the zero-bubble reference counts a chunk pass as 1/2.

Models (per op kind, in that unit):

- ``zb`` (default; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 3.1,
  ``mem_f=2, mem_b=-1, mem_w=-1`` in half units): F +1, B -1/2 (frees the activations,
  keeps what W needs), W -1/2, BW -1.
- ``inflight``: counts microbatches between their F and their last backward: F +1, B 0,
  W -1, BW -1 (the DualPipe README's "activation memory" column).

Allocation happens when an op starts, release when it ends. ``FB`` applies its forward
part's delta and its backward part's delta in ``fb_order``: ``alloc-then-free`` (both
live at once, the conservative order) or ``free-then-alloc``.
"""
from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from schedsim.errors import ScenarioError
from schedsim.program.flat import COMPUTE_KINDS
from schedsim.program.ir import Placement
from schedsim.sim.compiled import Compiled
from schedsim.sim.engine import RunState
from schedsim.timeline import Timeline
from schedsim.util.text import clip

PRESETS: dict[str, dict[str, float]] = {
    "zb": {"F": 1.0, "B": -0.5, "W": -0.5, "BW": -1.0},
    "inflight": {"F": 1.0, "B": 0.0, "W": -1.0, "BW": -1.0},
}
#: how an overlapped FB pair's allocation and free are ordered (``MemoryModel.fb_order``)
FbOrder = Literal["alloc-then-free", "free-then-alloc"]
FB_ORDERS: tuple[str, ...] = get_args(FbOrder)


class MemoryModel(BaseModel):
    """Activation deltas per kind (see module docstring). ``scale``: ``"auto"`` or a
    factor applied to every delta."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False,   # finite deltas
                              defer_build=True)

    F: float = 1.0
    B: float = -0.5
    W: float = -0.5
    BW: float = -1.0
    fb_order: FbOrder = "alloc-then-free"
    scale: Literal["auto"] | float = "auto"

    @field_validator("scale")
    @classmethod
    def _positive(cls, v: object) -> object:
        if v != "auto" and not v > 0:       # type: ignore[operator]
            raise ValueError("scale must be 'auto' or a number > 0")
        return v

    @classmethod
    def preset(cls, name: str, **kw: object) -> "MemoryModel":
        """``zb`` or ``inflight`` deltas (plus overrides). Raises :class:`ScenarioError`."""
        if name not in PRESETS:
            raise ScenarioError(f"unknown memory model {name!r}: expected "
                                f"{' or '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **kw})

    @classmethod
    def from_spec(cls, spec: object = None) -> "MemoryModel":
        """A model from what users write: None/True (the default ``zb``), a preset name,
        a scenario ``[memory]`` table (``model = "zb"|"inflight"`` plus any field:
        ``F``, ``B``, ``W``, ``BW``, ``fb_order``, ``scale``) or a model.
        Raises :class:`ScenarioError` naming the bad key or value."""
        if spec is None or spec is True:
            return cls()
        if isinstance(spec, MemoryModel):
            return spec
        if isinstance(spec, str):
            return cls.preset(spec)
        if isinstance(spec, dict):
            kw = dict(spec)
            name = kw.pop("model", None)
            try:          # strict: a quoted number or a boolean is not a delta
                if name:
                    cls.preset(name)        # an unknown preset: ScenarioError
                    kw = {**PRESETS[name], **kw}
                return cls.model_validate(kw, strict=True)
            except ValidationError as e:
                err = e.errors()[0]
                loc = clip(".".join(str(x) for x in err["loc"]))
                what = ("unknown key" if err["type"] == "extra_forbidden" else
                        f"bad value ({err['msg']}) for")
                raise ScenarioError(f"[memory]: {what} '{loc}' (keys: model, F, B, W, BW, "
                                    f"fb_order, scale)") from None
        raise ScenarioError(f"bad memory model {spec!r}: expected a preset name "
                            f"({', '.join(PRESETS)}) or a [memory] table")

    @classmethod
    def with_flags(cls, spec: object = None, model: str | None = None,
                   fb_order: str | None = None) -> "MemoryModel":
        """:meth:`from_spec` of ``spec`` (a scenario's ``[memory]``), then the command
        line's ``--memory-model`` (a preset over the table's other keys) and
        ``--fb-order`` (one of :data:`FB_ORDERS`) on top. Raises :class:`ScenarioError`
        for a bad value."""
        mm = cls.from_spec(spec or None)
        if model is not None:
            mm = cls.from_spec({**(spec if isinstance(spec, dict) else {}), "model": model})
        if fb_order is None:
            return mm
        if fb_order not in FB_ORDERS:
            raise ScenarioError(f"bad --fb-order {fb_order!r}: expected "
                                f"{' or '.join(FB_ORDERS)}")
        return mm.model_copy(update={"fb_order": fb_order})

    def factor(self, ranks: int, stages: int) -> float:
        return ranks / stages if self.scale == "auto" else float(self.scale)


def memory_curves(tl: Timeline, model: MemoryModel | None = None
                  ) -> list[list[tuple[float, float]]]:
    """Per rank, the activation level as a step function: ``[(time, level after), ...]``
    starting at ``(0, 0)``, in time order (allocations at op start, frees at op end)."""
    model = model or MemoryModel()
    k = model.factor(tl.ranks, tl.stages)
    events: list[list[tuple[float, int, float]]] = [[] for _ in range(tl.ranks)]
    for s in sorted(tl.spans, key=lambda s: (s.rank, s.start, s.end)):
        ev = events[s.rank]
        parts = [(p.kind) for p in s.parts] if s.parts else [s.kind]
        for j, kind in enumerate(parts):
            d = getattr(model, kind) * k
            if s.parts and model.fb_order == "free-then-alloc":
                # backward part frees at the op's start, then the forward allocates
                ev.append((s.start, 0 if j == 1 else 1, d))
            elif d >= 0:
                ev.append((s.start, 1, d))
            else:
                ev.append((s.end, 0, d))
    curves = []
    for ev in events:
        ev.sort(key=lambda e: (e[0], e[1]))
        level, pts = 0.0, [(0.0, 0.0)]
        for t, _, d in ev:
            level += d
            pts.append((t, level))
        curves.append(pts)
    return curves


def peak_activation(tl: Timeline, model: MemoryModel | None = None) -> list[float]:
    """Peak activation memory per rank (in the unit above)."""
    return [max(v for _, v in c) for c in memory_curves(tl, model)]


def param_memory(placement: Placement) -> list[float]:
    """Parameter memory per rank in stage-parameter units (1 = 1/P of the model).

    A rank holding c stages of an S-stage model holds ``c x P / S``; DualPipe holds two
    full copies of its stage (one per direction): 2.
    """
    if placement.kind == "dual":
        return [2.0] * placement.ranks
    share = placement.ranks / placement.stages
    return [len(placement.stages_of(r)) * share for r in range(placement.ranks)]


def peak_activation_run(cp: Compiled, st: RunState, model: MemoryModel | None = None
                        ) -> list[float]:
    """:func:`peak_activation` of the run ``(cp, st)`` of
    :func:`schedsim.sim.simulate.simulate_run`, read from its arrays (no span objects):
    the same events in the same order (spans by rank, start, end; each rank's events
    by time, frees first at a tie, then in that order), summed one by one, so the
    same floats. Per rank, in the unit of :func:`memory_curves`."""
    model = model or MemoryModel()
    k = model.factor(cp.ranks, cp.stages)
    fl = cp.flat
    ran = np.flatnonzero(st.send >= 0.0)
    gi = np.asarray(cp.span_gi)[ran]
    rank = fl.rank_of_instr()[gi].astype(np.int64)
    start, end = np.asarray(st.sstart)[ran], np.asarray(st.send)[ran]
    o = np.lexsort((end, start, rank))           # stable, as sorted() of the spans
    rank, start, end, gi = rank[o], start[o], end[o], gi[o]
    kind = fl.kind[gi].astype(np.int64)
    delta = np.array([getattr(model, n) * k if n != "FB" else 0.0 for n in COMPUTE_KINDS])
    fb = kind == COMPUTE_KINDS.index("FB")
    second = np.full(len(gi), -1, dtype=np.int64)  # an FB's backward part's kind
    if fb.any():
        second[fb] = fl.fb_kind[np.searchsorted(fl.fb_at, gi[fb])]
    first = np.where(fb, COMPUTE_KINDS.index("F"), kind)
    ev_span = np.concatenate([np.arange(len(gi)), np.flatnonzero(fb)])
    ev_part = np.concatenate([np.zeros(len(gi), np.int64), np.ones(int(fb.sum()), np.int64)])
    d = delta[np.concatenate([first, second[fb]])]
    if model.fb_order == "free-then-alloc":      # an FB's backward part frees first
        tie = np.where(fb[ev_span], 1 - ev_part, (d >= 0).astype(np.int64))
    else:
        tie = (d >= 0).astype(np.int64)
    t = np.where((tie == 1) | (fb[ev_span] & (model.fb_order == "free-then-alloc")),
                 start[ev_span], end[ev_span])
    er = rank[ev_span]
    oe = np.lexsort((2 * ev_span + ev_part, tie, t, er))
    er, d = er[oe], d[oe]
    out = []
    bounds = np.searchsorted(er, np.arange(cp.ranks + 1))
    for r in range(cp.ranks):
        lv = np.cumsum(d[bounds[r]:bounds[r + 1]])   # sequential: the same sums
        out.append(max(0.0, float(lv.max())) if len(lv) else 0.0)
    return out


def workload_memory(tl: Timeline) -> list | None:
    """Bytes per rank over ``tl`` when it carries a ``workload`` object with its byte
    model (``stage_bytes``, ``static_bytes``, ``recv_bytes``, ``stage_held`` when the
    workload has stage-held bytes; :mod:`schedsim.workload`):
    :class:`~schedsim.workload.run.RankMemory` per rank (curves in bytes of
    activations, ``peak`` with the static bytes), by the workload's event rules
    (:func:`schedsim.workload.run.byte_levels`); None otherwise."""
    from schedsim.workload.run import byte_levels

    wl = getattr(tl, "workload", None)
    if not isinstance(wl, dict) or not wl.get("stage_bytes"):
        return None
    kinds = list(COMPUTE_KINDS)
    cols: list[list[float]] = [[] for _ in range(7)]
    for s in tl.spans:
        f, b = (s.parts[0], s.parts[1]) if s.parts else (s, s)
        for col, v in zip(cols, (s.rank, kinds.index(s.kind), f.stage, kinds.index(b.kind),
                                 b.stage, s.start, s.end)):
            col.append(v)
    base = [a + b for a, b in zip(wl["static_bytes"], wl.get("recv_bytes") or
                                  [0.0] * tl.ranks)]
    return byte_levels(wl["stage_bytes"], base, tl.ranks, *cols, wl.get("stage_held"))

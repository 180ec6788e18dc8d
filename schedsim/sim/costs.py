"""Cost model (compute costs and message sizes), link model and comm semantics settings.

Time is a plain float in one unit the user picks (``unit``: slots, ms, ...); bandwidth is
bytes per that unit. With unit compute costs and zero comm cost the simulator reproduces
the T0, T1, ... slot diagrams papers draw.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from schedsim.errors import ScenarioError
from schedsim.program.flat import OpKind
from schedsim.program.ir import Op
from schedsim.program.vocab import MEASURED_SEMANTICS, CommStream, GroupSemantics, Semantics

KindName = Literal["F", "B", "W", "BW", "FB"]
_KINDS = ("F", "B", "W", "BW", "FB")

#: The largest cost of one op, in any unit (1e15 ns is 11.6 days; 1e15 ms 31,700 years):
#: above it a cost is a typo, and sums of such costs printed 300-digit makespans
#: (``--cost F=1e300``) instead of being refused. Costs are >= 0 and finite as well.
MAX_COST = 1e15


class KindCosts(BaseModel):
    """Per-kind costs at one level (a stage); unset kinds fall back to the next level."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    F: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)
    B: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)
    W: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)
    BW: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)
    FB: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)


class CostOverride(BaseModel):
    """Cost of one kind on one (stage, microbatch)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    stage: int = Field(ge=0)
    mb: int = Field(ge=0)
    kind: KindName
    cost: float = Field(ge=0, le=MAX_COST, allow_inf_nan=False)


class CostModel(BaseModel):
    """Compute cost of every op and byte size of every message.

    Lookup for an op of kind K on (stage s, microbatch m): an ``overrides`` entry for
    (s, m, K), else ``stage[s].K``, else the global K. If K is ``BW`` and no level sets
    it, BW costs B + W (each looked up the same way); if K is ``FB`` and no level sets it
    (looked up at the forward part's stage and microbatch), FB costs its forward part plus
    its backward part. Message bytes: ``stage_bytes[s]`` for messages produced by stage s,
    else ``message_bytes``. Times are in ``unit``.

    Derived costs (:meth:`with_derived`, set by a scenario's ``[model]``): a kind nobody
    typed (no override, no stage entry, not set in the table itself) costs what the stage
    model derives for it; a derived ``BW`` applies only when neither B nor W is typed, a
    derived ``FB`` only when neither of its parts (nor their components) is: an explicit
    per-kind cost always wins. ``message_bytes`` likewise, when not typed.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    F: float = Field(default=1.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    B: float = Field(default=1.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    W: float = Field(default=1.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    BW: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)
    FB: float | None = Field(default=None, ge=0, le=MAX_COST, allow_inf_nan=False)
    stage: dict[int, KindCosts] = Field(default_factory=dict)
    overrides: list[CostOverride] = Field(default_factory=list)
    message_bytes: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    stage_bytes: dict[int, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default_factory=dict)
    unit: str = "slot"

    _ov: dict = PrivateAttr(default_factory=dict)
    _cache: dict = PrivateAttr(default_factory=dict)
    _derived: Any = PrivateAttr(default=None)

    def model_post_init(self, _ctx: object) -> None:
        self._ov = {(o.stage, o.mb, o.kind): o.cost for o in self.overrides}
        self._cache = {}

    def with_derived(self, derived: Any, message_bytes: float | None = None) -> "CostModel":
        """A copy whose untyped kinds (and message bytes) come from ``derived``, an object
        with ``kind_cost(kind, stage)``, ``fb_cost(stage_f, stage_b, back_kind)``,
        ``varies`` (stages differ) and ``table()`` (rows whose third item has ``.cost``),
        such as :class:`schedsim.sim.stage_costs.StageCosts`."""
        c = self.model_copy()
        c._derived, c._cache = derived, {}
        if message_bytes is not None and "message_bytes" not in self.model_fields_set:
            # the field's value, left unset: a dump with exclude_unset leaves it out
            object.__setattr__(c, "message_bytes", message_bytes)
        return c

    def _typed(self, kind: str, stage: int, mb: int) -> float | None:
        """The cost of ``kind`` the user typed for (stage, mb), or None."""
        v = self._ov.get((stage, mb, kind))
        if v is not None:
            return v
        sc = self.stage.get(stage)
        if sc is not None:
            v = getattr(sc, kind)
            if v is not None:
                return v
        return getattr(self, kind) if kind in self.model_fields_set else None

    def _untyped(self, stage: int, mb: int, *kinds: str) -> bool:
        return all(self._typed(k, stage, mb) is None for k in kinds)

    def _explicit(self, kind: str, stage: int, mb: int) -> float | None:
        v = self._typed(kind, stage, mb)
        if v is not None:
            return v
        d = self._derived
        if d is not None and (kind != "BW" or self._untyped(stage, mb, "B", "W")):
            return d.kind_cost(kind, stage)
        return getattr(self, kind)

    def _fb(self, op: Op) -> float:
        c = self._typed("FB", op.stage, op.mb)
        if c is not None:
            return c
        f, b = op.parts
        back = ("B", "W", "BW") if b.kind == "BW" else (b.kind,)
        if (self._derived is not None and b.kind in ("B", "BW")
                and self._untyped(f.stage, f.mb, "F") and self._untyped(b.stage, b.mb, *back)):
            return self._derived.fb_cost(f.stage, b.stage, b.kind)
        c = self.FB
        if c is not None and self._derived is None:
            return c
        return sum(self.kind_cost(p.kind, p.stage, p.mb) for p in op.parts)

    def kind_cost(self, kind: str, stage: int, mb: int) -> float:
        """Cost of a non-FB op of ``kind`` on (stage, mb)."""
        key = (kind, stage, mb)
        c = self._cache.get(key)
        if c is None:
            c = self._explicit(kind, stage, mb)
            if c is None:   # only BW can be unset at every level
                c = self.kind_cost("B", stage, mb) + self.kind_cost("W", stage, mb)
            self._cache[key] = c
        return c

    def cost(self, op: Op) -> float:
        """Cost of ``op`` (any kind, FB included), in ``unit``."""
        if op.kind != "FB":
            return self.kind_cost(op.kind, op.stage, op.mb)
        return self._fb(op)

    def cost_fn(self) -> Callable[[Op], float]:
        """A fast, memoising ``op -> cost`` function, for hot loops."""
        slow = self.cost
        d = self._derived
        if not self.stage and not self.overrides and not (d is not None and d.varies):
            per = {k: self.kind_cost(k, 0, 0) for k in ("F", "B", "W", "BW")}
            fb = self.FB
            if d is not None:      # cost depends on the kinds only
                fbs = {k: self._fb(Op.fb(Op("F", 0, 0), Op(k, 0, 0))) for k in ("B", "BW")}

                def by_kinds(op: Op) -> float:
                    k = op.kind
                    if k != "FB":
                        return per[k]
                    return fbs.get(op.parts[1].kind) or slow(op)
                return by_kinds

            def by_kind(op: Op) -> float:  # cost depends on the kind only
                k = op.kind
                if k != "FB":
                    return per[k]
                return fb if fb is not None else per["F"] + per[op.parts[1].kind]
            return by_kind
        cache: dict[Op, float] = {}

        def fn(op: Op) -> float:
            c = cache.get(op)
            if c is None:
                c = cache[op] = slow(op)
            return c
        return fn

    def op_costs(self, kind: Any, stage: Any, mb: Any, bkind: Any, bstage: Any,
                 bmb: Any) -> Any:
        """Costs of many ops at once, as :meth:`cost` gives them (float64 array).

        Arrays of equal length: ``kind`` (OpKind codes: F 0, B 1, W 2, BW 3, FB 4),
        ``stage``, ``mb`` (for FB the forward part's) and, for FB, the backward part's
        ``bkind``/``bstage``/``bmb`` (ignored elsewhere). Stages must be in range.
        Ops on a (stage, mb) that ``overrides`` name are looked up one by one.
        """
        import numpy as np

        kind = np.asarray(kind)
        stage = np.asarray(stage)
        n = len(kind)
        if self._derived is not None and not self.overrides:
            from schedsim.sim.cost_arrays import derived_op_costs

            return derived_op_costs(self, kind, stage, np.asarray(bkind), np.asarray(bstage))
        if self._derived is not None:        # a stage model's costs: op by op
            fn = self.cost_fn()
            names = ("F", "B", "W", "BW", "FB")
            bkind, bstage, bmb = np.asarray(bkind), np.asarray(bstage), np.asarray(bmb)
            mb = np.asarray(mb)
            out = np.empty(n)
            for i, (k, s_, m_) in enumerate(zip(kind.tolist(), stage.tolist(), mb.tolist())):
                if k == OpKind.FB:
                    op = Op.fb(Op("F", s_, m_), Op(names[int(bkind[i])], int(bstage[i]),
                                                   int(bmb[i])))
                else:
                    op = Op(names[k], s_, m_)
                out[i] = fn(op)
            return out
        if not self.stage and not self.overrides:     # the cost depends on the kind only
            per = [self.kind_cost(k, 0, -1) for k in ("F", "B", "W", "BW")]
            fb = self.FB
            table = np.array(per + [np.nan])
            out = table[kind]
            is_fb = kind == OpKind.FB
            if is_fb.any():
                with np.errstate(over="ignore"):     # inf times: simulate() reports them
                    pair = per[0] + np.array(per)[np.where(is_fb, bkind, 0)]
                out = np.where(is_fb, pair if fb is None else fb, out)
            return out.astype(np.float64, copy=False)      # float64 already: no copy
        S = int(max(stage.max(initial=-1), np.asarray(bstage).max(initial=-1))) + 1
        names = ("F", "B", "W", "BW")
        table = np.array([[self.kind_cost(k, s, -1) for s in range(S)] for k in names]
                         ).reshape(4, S)
        fbt = np.array([np.nan if (v := self._explicit("FB", s, -1)) is None else v
                        for s in range(S)])
        is_fb = kind == OpKind.FB
        k0 = np.where(is_fb, 0, kind)
        out = table[k0, stage] if n else np.zeros(0)
        if is_fb.any():
            bk = np.where(is_fb, bkind, 0)
            bs = np.where(is_fb, bstage, 0)
            with np.errstate(over="ignore"):
                pair = table[0, stage] + table[bk, bs]
            explicit = fbt[stage]
            out = np.where(is_fb, np.where(np.isnan(explicit), pair, explicit), out)
        if self.overrides:
            mb = np.asarray(mb, dtype=np.int64)
            big = int(max(mb.max(initial=0), np.asarray(bmb).max(initial=0),
                          max(o.mb for o in self.overrides))) + 1
            touched = np.array(sorted({o.stage * big + o.mb for o in self.overrides}))
            hit = np.isin(stage * big + mb, touched)
            if is_fb.any():
                hit |= is_fb & np.isin(np.asarray(bstage) * big + np.asarray(bmb), touched)
            kinds = ("F", "B", "W", "BW", "FB")
            for i in np.flatnonzero(hit).tolist():
                k = kinds[int(kind[i])]
                if k == "FB":
                    op = Op.fb(Op("F", int(stage[i]), int(mb[i])),
                               Op(names[int(bkind[i])], int(bstage[i]), int(bmb[i])))
                else:
                    op = Op(k, int(stage[i]), int(mb[i]))
                out[i] = self.cost(op)
        return np.asarray(out, dtype=np.float64)

    def bytes_of(self, producing_stage: int) -> float:
        """Bytes of a message produced by ``producing_stage`` (activation or gradient)."""
        return self.stage_bytes.get(producing_stage, self.message_bytes)

    def is_integral(self) -> bool:
        """True if every cost is a whole number (the Gantt then draws T0, T1, ... slots)."""
        vals = [self.F, self.B, self.W, self.BW, self.FB]
        vals += [getattr(k, n) for k in self.stage.values() for n in _KINDS]
        vals += [o.cost for o in self.overrides]
        if self._derived is not None:
            vals += [row[2].cost for row in self._derived.table()]
        return all(v is None or float(v).is_integer() for v in vals)


def parse_cost_string(text: str, base: CostModel | None = None) -> CostModel:
    """Parse ``"F=1,B=1,W=1,BW=2,FB=3"`` into a :class:`CostModel` (on top of ``base``).

    Raises :class:`ScenarioError` on an unknown key or a value that is not a number from 0
    to :data:`MAX_COST`.
    """
    data = base.model_dump(exclude_unset=True) if base else {}
    seen: set[str] = set()
    for item in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in item:
            raise ScenarioError(f"bad cost {item!r}: expected KIND=VALUE, e.g. F=1,BW=2")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in _KINDS:
            raise ScenarioError(f"unknown cost key {k!r}: expected one of "
                                f"{', '.join(_KINDS)}")
        if k in seen:
            raise ScenarioError(f"cost {k} given twice in {text!r}")
        seen.add(k)
        try:
            val = float(v)
        except ValueError:
            raise ScenarioError(f"bad cost value {item!r}: {v!r} is not a number") from None
        if not 0 <= val <= MAX_COST:
            raise ScenarioError(f"bad cost value {item!r}: give a finite number from 0 to "
                                f"{MAX_COST:.0e} (in the cost unit)")
        data[k] = val
    return CostModel.model_validate(data)


class LinkOverride(BaseModel):
    """Latency/bandwidth of one directed link src -> dst (unset fields: the default), and
    its eager threshold: under ``rendezvous``, a message of at most
    ``eager_threshold_bytes`` on this link completes eagerly (its send does not wait for
    the recv), in place of ``[comm] eager_threshold_bytes``. Models a transport whose
    receive-side buffer takes small messages (e.g. NCCL's intra-node P2P FIFO of
    ``NCCL_BUFFSIZE``, 4 MiB by default) next to one that needs the receiver (a network
    link): see ``docs/comm-semantics.md``, "Hangs on two nodes, not on one"."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    src: int = Field(ge=0)
    dst: int = Field(ge=0)
    latency: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    bandwidth: float | None = Field(default=None, gt=0)
    eager_threshold_bytes: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class MessageTime(BaseModel):
    """The measured times of one message (kind F|B, producing stage, mb), counted from
    when its transfer starts: ``time`` to its arrival (replacing ``latency + bytes /
    bandwidth``; it does not occupy the link, the measurement already holds any
    queueing) and, when given, ``send`` to the sender's completion (else the semantics
    decide: eager at the transfer's end, rendezvous at arrival). Written by ``schedsim
    calibrate --exact``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    kind: Literal["F", "B"]
    stage: int = Field(ge=0)
    mb: int = Field(ge=0)
    time: float = Field(ge=0, allow_inf_nan=False)
    send: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class LinkModel(BaseModel):
    """Directed links between ranks: a message costs ``latency + bytes / bandwidth``.

    Transfers on one directed link are serialized in the order they start: each occupies
    the link for ``bytes / bandwidth`` (latency is pipelined). Defaults: latency 0,
    infinite bandwidth. ``links`` overrides single directed links; ``messages`` gives
    single messages a measured transfer time (:class:`MessageTime`).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    latency: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    bandwidth: float = Field(default=math.inf, gt=0)
    links: list[LinkOverride] = Field(default_factory=list)
    messages: list[MessageTime] = Field(default_factory=list)

    def message_times(self) -> dict[tuple[str, int, int], "MessageTime"]:
        """``(kind, stage, mb) ->`` :class:`MessageTime` of :attr:`messages`."""
        return {(m.kind, m.stage, m.mb): m for m in self.messages}

    def params(self, src: int, dst: int) -> tuple[float, float]:
        """``(latency, bandwidth)`` of the directed link src -> dst."""
        lat, bw = self.latency, self.bandwidth
        for o in self.links:
            if o.src == src and o.dst == dst:
                lat = lat if o.latency is None else o.latency
                bw = bw if o.bandwidth is None else o.bandwidth
        return lat, bw


class HostTime(BaseModel):
    """Measured host time at instruction ``index`` of rank ``rank`` (``index`` = the
    rank's program length for the implicit ``END``), in the cost unit: ``before`` is spent
    before the instruction starts (interpreter overhead, a late start of the rank), and,
    for a launch, ``launch`` is the launch's own time (replacing ``launch_cost``). Written
    by ``schedsim calibrate --exact`` so that a simulation reproduces a measured run's
    host timeline."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    rank: int = Field(ge=0)
    index: int = Field(ge=0)
    before: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    launch: float | None = Field(default=None, ge=0, allow_inf_nan=False)




class CommModel(BaseModel):
    """How P2P ops complete (see DESIGN.md, "Comm semantics").

    - ``data``: comm instructions are ignored; an op waits only for its producers' outputs
      (producer end + link cost). What papers draw.
    - ``eager``: a send completes once its bytes have left; data waits at the receiver.
    - ``rendezvous``: a transfer starts once both sides have posted; both complete at
      arrival. With ``eager_threshold_bytes`` set, messages of at most that many bytes
      are eager.
    - ``comm_stream``: ``none`` (each P2P op progresses on its own), ``per-peer`` or
      ``per-rank`` (a rank's P2P launches run one after another on one stream per peer or
      per rank; a launch, bare post or ``BATCH``, runs as one unit).
    - ``launch_cost``: host time (in the cost unit) of one launch (a bare post or a
      ``BATCH``: one ``isend``/``irecv``/``batch_isend_irecv`` call): the rank is
      busy for it and its ops count as posted when it ends. Default 0; ``schedsim
      calibrate`` measures it. Not used under ``data`` semantics.
    - ``host``: measured host time of single instructions (:class:`HostTime`): time spent
      before an instruction, and a launch's own time. Not used under ``data`` semantics.
    - ``host_cost``: host time spent before every instruction that ``host`` does not list
      (the interpreter's and the profiler's work between a run's actions), in the cost
      unit; ``calibrate --from-timeline`` fits the run's mean. Default 0. Not used under
      ``data`` semantics.
    - ``lazy_init``: NCCL creates a 2-rank communicator at the first *bare* post
      (``isend``/``irecv``) between two ranks: both hosts block at that launch until the
      other rank reaches its own first bare post to it, then ``init_cost`` more (in the
      cost unit). A ``BATCH`` uses the group's communicator, taken as already created.
      Not used under ``data`` semantics. See ``docs/comm-semantics.md``.
    - ``connections``: the rank's hardware work queues (``CUDA_DEVICE_MAX_CONNECTIONS``,
      1..32, CUDA's default 8). With 1, the kernels of all its streams dispatch in host
      launch order, so a kernel waiting at the head blocks the others; the stage model's
      pieces inside an op are placed so (:func:`schedsim.sim.overlap.schedule`). With 2
      or more its streams are independent. Used under every semantics.
    - ``group_semantics``: how the members of one ``BATCH`` progress. ``independent``
      (gloo): each op on its own. ``atomic`` (NCCL's ``ncclGroupStart``/``End``, one
      kernel for the group): no member moves data until every member is matched (its
      partner active), and the members complete together. Not used under ``data``
      semantics. See ``docs/messages.md``.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    semantics: Semantics = "data"
    comm_stream: CommStream = "none"
    eager_threshold_bytes: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    launch_cost: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    host: list[HostTime] = Field(default_factory=list)
    host_cost: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    lazy_init: bool = False
    init_cost: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    connections: int = Field(default=8, ge=1, le=32)
    group_semantics: GroupSemantics = "independent"

    @field_validator("comm_stream", mode="before")
    @classmethod
    def _dash(cls, v: object) -> object:
        return v.replace("_", "-") if isinstance(v, str) else v

    def unused(self, semantics: str | None = None) -> list[str]:
        """A line naming the settings that change nothing in a run under ``semantics``
        (default: these; as their flags) and why, or []: under ``data`` every P2P setting
        (comm instructions are ignored); ``init_cost`` without ``lazy_init``;
        ``eager_threshold_bytes`` under ``eager``."""
        semantics = semantics or self.semantics
        if semantics == "data":
            flags = [f for f, on in (
                ("--comm-stream", self.comm_stream != "none"),
                ("--eager-threshold", self.eager_threshold_bytes is not None),
                ("--launch-cost", self.launch_cost > 0 or bool(self.host)
                 or self.host_cost > 0),
                ("--lazy-init", self.lazy_init), ("--init-cost", self.init_cost > 0),
                ("--group-semantics", self.group_semantics != "independent")) if on]
            return [f"{', '.join(flags)} change{'s' * (len(flags) == 1)} nothing under data "
                    f"semantics, which ignore the program's sends and recvs: add --semantics "
                    f"eager or rendezvous"] if flags else []
        if semantics not in MEASURED_SEMANTICS:       # a measured timeline
            return []
        if self.init_cost > 0 and not self.lazy_init:
            return ["--init-cost changes nothing without --lazy-init: add --lazy-init"]
        if semantics == "eager" and self.eager_threshold_bytes is not None:
            return ["--eager-threshold changes nothing under eager semantics (every message "
                    "is eager): it applies to --semantics rendezvous"]
        return []

    def eager_messages(self, link: "LinkModel", nbytes: Any, src: Any, dst: Any) -> Any:
        """Which messages complete eagerly: bool array over messages given their bytes,
        source and destination ranks (int arrays, equal lengths). Everything under
        ``data`` and ``eager``; under ``rendezvous`` a message of at most its link's
        threshold (:attr:`LinkOverride.eager_threshold_bytes`, else
        :attr:`eager_threshold_bytes`; none: no message). The one home of this rule."""
        import numpy as np

        nbytes = np.asarray(nbytes, dtype=np.float64)
        if self.semantics != "rendezvous":
            return np.ones(len(nbytes), dtype=bool)
        t = self.eager_threshold_bytes
        default = -np.inf if t is None else float(t)
        own = {(o.src, o.dst): o.eager_threshold_bytes for o in link.links
               if o.eager_threshold_bytes is not None}
        if not own or not len(nbytes):
            return nbytes <= default
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        n = int(max(src.max(), dst.max(), *(max(k) for k in own))) + 1
        keys = sorted((a * n + b, v) for (a, b), v in own.items())   # link id src * n + dst
        ids = np.array([k for k, _ in keys], dtype=np.int64)
        lid = src * n + dst
        at = np.minimum(np.searchsorted(ids, lid), len(ids) - 1)
        thr = np.where(ids[at] == lid, np.array([v for _, v in keys])[at], default)
        return nbytes <= thr

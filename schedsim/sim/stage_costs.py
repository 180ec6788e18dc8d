"""The pieces of a stage's ops and their costs under the stage model
(:mod:`schedsim.sim.stage_model`, whose docstring describes the pieces, the collectives'
places and the overlap modes): :func:`phase_pieces` builds an op's pieces,
:class:`StageCosts` schedules them (:mod:`schedsim.sim.overlap`) into each op's cost.

Plain Python (no torch).
"""
from __future__ import annotations

from dataclasses import replace

from schedsim.sim.combined import combined_order
from schedsim.sim.overlap import (
    COLLECTIVE,
    COMPUTE,
    OpCost,
    Piece,
    Placed,
    chained,
    schedule,
    union,
)
from schedsim.sim.stage_model import KINDS, StageModel


# -- pieces ------------------------------------------------------------------------------
class _Stage:
    """A stage's resolved parameters (overrides applied)."""

    def __init__(self, m: StageModel, stage: int | None) -> None:
        o = m.stage.get(stage) if stage is not None else None
        self.layers = o.layers if o is not None and o.layers is not None else m.layers
        self.attn = o.attention if o is not None and o.attention is not None else m.attention
        self.mlp = o.mlp if o is not None and o.mlp is not None else m.mlp
        self.slowdown = (o.comm_slowdown if o is not None and o.comm_slowdown is not None
                         else m.comm_slowdown)
        self.embedding = o.embedding if o is not None else None
        self.head = o.head if o is not None else None
        dense = (o.dense_layers or 0) if o is not None and m.moe else 0
        self.dense = min(dense, self.layers)
        self.dense_mlp = (o.dense_mlp if o is not None and o.dense_mlp is not None
                          else self.mlp)

    def moe_at(self, m: StageModel, layer: int) -> bool:
        """Whether the stage's layer ``layer`` has an expert MLP."""
        return m.moe and layer >= self.dense


class _Builder:
    """Builds the pieces of one phase of one half (``frac`` of the microbatch)."""

    def __init__(self, m: StageModel, frac: float, half: int | None) -> None:
        self.m, self.frac, self.half = m, frac, half
        self.out: list[Piece] = []
        self.block = ""                 # the block the next pieces belong to
        self.blocks: list[str] = []     # per piece: its block (combined.BLOCKS)

    def at(self, block: str) -> "_Builder":
        self.block = block
        return self

    def compute(self, name: str, cost: float, part: str, layer: int) -> int:
        self.out.append(Piece(name, COMPUTE, cost * self.frac, part=part, layer=layer,
                              half=self.half))
        self.blocks.append(self.block)
        return len(self.out) - 1

    def coll(self, name: str, kind: str, group: str, part: str, layer: int) -> None:
        m = self.m
        if group == "tp":
            n, span, nbytes = m.tp, m.tp, m.activation_bytes
        else:
            n, span = m.ep, m.tp * m.ep
            nbytes = m.activation_bytes * m.topk / (m.tp if m.sequence_parallel else 1)
        if n == 1:       # Megatron bypasses a collective on one rank
            return
        nbytes *= self.frac
        self.out.append(Piece(name, COLLECTIVE, m.links.time(kind, n, nbytes, span),
                              part=part, layer=layer, half=self.half, collective=kind,
                              group=group, nbytes=nbytes))
        self.blocks.append(self.block)


def _forward(m: StageModel, st: _Stage, frac: float, half: int | None,
             blocks: list[str] | None = None) -> list[Piece]:
    """F of one half as a chain (deps: the previous piece); ``blocks`` (if given)
    receives each piece's block (attention, dispatch, mlp, combine)."""
    b = _Builder(m, frac, half)
    sp = m.sequence_parallel
    if st.embedding is not None:
        b.at("attention").compute("embedding", st.embedding.F, "F", -1)
        b.coll("embedding reduce-scatter" if sp else "embedding all-reduce",
               "reduce-scatter" if sp else "all-reduce", "tp", "F", -1)
    for ly in range(st.layers):
        if sp:
            b.at("attention").coll("qkv all-gather", "all-gather", "tp", "F", ly)
        b.at("attention").compute("attention", st.attn.F, "F", ly)
        b.coll("proj reduce-scatter" if sp else "proj all-reduce",
               "reduce-scatter" if sp else "all-reduce", "tp", "F", ly)
        if st.moe_at(m, ly):
            b.at("dispatch").coll("dispatch all-to-all", "all-to-all", "ep", "F", ly)
            b.at("mlp").compute("experts", st.mlp.F, "F", ly)
            b.at("combine").coll("combine all-to-all", "all-to-all", "ep", "F", ly)
        else:
            if sp:
                b.at("mlp").coll("fc1 all-gather", "all-gather", "tp", "F", ly)
            b.at("mlp").compute("mlp", st.dense_mlp.F if m.moe else st.mlp.F, "F", ly)
            b.coll("fc2 reduce-scatter" if sp else "fc2 all-reduce",
                   "reduce-scatter" if sp else "all-reduce", "tp", "F", ly)
    if st.head is not None:
        if sp:
            b.at("attention").coll("head all-gather", "all-gather", "tp", "F", st.layers)
        b.at("attention").compute("head", st.head.F, "F", st.layers)
    if blocks is not None:
        blocks += b.blocks
    return chained(b.out)


def _backward(m: StageModel, st: _Stage, frac: float, half: int | None,
              with_w: bool, blocks: list[str] | None = None) -> list[Piece]:
    """B of one half as a chain, plus (``with_w``) the W pieces, each depending only on
    the B compute piece of its block (the output gradient it needs); ``blocks`` (if
    given) receives each piece's block (a W piece's: ``mlp-w``, ``attention-w``)."""
    b = _Builder(m, frac, half)
    sp = m.sequence_parallel
    wdeps: list[tuple[str, float, int, int]] = []     # (name, cost, layer, B piece)
    if st.head is not None:
        i = b.at("attention").compute("head", st.head.B, "B", st.layers)
        b.coll("head dgrad reduce-scatter" if sp else "head dgrad all-reduce",
               "reduce-scatter" if sp else "all-reduce", "tp", "B", st.layers)
        wdeps.append(("head", st.head.W, st.layers, i))
    for ly in reversed(range(st.layers)):
        if st.moe_at(m, ly):
            b.at("combine").coll("combine all-to-all", "all-to-all", "ep", "B", ly)
            i = b.at("mlp").compute("experts", st.mlp.B, "B", ly)
            b.at("dispatch").coll("dispatch all-to-all", "all-to-all", "ep", "B", ly)
            wdeps.append(("experts", st.mlp.W, ly, i))
        else:
            mlp = st.dense_mlp if m.moe else st.mlp
            if sp:
                b.at("mlp").coll("fc2 grad all-gather", "all-gather", "tp", "B", ly)
            i = b.at("mlp").compute("mlp", mlp.B, "B", ly)
            b.coll("fc1 dgrad reduce-scatter" if sp else "fc1 dgrad all-reduce",
                   "reduce-scatter" if sp else "all-reduce", "tp", "B", ly)
            wdeps.append(("mlp", mlp.W, ly, i))
        if sp:
            b.at("attention").coll("proj grad all-gather", "all-gather", "tp", "B", ly)
        i = b.at("attention").compute("attention", st.attn.B, "B", ly)
        b.coll("qkv dgrad reduce-scatter" if sp else "qkv dgrad all-reduce",
               "reduce-scatter" if sp else "all-reduce", "tp", "B", ly)
        wdeps.append(("attention", st.attn.W, ly, i))
    if st.embedding is not None:
        i = b.at("attention").compute("embedding", st.embedding.B, "B", -1)
        wdeps.append(("embedding", st.embedding.W, -1, i))
    pieces = chained(b.out)
    if with_w:
        pieces += [Piece(name, COMPUTE, cost * frac, (dep,), part="W", layer=ly, half=half)
                   for name, cost, ly, dep in wdeps]
    if blocks is not None:
        blocks += b.blocks
        if with_w:
            blocks += [("attention-w" if name in ("attention", "head", "embedding")
                        else "mlp-w")
                       for name, _c, _l, _d in wdeps]
    return pieces


def _weight(m: StageModel, st: _Stage, frac: float, half: int | None) -> list[Piece]:
    """W of one half: the weight-gradient pieces, last layer first (no collective)."""
    out = []
    if st.head is not None:
        out.append(Piece("head", COMPUTE, st.head.W * frac, part="W", layer=st.layers,
                         half=half))
    for ly in reversed(range(st.layers)):
        moe = st.moe_at(m, ly)
        mlp = st.mlp if moe or not m.moe else st.dense_mlp
        out.append(Piece("experts" if moe else "mlp", COMPUTE, mlp.W * frac, part="W",
                         layer=ly, half=half))
        out.append(Piece("attention", COMPUTE, st.attn.W * frac, part="W", layer=ly,
                         half=half))
    if st.embedding is not None:
        out.append(Piece("embedding", COMPUTE, st.embedding.W * frac, part="W", layer=-1,
                         half=half))
    return chained(out)


def _interleave(frags: list[list[Piece]]) -> list[Piece]:
    """Pieces of equally shaped fragments (the Domino halves) in program order
    ``a0 b0 a1 b1 ...``, each keeping its own dependencies."""
    k = len(frags)
    return [replace(p, deps=tuple(d * k + f for d in p.deps))
            for j in range(len(frags[0])) for f, frag in enumerate(frags)
            for p in (frag[j],)]


def phase_pieces(m: StageModel, stage: int | None, kind: str, split: bool = False,
                 free_w: bool = False) -> list[Piece]:
    """The pieces of op ``kind`` (F, B, W, BW) on ``stage`` (None: the default stage)
    with true dependencies; ``split``: as two Domino halves; ``free_w``: in BW, each W
    piece depends only on its B compute piece (else BW is B then W, one chain)."""
    st = _Stage(m, stage)

    def one(frac: float, half: int | None) -> list[Piece]:
        if kind == "F":
            return _forward(m, st, frac, half)
        if kind == "W":
            return _weight(m, st, frac, half)
        pieces = _backward(m, st, frac, half, with_w=kind == "BW")
        return pieces if kind == "B" or free_w else chained(pieces)

    if kind not in KINDS:
        raise ValueError(f"unknown op kind {kind!r}: expected F, B, W or BW")
    if not split:
        return one(1.0, None)
    return _interleave([one(0.5, 0), one(0.5, 1)])


def _shifted(c: OpCost, dt: float) -> tuple[Placed, ...]:
    return tuple(Placed(p.piece, p.start + dt, p.end + dt) for p in c.pieces)


class StageCosts:
    """The derived costs of a :class:`StageModel`, memoised per (kind, stage).

    ``op(kind, stage)`` and ``fb(forward stage, backward stage, backward kind)`` give the
    :class:`~schedsim.sim.overlap.OpCost`; :meth:`kind_cost` / :meth:`fb_cost` the numbers
    :class:`~schedsim.sim.costs.CostModel` uses for kinds nobody typed. ``varies`` is
    true when stages differ (per-stage overrides).
    """

    def __init__(self, model: StageModel, connections: int = 8) -> None:
        self.model = model
        self.connections = connections
        self.varies = bool(model.stage)
        self._ops: dict[tuple[str, int | None], OpCost] = {}
        self._fbs: dict[tuple[int | None, int | None, str], OpCost] = {}

    def _key(self, stage: int | None) -> int | None:
        return stage if stage in self.model.stage else None

    def op(self, kind: str, stage: int | None = None) -> OpCost:
        """Cost of op ``kind`` (F, B, W, BW) on ``stage``. Raises ValueError for FB (use
        :meth:`fb`) or an unknown kind."""
        key = (kind, self._key(stage))
        c = self._ops.get(key)
        if c is None:
            domino = self.model.overlap == "domino" and kind != "W"
            c = schedule(phase_pieces(self.model, key[1], kind, split=domino,
                                      free_w=domino), **self._device(key[1]))
            self._ops[key] = c
        return c

    def fb(self, stage_f: int | None = None, stage_b: int | None = None,
           back: str = "BW") -> OpCost:
        """Cost of an FB pair: the forward of ``stage_f`` with the ``back`` (B or BW) of
        ``stage_b``; overlapped only under ``overlap = "fb"``."""
        key = (self._key(stage_f), self._key(stage_b), back)
        c = self._fbs.get(key)
        if c is None:
            if back not in ("B", "BW"):
                raise ValueError(f"an FB pair's backward part is B or BW (got {back!r})")
            m = self.model
            if m.overlap == "fb":
                c = schedule(union(phase_pieces(m, key[0], "F"),
                                   phase_pieces(m, key[1], back, free_w=True)),
                             **self._device(key[1]))
            elif m.overlap == "megatron":
                fbl: list[str] = []
                bbl: list[str] = []
                f = _forward(m, _Stage(m, key[0]), 1.0, None, fbl)
                b = _backward(m, _Stage(m, key[1]), 1.0, None, back == "BW", bbl)
                c = schedule(combined_order(f, fbl, b, bbl, m.delay_wgrad), in_order=True,
                             **self._device(key[1]))
            else:
                f, b = self.op("F", key[0]), self.op(back, key[1])
                pieces = (tuple(Placed(replace(p.piece, which=0), p.start, p.end)
                                for p in f.pieces)
                          + tuple(Placed(replace(p.piece, which=1), p.start, p.end)
                                  for p in _shifted(b, f.cost)))
                c = OpCost(f.cost + b.cost, f.compute + b.compute,
                           f.collective + b.collective, f.exposed + b.exposed, pieces)
            self._fbs[key] = c
        return c

    def _device(self, stage: int | None) -> dict:
        """The device options of :func:`~schedsim.sim.overlap.schedule` on ``stage``'s
        rank: its hardware queues and its compute slowdown under a collective."""
        return {"connections": self.connections,
                "slowdown": _Stage(self.model, stage).slowdown}

    def kind_cost(self, kind: str, stage: int) -> float:
        return self.op(kind, stage).cost

    def fb_cost(self, stage_f: int, stage_b: int, back: str) -> float:
        return self.fb(stage_f, stage_b, back).cost

    def table(self) -> list[tuple[str, str, OpCost]]:
        """``(stages, kind, cost)`` rows: the default stage, then each overridden stage;
        kinds F, B, W, BW and FB (= F + BW of the same stage)."""
        groups: list[tuple[str, int | None]] = [("default" if self.model.stage else "all",
                                                 None)]
        groups += [(str(s), s) for s in sorted(self.model.stage)]
        rows = []
        for label, s in groups:
            rows += [(label, k, self.op(k, s)) for k in KINDS]
            rows.append((label, "FB", self.fb(s, s, "BW")))
        return rows

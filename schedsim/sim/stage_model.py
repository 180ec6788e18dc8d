"""The stage model (``[model]`` of a scenario): what happens inside one stage's op.

A pipeline stage is itself tensor-parallel (and, for MoE, expert-parallel): every layer's
attention and MLP run on ``tp`` GPUs that exchange partial results with collectives. From
the layers, their per-layer compute costs and the group sizes this module derives each
op's internal sequence of pieces and, with :mod:`schedsim.sim.overlap`, its cost:

- **F**, per layer: attention, then the all-reduce of the attention output projection
  (Megatron's *g* operator, ``mappings.reduce_from_tensor_model_parallel_region``), then
  the MLP and the all-reduce after ``fc2`` (g again). With ``sequence_parallel`` each
  all-reduce becomes a reduce-scatter and an all-gather precedes QKV and ``fc1``
  (``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_parallel_region``).
  With ``moe`` the MLP is the expert layer: all-to-all dispatch, experts, all-to-all
  combine on the EP group (DeepSeek-V3 report, section 3.2.1: attention, dispatch, MLP,
  combine).
- **B** (input gradient), layers in reverse: MLP input-gradient, then the all-reduce of the
  input gradient at ``fc1`` (the backward of Megatron's *f*,
  ``copy_to_tensor_model_parallel_region``), then attention and the all-reduce at QKV.
  Sequence parallelism: all-gather of the output gradient and reduce-scatter of the input
  gradient instead. MoE: the combine's backward (an all-to-all), experts, the dispatch's
  backward (an all-to-all).
- **W** (weight gradient): compute only, no collective (tensor-parallel weights are
  sharded, their gradients local; the gathered inputs are assumed kept for W, as the B/W
  split needs them — Megatron's fused backward re-gathers them instead).
- **BW** = B then W; **FB** = an F and a B or BW of two microbatches.

Megatron-LM ``megatron/core/tensor_parallel/mappings.py`` and ``layers.py`` give the places
of the collectives. Collective times: :mod:`schedsim.sim.collectives` (nccl-tests
conventions). Overlap (``overlap``):

- ``none``: every op is one chain, its cost the sum of its pieces;
- ``domino``: the microbatch is split in two halves (each compute piece costs half,
  each collective moves half the bytes) whose pieces interleave, so one half's
  collective runs during the other half's compute (DeepSpeed
  ``deepspeed/runtime/domino/transformer.py``: ``handle0`` waits while half 1 computes);
  in BW the weight gradients also run while the input-gradient all-reduce is in flight
  (Domino's ``async_linear.py``, Megatron's async dgrad all-reduce). W and FB as ``none``
  (FB = its two parts back to back);
- ``fb``: F, B, W, BW as ``none``; in an FB pair each part's collectives overlap the other
  part's compute (DualPipe, DeepSeek-V3 section 3.2.1 and its figure 4);
- ``megatron``: as ``fb``, but the pair's pieces are launched in Megatron-LM's
  combined-1F1B order, layer by layer (:mod:`schedsim.sim.combined`), and each stream
  runs them in that order (``delay_wgrad``: Megatron's ``delay_wgrad_compute``, the
  weight gradients launched after the next all-to-all instead of inside their backward).

Device options of the rank (:func:`schedsim.sim.overlap.schedule`): ``connections``
(``[comm] connections``, ``CUDA_DEVICE_MAX_CONNECTIONS``; 1 = one in-order hardware
queue for both streams) and ``comm_slowdown`` (compute this many times slower while a
collective runs; per stage with ``[model.stage.N]``, i.e. per rank).

The compute costs are those of one rank (one GPU's share of the layer), in the unit of
``[costs]``; ``activation_bytes`` is one microbatch's activation (``seq x mb x hidden x
bytes per element``): the ``S`` of every TP collective, ``topk`` times it (over ``tp``
with sequence parallelism) of an all-to-all, and the P2P message size (over ``tp`` with
sequence parallelism, as Megatron sends the sequence shard).

Plain Python (no torch).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schedsim.sim.collectives import ModelLinks
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

Overlap = Literal["none", "domino", "fb", "megatron"]
KINDS = ("F", "B", "W", "BW")


class BlockCosts(BaseModel):
    """Per-layer compute cost of one block (attention or MLP) on one rank, per phase."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    F: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    B: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    W: float = Field(default=0.5, ge=0, allow_inf_nan=False)


class StageOverride(BaseModel):
    """``[model.stage.N]``: stage N's layers and block costs (unset: the model's).

    ``embedding`` / ``head``: the costs of the stage's input embedding (its F first, its
    W last; an embedding has no input gradient, so its B is usually 0) and of its final
    norm, LM head and loss (F last, B and W first), with their tensor-parallel
    collectives (Megatron's ``VocabParallelEmbedding`` reduces its output; the LM head is
    a column-parallel layer: an all-gather of its input under sequence parallelism, the
    input gradient's all-reduce or reduce-scatter in B); in Megatron's combined FB order
    they belong to the attention block. ``dense_layers``: with ``moe``, how many of the
    stage's layers (its first ones, as DeepSeek-V3's ``first_k_dense_replace`` puts them)
    have a dense MLP costing ``dense_mlp`` with the TP collectives of a dense layer."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    layers: int | None = Field(default=None, ge=0)
    attention: BlockCosts | None = None
    mlp: BlockCosts | None = None
    comm_slowdown: float | None = Field(default=None, ge=1, allow_inf_nan=False)
    embedding: BlockCosts | None = None
    head: BlockCosts | None = None
    dense_layers: int | None = Field(default=None, ge=0)
    dense_mlp: BlockCosts | None = None


class StageModel(BaseModel):
    """``[model]``: layers, block costs, parallel sizes, activation size and overlap.

    Example::

        [model]
        layers = 4                       # transformer layers per stage
        tp = 4                           # tensor-parallel size
        sequence_parallel = false
        moe = true                       # the MLP is an expert layer ...
        ep = 8                           # ... on an expert-parallel group of 8
        topk = 2                         # experts per token (all-to-all bytes x topk)
        activation_bytes = 16e6          # one microbatch's activation, bytes
        overlap = "fb"                   # none | domino | fb | megatron
        delay_wgrad = false              # megatron: Megatron's delay_wgrad_compute
        comm_slowdown = 1.0              # compute x this while a collective runs
        attention = { F = 1.0, B = 1.0, W = 0.6 }   # per layer, one rank
        mlp = { F = 1.2, B = 1.2, W = 0.8 }
        [model.links]                    # bus bandwidth (bytes / unit), latency (unit)
        gpus_per_node = 8
        intra = { bandwidth = 150e6, latency = 0.001 }
        inter = { bandwidth = 40e6, latency = 0.005 }
        [model.stage.0]                  # per-stage override
        layers = 3

    Raises ``ValueError`` (a :class:`~schedsim.errors.ScenarioError` through the scenario)
    for ``ep > 1`` or ``topk > 1`` without ``moe``.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    layers: int = Field(default=1, ge=0)
    attention: BlockCosts = Field(default_factory=BlockCosts)
    mlp: BlockCosts = Field(default_factory=BlockCosts)
    tp: int = Field(default=1, ge=1)
    sequence_parallel: bool = False
    moe: bool = False
    ep: int = Field(default=1, ge=1)
    topk: int = Field(default=1, ge=1)
    activation_bytes: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    overlap: Overlap = "none"
    delay_wgrad: bool = False
    comm_slowdown: float = Field(default=1.0, ge=1, allow_inf_nan=False)
    links: ModelLinks = Field(default_factory=ModelLinks)
    stage: dict[int, StageOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "StageModel":
        if not self.moe and (self.ep > 1 or self.topk > 1):
            raise ValueError(f"ep = {self.ep} and topk = {self.topk} describe an MoE "
                             f"layer: set moe = true (or drop them)")
        from schedsim.util.limits import check

        # a group's GPUs count against the ranks limit (tp = 10**30 was accepted)
        check("ranks", self.tp * self.ep, f"[model] tp = {self.tp:,} x ep = {self.ep:,}: a "
                                          f"group of {self.tp * self.ep:,} GPUs")
        self._check_inter_link()
        return self

    def _check_inter_link(self) -> None:
        """A TP group (``tp`` GPUs) or EP group (``tp x ep``) wider than a node runs on the
        inter-node link: with ``[model.links] intra`` set and ``inter`` not, its
        collectives would silently cost nothing (tp = 8 ran 105.6 and tp = 9 30). Raises
        ValueError naming the group and the key to set."""
        lk = self.links
        if "intra" not in lk.model_fields_set or "inter" in lk.model_fields_set:
            return
        for name, gpus, n in (("TP", self.tp, self.tp), ("EP", self.tp * self.ep, self.ep)):
            if n > 1 and gpus > lk.gpus_per_node:
                raise ValueError(f"the {name} group spans {gpus} GPUs, more than "
                                 f"gpus_per_node = {lk.gpus_per_node}, so it runs on the "
                                 f"inter-node link, which [model.links] does not set (its "
                                 f"collectives would be free): set [model.links] inter = "
                                 f"{{ bandwidth = ..., latency = ... }}")

    def message_bytes(self) -> float | None:
        """Bytes of one P2P activation/gradient message (None without
        ``activation_bytes``): the sequence shard with sequence parallelism."""
        if not self.activation_bytes:
            return None
        return self.activation_bytes / (self.tp if self.sequence_parallel else 1)


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

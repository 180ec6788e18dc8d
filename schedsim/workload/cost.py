"""Costs in ms from a workload: a roofline per piece plus a fixed per-piece overhead,
assembled into the stage model (:class:`schedsim.sim.stage_model.StageModel`) so that
the TP/EP collectives, the overlap modes and ``--detail`` work on derived costs as on
typed ones.

**A piece's time**: ``max(flops / (peak x efficiency), bytes / (hbm_bandwidth x
efficiency)) + overhead_ms`` (0 for a piece with neither FLOPs nor bytes); the GEMMs at the peak of ``gemm_dtype``
(fp8 included), flash attention's core at the peak of ``params_dtype`` (bf16 kernels
also under Float8 training). Pieces per layer and phase (:mod:`schedsim.workload.flops`):
``attention`` (projections + core attention) and ``mlp`` / ``experts``; per stage, the
``embedding`` on the first stage and the ``head`` (final norm, LM head, loss) on the last,
whose GEMMs run at the ``params_dtype`` peak (Float8 training converts the decoder
layers' linears only: torchtitan's ``float8.py`` filters out ``output``, Megatron-LM's
output layer is a plain column-parallel linear).

**Recompute** (where the policy puts it): ``full`` adds each layer's forward to its B
(a forward before each backward, Megatron's ``--recompute-granularity full`` and
torchtitan's full activation checkpointing of each decoder layer); ``selective`` adds
the core attention's forward to the attention's B (Korthikanti et al. section 5).

**Collectives and P2P**: ``[model.links]`` from the GPU: the intra-node link at
``nvlink_bandwidth x comm_efficiency`` bus bandwidth, the inter-node link at
``network_bandwidth x comm_efficiency``, ``gpus_per_node`` GPUs a node; byte counts from
the model (``seq x micro_batch_size x hidden x bytes`` per TP collective, ``topk`` times
that, over ``tp`` with sequence parallelism, per all-to-all; the P2P message the same
activation over ``tp`` with sequence parallelism).

Plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from schedsim.sim.collectives import LinkSpec, ModelLinks
from schedsim.sim.stage_model import BlockCosts, StageModel, StageOverride
from schedsim.workload.flops import (
    PieceFlops,
    core_attention_macs_per_token,
    embedding_pieces,
    head_pieces,
    layer_pieces,
)
from schedsim.workload.hardware import DTYPE_BYTES
from schedsim.workload.layout import StageLayout, Workload

#: latency (ms) per ring step of a collective and per P2P message: intra-node, network
NVLINK_LATENCY_MS = 0.005
NETWORK_LATENCY_MS = 0.015


@dataclass(frozen=True)
class StagePieces:
    """Per-rank costs of one stage (ms per microbatch) and what they came from:
    ``attention`` / ``mlp`` (per layer, averaged over the stage's layers of that kind),
    ``dense_mlp`` (an MoE stage's dense layers), ``embedding`` / ``head`` (None when
    absent), ``flops`` (per rank per microbatch: F, B, W, recompute)."""

    layout: StageLayout
    attention: BlockCosts
    mlp: BlockCosts
    dense_mlp: BlockCosts | None
    dense_layers: int
    embedding: BlockCosts | None
    head: BlockCosts | None
    flops: dict[str, float]


class _Timer:
    def __init__(self, w: Workload) -> None:
        hw = w.gpu
        self.w = w
        self.gemm = hw.peak_flops(w.gemm_dtype)
        self.core = hw.peak_flops(w.params_dtype)
        self.bw = hw.hbm_bandwidth
        self.e = float(DTYPE_BYTES[w.params_dtype])
        self.gb = float(DTYPE_BYTES[w.grad_dtype])

    def block(self, p: PieceFlops, core_f: float = 0.0, tp: int = 1,
              gemm_peak: float | None = None) -> BlockCosts:
        """F, B, W ms of piece ``p`` on one of ``tp`` ranks; ``core_f``: the FLOPs of
        its core attention forward (at the core's peak; its B costs 2x); ``gemm_peak``:
        its GEMMs' peak (default: ``gemm_dtype``'s)."""
        w = self.w
        ov, eff = w.overhead_ms, w.efficiency
        peak = gemm_peak or self.gemm

        def t(gemm_flops: float, core: float, nbytes: float) -> float:
            if gemm_flops <= 0 and core <= 0 and nbytes <= 0:
                return 0.0
            c = gemm_flops / tp / (peak * eff) + core / tp / (self.core * eff)
            return max(c, nbytes / (self.bw * eff)) * 1e3 + ov

        return BlockCosts(F=t(p.F - core_f, core_f, p.bytes_F),
                          B=t(p.B - 2 * core_f, 2 * core_f, p.bytes_B),
                          W=t(p.W, 0.0, p.bytes_W))

    def core_ms(self, core_f: float, tp: int) -> float:
        return core_f / tp / (self.core * self.w.efficiency) * 1e3


def _add(a: BlockCosts, b: BlockCosts, n: float) -> BlockCosts:
    return BlockCosts(F=a.F + b.F * n, B=a.B + b.B * n, W=a.W + b.W * n)


def stage_pieces(w: Workload) -> list[StagePieces]:
    """Per-stage costs of a (checked) workload, stage order (:meth:`Workload.stage_layout`).
    Layers of one kind (dense or MoE) cost the same, so each stage's blocks are computed
    once per kind."""
    m, tp, seq, mbs = w.model, w.tp, w.seq, w.micro_batch_size
    timer = _Timer(w)
    core_f = 2.0 * seq * mbs * core_attention_macs_per_token(m, seq)
    kinds: dict[bool, tuple[BlockCosts, BlockCosts, dict[str, float]]] = {}

    def kind(layer: int) -> tuple[BlockCosts, BlockCosts, dict[str, float]]:
        moe = m.is_moe_layer(layer)
        if moe not in kinds:
            p = layer_pieces(m, layer, seq, mbs, tp, timer.e, timer.gb)
            att, mlp = p["attention"], p["experts" if moe else "mlp"]
            a, b = timer.block(att, core_f, tp), timer.block(mlp, 0.0, tp)
            if w.recompute == "full":
                a, b = BlockCosts(F=a.F, B=a.B + a.F, W=a.W), BlockCosts(F=b.F, B=b.B + b.F, W=b.W)
                rec = (att.F + mlp.F) / tp
            elif w.recompute == "selective":
                a = BlockCosts(F=a.F, B=a.B + timer.core_ms(core_f, tp), W=a.W)
                rec = core_f / tp
            else:
                rec = 0.0
            fl = {"F": (att.F + mlp.F) / tp, "B": (att.B + mlp.B) / tp,
                  "W": (att.W + mlp.W) / tp, "recompute": rec}
            kinds[moe] = (a, b, fl)
        return kinds[moe]

    out = []
    zero = BlockCosts(F=0.0, B=0.0, W=0.0)
    for st in w.stage_layout():
        att = mlp = dmlp = zero
        n_moe = n_dense = 0
        fl = {"F": 0.0, "B": 0.0, "W": 0.0, "recompute": 0.0}
        for i in range(st.first, st.first + st.layers):
            a, b, f = kind(i)
            att = _add(att, a, 1)
            if m.is_moe_layer(i):
                mlp, n_moe = _add(mlp, b, 1), n_moe + 1
            else:
                dmlp, n_dense = _add(dmlp, b, 1), n_dense + 1
            fl = {k: fl[k] + f[k] for k in fl}
        n = max(st.layers, 1)
        att = _add(zero, att, 1 / n)
        if m.experts:
            mlp = _add(zero, mlp, 1 / max(n_moe, 1))
            dense = _add(zero, dmlp, 1 / max(n_dense, 1)) if n_dense else None
        else:
            mlp, dense = _add(zero, dmlp, 1 / n), None
        emb = head = None
        if st.embedding:
            emb = timer.block(embedding_pieces(m, seq, mbs, tp, timer.e, timer.gb), 0.0, tp,
                              timer.core)
        if st.head:       # the LM head stays at params_dtype (fp8 is for decoder linears)
            hp = head_pieces(m, seq, mbs, tp, timer.e, timer.gb, w.vocab_divisor)
            head = timer.block(hp, 0.0, tp, timer.core)
            fl = {"F": fl["F"] + hp.F / tp, "B": fl["B"] + hp.B / tp,
                  "W": fl["W"] + hp.W / tp, "recompute": fl["recompute"]}
        out.append(StagePieces(st, att, mlp, dense, n_dense, emb, head, fl))
    return out


def model_links(w: Workload) -> ModelLinks:
    """``[model.links]`` of the workload's GPU (module docstring), bandwidths in bytes
    per ms."""
    hw, ce = w.gpu, w.comm_efficiency
    return ModelLinks(gpus_per_node=hw.gpus_per_node,
                      intra=LinkSpec(bandwidth=hw.nvlink_bandwidth * ce / 1e3,
                                     latency=NVLINK_LATENCY_MS),
                      inter=LinkSpec(bandwidth=hw.network_bandwidth * ce / 1e3,
                                     latency=NETWORK_LATENCY_MS))


def activation_bytes(w: Workload) -> float:
    """One microbatch's activation, ``seq x micro_batch_size x hidden x bytes``."""
    return float(w.seq * w.micro_batch_size * w.model.hidden_size * DTYPE_BYTES[w.params_dtype])


def stage_model(w: Workload, pieces: list[StagePieces] | None = None,
                overlap: str = "none") -> StageModel:
    """The :class:`StageModel` of a (checked) workload: the first stage whose blocks are
    the commonest is the default, every other stage an override."""
    pieces = pieces if pieces is not None else stage_pieces(w)

    def spec(p: StagePieces) -> tuple:
        def b(x: BlockCosts | None) -> tuple | None:
            return None if x is None else (x.F, x.B, x.W)
        return (p.layout.layers, b(p.attention), b(p.mlp), b(p.embedding), b(p.head),
                p.dense_layers, b(p.dense_mlp))

    from collections import Counter

    specs = [spec(p) for p in pieces]
    counts = Counter(specs)
    common = max(range(len(specs)), key=lambda i: (counts[specs[i]], -i))
    base = pieces[common]
    over = {}
    for i, p in enumerate(pieces):
        if specs[i] == specs[common] and p.embedding is None and p.head is None:
            continue
        over[i] = StageOverride(layers=p.layout.layers, attention=p.attention, mlp=p.mlp,
                                embedding=p.embedding, head=p.head,
                                dense_layers=p.dense_layers or None, dense_mlp=p.dense_mlp)
    m = w.model
    return StageModel(layers=base.layout.layers, attention=base.attention, mlp=base.mlp,
                      tp=w.tp, sequence_parallel=w.sp and w.tp > 1, moe=bool(m.experts),
                      ep=w.ep if m.experts else 1, topk=max(1, m.topk) if m.experts else 1,
                      activation_bytes=activation_bytes(w), overlap=overlap,  # type: ignore[arg-type]
                      links=model_links(w), stage=over)

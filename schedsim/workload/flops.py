"""FLOPs of a training step, per layer piece and per step.

**Model FLOPs per step** (:func:`model_flops_per_step`) are counted exactly as Megatron-LM
counts them for its MFU and TFLOP/s figures: ``num_floating_point_operations(args,
batch_size)`` (the standard-transformer branch, ``transformer_flops``) in
``megatron/training/training.py`` of NVIDIA/Megatron-LM at commit
``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (2026-08-22): every GEMM counted three times
(forward, data gradient, weight gradient) at 2 FLOPs per multiply-add; GQA through
``num_query_groups``; SwiGLU as a 3x FFN expansion; MoE layers (``moe_layer_freq``, here
from ``first_k_dense_replace`` / ``decoder_sparse_step`` / ``mlp_only_layers``) with
``moe_router_topk`` routed experts of ``moe_ffn_hidden_size`` plus the shared experts;
multi-latent attention's low-rank projections; the causal core attention as
``seq^2 x heads x (qk + v head dims) / 2`` multiply-adds per sample and layer; the logits
over the *padded* vocabulary (``vocab_size_with_padding``: a multiple of
``make_vocab_size_divisible_by = 128 x tp``, ``megatron/core/tokenizers/utils/
build_tokenizer.py``). Recomputation, the router, norms, the embedding and the loss are
not counted (Megatron does not), so MFU compares across recompute policies. MTP layers
are not built (``mtp_num_layers = None``).

**Pieces** (:func:`layer_pieces`): the same FLOPs split by where they run, per
microbatch and per phase: ``F`` (forward), ``B`` (input gradients: each GEMM's data
gradient and the core attention's whole backward, 2x its forward, as it has no weights)
and ``W`` (each GEMM's weight gradient). Summed over a step's pieces they give
:func:`model_flops_per_step` exactly (a test holds them together). Bytes per piece (what
the roofline of :mod:`schedsim.workload.cost` weighs against HBM bandwidth) are the
GEMMs' operands and results and flash attention's Q, K, V and output.

Units: FLOPs and bytes (floats). Plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from schedsim.workload.model import ModelConfig

#: Megatron-LM's default ``--make-vocab-size-divisible-by``
VOCAB_DIVISOR = 128


def padded_vocab(model: ModelConfig, tp: int, divisor: int = VOCAB_DIVISOR) -> int:
    """Megatron's padded vocabulary: ``vocab_size`` rounded up to a multiple of
    ``divisor x tp`` (``divisor`` 1: no padding beyond a multiple of ``tp``)."""
    mult = divisor * tp
    return -(-model.vocab_size // mult) * mult


@dataclass(frozen=True)
class PieceFlops:
    """FLOPs and bytes of one piece for one microbatch, whole layer (all TP ranks
    together): ``F``, ``B``, ``W`` FLOPs; ``bytes_F`` / ``bytes_B`` / ``bytes_W`` the HBM
    traffic of each phase on one TP rank (operands and results)."""

    F: float
    B: float
    W: float
    bytes_F: float = 0.0
    bytes_B: float = 0.0
    bytes_W: float = 0.0

    def total(self) -> float:
        return self.F + self.B + self.W


def _gemm(tokens: float, weights: float, k: float, n: float, e: float, tp: int,
          grad_bytes: float) -> PieceFlops:
    """A stack of GEMMs with ``weights`` weights (multiply-adds per token), input width
    ``k`` and output width ``n`` per token, sharded over ``tp``: F = B = W =
    ``2 x tokens x weights``; bytes per rank of F: weights + input + output at ``e``
    bytes; B the same; W reads input and output gradient and accumulates the weight
    gradient at ``grad_bytes``."""
    f = 2.0 * tokens * weights
    w_b = weights / tp
    io = tokens * (k + n / tp)
    return PieceFlops(f, f, f, (w_b + io) * e, (w_b + io) * e, io * e + w_b * grad_bytes)


def attention_linear_weights(m: ModelConfig) -> float:
    """Multiply-adds per token of the attention projections, as Megatron counts them
    (``standard_self_attn_term / 6``; MLA with its ``+ 1`` norm terms)."""
    h, a = m.hidden_size, m.num_attention_heads
    if m.mla:
        qk, pos = (m.qk_nope_head_dim or m.kv_channels), (m.qk_rope_head_dim or 0)
        v = m.v_head_dim or m.kv_channels
        q = (h * a * (qk + pos) if m.q_lora_rank is None
             else m.q_lora_rank * (h + a * (qk + pos) + 1))
        kv = m.kv_lora_rank * (h + a * (qk + v) + 1) + h * pos   # type: ignore[operator]
        return float(q + kv + a * v * h)
    d, g = m.kv_channels, m.kv_heads
    return float(h * (a * d + 2 * g * d) + a * d * h)


def core_attention_macs_per_token(m: ModelConfig, seq: int) -> float:
    """Forward multiply-adds per token of the causal core attention (``QK^T`` and the
    product with V, half of the ``seq x seq`` scores): ``seq x heads x (d_qk + d_v)
    / 2``."""
    a = m.num_attention_heads
    if m.mla:
        qk = (m.qk_nope_head_dim or m.kv_channels) + (m.qk_rope_head_dim or 0)
        v = m.v_head_dim or m.kv_channels
    else:
        qk = v = m.kv_channels
    return seq * a * (qk + v) / 2.0


def layer_pieces(m: ModelConfig, layer: int, seq: int, mbs: int, tp: int, e: float = 2.0,
                 grad_bytes: float = 4.0) -> dict[str, PieceFlops]:
    """FLOPs of decoder layer ``layer`` for one microbatch of ``mbs`` samples of ``seq``
    tokens: pieces ``attention`` (projections + core), ``mlp`` (dense) or ``experts``
    (routed + shared); bytes per rank with activations of ``e`` bytes."""
    T = float(seq * mbs)
    h = m.hidden_size
    lin = attention_linear_weights(m)
    a = m.num_attention_heads
    # per-token widths of the projections' outputs (QKV, then the output projection)
    qkv_out = ((a + 2 * m.kv_heads) * m.kv_channels if not m.mla
               else a * (m.v_head_dim or m.kv_channels) * 3)
    att = _gemm(T, lin, h, qkv_out + h, e, tp, grad_bytes)
    core_f = 2.0 * T * core_attention_macs_per_token(m, seq)
    d_qk = (m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0) if m.mla else m.kv_channels
    g = m.num_attention_heads if m.mla else m.kv_heads
    qkvo = T * (a * d_qk + g * d_qk + 2 * g * (m.v_head_dim or m.kv_channels)) / tp * e
    attention = PieceFlops(att.F + core_f, att.B + 2 * core_f, att.W,
                           att.bytes_F + qkvo, att.bytes_B + 2 * qkvo, att.bytes_W)
    expansion = 3 if m.gated else 2
    if m.is_moe_layer(layer):
        ffn = m.moe_ffn * m.topk + m.shared_ffn
        mlp = _gemm(T, h * ffn * expansion, h, ffn * (expansion - 1), e, tp, grad_bytes)
        return {"attention": attention, "experts": mlp}
    ffn = m.intermediate_size
    mlp = _gemm(T, h * ffn * expansion, h, ffn * (expansion - 1), e, tp, grad_bytes)
    return {"attention": attention, "mlp": mlp}


def head_pieces(m: ModelConfig, seq: int, mbs: int, tp: int, e: float = 2.0,
                grad_bytes: float = 4.0, divisor: int = VOCAB_DIVISOR) -> PieceFlops:
    """The LM head over the padded vocabulary (F = B = W = ``2 x tokens x h x V``) and
    the loss: the vocab-parallel cross entropy reads the logits and writes its fp32
    softmax in F, writes the logits' gradient in B (no FLOPs counted, bytes only)."""
    T = float(seq * mbs)
    V = padded_vocab(m, tp, divisor)
    g = _gemm(T, float(m.hidden_size * V), m.hidden_size, V, e, tp, grad_bytes)
    logits = T * V / tp
    return PieceFlops(g.F, g.B, g.W, g.bytes_F + logits * (e + 4.0),
                      g.bytes_B + logits * (4.0 + e), g.bytes_W)


def embedding_pieces(m: ModelConfig, seq: int, mbs: int, tp: int, e: float = 2.0,
                     grad_bytes: float = 4.0) -> PieceFlops:
    """The input embedding: a gather in F (reads and writes ``tokens x h``), nothing in B
    (no input gradient), a scatter-add into the weight gradient in W. No FLOPs."""
    T = float(seq * mbs)
    return PieceFlops(0.0, 0.0, 0.0, 2 * T * m.hidden_size * e, 0.0,
                      T * m.hidden_size * (e + grad_bytes))


def model_flops_per_step(model: ModelConfig, seq: int, global_batch_size: int,
                         tp: int = 1, vocab_divisor: int = VOCAB_DIVISOR) -> float:
    """Megatron-LM's ``num_floating_point_operations`` for one step of
    ``global_batch_size`` samples of ``seq`` tokens (module docstring; the vocabulary
    padded to ``vocab_divisor x tp``). Equal to the sum of the :func:`layer_pieces` and
    :func:`head_pieces` FLOPs over the step."""
    total = 0.0
    kinds: dict[bool, tuple[int, int]] = {}     # MoE or not -> (a layer of it, count)
    for i in range(model.num_hidden_layers):
        k = model.is_moe_layer(i)
        first, n = kinds.get(k, (i, 0))
        kinds[k] = (first, n + 1)
    for first, n in kinds.values():           # layers of one kind count the same
        total += n * sum(p.total() for p in layer_pieces(model, first, seq, 1, 1).values())
    total += head_pieces(model, seq, 1, tp, divisor=vocab_divisor).total()
    return total * global_batch_size

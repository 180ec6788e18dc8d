"""Bytes per rank: activations per layer per microbatch, the W-stash, parameters,
gradients, optimizer states, FSDP's unsharded copies and P2P receive buffers.

**Activations** (:func:`layer_activations`) follow Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", section 4 and Table 2, generalised
per tensor. The paper's GPT layer (LayerNorm, MHA, a 4h GeLU MLP, dropout, no flash
attention, 16-bit activations) stores, per layer and ``s x b`` tokens:

- replicated over TP unless sequence parallel (``10sbh``): both norms' inputs (2+2), the
  QKV and fc1 inputs (the norms' outputs, 2+2) and two dropout masks (1+1 byte);
- sharded over TP (``24sbh/t``): Q, K (2+2), V (2), the output projection's input (2),
  the GeLU's input (8) and fc2's input (8);
- the core attention (``5as^2b/t``): the softmax output (2), its dropout mask (1) and
  the dropout's output (2), each ``a x s x s x b``.

Here each tensor is sized from the model: Q ``a d_qk``, K ``g d_qk`` and V ``g d_v``
(GQA), the projection input ``a d_v``, a SwiGLU MLP's ``2f`` gate/up output and ``f``
fc2 input, an MoE layer's ``topk`` routed copies of (input ``h``, ``2f_e``, ``f_e``) plus
the shared experts' and the router's fp32 logits, MLA's latents; dropout masks only
with ``dropout``; with ``flash_attention`` the core keeps only the fp32 log-sum-exp
(``4 a`` bytes per token, the output being the projection's input already kept) instead
of the ``s x s`` tensors. For the paper's model the sums are exactly its rows:

==========================  =========================  ===================================
recompute / parallelism      Table 2 row                 bytes per layer
==========================  =========================  ===================================
none, t = 1                  no parallelism              ``sbh(34 + 5as/h)``
none, TP                     tensor parallel             ``sbh(10 + 24/t + 5as/(ht))``
none, TP + SP                tensor + sequence parallel  ``sbh(34/t + 5as/(ht))``
selective                    the rows above, no          ``5as/h`` term dropped
                             core-attention term
full                         full recompute              ``2sbh`` (the layer's input; ``/t``
                                                         under SP, Megatron keeps the shard)
==========================  =========================  ===================================

**W-stash** (what a split backward's B keeps for its W): each GEMM's input and output
gradient, under the same sharding rule; B frees the rest.

**Static bytes** (:func:`static_bytes`): parameters (``params_dtype``), gradients
(``grad_dtype``) and optimizer states (Adam: fp32 master copy when ``master_dtype``
differs from ``params_dtype``, plus two fp32 moments; SGD: master plus one momentum),
sharded over data parallelism as ``zero`` says (1: optimizer; 2: + gradients; 3 = FSDP:
+ parameters); expert weights shard over the expert-data-parallel group ``tp x dp /
ep``. FSDP with ``reshard_after_forward`` off (torchtitan's default under pipeline
parallelism, ``torchtitan/models/llama3/infra/parallelize.py``: "For PP, do not reshard
after forward to avoid per-microbatch all-gathers") keeps the stage's parameters gathered
and its gradients unsharded (accumulated across microbatches, reduce-scattered once)
for the step; with it on, two layers' parameters are gathered at a time (the current
one and the prefetched next).

Units: bytes (floats). Plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from schedsim.workload.flops import padded_vocab
from schedsim.workload.hardware import DTYPE_BYTES
from schedsim.workload.model import ModelConfig


@dataclass(frozen=True)
class LayerActivations:
    """One layer's activation bytes per microbatch on one rank: ``stored`` (kept from F
    to B under the recompute policy), ``stash_w`` (what B keeps for W), ``working``
    (extra bytes live during B: the recomputed activations of one layer under full
    recompute, its core attention under selective), ``row`` (the Korthikanti Table 2
    row used) and ``tensors`` (name -> bytes, before the policy)."""

    stored: float
    stash_w: float
    working: float
    row: str
    tensors: dict[str, float] = field(default_factory=dict)


def _tensors(m: ModelConfig, layer: int, seq: int, flash: bool, dropout: bool, e: float
             ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(replicated, sharded, core) bytes per token of layer ``layer``'s saved tensors."""
    h, a, g = m.hidden_size, m.num_attention_heads, m.kv_heads
    mask = 1.0 if dropout else 0.0
    rep = {"norm1 input": h * e, "qkv input": h * e, "attention dropout mask": h * mask,
           "norm2 input": h * e, "fc1 input": h * e, "mlp dropout mask": h * mask}
    if m.mla:
        d_qk = (m.qk_nope_head_dim or m.kv_channels) + (m.qk_rope_head_dim or 0)
        d_v = m.v_head_dim or m.kv_channels
        g = a
        rep["mla latents"] = ((m.q_lora_rank or 0) + (m.kv_lora_rank or 0)
                              + (m.qk_rope_head_dim or 0)) * e
    else:
        d_qk = d_v = m.kv_channels
    sh = {"q": a * d_qk * e, "k": g * d_qk * e, "v": g * d_v * e,
          "proj input": a * d_v * e}
    up = 2 if m.gated else 1
    if m.is_moe_layer(layer):
        k, f = m.topk, m.moe_ffn
        sh["experts input"] = k * h * e
        sh["experts act input"] = k * up * f * e
        sh["experts fc2 input"] = k * f * e
        sh["router logits"] = m.experts * 4.0
        if m.shared_ffn:
            sh["shared act input"] = up * m.shared_ffn * e
            sh["shared fc2 input"] = m.shared_ffn * e
    else:
        f = m.intermediate_size
        sh["act input"] = up * f * e
        sh["fc2 input"] = f * e
    if flash:
        core = {"softmax log-sum-exp": a * 4.0}
    else:
        core = {"softmax output": a * seq * e, "softmax dropout mask": a * seq * mask,
                "attention dropout output": a * seq * e * mask}
    return rep, sh, core


def layer_activations(m: ModelConfig, layer: int, seq: int, mbs: int, tp: int = 1,
                      sp: bool = False, recompute: str = "none", flash: bool = True,
                      dropout: bool = False, e: float = 2.0) -> LayerActivations:
    """Activation bytes of decoder layer ``layer`` for one microbatch of ``mbs`` samples
    of ``seq`` tokens on one TP rank (module docstring). Raises ValueError for an
    unknown ``recompute``."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute is none, selective or full (got {recompute!r})")
    T = float(seq * mbs)
    rep, sh, core = _tensors(m, layer, seq, flash, dropout, e)
    rep_div = tp if sp else 1
    R, S, C = sum(rep.values()), sum(sh.values()), sum(core.values())
    full_layer = T * (R / rep_div + S / tp + C / tp)
    tensors = {k: T * v / rep_div for k, v in rep.items()}
    tensors |= {k: T * v / tp for k, v in {**sh, **core}.items()}
    par = ("tensor + sequence parallel" if sp and tp > 1 else
           "tensor parallel" if tp > 1 else "no parallelism")
    # W needs each GEMM's input (qkv, proj, fc1, fc2 inputs) and output gradient
    h = m.hidden_size
    gemm_in_rep = rep["qkv input"] + rep["fc1 input"]
    gemm_in_sh = sh["proj input"] + sh.get("fc2 input", 0.0) + sh.get("experts fc2 input", 0.0)
    gemm_in_sh += sh.get("experts input", 0.0) + sh.get("shared fc2 input", 0.0)
    out_grads = (sh["q"] + sh["k"] + sh["v"] + sh.get("act input", 0.0)
                 + sh.get("experts act input", 0.0) + sh.get("shared act input", 0.0))
    stash = T * (gemm_in_rep / rep_div + (gemm_in_sh + out_grads) / tp + 2 * h * e / rep_div)
    if recompute == "full":
        stored = T * h * e / rep_div
        return LayerActivations(stored, stash, full_layer, f"full recompute ({par})",
                                tensors)
    if recompute == "selective":
        stored = full_layer - T * C / tp
        return LayerActivations(stored, min(stash, stored), T * C / tp,
                                f"{par}, selective recompute", tensors)
    return LayerActivations(full_layer, min(stash, full_layer), 0.0, par, tensors)


def head_activations(m: ModelConfig, seq: int, mbs: int, tp: int, sp: bool,
                     e: float = 2.0, divisor: int = 128) -> float:
    """Bytes the final norm, LM head and loss keep from F to B per microbatch: the norm's
    input, the head's input (gathered over TP), the vocab-parallel logits and the loss's
    fp32 softmax over the padded vocabulary shard. Not recomputed (Megatron and
    torchtitan checkpoint decoder layers only)."""
    T = float(seq * mbs)
    h = m.hidden_size
    V = padded_vocab(m, tp, divisor)
    return T * (h * e / (tp if sp else 1) + h * e + V / tp * (e + 4.0))


@dataclass(frozen=True)
class StaticBytes:
    """Bytes per rank that live for the whole step: ``params``, ``grads``, ``optimizer``,
    ``unsharded`` (FSDP's gathered parameters and unsharded gradients), all floats;
    ``opt_params``: how many parameters the rank's optimizer shard updates."""

    params: float
    grads: float
    optimizer: float
    unsharded: float = 0.0
    opt_params: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.unsharded


def stage_params(m: ModelConfig, first: int, layers: int, embedding: bool, head: bool,
                 tp: int, ep: int, divisor: int = 128) -> tuple[float, float]:
    """``(dense, expert)`` weights a rank holds of a stage with decoder layers ``first``
    .. ``first + layers - 1`` (and the embedding / final norm + LM head): dense weights
    over ``tp``, routed experts over ``ep`` (expert tensor parallelism 1)."""
    dense = expert = 0.0
    per_kind: dict[bool, tuple[float, float]] = {}     # layers of a kind weigh the same
    for i in range(first, first + layers):
        moe = m.is_moe_layer(i)
        if moe not in per_kind:
            routed = m.experts * m.mlp_params(m.moe_ffn) if moe else 0
            per_kind[moe] = ((m.layer_params(i) - routed) / tp, routed / ep)
        d, x = per_kind[moe]
        dense, expert = dense + d, expert + x
    V = padded_vocab(m, tp, divisor)
    if embedding:
        dense += V * m.hidden_size / tp
    if head:
        dense += V * m.hidden_size / tp + m.hidden_size
    return dense, expert


def static_bytes(dense: float, expert: float, *, dp: int, tp: int, ep: int, zero: int,
                 params_dtype: str, grad_dtype: str, master_dtype: str, optimizer: str,
                 fsdp_keep_gathered: bool, layer_params: float = 0.0,
                 framework: str = "megatron") -> StaticBytes:
    """Static bytes of a rank holding ``dense`` + ``expert`` weights (module docstring);
    ``layer_params``: the largest layer's weights on the rank (FSDP's gathering unit).
    ``framework = "torchtitan"`` with FSDP (``zero = 3``): the sharded parameter is the
    fp32 master (FSDP2 casts to ``params_dtype`` at the all-gather; no second shard), and
    under ``fsdp_keep_gathered`` the gathered copies and all gradients are stage lifetimes
    (:mod:`schedsim.workload.lifetimes`), not static."""
    pb, gb, mb = (DTYPE_BYTES[params_dtype], DTYPE_BYTES[grad_dtype],
                  DTYPE_BYTES[master_dtype])
    edp = max(1, tp * dp // ep)
    per_state = (0 if master_dtype == params_dtype else mb) + (8 if optimizer == "adam" else 4)

    def shard(n_dense: float, n_exp: float, on: bool) -> float:
        return n_dense / dp + n_exp / edp if on else n_dense + n_exp

    n = dense + expert
    params = shard(dense, expert, zero >= 3) * pb
    grads = shard(dense, expert, zero >= 2) * gb
    opt = shard(dense, expert, zero >= 1) * per_state
    unsharded = 0.0
    if zero >= 3:
        if fsdp_keep_gathered:
            unsharded = n * pb - params + n * pb     # gathered params + unsharded grads
        else:
            unsharded = 2 * layer_params * pb
        if framework == "torchtitan":
            if master_dtype != params_dtype:
                params = 0.0
            if fsdp_keep_gathered:
                grads = unsharded = 0.0
    return StaticBytes(params, grads, opt, unsharded, shard(dense, expert, zero >= 1))

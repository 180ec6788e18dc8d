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
and its gradients unsharded (accumulated across microbatches at ``grad_dtype``, as FSDP2
does in its fp32 reduce dtype, reduce-scattered once) for the step; with it on, two layers' parameters are gathered at a time (the current
one and the prefetched next).

**Backward transients** (torchtitan's rules; Megatron's stay the paper's tensors): a
backward also holds what it makes on its way, freed at its end: a layer's largest GEMM
gradients in flight and, under FSDP2, the layer's weight gradients in the parameter dtype
(:func:`layer_backward_bytes`); the last stage's loss backward, the fp32 tensors of
torchtitan's eager cross-entropy over the vocabulary shard (:func:`loss_backward_bytes`).
They are a stage's ``working`` bytes, so they enter a rank's peak only where the schedule
puts them on top of everything else live (:mod:`schedsim.workload.run`).

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


def _tensors(m: ModelConfig, layer: int, seq: int, flash: bool, dropout: bool, e: float,
             gi: float = 0.0) -> tuple[dict[str, float], dict[str, float], dict[str, float],
                                      dict[str, float]]:
    """(replicated, sharded, core, gathered) bytes per token of layer ``layer``'s saved
    tensors; ``gi`` > 0: the GEMM inputs kept as torch's TP and Float8Linear keep them
    (:func:`layer_activations`), ``gathered`` being the all-gathered ones."""
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
    full: dict[str, float] = {}
    if gi > 0 and not m.is_moe_layer(layer):
        # column-parallel GEMMs keep their all-gathered input (the norms' outputs are
        # saved by no op); the row-parallel ones their local input, at g bytes
        full = {"qkv input (gathered)": h * gi, "fc1 input (gathered)": h * gi}
        del rep["qkv input"], rep["fc1 input"]
        if not m.mla:          # repeat_kv: SDPA keeps K and V at every query head
            sh["k"], sh["v"] = a * d_qk * e, a * d_v * e
        sh["fc2 input"] = f * gi
        if gi != e:            # SDPA keeps its bf16 output, Float8Linear its fp8 cast
            sh["proj fp8 input"] = a * d_v * gi
    return rep, sh, core, full


def layer_activations(m: ModelConfig, layer: int, seq: int, mbs: int, tp: int = 1,
                      sp: bool = False, recompute: str = "none", flash: bool = True,
                      dropout: bool = False, e: float = 2.0, gemm_inputs: float = 0.0
                      ) -> LayerActivations:
    """Activation bytes of decoder layer ``layer`` for one microbatch of ``mbs`` samples
    of ``seq`` tokens on one TP rank (module docstring). ``gemm_inputs``: 0 keeps the
    paper's tensors (Megatron-LM: sequence parallelism saves the norms' outputs sharded and
    all-gathers them again in the backward); > 0, the bytes per element at which each
    dense layer's GEMMs keep their inputs as torch's DTensor TP and torchao's Float8Linear
    do (torchtitan): the QKV and fc1 GEMMs keep their all-gathered input (``h``
    elements a token, not ``/tp``: torchtitan's plan, ``parallelize_llama.py::apply_tp``
    @9dec370, redistributes the attention's and the MLP's input from ``Shard(1)`` to
    ``Replicate()`` with ``PrepareModuleInput``, with Float8 ``PrepareFloat8ModuleInput``,
    which casts before the all-gather so that the GEMMs sharing the input share one fp8
    gathered copy: ``torchao/float8/float8_tensor_parallel.py``), fc2 its
    input at ``gemm_inputs`` bytes, SDPA K and V at every query head (torchtitan's
    ``Attention.forward`` @9dec370 expands them with ``repeat_kv`` before
    ``scaled_dot_product_attention``), and with fp8 (``gemm_inputs`` != ``e``) the output
    projection an fp8 copy beside SDPA's bf16 output (``Float8Linear`` saves its fp8
    input: ``torchao/float8/float8_linear.py``
    ``manual_float8_matmul_with_args_in_float8.forward``, torchao 024fe94). Raises
    ValueError for an unknown ``recompute``."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute is none, selective or full (got {recompute!r})")
    T = float(seq * mbs)
    rep, sh, core, gath = _tensors(m, layer, seq, flash, dropout, e, gemm_inputs)
    rep_div = tp if sp else 1
    R, S, C = sum(rep.values()), sum(sh.values()), sum(core.values())
    full_layer = T * (R / rep_div + S / tp + C / tp + sum(gath.values()))
    tensors = {k: T * v / rep_div for k, v in rep.items()}
    tensors |= {k: T * v / tp for k, v in {**sh, **core}.items()}
    tensors |= {k: T * v for k, v in gath.items()}
    par = ("tensor + sequence parallel" if sp and tp > 1 else
           "tensor parallel" if tp > 1 else "no parallelism")
    # W needs each GEMM's input (qkv, proj, fc1, fc2 inputs) and output gradient
    h = m.hidden_size
    gemm_in_rep = rep.get("qkv input", 0.0) + rep.get("fc1 input", 0.0)
    gemm_in_rep += sum(gath.values()) * rep_div
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
                     e: float = 2.0, divisor: int = 128, keep_logits: bool = True) -> float:
    """Bytes the final norm, LM head and loss keep from F to B per microbatch: the norm's
    input, the head's input (gathered over TP), the vocab-parallel logits (unless
    ``keep_logits`` is off: torchtitan without PP deletes them before the backward,
    ``train.py`` @9dec370 ``del pred``) and the loss's fp32 (log-)softmax over the padded
    vocabulary shard. Not recomputed (Megatron and torchtitan checkpoint decoder layers
    only)."""
    return sum(head_tensors(m, seq, mbs, tp, sp, e, divisor, keep_logits).values())


def head_tensors(m: ModelConfig, seq: int, mbs: int, tp: int, sp: bool, e: float = 2.0,
                 divisor: int = 128, keep_logits: bool = True) -> dict[str, float]:
    """:func:`head_activations` tensor by tensor (name -> bytes, in the forward's order:
    the final norm's input, the head's gathered input, the logits, the loss's fp32
    log-softmax); ``logits`` is absent without ``keep_logits``."""
    T = float(seq * mbs)
    h = m.hidden_size
    V = padded_vocab(m, tp, divisor)
    out = {"final norm input": T * h * e / (tp if sp else 1), "head input": T * h * e}
    if keep_logits:
        out["logits"] = T * V / tp * e
    out["log-softmax"] = T * V / tp * 4.0
    return out


def loss_backward_bytes(m: ModelConfig, seq: int, mbs: int, tp: int, divisor: int = 128
                        ) -> float:
    """Bytes live during torchtitan's loss backward on one TP rank beyond what the loss
    saved (its fp32 log-softmax, :func:`head_activations`), per microbatch: the loss is
    ``cross_entropy(pred.flatten(0, 1).float(), labels)``, eager (torchtitan ``train.py``
    @9dec370 ``loss_fn``: "compiling loss function causes CUDA errors"), on ``N = seq x
    mbs x V / tp`` logits of the vocabulary shard.

    - ``tp > 1``, loss parallel (torchtitan's default): DTensor's
      ``_nll_loss_and_log_softmax_backward`` (``torch/distributed/tensor/parallel/loss.py``,
      stored at pytorch 02eef6b) computes ``(zeros_like(x) + exp(x)) * grad``: the
      zeros, ``exp(x)`` and their sum, then the product in its place: 3 fp32 tensors,
      ``12 N`` bytes;
    - ``tp = 1``: aten's ``nll_loss_backward`` (a dense fp32 gradient) and
      ``_log_softmax_backward_data`` (another): ``8 N`` bytes.

    The ``.float()``'s backward then casts to bf16 (``4 N + 2 N``, below either). The
    forward's transient (the fp32 copy, and under loss parallel the shifted logits and
    their ``exp``, ``8 N`` beyond what it keeps) is smaller, so the backward's is the peak."""
    return sum(loss_backward_tensors(m, seq, mbs, tp, divisor))


def loss_backward_tensors(m: ModelConfig, seq: int, mbs: int, tp: int, divisor: int = 128
                          ) -> list[float]:
    """:func:`loss_backward_bytes` tensor by tensor (bytes, in allocation order): three
    fp32 tensors of the vocabulary shard under loss parallel (``tp > 1``), two
    without."""
    n = float(seq * mbs) * padded_vocab(m, tp, divisor) / tp
    return [4.0 * n] * (3 if tp > 1 else 2)


def loss_forward_tensors(m: ModelConfig, seq: int, mbs: int, tp: int, divisor: int = 128
                         ) -> list[float]:
    """The loss forward's fp32 transients beyond what it keeps (bytes; the forward's
    transient of :func:`loss_backward_bytes`): the ``.float()`` copy, and under loss
    parallel the shifted logits' ``exp`` (``8 N``); the copy alone without (``4 N``)."""
    n = float(seq * mbs) * padded_vocab(m, tp, divisor) / tp
    return [4.0 * n] * (2 if tp > 1 else 1)


def layer_backward_bytes(m: ModelConfig, layer: int, tokens: float, tp: int, e: float,
                         fp8: bool, weight_grads: float) -> float:
    """Bytes live during the backward of decoder layer ``layer`` on one TP rank beyond its
    saved (or recomputed) activations, for ``tokens`` tokens: the largest op's gradients
    in flight, plus ``weight_grads`` (the layer's weight gradients before they are
    accumulated: FSDP2 computes them in the parameter dtype and upcasts, accumulates or
    reduce-scatters them in the layer group's ``post_backward``, after the layer's
    backward: ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``
    ``post_backward``, ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``).

    A GEMM's backward holds its output gradient while it makes its input gradient
    (autograd's ``mm`` backward); with fp8 GEMMs the output gradient's e5m2 cast too
    (``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` wrap the outputs in
    ``NoopFwToFloat8BwDynamic``, a cast of the gradient in the backward). Per token, at
    ``e`` bytes: QKV
    ``(a d_qk + g d_qk + g d_v) / tp`` out and ``h`` in (the column-parallel input gradient
    is the full sequence's partial sum before its reduce-scatter), the output projection
    ``h`` out (the sequence-parallel output's gradient, all-gathered) and ``a d_v / tp``
    in, fc1 ``up x f / tp`` out and ``h`` in, fc2 ``h`` out and ``f / tp`` in; and the
    core attention's backward, its output gradient and the Q, K, V gradients at every
    query head (``repeat_kv``); MoE layers with ``topk x`` the expert size as ``f``."""
    return sum(gemm_gradient_tensors(m, layer, tokens, tp, e, fp8)) + weight_grads


def gemm_gradient_tensors(m: ModelConfig, layer: int, tokens: float, tp: int, e: float,
                          fp8: bool) -> list[float]:
    """The gradients in flight at the largest op of :func:`layer_backward_bytes` (bytes,
    in allocation order): its output gradient, with fp8 GEMMs that gradient's e5m2 cast,
    and its input gradient(s)."""
    h, a, g = m.hidden_size, m.num_attention_heads, m.kv_heads
    d_qk = d_v = m.kv_channels
    if m.mla:
        d_qk = (m.qk_nope_head_dim or m.kv_channels) + (m.qk_rope_head_dim or 0)
        d_v, g = m.v_head_dim or m.kv_channels, a
    f = m.topk * m.moe_ffn if m.is_moe_layer(layer) else m.intermediate_size
    up = 2 if m.gated else 1
    cast = 1.0 / e if fp8 else 0.0       # a GEMM's output gradient's e5m2 cast
    # (output gradient, its cast, input gradient) per op, elements a token
    ops = (((a * d_qk + g * d_qk + g * d_v) / tp, cast, h), (h, cast, a * d_v / tp),
           (up * f / tp, cast, h), (h, cast, f / tp),
           (a * d_v / tp, 0.0, (2 * a * d_qk + a * d_v) / tp))    # SDPA: dO in, dQ dK dV
    o, c, i = max(ops, key=lambda x: x[0] * (1.0 + x[1]) + x[2])
    return [x * tokens * e for x in (o, o * c, i) if x > 0]


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


@dataclass(frozen=True)
class StateRules:
    """How a rank keeps its weights' states (:func:`static_bytes`): the data-parallel
    size ``dp``, ``tp``, ``ep``, ``zero``, the ``params_dtype``, ``grad_dtype`` and
    ``master_dtype`` names, the ``optimizer`` (``adam`` | ``sgd``) and the ``framework``
    (``megatron`` | ``torchtitan``)."""

    dp: int
    tp: int
    ep: int
    zero: int
    params_dtype: str
    grad_dtype: str
    master_dtype: str
    optimizer: str = "adam"
    framework: str = "megatron"


def static_bytes(dense: float, expert: float, rules: StateRules, *,
                 fsdp_keep_gathered: bool, layer_params: float = 0.0) -> StaticBytes:
    """Static bytes of a rank holding ``dense`` + ``expert`` weights (module docstring)
    under ``rules``; ``layer_params``: the largest layer's weights on the rank (FSDP's
    gathering unit). ``framework = "torchtitan"`` with FSDP (``zero = 3``): the sharded
    parameter is the fp32 master (FSDP2 casts to ``params_dtype`` at the all-gather; no
    second shard), and under ``fsdp_keep_gathered`` the gathered copies and all gradients
    are stage lifetimes (:mod:`schedsim.workload.lifetimes`), not static."""
    r = rules
    dp, tp, ep, zero, framework = r.dp, r.tp, r.ep, r.zero, r.framework
    params_dtype, grad_dtype, master_dtype = r.params_dtype, r.grad_dtype, r.master_dtype
    optimizer = r.optimizer
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
            unsharded = n * pb - params + n * gb     # gathered params + unsharded grads
        else:
            unsharded = 2 * layer_params * pb
        if framework == "torchtitan":
            if master_dtype != params_dtype:
                params = 0.0
            if fsdp_keep_gathered:
                grads = unsharded = 0.0
    return StaticBytes(params, grads, opt, unsharded, shard(dense, expert, zero >= 1))

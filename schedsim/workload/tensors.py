"""The workload's memory as the framework allocates it, tensor by tensor: each op's
allocations and frees in the order torch issues them, run through the caching allocator
model (:mod:`schedsim.workload.allocator`) to get the reserved bytes per rank.

The byte sums are :mod:`schedsim.workload.memory`'s and :mod:`~schedsim.workload.lifetimes`'
(one home for each size); this module only cuts them into blocks and orders them. Per
microbatch, on the rank that runs it:

- **forward** of a stage (torch autograd; ``torch.utils.checkpoint`` under full
  recompute): the stage's input is allocated first (the embedding's output, or the kept
  copy of the received input); then per decoder layer, in op order, the tensors of
  :func:`~schedsim.workload.memory.layer_activations` (``.tensors``) after the layer's
  input (its first tensor), then the next layer's input (this layer's output: the next
  layer's first tensor, the head's first tensor or the stage's output that torch
  pipelining keeps), and then the layer's tensors that the recompute policy does not keep
  are freed (all but the input under full recompute, the core attention under
  selective, none without recompute), in allocation order. A last stage then allocates
  the head's tensors (:func:`~schedsim.workload.memory.head_tensors`), the loss's
  forward transients (:func:`~schedsim.workload.memory.loss_forward_tensors`) before
  its kept log-softmax, freed after it.
- **backward** (reverse order): on a last stage the loss's tensors
  (:func:`~schedsim.workload.memory.loss_backward_tensors`), freed, then the head's kept
  tensors (the logits stay when torch pipelining keeps them to the step end); per layer
  from the last: the recomputed tensors (the policy's ``working`` tensors), the largest
  GEMM's gradients in flight (:func:`~schedsim.workload.memory.gemm_gradient_tensors`),
  the layer's weight gradients in the parameter dtype under FSDP (one block a weight
  matrix, as autograd makes them), then the gradients and weight gradients are freed,
  the recomputed tensors, and the layer's kept tensors. A split backward (``B``) then
  allocates the layer's W-stash (freed by the stage's next ``W``, FIFO); the input
  gradient torch pipelining keeps is allocated at the end.
- **FSDP2 under PP** (:mod:`~schedsim.workload.lifetimes`): a unit's (embedding, each
  layer, head) gathered weights are allocated at its first forward, just before the
  unit runs, one block a weight, after the flat all-gather output on the all-gather
  stream (stream 1, freed after the copy-out: FSDP2's ``foreach_all_gather`` /
  ``foreach_all_gather_copy_out``); the fp32 unsharded gradients of all the stage's
  units at the start of its first backward, one block a weight, as the lifetimes hold
  them (FSDP2 makes a unit's in its ``post_backward``, the upcast after the unit's
  backward: layer by layer); at the stage's last backward end, unit by unit in forward
  order (the pipeline stage's ``post_backward`` calls), the unit's sharded gradients
  are allocated on the reduce-scatter stream (stream 2, one flat block: the
  reduce-scatter's output, ``foreach_reduce``; to the next step's ``zero_grad``), then
  its unsharded gradients and gathered weights are freed.
- **for the step**: the static bytes (parameters, gradients, master weights and
  optimizer states, one block a weight matrix of each) and the receive buffers (one per
  microbatch) are allocated before the first step and never freed, but the optimizer's
  moments, made at the end of the first step (:mod:`schedsim.workload.reserved`).

Block sizes within a unit's weights are in proportion to the weight matrices' element
counts (totals exact). Approximated: the order inside an op beyond the above (autograd
frees a tensor when its last use ends, not at the layer's end), the layer's input
gradient passed between layers, FSDP2's fp32 copy when it accumulates a later
microbatch's gradient, the reduce-scatter buffers at a stage's last backward and the
optimizer's temporaries (none in :mod:`~schedsim.workload.memory` either); an ``FB`` runs
its forward's events, then its backward's; a split backward's weight gradients are made
in its ``B``, and its W-stash is allocated after the layer's kept tensors are freed.

The allocated (requested) bytes of this stream peak at the aggregated model's peak
(:func:`schedsim.workload.run.byte_levels`; a test) but where the order differs: the
stream frees a backward's kept tensors unit by unit (the aggregate at its end: a last
stage whose layer's working set is above its loss's peaks lower by the head's kept
tensors), and it has the forward's working sets (the aggregate counts a forward's
kept bytes only, and not FSDP2's all-gather buffer: a stream can peak above it
inside a forward or an ``FB``).

Units: bytes. Plain Python + numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from schedsim.program.flat import COMPUTE_KINDS
from schedsim.workload.allocator import CachingAllocator, OutOfMemory
from schedsim.workload.hardware import DTYPE_BYTES
from schedsim.workload.memory import (
    gemm_gradient_tensors,
    head_tensors,
    layer_activations,
    loss_backward_tensors,
    loss_forward_tensors,
    stage_params,
)
from schedsim.workload.model import ModelConfig

_F, _B, _W, _BW, _FB = (COMPUTE_KINDS.index(k) for k in ("F", "B", "W", "BW", "FB"))

#: the forward's op order of the tensors :func:`layer_activations` names (others follow)
_ORDER = ("norm1 input", "qkv input", "qkv input (gathered)", "mla latents", "q", "k", "v",
          "softmax output", "softmax dropout mask", "attention dropout output",
          "softmax log-sum-exp", "proj input", "proj fp8 input", "attention dropout mask",
          "norm2 input", "fc1 input", "fc1 input (gathered)", "router logits",
          "experts input", "act input", "experts act input", "shared act input",
          "fc2 input", "experts fc2 input", "shared fc2 input", "mlp dropout mask")
_CORE = {"softmax output", "softmax dropout mask", "attention dropout output",
         "softmax log-sum-exp"}

#: the most allocator events one run may take (estimated before it runs); above it the
#: reserved bytes are not computed (None)
MAX_EVENTS = 4_000_000


@dataclass(frozen=True)
class LayerBlocks:
    """One decoder layer's blocks for one microbatch (bytes): ``first`` (its input),
    ``fwd`` ``(bytes, kept)`` after it in op order, ``recomputed`` (the backward's
    working tensors), ``grads`` (the largest GEMM's gradients in flight), ``wgrads``
    (weight gradients, one a matrix), ``stash`` (its share of the W-stash), ``weights``
    (element counts of its weight matrices: the proportions of its FSDP blocks)."""

    first: float
    fwd: tuple[tuple[float, bool], ...]
    recomputed: tuple[float, ...]
    grads: tuple[float, ...]
    wgrads: tuple[float, ...]
    stash: float
    weights: tuple[float, ...]


@dataclass(frozen=True)
class StageBlocks:
    """One stage's blocks (bytes): ``layers``, ``head`` (kept F to B; the first is the
    last layer's output), ``keep_logits`` (index in ``head`` torch pipelining keeps to the
    step end, -1 none), ``loss`` (the loss backward's tensors), ``loss_fwd`` (the loss
    forward's transients, allocated before the last head tensor), ``head_stash``,
    ``units`` (per FSDP unit in forward order, the elements of each of its weights on
    the rank), ``gathered``/``grads``/``sharded`` (the stage's FSDP
    totals), ``output`` and ``input_grad`` (kept per microbatch to the step end)."""

    layers: tuple[LayerBlocks, ...]
    head: tuple[float, ...]
    keep_logits: int
    loss: tuple[float, ...]
    loss_fwd: tuple[float, ...]
    head_stash: float
    units: tuple[tuple[float, ...], ...]
    gathered: float
    grads: float
    sharded: float
    output: float
    input_grad: float


def _weights(m: ModelConfig, i: int) -> tuple[float, ...]:
    """Element counts of layer ``i``'s weights, one per matrix (norms included)."""
    h = m.hidden_size
    if m.mla or m.is_moe_layer(i):
        return (h, m.attention_params(), h, m.layer_params(i) - m.attention_params() - 2 * h)
    a, g, d, f = m.num_attention_heads, m.kv_heads, m.kv_channels, m.intermediate_size
    mats = (h, h * a * d, h * g * d, h * g * d, a * d * h, h, h * f, f * h)
    return mats + ((h * f,) if m.gated else ())


def _layer_blocks(w: Any, i: int, titan: bool) -> LayerBlocks:
    m, e = w.model, float(DTYPE_BYTES[w.params_dtype])
    fp8 = w.gemm_dtype == "fp8"
    g = (float(DTYPE_BYTES[w.gemm_dtype]) if fp8 else e) if titan else 0.0
    a = layer_activations(m, i, w.seq, w.micro_batch_size, w.tp, w.sp, w.recompute,
                          w.flash_attention, w.dropout, e, g)
    names = sorted(a.tensors, key=lambda k: _ORDER.index(k) if k in _ORDER else len(_ORDER))
    names = [k for k in names if a.tensors[k] > 0]
    drop = (set(names) - {"norm1 input"} if w.recompute == "full" else
            _CORE if w.recompute == "selective" else set())
    fwd = tuple((a.tensors[k], k not in drop) for k in names if k != "norm1 input")
    # full recompute: the layer's forward again, its input's copy counted as the
    # working set of layer_activations counts it
    recomputed = tuple(a.tensors[k] for k in names
                       if k in drop or (w.recompute == "full" and k == "norm1 input"))
    grads: tuple[float, ...] = ()
    wgrads: tuple[float, ...] = ()
    weights = _weights(m, i)
    if titan:
        T = float(w.seq * w.micro_batch_size)
        grads = tuple(gemm_gradient_tensors(m, i, T, w.tp, e, fp8))
        if w.zero == 3:
            dense, expert = stage_params(m, i, 1, False, False, w.tp, w.ep)
            wgrads = tuple(_split((dense + expert) * e, weights))
    return LayerBlocks(a.tensors["norm1 input"], fwd, recomputed, grads, wgrads,
                       a.stash_w, weights)


def _split(total: float, weights: tuple[float, ...]) -> list[float]:
    """``total`` in parts proportional to ``weights`` (zeros dropped)."""
    s = float(sum(weights))
    return [total * x / s for x in weights if x > 0] if total > 0 and s > 0 else []


def stage_blocks(d: Any) -> list[StageBlocks]:
    """Per stage of the derived workload ``d``
    (:class:`~schedsim.workload.derive.DerivedWorkload`), its :class:`StageBlocks`."""
    w = d.workload
    m, titan = w.model, w.framework == "torchtitan"
    e = float(DTYPE_BYTES[w.params_dtype])
    cache: dict[bool, LayerBlocks] = {}
    out = []
    for p, sb in zip(d.pieces, d.stage_bytes):
        st = p.layout
        layers = []
        for i in range(st.first, st.first + st.layers):
            k = m.is_moe_layer(i)
            if k not in cache:
                cache[k] = _layer_blocks(w, i, titan)
            layers.append(cache[k])
        head: tuple[float, ...] = ()
        loss: tuple[float, ...] = ()
        loss_fwd: tuple[float, ...] = ()
        keep = -1
        held = d.stage_held[st.stage] if d.stage_held is not None else None
        if st.head:
            ht = head_tensors(m, w.seq, w.micro_batch_size, w.tp, w.sp, e, w.vocab_divisor,
                              keep_logits=not (titan and w.pp == 1))
            head = tuple(ht.values())
            if held is not None and held.output_after_backward > 0 and "logits" in ht:
                keep = list(ht).index("logits")
            if titan:
                loss = tuple(loss_backward_tensors(m, w.seq, w.micro_batch_size, w.tp,
                                                   w.vocab_divisor))
                loss_fwd = tuple(loss_forward_tensors(m, w.seq, w.micro_batch_size, w.tp,
                                                      w.vocab_divisor))
        # the W-stash, in the stage total's proportions (per layer, head)
        parts = [x.stash for x in layers] + ([sum(head) / 2] if st.head else [])
        stash = _split(sb.stash_w, tuple(parts)) if sum(parts) > 0 else []
        if stash:
            layers = [LayerBlocks(x.first, x.fwd, x.recomputed, x.grads, x.wgrads, s,
                                  x.weights) for x, s in zip(layers, stash)]
        units = []
        if st.embedding:
            units.append((float(sum(stage_params(m, 0, 0, True, False, w.tp, w.ep,
                                                 w.vocab_divisor))),))
        for i, lb in zip(range(st.first, st.first + st.layers), layers):
            # the layer's weights on this rank (over tp, experts over ep), per matrix
            on_rank = float(sum(stage_params(m, i, 1, False, False, w.tp, w.ep)))
            units.append(tuple(x * on_rank / sum(lb.weights) for x in lb.weights))
        if st.head:
            units.append((float(m.hidden_size),
                          float(sum(stage_params(m, 0, 0, False, True, w.tp, w.ep,
                                                 w.vocab_divisor))) - m.hidden_size))
        out.append(StageBlocks(
            tuple(layers), head, keep, loss, loss_fwd, stash[-1] if st.head and stash else 0.0,
            tuple(units), held.gathered if held else 0.0, held.grads if held else 0.0,
            held.sharded_grads if held else 0.0, held.output if held else 0.0,
            held.input_grad + (0.0 if keep >= 0 else held.output_after_backward)
            if held else 0.0))
    return out


__all__ = ["LayerBlocks", "StageBlocks", "stage_blocks", "MAX_EVENTS"]

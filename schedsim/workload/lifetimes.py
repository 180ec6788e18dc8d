"""Bytes a stage holds for spans of the step that its per-microbatch activations do not
cover: FSDP's gathered parameters and unsharded gradients under pipeline parallelism, and
what torch.distributed.pipelining keeps per microbatch until the step ends.

**FSDP under pipeline parallelism** (torchtitan with torch's ``PipelineStage``): torchtitan
turns ``reshard_after_forward`` off for every block when PP is on
(``torchtitan/parallelisms/parallelize_llama.py::apply_fsdp`` @9dec370: "to avoid
per-microbatch all-gathers"), and the pipeline stage runs every backward but the stage's
last with ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``,
then calls each FSDP group's ``post_backward`` (reduce-scatter, reshard)
(``torch/distributed/pipelining/stage.py::backward_maybe_with_nosync``). So, per stage:

- ``gathered`` (its parameters all-gathered) lives from the stage's **first forward**
  start to its **last backward** end;
- ``grads`` (its unsharded gradients, accumulated across microbatches in FSDP2's reduce
  dtype: ``FSDPParam.to_accumulated_grad_if_needed`` upcasts when it differs from the
  parameter dtype) lives from its **first weight-gradient op** (``BW``, or ``W`` of a split
  backward) start to its **last backward** end;
- ``sharded_grads`` (after the reduce-scatter, ``1/dp`` of them) from that end to the step
  end (the trainer's ``zero_grad`` at the next step's start frees them).

An interleaved rank thus holds one chunk's unsharded gradients at a time where the last
chunk's backwards all come first (torch ``ScheduleInterleaved1F1B``), a 1F1B rank its whole
stage's, from its first backward on.

**torch.distributed.pipelining retention** (torch @1963fc8, Dec 2024; ``stage.py``):
``forward_one_chunk`` appends every microbatch's output to ``output_chunks`` on every
stage, cleared only by the next step's ``clear_runtime_states`` (pytorch#153383 later kept
it on the last stage only), and ``stage_backward`` leaves each input gradient on the
receive buffer's ``.grad`` (pytorch#164329 later freed it early). So per microbatch:

- ``output`` from the forward's end to the step end (a non-last stage's output, the
  message it sends);
- ``output_after_backward`` from the backward's end to the step end (the last stage's
  logits, which the stage's stored activations already count from F to B);
- ``input_grad`` from the backward's end to the step end (non-first stages).

Units: bytes and the run's time unit. Plain Python + numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from schedsim.program.flat import COMPUTE_KINDS
from schedsim.workload.flops import padded_vocab
from schedsim.workload.hardware import DTYPE_BYTES
from schedsim.workload.layout import StageLayout, Workload
from schedsim.workload.memory import stage_params

_F, _B, _W, _BW = (COMPUTE_KINDS.index(k) for k in ("F", "B", "W", "BW"))


@dataclass(frozen=True)
class StageHeld:
    """Bytes stage-held on its rank (module docstring); every field >= 0, 0 = none."""

    gathered: float = 0.0
    grads: float = 0.0
    sharded_grads: float = 0.0
    output: float = 0.0
    output_after_backward: float = 0.0
    input_grad: float = 0.0


#: the order of a :class:`StageHeld` as a row of numbers (the Timeline JSON's
#: ``workload.stage_held``)
HELD_FIELDS = tuple(f.name for f in fields(StageHeld))


def held_row(h: StageHeld) -> list[float]:
    """``h`` as a row in :data:`HELD_FIELDS` order."""
    return [float(getattr(h, k)) for k in HELD_FIELDS]


def lifetime_events(rank: np.ndarray, stage: np.ndarray, kind: np.ndarray,
                    start: np.ndarray, end: np.ndarray, held: list[StageHeld],
                    step_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory events ``(times, ranks, deltas)`` of the bytes in ``held`` (one per stage)
    over one run's compute ops. ``rank``, ``stage``, ``kind`` (indices into
    ``COMPUTE_KINDS``; an ``FB`` must come as two rows, its ``F`` and its backward part,
    with the FB's times), ``start``, ``end``: one row per op, equal lengths. A stage's
    "backward" ops are its ``B``, ``W`` and ``BW``; its last backward end is the latest
    end among them. Everything still held is freed at ``step_end`` (just after
    whatever else happens then). Raises ValueError
    for arrays of unequal length or a stage without an entry in ``held``."""
    rank, stage, kind = (np.asarray(x, dtype=np.int64) for x in (rank, stage, kind))
    start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    if not len(rank) == len(stage) == len(kind) == len(start) == len(end):
        raise ValueError("rank, stage, kind, start and end must have one entry per op")
    if len(stage) and int(stage.max()) >= len(held):
        raise ValueError(f"stage {int(stage.max())} has no StageHeld entry "
                         f"({len(held)} given)")
    S = len(held)
    cols = {k: np.array([getattr(h, k) for h in held], dtype=float) for k in HELD_FIELDS}
    fwd = kind == _F
    bwd = (kind == _B) | (kind == _W) | (kind == _BW)
    wgrad = (kind == _W) | (kind == _BW)
    grad_in = (kind == _B) | (kind == _BW)       # ops that finish a microbatch's input grad

    def first(mask: np.ndarray, t: np.ndarray) -> np.ndarray:
        out = np.full(S, np.inf)
        np.minimum.at(out, stage[mask], t[mask])
        return out

    f0, g0 = first(fwd, start), first(wgrad, start)
    g0 = np.where(np.isfinite(g0), g0, first(bwd, start))
    b1 = np.full(S, -np.inf)
    np.maximum.at(b1, stage[bwd], end[bwd])
    srank = np.zeros(S, dtype=np.int64)
    srank[stage] = rank
    has_f, has_b = np.isfinite(f0), np.isfinite(b1)
    last = np.where(has_b, b1, step_end)          # when the stage lets go of its copies
    T, R, D = [], [], []

    def ev(t: np.ndarray, r: np.ndarray, d: np.ndarray) -> None:
        keep = d != 0
        T.append(t[keep]), R.append(r[keep]), D.append(d[keep])

    # a lifetime of zero length holds nothing (frees go first at one instant)
    gathered = np.where(has_f & (last > f0), cols["gathered"], 0.0)
    grads = np.where(has_b & (last > g0), cols["grads"], 0.0)
    sharded = np.where(has_b, cols["sharded_grads"], 0.0)
    # the step-end frees come after everything else at that instant
    end_t = np.full(S, np.nextafter(float(step_end), np.inf))
    ev(np.where(has_f, f0, 0.0), srank, gathered)
    ev(last, srank, -gathered)
    ev(np.where(has_b, g0, 0.0), srank, grads)
    ev(last, srank, sharded - grads)
    ev(end_t, srank, -sharded)
    # per-microbatch retention, freed together at the step end
    out_f = cols["output"][stage[fwd]]
    kept_b = (cols["output_after_backward"] + cols["input_grad"])[stage[grad_in]]
    ev(end[fwd], rank[fwd], out_f)
    ev(end[grad_in], rank[grad_in], kept_b)
    total = np.zeros(S)
    np.add.at(total, stage[fwd], out_f)
    np.add.at(total, stage[grad_in], kept_b)
    ev(end_t, srank, -total)
    return (np.concatenate(T), np.concatenate(R).astype(np.int64), np.concatenate(D))


def stage_held(w: Workload, layouts: list[StageLayout], message_bytes: float
               ) -> list[StageHeld] | None:
    """Per stage, what it holds over spans of the step under ``w.framework``
    (module docstring); None for ``megatron`` or without pipeline parallelism.
    ``message_bytes``: one P2P activation (a stage's output, an input gradient).

    With FSDP (``zero = 3``) each stage's weights on its rank (dense over ``dp``, routed
    experts over ``tp x dp / ep``, as :func:`~schedsim.workload.memory.static_bytes`) are
    gathered at ``params_dtype`` bytes, the decoder-layer GEMM weights at 1 byte under
    ``fp8_param_gather`` with fp8 GEMMs (the layers' norms stay at ``params_dtype``);
    unsharded gradients at ``grad_dtype`` bytes (FSDP2 accumulates in its reduce dtype),
    reduce-scattered to their shard. The last stage's kept output is its logits over the
    vocabulary shard, ``seq x micro_batch_size x vocab / tp x params bytes``."""
    if w.framework != "torchtitan" or w.pp == 1:
        return None
    m, tp, pb = w.model, w.tp, float(DTYPE_BYTES[w.params_dtype])
    gb = float(DTYPE_BYTES[w.grad_dtype])
    dp, edp = w.data_parallel, max(1, w.tp * w.data_parallel // w.ep)
    fp8 = w.fp8_param_gather and w.gemm_dtype == "fp8"
    logits = float(w.seq * w.micro_batch_size) * padded_vocab(m, tp, w.vocab_divisor) / tp * pb
    last = len(layouts) - 1
    out = []
    for st in layouts:
        dense, expert = stage_params(m, st.first, st.layers, st.embedding, st.head, tp, w.ep,
                                     w.vocab_divisor)
        gathered = grads = sharded = 0.0
        if w.zero == 3:
            dense_gemm = 0.0          # the layers' dense GEMM weights on this rank
            for i in range(st.first, st.first + st.layers):
                routed = m.experts * m.mlp_params(m.moe_ffn) if m.is_moe_layer(i) else 0
                dense_gemm += (m.layer_params(i) - 2 * m.hidden_size - routed) / tp
            dense_gemm = dense_gemm if fp8 else 0.0
            gathered = (dense - dense_gemm) * pb + dense_gemm + expert * (1.0 if fp8 else pb)
            grads = (dense + expert) * gb
            sharded = (dense / dp + expert / edp) * gb
        out.append(StageHeld(
            gathered=gathered, grads=grads, sharded_grads=sharded,
            output=message_bytes if st.stage < last else 0.0,
            output_after_backward=logits if st.stage == last else 0.0,
            input_grad=message_bytes if st.stage > 0 else 0.0))
    return out

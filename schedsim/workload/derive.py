"""A workload on a placement → the simulator's models (costs in ms, P2P links, bytes per
rank, the step boundary), and :func:`simulate_workload`: one call from a workload and a
schedule name to step time, tokens/s/GPU, MFU and peak GiB per rank.

**The step.** A simulated step is the pipeline's makespan (its compute and P2P, exact to
the schedule) plus the **step boundary** (:func:`step_boundary_ms`), taken as the
slowest pipeline rank's: the data-parallel gradient reduction (``zero = 0``: an
all-reduce of the gradients; ``1``: Megatron's distributed optimizer, a reduce-scatter
of the gradients and an all-gather of the updated parameters; ``2``: the all-gather
alone, the gradients having gone per microbatch; ``3`` under PP: the reduce-scatter and
the all-gather once, the stage's parameters staying gathered for the step; ``3``
without PP: nothing, all of it per microbatch) on the DP group (``dp`` ranks ``tp``
GPUs apart, Megatron's ``tp-cp-ep-dp-pp`` order; over the network when ``tp x dp``
exceeds a node), unless ``overlap_grad_reduce``; then the optimizer step, memory bound
(every state read and written once at HBM bandwidth); then, with ZeRO-2/3, the exposed
part of the collectives they run in every microbatch.

**ZeRO-2 and ZeRO-3** (:func:`per_microbatch_dp_ms`). Sharded gradients cannot
accumulate over the step's microbatches unsharded, so ZeRO-2 reduce-scatters each
microbatch's gradients in its backward, as DeepSpeed's stage 2 does (microsoft/DeepSpeed
``deepspeed/runtime/zero/stage_1_and_2.py``: with ``partition_gradients`` it installs
``create_reduce_and_remove_grad_hooks``, reducing in every backward). ZeRO-3 follows torchtitan's FSDP2 default
(pytorch/torchtitan ``torchtitan/models/llama3/infra/parallelize.py::apply_fsdp``
@018740b: ``reshard_after_forward = not pp_enabled``, "For PP, by default do not
reshard after forward to avoid per-microbatch all-gathers, which can be expensive and
non-overlapped"; the final norm and LM head are never resharded): without PP every
microbatch all-gathers the parameters in F and again in B (all but the head) and
reduce-scatters the gradients in B, because ``torchtitan/train.py::train_step``
@018740b runs each accumulation microbatch's ``loss.backward()`` with gradient sync on
(FSDP2's default); under PP the parameters stay gathered from the first forward to the
last backward and torch's ``PipelineStage`` reduce-scatters once
(:mod:`~schedsim.workload.lifetimes`), so the gather and the reduce-scatter are charged
once a step and the memory holds the whole stage's parameters. The frameworks run these
collectives on their own streams beside the compute, one unit (decoder layer) ahead
(FSDP2's prefetch) or behind: per stage and microbatch a phase exposes ``max(u, C -
compute)``, ``C`` its collectives' ms, ``compute`` the ms of the phase's ops (F; B + W)
and ``u`` one layer's collective (the first all-gather, the last reduce-scatter; 0
with ``overlap_grad_reduce``, which also hides the end-of-step collectives).
Charged with the step boundary (exact without PP, where one rank's ops run back to
back; under PP the slowest rank's sum). ``framework = "megatron"`` uses the same rules
(Megatron-LM's ZeRO-2/3 are Megatron-FSDP's ``optim_grads`` / ``optim_grads_params``,
``megatron/core/distributed/fsdp/``; its distributed optimizer is ZeRO-1).

**Pipeline links.** Pipeline rank ``r`` is GPU ``r x tp x dp`` of its replica: two
pipeline ranks on one node talk over NVLink, others over the network (both at
``comm_efficiency`` of the GPU's figure, ms per byte), each message paying a latency.

**MFU** = model FLOPs per step (:func:`~schedsim.workload.flops.model_flops_per_step`)
/ (step time x GPUs x the dense peak of ``params_dtype``): the bf16 peak that Megatron-LM
and torchtitan report MFU against, also when the GEMMs run in fp8.

Plain Python + numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedsim.errors import ScenarioError
from schedsim.program.ir import Placement
from schedsim.sim.costs import CostModel, LinkModel, LinkOverride
from schedsim.sim.stage_costs import StageCosts
from schedsim.sim.stage_model import StageModel
from schedsim.workload.cost import (
    NETWORK_LATENCY_MS,
    NVLINK_LATENCY_MS,
    StagePieces,
    model_links,
    stage_model,
    stage_pieces,
)
from schedsim.workload.flops import model_flops_per_step
from schedsim.workload.hardware import DTYPE_BYTES, GiB
from schedsim.workload.layout import Workload, WorkloadError
from schedsim.workload.lifetimes import StageHeld, stage_held
from schedsim.workload.memory import (
    StaticBytes,
    StateRules,
    head_activations,
    layer_activations,
    layer_backward_bytes,
    loss_backward_bytes,
    stage_params,
    static_bytes,
)


@dataclass
class StageBytes:
    """Activation bytes of one stage per microbatch on one rank: ``stored`` (F to B),
    ``stash_w`` (B to W), ``working`` (live during B only), and its ``rows`` (the
    Korthikanti Table 2 rows used)."""

    stored: float
    stash_w: float
    working: float
    rows: tuple[str, ...] = ()


@dataclass
class DerivedWorkload:
    """What :func:`derive` gives: ``costs`` (a :class:`CostModel` in ms whose kinds come
    from ``stage_model``), ``link`` (P2P between pipeline ranks), ``stage_bytes`` (per
    stage), ``static`` (per pipeline rank), ``recv_bytes`` (P2P receive buffers held per
    rank for the step), ``step_boundary`` (ms per rank), ``model_flops_per_step``,
    ``tokens_per_step``, ``pieces`` (the per-stage breakdown), ``stage_held`` (per stage,
    the bytes held over spans of the step: :func:`schedsim.workload.lifetimes.stage_held`;
    None under Megatron's rules)."""

    workload: Workload
    placement: Placement
    pieces: list[StagePieces]
    stage_model: StageModel
    costs: CostModel
    link: LinkModel
    stage_bytes: list[StageBytes]
    static: list[StaticBytes]
    recv_bytes: list[float]
    step_boundary: list[float]
    model_flops_per_step: float
    tokens_per_step: int
    stage_held: list[StageHeld] | None = None

    @property
    def step_boundary_ms(self) -> float:
        return max(self.step_boundary, default=0.0)

    @property
    def peak_flops(self) -> float:
        """The per-GPU peak MFU is measured against (FLOP/s)."""
        return self.workload.gpu.peak_flops(self.workload.params_dtype)


def _stage_bytes(w: Workload, p: StagePieces) -> StageBytes:
    """One stage's :class:`StageBytes`. Under ``framework = "torchtitan"`` the layers keep
    their GEMM inputs as torch's TP and Float8Linear do, a backward also holds the largest
    GEMM's gradients and (FSDP2) the layer's weight gradients in the parameter dtype, and
    the last stage's backward peaks in the loss's fp32 tensors
    (:func:`~schedsim.workload.memory.layer_activations`,
    :func:`~schedsim.workload.memory.layer_backward_bytes`,
    :func:`~schedsim.workload.memory.loss_backward_bytes`); Megatron's rules are the
    paper's tensors alone."""
    st, m = p.layout, w.model
    e = float(DTYPE_BYTES[w.params_dtype])
    titan = w.framework == "torchtitan"
    fp8 = w.gemm_dtype == "fp8"
    g = (float(DTYPE_BYTES[w.gemm_dtype]) if fp8 else e) if titan else 0.0
    T = float(w.seq * w.micro_batch_size)
    stored = stash = working = 0.0
    rows: list[str] = []
    cache: dict[bool, Any] = {}
    for i in range(st.first, st.first + st.layers):
        k = m.is_moe_layer(i)
        if k not in cache:
            a = layer_activations(m, i, w.seq, w.micro_batch_size, w.tp, w.sp,
                                  w.recompute, w.flash_attention, w.dropout, e, g)
            extra = 0.0
            if titan:
                dense, expert = stage_params(m, i, 1, False, False, w.tp, w.ep)
                wgrads = (dense + expert) * e if w.zero == 3 else 0.0
                extra = layer_backward_bytes(m, i, T, w.tp, e, fp8, wgrads)
            cache[k] = (a, a.working + extra)
        a, work = cache[k]
        stored, stash, working = stored + a.stored, stash + a.stash_w, max(working, work)
        if a.row not in rows:
            rows.append(a.row)
    if st.head:
        hb = head_activations(m, w.seq, w.micro_batch_size, w.tp, w.sp, e, w.vocab_divisor,
                              keep_logits=not (titan and w.pp == 1))
        stored += hb
        stash += hb / 2
        if titan:
            working = max(working, loss_backward_bytes(m, w.seq, w.micro_batch_size, w.tp,
                                                       w.vocab_divisor))
    return StageBytes(stored, min(stash, stored), working, tuple(rows))


def _pipeline_link(w: Workload, ranks: int) -> LinkModel:
    """P2P links between pipeline ranks (module docstring): the default is the link most
    neighbour pairs use, the others are overrides."""
    hw, ce = w.gpu, w.comm_efficiency
    stride = w.tp * w.cp * w.data_parallel
    node = [(r * stride) // hw.gpus_per_node for r in range(ranks)]
    fast = (NVLINK_LATENCY_MS, hw.nvlink_bandwidth * ce / 1e3)
    slow = (NETWORK_LATENCY_MS, hw.network_bandwidth * ce / 1e3)
    pairs = {(r, (r + 1) % ranks) for r in range(ranks)} | {((r + 1) % ranks, r)
                                                            for r in range(ranks)}
    pairs = {(a, b) for a, b in pairs if a != b}
    same = {(a, b): node[a] == node[b] for a, b in pairs}
    default = fast if sum(same.values()) * 2 >= len(same) else slow
    over = [LinkOverride(src=a, dst=b, latency=(fast if s else slow)[0],
                         bandwidth=(fast if s else slow)[1])
            for (a, b), s in sorted(same.items()) if (fast if s else slow) != default]
    return LinkModel(latency=default[0], bandwidth=default[1], links=over)


def _rank_static(w: Workload, placement: Placement, pieces: list[StagePieces]
                 ) -> list[StaticBytes]:
    m = w.model
    out = []
    keep = w.pp > 1
    rules = StateRules(dp=w.data_parallel, tp=w.tp, ep=w.ep, zero=w.zero,
                       params_dtype=w.params_dtype, grad_dtype=w.grad_dtype,
                       master_dtype=w.master_dtype, optimizer=w.optimizer,
                       framework=w.framework)
    for r in range(placement.ranks):
        dense = expert = biggest = 0.0
        for s in placement.stages_of(r):
            st = pieces[s].layout
            d, x = stage_params(m, st.first, st.layers, st.embedding, st.head, w.tp, w.ep,
                                w.vocab_divisor)
            dense, expert = dense + d, expert + x
            if st.layers:
                ld, lx = stage_params(m, st.first, 1, False, False, w.tp, w.ep)
                biggest = max(biggest, ld + lx)
        out.append(static_bytes(dense, expert, rules, fsdp_keep_gathered=keep,
                                layer_params=biggest))
    return out


def _unit_params(w: Workload, pieces: list[StagePieces], s: int
                 ) -> tuple[float, float, float]:
    """Stage ``s``'s weights on its rank, elements: all of them, its largest decoder
    layer's, and its final norm + LM head's (0 off the last stage)."""
    m, st = w.model, pieces[s].layout
    d, x = stage_params(m, st.first, st.layers, st.embedding, st.head, w.tp, w.ep,
                        w.vocab_divisor)
    layer = sum(stage_params(m, st.first, 1, False, False, w.tp, w.ep)) if st.layers else 0.0
    head = (sum(stage_params(m, 0, 0, False, True, w.tp, w.ep, w.vocab_divisor))
            if st.head else 0.0)
    return d + x, layer, head


def per_microbatch_dp_ms(w: Workload, placement: Placement, pieces: list[StagePieces],
                         costs: StageCosts) -> list[float]:
    """Per pipeline rank, the exposed ms per step of the data-parallel collectives that
    ZeRO-2 and ZeRO-3 run in every microbatch (module docstring, **ZeRO-2 and ZeRO-3**):
    per stage and microbatch, a phase (F, or B + W) whose collectives take ``C`` ms beside
    the ``compute`` ms of the phase's ops (:class:`StageCosts`, TP collectives included)
    exposes ``max(u, C - compute)``, ``u`` one unit's collective (the stage's largest
    decoder layer) that nothing hides: the first all-gather of F, the last reduce-scatter
    of B; with ``overlap_grad_reduce`` those too hide (behind the neighbouring
    microbatch's compute), ``u = 0``. Zero for ``zero`` 0 / 1, ``dp = 1`` and ZeRO-3
    under PP (gathered once a step)."""
    dp = w.data_parallel
    out = [0.0] * placement.ranks
    regather = w.zero == 3 and w.pp == 1          # FSDP resharding after each forward
    if dp == 1 or w.zero < 2 or (w.zero == 3 and not regather):
        return out
    links = model_links(w)
    pb, gb = DTYPE_BYTES[w.params_dtype], DTYPE_BYTES[w.grad_dtype]
    span = w.tp * w.cp * dp
    unit = 0.0 if w.overlap_grad_reduce else 1.0     # the un-hidden unit's share
    for r in range(placement.ranks):
        for s in placement.stages_of(r):
            n, layer, head = _unit_params(w, pieces, s)
            back = costs.kind_cost("B", s) + costs.kind_cost("W", s)
            rs = links.time("reduce-scatter", dp, n * gb, span)
            rs_u = unit * links.time("reduce-scatter", dp, layer * gb, span)
            exposed = max(rs_u, rs - back)
            if regather:
                ag_f = links.time("all-gather", dp, n * pb, span)
                ag_b = links.time("all-gather", dp, (n - head) * pb, span)
                ag_u = unit * links.time("all-gather", dp, layer * pb, span)
                exposed = (max(ag_u, ag_f - costs.kind_cost("F", s))
                           + max(rs_u, ag_b + rs - back))
            out[r] += w.microbatches * exposed
    return out


def step_boundary_ms(w: Workload, static: list[StaticBytes], placement: Placement,
                     pieces: list[StagePieces], costs: StageCosts | None = None
                     ) -> list[float]:
    """Per pipeline rank, the step boundary in ms (module docstring); with ZeRO-2/3 it
    adds the exposed per-microbatch collectives (:func:`per_microbatch_dp_ms` on
    ``costs``, default the workload's own stage model's)."""
    m, dp = w.model, w.data_parallel
    links = model_links(w)
    pb, gb = DTYPE_BYTES[w.params_dtype], DTYPE_BYTES[w.grad_dtype]
    span = w.tp * w.cp * dp
    per_mb = [0.0] * placement.ranks
    if w.zero >= 2 and dp > 1:
        if costs is None:
            costs = StageCosts(stage_model(w, pieces, w.overlap))
        per_mb = per_microbatch_dp_ms(w, placement, pieces, costs)
    out = []
    for r in range(placement.ranks):
        n = 0.0
        for s in placement.stages_of(r):
            st = pieces[s].layout
            d, x = stage_params(m, st.first, st.layers, st.embedding, st.head, w.tp, w.ep,
                                w.vocab_divisor)
            n += d + x
        comm = 0.0
        if dp > 1 and not w.overlap_grad_reduce:
            if w.zero == 0:
                comm = links.time("all-reduce", dp, n * gb, span)
            elif w.zero == 2:       # gradients reduce-scattered per microbatch already
                comm = links.time("all-gather", dp, n * pb, span)
            elif w.zero == 3 and w.pp == 1:     # all of it per microbatch
                comm = 0.0
            else:
                comm = (links.time("reduce-scatter", dp, n * gb, span)
                        + links.time("all-gather", dp, n * pb, span))
        # the optimizer reads and writes its shard's parameters, states and gradients
        sb = static[r]
        opt_bytes = sb.opt_params * (2 * pb + gb) + 2 * sb.optimizer
        opt = opt_bytes / (w.gpu.hbm_bandwidth * w.efficiency) * 1e3
        out.append(comm + opt + per_mb[r])
    return out


def placement_free_models(workload: Workload, overlap: str | None = None,
                          connections: int | None = None) -> tuple[CostModel, LinkModel]:
    """The costs (ms) and pipeline links of a (checked) workload, which depend on its
    stages and ranks but not on which rank holds which stage: what a cost-aware planner
    reads before the placement exists. ``connections``: the hardware queues the stage
    model's collectives share (``[comm] connections``; default the CommModel's)."""
    w = workload.check()
    sm = stage_model(w, stage_pieces(w), overlap or w.overlap)
    sc = StageCosts(sm) if connections is None else StageCosts(sm, connections)
    return (CostModel(unit="ms").with_derived(sc, sm.message_bytes()),
            _pipeline_link(w, w.pp))


def derive(workload: Workload, placement: Placement, overlap: str | None = None
           ) -> DerivedWorkload:
    """The simulator's models of ``workload`` (checked here) on ``placement`` (its
    ``stages`` must be the workload's ``pp x chunks`` and its ranks ``pp``); ``overlap``
    (default: the workload's) as the stage model's. Raises :class:`WorkloadError`."""
    w = workload.check()
    if placement.ranks != w.pp or placement.stages != w.stages:
        raise WorkloadError("layers fill pp x chunks stages",
                            f"the schedule has {placement.stages} stages on {placement.ranks} "
                            f"ranks but the workload has pp = {w.pp} and pp x chunks = "
                            f"{w.stages}: set pp = {placement.ranks} and chunks = "
                            f"{placement.stages // placement.ranks}")
    pieces = stage_pieces(w)
    sm = stage_model(w, pieces, overlap or w.overlap)
    stage_costs = StageCosts(sm)
    costs = CostModel(unit="ms").with_derived(stage_costs, sm.message_bytes())
    stage_b = [_stage_bytes(w, p) for p in pieces]
    static = _rank_static(w, placement, pieces)
    msg = sm.message_bytes() or 0.0
    recv = [0.0] * placement.ranks
    if w.recv_buffers == "per-microbatch":     # one buffer per microbatch and neighbour
        per = w.microbatches // (2 if placement.kind == "dual" else 1)
        for r in range(placement.ranks):
            for s in placement.stages_of(r):
                recv[r] += per * msg * ((s > 0) + (s < placement.stages - 1))
    return DerivedWorkload(
        workload=w, placement=placement, pieces=pieces, stage_model=sm, costs=costs,
        link=_pipeline_link(w, placement.ranks), stage_bytes=stage_b, static=static,
        recv_bytes=recv, step_boundary=step_boundary_ms(w, static, placement, pieces,
                                                               stage_costs),
        model_flops_per_step=model_flops_per_step(w.model, w.seq, w.global_batch_size, w.tp,
                                                  w.vocab_divisor),
        tokens_per_step=w.tokens_per_step,
        stage_held=stage_held(w, [p.layout for p in pieces], msg))

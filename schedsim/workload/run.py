"""One call from a workload and a schedule to its numbers: :func:`simulate_workload`
builds the schedule on ``pp`` ranks with the workload's microbatches, derives the models
(:func:`schedsim.workload.derive.derive`), simulates, and reads step time, tokens/s per
GPU, MFU and bytes per rank over time (:func:`memory_run`) from the run's arrays.

Plain Python + numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedsim.program.flat import COMPUTE_KINDS
from schedsim.sim.compiled import Compiled
from schedsim.sim.engine import RunState
from schedsim.timeline import Timeline
from schedsim.workload.derive import DerivedWorkload, derive, placement_free_models
from schedsim.workload.hardware import GiB
from schedsim.workload.layout import Workload, WorkloadError
from schedsim.workload.lifetimes import HELD_FIELDS, StageHeld, held_row, lifetime_events


@dataclass
class RankMemory:
    """Bytes of one pipeline rank: ``static`` (parameters, gradients, optimizer, FSDP
    copies), ``recv`` (P2P receive buffers held for the step), ``peak_activations`` and
    ``peak`` (the sum at the worst moment), ``peak_at`` (ms), ``curve``: ``(times,
    activation bytes after each event)`` arrays (held bytes included), ``held``: the
    stage-held bytes at the peak (:mod:`schedsim.workload.lifetimes`; ``peak_activations``
    excludes them)."""

    static: float
    recv: float
    peak_activations: float
    peak: float
    peak_at: float
    curve: tuple[Any, Any] = field(repr=False, default=((), ()))
    held: float = 0.0


def _levels(d: DerivedWorkload, ranks: int, rank: Any, kind: Any, stage: Any, bkind: Any,
            bstage: Any, start: Any, end: Any) -> list[RankMemory]:
    """Per rank, the activation level over the ops given as columns (``kind``/``stage``:
    the op, or an FB's forward part; ``bkind``/``bstage``: an FB's backward part, else
    equal to ``kind``/``stage``; ``start``/``end``: its times or any numbers in the
    rank's op order): F allocates its stage's stored activations at its start; B
    allocates its working set at its start and frees it, and all but the W-stash, at its
    end; W frees the stash at its end; BW frees everything at its end; an FB does both
    parts. Frees before allocations at one instant. With ``d.stage_held`` the level also
    carries the stage-held bytes (:func:`~schedsim.workload.lifetimes.lifetime_events`:
    FSDP copies, torch pipelining's kept outputs and input gradients)."""
    sb = [[b.stored, b.stash_w, b.working] for b in d.stage_bytes]
    base = [x.total + r for x, r in zip(d.static, d.recv_bytes)]
    held = None if d.stage_held is None else [held_row(h) for h in d.stage_held]
    return [RankMemory(x.total, rv, m.peak_activations, m.peak, m.peak_at, m.curve, m.held)
            for x, rv, m in zip(d.static, d.recv_bytes,
                                byte_levels(sb, base, ranks, rank, kind, stage, bkind,
                                            bstage, start, end, held))]


def pass_deltas(stored: Any, stash_w: Any) -> tuple[Any, Any, Any]:
    """The net activation bytes a stage's ``F``, ``B`` and ``W`` leave behind per
    microbatch (numbers or arrays per stage): ``F`` allocates ``stored``, ``B`` frees all
    but the W-stash (``-(stored - stash_w)``), ``W`` frees the stash (``-stash_w``); they
    sum to 0. The B's working set is live during the B only, on top. The one home of
    these rules: :func:`byte_levels` simulates with them and
    :func:`schedsim.workload.table.planner_memory` gives them to the memory-limited
    planners."""
    return stored, -(stored - stash_w), -stash_w


def byte_levels(stage_bytes: Any, base: Any, ranks: int, rank: Any, kind: Any, stage: Any,
                bkind: Any, bstage: Any, start: Any, end: Any, held: Any = None
                ) -> list[RankMemory]:
    """:func:`_levels` from plain numbers: ``stage_bytes`` rows ``[stored, stash_w,
    working]`` per stage, ``base`` the bytes each rank holds all step (static +
    receive buffers), ``held`` None or rows of :data:`HELD_FIELDS` per stage (the
    stage-held bytes, :func:`~schedsim.workload.lifetimes.lifetime_events`, freed at the
    latest ``end``); the columns as :func:`_levels` takes them. The one home of the
    event rules (also :func:`schedsim.analysis.memory.workload_memory`)."""
    sbt = np.asarray(stage_bytes, dtype=np.float64).reshape(-1, 3)
    stored, stash, work = sbt[:, 0], sbt[:, 1], sbt[:, 2]
    rank, kind, stage = (np.asarray(x, dtype=np.int64) for x in (rank, kind, stage))
    bkind, bstage = np.asarray(bkind, dtype=np.int64), np.asarray(bstage, dtype=np.int64)
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    F, B, W, BW, FB = (COMPUTE_KINDS.index(k) for k in ("F", "B", "W", "BW", "FB"))
    fb = kind == FB
    kind = np.where(fb, F, kind)
    ev_t, ev_r, ev_d = [], [], []

    def add(mask: Any, t: Any, dv: Any) -> None:
        ev_t.append(t[mask])
        ev_r.append(rank[mask])
        ev_d.append(np.broadcast_to(dv, t.shape)[mask])

    d_f, d_b, d_w = pass_deltas(stored, stash)
    add(kind == F, start, d_f[stage])
    for k_arr, s_arr, sel in ((kind, stage, ~fb), (bkind, bstage, fb)):
        isb = sel & (k_arr == B)
        add(isb, start, work[s_arr])
        add(isb, end, d_b[s_arr] - work[s_arr])
        isbw = sel & (k_arr == BW)
        add(isbw, start, work[s_arr])
        add(isbw, end, -(d_f[s_arr] + work[s_arr]))
        add(sel & (k_arr == W), end, d_w[s_arr])
    n_act = sum(len(x) for x in ev_t)
    if held is not None:        # FSDP copies and retention over spans of the step
        rk, sg, kd, a0, a1 = (np.concatenate([a, a[fb]]) for a in (rank, stage, kind, start, end))
        kd[len(kind):], sg[len(kind):] = bkind[fb], bstage[fb]
        hs = [StageHeld(*map(float, row)) for row in held]
        lt = lifetime_events(rk, sg, kd, a0, a1, hs, float(np.max(end)) if len(end) else 0.0)
        ev_t.append(lt[0]), ev_r.append(lt[1]), ev_d.append(lt[2])
    t, r, dv = (np.concatenate(x) for x in (ev_t, ev_r, ev_d))
    hv = np.where(np.arange(len(dv)) >= n_act, dv, 0.0)
    o = np.lexsort((dv >= 0, t, r))
    t, r, dv, hv = t[o], r[o], dv[o], hv[o]
    bounds = np.searchsorted(r, np.arange(ranks + 1))
    out = []
    for q in range(ranks):
        tq, lv = t[bounds[q]:bounds[q + 1]], np.cumsum(dv[bounds[q]:bounds[q + 1]])
        i = int(np.argmax(lv)) if len(lv) else -1
        act = max(0.0, float(lv[i])) if i >= 0 else 0.0
        hq = float(np.sum(hv[bounds[q]:bounds[q] + i + 1])) if i >= 0 else 0.0
        b = float(base[q])
        out.append(RankMemory(b, 0.0, act - hq, b + act, float(tq[i]) if i >= 0 else 0.0,
                              (tq, lv), hq))
    return out


def _fb_parts(fl: Any, gi: Any, kind: Any, stage: Any) -> tuple[Any, Any]:
    """(backward kind, backward stage) of the instructions ``gi``: an FB's backward
    part, else the op's own."""
    bkind, bstage = kind.copy(), stage.copy()
    fb = kind == COMPUTE_KINDS.index("FB")
    if fb.any():
        at = np.searchsorted(fl.fb_at, gi[fb])
        bkind[fb], bstage[fb] = fl.fb_kind[at], fl.fb_stage[at]
    return bkind, bstage


def _run_columns(cp: Compiled, st: RunState) -> tuple[Any, ...]:
    """The op columns of the run ``(cp, st)`` (:func:`_levels`'s arguments after
    ``ranks``)."""
    fl = cp.flat
    ran = np.flatnonzero(np.asarray(st.send) >= 0.0)
    gi = np.asarray(cp.span_gi)[ran]
    kind = fl.kind[gi].astype(np.int64)
    stage = fl.stage[gi].astype(np.int64)
    bkind, bstage = _fb_parts(fl, gi, kind, stage)
    return (fl.rank_of_instr()[gi].astype(np.int64), kind, stage, bkind, bstage,
            np.asarray(st.sstart)[ran], np.asarray(st.send)[ran])


def memory_run(cp: Compiled, st: RunState, d: DerivedWorkload) -> list[RankMemory]:
    """Bytes per rank over the run ``(cp, st)`` of ``d``'s costs (:func:`_levels`; times
    in ms)."""
    return _levels(d, cp.ranks, *_run_columns(cp, st))


def reserved_bytes(cp: Compiled, st: RunState, d: DerivedWorkload) -> list[float] | None:
    """Per rank, the caching allocator's peak reserved bytes over the run ``(cp, st)``
    (:func:`allocator_run`); None without a replay. A rank out of memory reports its
    uncapped replay's peak, at least the HBM plus one byte."""
    rr = allocator_run(cp, st, d)
    return None if rr is None else _reserved_of(rr, d)


def _reserved_of(rr: Any, d: DerivedWorkload) -> list[float]:
    hbm = float(d.workload.gpu.hbm_bytes)
    return [max(r.peak_reserved, hbm + 1) if r.oom else r.peak_reserved for r in rr]


def allocator_run(cp: Compiled, st: RunState, d: DerivedWorkload) -> list[Any] | None:
    """Per rank, the :class:`~schedsim.workload.reserved.ReservedMemory` of the run
    ``(cp, st)`` (:func:`schedsim.workload.reserved.reserved_run`, with expandable
    segments under ``allocator = "expandable"``): reserved and allocated peaks of one
    stream, and where a rank ran out of memory; None when the workload's ``allocator`` is
    ``none`` or the run has too many allocations to replay
    (:data:`schedsim.workload.tensors.MAX_EVENTS`)."""
    model = d.workload.allocator_model
    if model == "none":
        return None
    from schedsim.workload.reserved import reserved_run

    return reserved_run(d, cp.ranks, *_run_columns(cp, st), expandable=model == "expandable")


def peak_bytes(d: DerivedWorkload, program: Any) -> list[float]:
    """Per pipeline rank, the peak bytes :func:`memory_run` reports for any finished run
    of ``program``, from its compute order alone (a rank's ops do not overlap, so the
    events in time order are the events in program order): for pruning before a
    simulation."""
    from schedsim.program.flat import Opcode

    fl = program.flat()
    gi = np.flatnonzero(fl.code == Opcode.COMPUTE)
    kind = fl.kind[gi].astype(np.int64)
    stage = fl.stage[gi].astype(np.int64)
    bkind, bstage = _fb_parts(fl, gi, kind, stage)
    pos = gi.astype(np.float64) * 2
    return [m.peak for m in _levels(d, fl.ranks, fl.rank_of_instr()[gi].astype(np.int64),
                                    kind, stage, bkind, bstage, pos, pos + 1)]


@dataclass
class WorkloadResult:
    """The numbers of one simulated step (:func:`simulate_workload`): ``step_ms``
    (makespan + step boundary), ``makespan_ms``, ``step_boundary_ms``,
    ``tokens_per_step``, ``tokens_per_s_per_gpu``, ``model_flops_per_step``, ``mfu``,
    ``peak_flops`` (per-GPU FLOP/s MFU is measured against), ``peak_memory_bytes`` (per
    pipeline rank, the tensors' bytes: torch's allocated; where the allocator is replayed,
    the replay's peak of the bytes asked, from the stream its reserved peak comes from,
    else the byte model's, ``memory``'s ``peak``; the two agree but where the stream's
    order differs: :mod:`schedsim.workload.tensors`), ``memory`` (:class:`RankMemory`
    per rank), ``hbm_bytes``, ``fits`` (the reserved peaks within HBM where they are
    computed, else the allocated ones), ``bubble_ratio``, ``timeline``, ``derived``,
    ``peak_reserved_bytes`` (per pipeline rank, the caching allocator's segments:
    :func:`reserved_bytes`; None without), ``allocator`` (per pipeline rank, the replay's
    :class:`~schedsim.workload.reserved.ReservedMemory`, out-of-memory ranks included:
    :func:`allocator_run`; None without)."""

    step_ms: float
    makespan_ms: float
    step_boundary_ms: float
    tokens_per_step: int
    tokens_per_s_per_gpu: float
    model_flops_per_step: float
    mfu: float
    peak_flops: float
    peak_memory_bytes: list[float]
    memory: list[RankMemory]
    hbm_bytes: float
    fits: bool
    bubble_ratio: float
    timeline: Timeline = field(repr=False)
    derived: DerivedWorkload = field(repr=False)
    peak_reserved_bytes: list[float] | None = None
    allocator: list[Any] | None = field(repr=False, default=None)

    def summary(self) -> dict[str, Any]:
        """The Timeline JSON's ``workload`` object (docs/formats.md)."""
        return {"step_ms": self.step_ms, "makespan_ms": self.makespan_ms,
                "step_boundary_ms": self.step_boundary_ms,
                "tokens_per_step": self.tokens_per_step,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "model_flops_per_step": self.model_flops_per_step, "mfu": self.mfu,
                "peak_flops": self.peak_flops,
                "peak_memory_bytes": list(self.peak_memory_bytes),
                "hbm_bytes": self.hbm_bytes, "fits": self.fits,
                "gpu": self.derived.workload.gpu.name,
                "model": self.derived.workload.model.name,
                "gpus": self.derived.workload.gpus,
                "stage_bytes": [[b.stored, b.stash_w, b.working]
                                for b in self.derived.stage_bytes],
                "static_bytes": [m.static for m in self.memory],
                "recv_bytes": [m.recv for m in self.memory],
                **({"stage_held": [held_row(h) for h in self.derived.stage_held]}
                   if self.derived.stage_held is not None else {}),
                **({"peak_reserved_bytes": list(self.peak_reserved_bytes)}
                   if self.peak_reserved_bytes is not None else {})}

    def line(self) -> str:
        """One line: step ms, tokens/s/GPU, MFU, peak GiB (the worst rank; allocated,
        and reserved where computed) of the HBM, at one precision
        (:func:`~schedsim.util.units.fmt_gib_pair`), and the fit in one clause: where
        the allocator ran out of memory, the first such rank, the bytes it asked and
        what it had reserved then."""
        from schedsim.util.units import fmt_gib, fmt_gib_pair, fmt_mfu, fmt_rate, with_unit

        peak = max(self.peak_memory_bytes)
        rp = self.peak_reserved_bytes
        worst = peak if rp is None else max(rp)
        worst_text, hbm = fmt_gib_pair(worst, self.hbm_bytes)
        oom = [(q, r) for q, r in enumerate(self.allocator or ()) if r.oom]
        if self.fits:
            fit = "fits"
        elif oom:
            q, r = oom[0]
            n = len(self.allocator or ())
            more = f"; {len(oom)} of {n} ranks out of memory" if len(oom) > 1 else ""
            where = f"step {r.oom_step}" if r.oom_step else "its static state"
            fit = (f"does NOT fit: rank {q} out of memory in {where}, "
                   f"{fmt_gib(r.oom_request)} asked with {fmt_gib(r.oom_reserved)} "
                   f"reserved{more}")
        else:
            fit = f"does NOT fit: {worst_text} > {hbm}"
        res = "" if rp is None else f" allocated, {worst_text} reserved,"
        peak_text = worst_text if rp is None else fmt_gib(peak)
        return (f"step {with_unit(self.step_ms, 'ms')}, "
                f"{fmt_rate(self.tokens_per_s_per_gpu)} tokens/s/GPU, "
                f"MFU {fmt_mfu(self.mfu)}, peak {peak_text}{res} of {hbm} ({fit})")


def result_of(d: DerivedWorkload, tl: Timeline, cp: Compiled, st: RunState) -> WorkloadResult:
    """The :class:`WorkloadResult` of a finished run of ``d``'s models; sets the
    timeline's ``workload`` object (:meth:`WorkloadResult.summary`)."""
    w = d.workload
    mem = memory_run(cp, st, d)
    step = tl.makespan + d.step_boundary_ms
    gpus = w.gpus
    tps = d.tokens_per_step / (step / 1e3) / gpus if step > 0 else 0.0
    mfu = d.model_flops_per_step / (step / 1e3 * gpus * d.peak_flops) if step > 0 else 0.0
    rr = allocator_run(cp, st, d)
    # allocated and reserved from one stream where it is replayed (reserved >= allocated
    # per rank); the byte model's peaks otherwise
    peaks = [m.peak for m in mem] if rr is None else [r.peak_requested for r in rr]
    reserved = None if rr is None else _reserved_of(rr, d)
    worst = max(peaks if reserved is None else reserved)
    res = WorkloadResult(step, tl.makespan, d.step_boundary_ms, d.tokens_per_step, tps,
                         d.model_flops_per_step, mfu, d.peak_flops, peaks, mem,
                         w.gpu.hbm_bytes, worst <= w.gpu.hbm_bytes,
                         tl.bubble_ratio(), tl, d, reserved, rr)
    tl.workload = res.summary()        # the Timeline JSON's optional workload object
    return res


def workload_program(workload: Workload, schedule_name: str, comm_policy: str | None = None,
                     overlap: str | None = None, **generator_params: Any) -> Any:
    """The program :func:`simulate_workload` runs: ``schedule_name`` on ``pp`` ranks and
    the workload's microbatches, with the workload's ``chunks`` for a generator that
    takes them and, for a cost-aware planner (zb-1p, zb-2p, zbv), the derived costs and
    pipeline links (they depend on the stages, not on which rank holds them). Raises
    :class:`~schedsim.errors.LimitError` for a program above the ``--max`` limits
    (:func:`schedsim.util.limits.check_program_size`, before building it) and what
    :func:`~schedsim.generators.build_program` raises."""
    from schedsim.generators import build_program, get

    w = workload
    spec = get(schedule_name)
    params = dict(generator_params)
    takes = spec.accepted()
    if "chunks" in takes:
        params.setdefault("chunks", w.chunks)
    from schedsim.generators import generated_stages
    from schedsim.util.limits import check_program_size

    # bounded before it is built, as simulate bounds a scenario's program (--max)
    check_program_size(schedule_name, ranks=w.pp, microbatches=w.microbatches,
                       stages=generated_stages(spec, w.pp, params))
    if "costs" in takes or "link" in takes:
        costs, link = placement_free_models(w, overlap)
        if "costs" in takes:
            params.setdefault("costs", costs)
        if "link" in takes:
            params.setdefault("link", link)
    return build_program(schedule_name, w.pp, w.microbatches, comm_policy, **params)


def simulate_workload(workload: Workload, schedule_name: str, comm_policy: str | None = None,
                      semantics: str = "rendezvous", overlap: str | None = None,
                      **generator_params: Any) -> WorkloadResult:
    """Simulate one step of ``workload`` under schedule ``schedule_name`` (any name of
    ``schedsim list``) on ``pp`` ranks and the workload's microbatches; a generator that
    takes ``chunks`` gets the workload's. Raises :class:`WorkloadError` for a broken
    rule (also when the schedule's stages are not ``pp x chunks``),
    :class:`~schedsim.errors.ScheduleError` for a schedule that cannot run these sizes."""
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate_run

    w = workload.check()
    prog = workload_program(w, schedule_name, comm_policy, overlap=overlap,
                            **generator_params)
    d = derive(w, prog.placement, overlap)
    tl, cp, st = simulate_run(prog, d.costs, d.link, CommModel(semantics=semantics))  # type: ignore[arg-type]
    return result_of(d, tl, cp, st)


def calibrate_efficiency(workload: Workload, schedule_name: str, step_ms: float,
                         **kw: Any) -> float:
    """The ``efficiency`` at which :func:`simulate_workload` (``schedule_name``, ``kw``)
    predicts ``step_ms`` (a measured step time, ms): bisection, the step time falling as
    the efficiency grows (every roofline term scales with 1 / efficiency; overheads and
    links do not), to a relative 1e-6. Raises :class:`~schedsim.errors.ScenarioError`
    when even efficiency 1 is slower than ``step_ms`` (the fixed costs alone exceed it)."""
    from schedsim.errors import ScenarioError
    from schedsim.util.units import with_unit

    def step(eff: float) -> float:      # time alone: no allocator replay
        return simulate_workload(workload.model_copy(update={"efficiency": eff,
                                                             "allocator": "none"}),
                                 schedule_name, **kw).step_ms

    fastest = step(1.0)
    if fastest > step_ms:
        raise ScenarioError(f"a step of {with_unit(step_ms, 'ms')} is faster than this "
                            f"workload runs at efficiency 1 ({with_unit(fastest, 'ms')}): check "
                            f"the measurement, the "
                            f"GPU's peaks, the overhead and the links")
    lo, hi = 1e-4, 1.0
    if step(lo) < step_ms:
        return lo
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if step(mid) <= step_ms else (mid, hi)
    return hi


__all__ = ["allocator_run", "calibrate_efficiency", "RankMemory", "WorkloadResult", "memory_run", "peak_bytes",
           "reserved_bytes", "result_of",
           "simulate_workload", "workload_program", "WorkloadError"]

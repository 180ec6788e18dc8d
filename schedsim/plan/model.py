"""What the planner asks of the workload model (:mod:`schedsim.workload`): the space's
defaults, a candidate's bounds before simulation, and its simulation.

Memory limit: the GPU's HBM minus :data:`RESERVE_GIB` (the CUDA context, NCCL's
buffers and the caching allocator's fragmentation, which no activation count sees)
unless ``--mem-limit`` is given.
"""
from __future__ import annotations

import math
from typing import Any, get_args

from schedsim.errors import ScenarioError, SchedsimError, Stopped
from schedsim.program.vocab import check_semantics
from schedsim.plan.candidates import Legal, Resolved, divisors
from schedsim.plan.rows import GIB, PlanRow
from schedsim.plan.space import DEFAULT_RECOMPUTE, DEFAULT_SCHEDULES, PlanSpace

#: GiB of HBM kept out of the default memory limit (module docstring)
RESERVE_GIB = 4.0
#: sequence length and global batch size when the space gives none
DEFAULT_SEQ = 4096
DEFAULT_GLOBAL_BATCH = 256


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(int(math.log2(max(1, limit))) + 1)]


def resolve_space(space: PlanSpace) -> Resolved:
    """The space with defaults (TP: powers of two up to a node; PP: the divisors of the
    GPUs up to the layers; EP: 1 for a dense model, powers of two dividing the experts
    for an MoE one; CP 1; micro-batch size 1; chunks 2 for the interleaved schedules;
    ZeRO 1; the schedules of :data:`~schedsim.plan.space.DEFAULT_SCHEDULES`; every
    recompute mode). Raises :class:`ScenarioError` for an unknown model, GPU, schedule,
    recompute mode, ZeRO stage or a bad number."""
    from schedsim.workload import gpu_preset, load_model

    if space.gpus < 1:
        raise ScenarioError(f"--gpus must be >= 1 (got {space.gpus})")
    model = load_model(space.model)
    gpu = gpu_preset(space.gpu)
    # None is unset; 0 is a value (refused below), never the default
    seq = DEFAULT_SEQ if space.seq is None else space.seq
    gbs = DEFAULT_GLOBAL_BATCH if space.global_batch_size is None else space.global_batch_size
    if seq < 1 or gbs < 1:
        raise ScenarioError("--seq and --global-batch-size must be >= 1")
    from schedsim.workload.layout import check_sizes

    check_sizes(seq=seq, global_batch_size=gbs, num_gpus=space.gpus)
    experts = model.experts
    lists: dict[str, list] = {
        "tp": space.tp or [t for t in _powers_of_two(gpu.gpus_per_node) if t <= space.gpus],
        "pp": space.pp or divisors(space.gpus, model.num_hidden_layers),
        "cp": space.cp or [1],
        "ep": space.ep or ([e for e in _powers_of_two(min(experts, space.gpus))
                            if experts % e == 0] if experts else [1]),
        "micro_batch_size": space.micro_batch_size or [1],
        "chunks": space.chunks or [2],
        "schedules": space.schedules or list(DEFAULT_SCHEDULES),
        "recompute": space.recompute or list(DEFAULT_RECOMPUTE),
        "zero": space.zero if space.zero is not None else [1],
    }
    check_names(space, lists["schedules"], lists["recompute"])
    for z in lists["zero"]:
        if z not in (0, 1, 2, 3):
            raise ScenarioError(f"bad --zero {z}: ZeRO stages are 0, 1, 2 and 3")
    if space.mem_limit_gib is not None:
        if not space.mem_limit_gib > 0 or not math.isfinite(space.mem_limit_gib):
            raise ScenarioError(f"--mem-limit must be a finite number of GiB > 0 (got "
                                f"{space.mem_limit_gib})")
        limit = space.mem_limit_gib * GIB
        from schedsim.workload.hardware import mem_limit_above_hbm

        above = mem_limit_above_hbm(limit, gpu)     # the one rule (simulate's too)
        if above is not None:
            raise ScenarioError(f"--mem-limit {above}")
    else:
        limit = gpu.hbm_bytes - RESERVE_GIB * GIB
    return Resolved(space, model, gpu, seq, gbs, lists, limit, RESERVE_GIB)


#: generator parameters the plan gives every candidate itself, and from what
PLAN_SETS = {"chunks": "from --chunks", "costs": "from the workload model",
             "link": "from the workload model"}


def check_names(space: PlanSpace, schedules: list[str], recompute: list[str]) -> None:
    """Refuse an unknown name before any work, with the closest known one
    (:func:`schedsim.util.suggest.did_you_mean`) and each rule's home as ``simulate``
    uses it: the ``schedules`` (:func:`schedsim.generators.get`), the ``recompute``
    modes, the semantics (:func:`schedsim.scenario_flags.check_choices`, then
    :func:`~schedsim.program.vocab.check_semantics`), the comm policy
    (:func:`~schedsim.program.lower.get_policy`) and each ``--param`` key, which the comm
    policy or one of the schedules must take, and each ``--param`` value, of the type the
    policy (or each schedule) taking it declares (``batch_p2p_comm=maybe`` is no bool).
    Raises :class:`ScenarioError` / :class:`~schedsim.errors.ScheduleError`."""
    from schedsim.generators import coerce_params as schedule_params
    from schedsim.generators import foreign_key_hint, get
    from schedsim.program.lower import coerce_params as policy_params
    from schedsim.program.lower import get_policy
    from schedsim.scenario_flags import check_choices
    from schedsim.util.suggest import did_you_mean
    from schedsim.workload.layout import Recompute

    for name in schedules:
        get(name)                       # unknown: ScheduleError naming the choices
    modes = get_args(Recompute)
    for rc in recompute:
        if rc not in modes:
            raise ScenarioError(f"unknown --recompute {rc!r}{did_you_mean(rc, modes)}: "
                                f"expected one of {', '.join(modes)}")
    check_choices(semantics=space.semantics)
    check_semantics(space.semantics)
    policy = space.comm_policy or "async"
    pol = get_policy(policy)            # unknown: ScheduleError naming the choices
    takes = {k: None for name in schedules for k in get(name).accepted()
             if k not in PLAN_SETS}
    takes.update(dict.fromkeys(pol.params))
    for k in space.params:
        if k in PLAN_SETS:
            raise ScenarioError(f"--param {k}: the plan sets it ({PLAN_SETS[k]})")
        if k not in takes:
            hint = foreign_key_hint(k)
            raise ScenarioError(f"--param {hint}" if hint else
                                f"unknown --param {k!r}{did_you_mean(k, takes)}: neither "
                                f"the {policy} comm policy nor the schedules "
                                f"({', '.join(schedules)}) take it; they take: "
                                f"{', '.join(takes) or 'none'}")
    # each value as the policy or the schedules taking it convert it (one home each:
    # their coerce_params), so that a bad one is refused now, not once per candidate
    for k, v in space.params.items():
        if k in pol.params:
            policy_params(pol, {k: v})
        for name in schedules if k not in pol.params else ():
            if k in get(name).accepted():
                schedule_params(get(name), {k: v})


#: cost models kept per process, by their stage model (candidates that differ only in
#: ZeRO, DP or the schedule have equal stage models: the same op costs)
COSTS_CACHE = 256
_costs: dict[str, Any] = {}


def derived(w: Any, placement: Any) -> Any:
    """:func:`schedsim.workload.derive` of ``w`` on ``placement``, its cost model shared
    with earlier candidates of this process whose stage model is the same (so that each
    op kind of each stage is priced once: the stage model's list scheduling is most of a
    candidate's time)."""
    from schedsim.workload import derive

    d = derive(w, placement)
    key = d.stage_model.model_dump_json()
    got = _costs.get(key)
    if got is None:
        if len(_costs) >= COSTS_CACHE:
            _costs.pop(next(iter(_costs)))
        _costs[key] = d.costs
    else:
        d.costs = got
    return d


def _derived(lg: Legal) -> Any:
    """The workload's models of candidate ``lg`` on its program's placement."""
    return derived(lg.workload, lg.shape.placement)


def bounds_of(lg: Legal, res: Resolved) -> tuple[list[float], float]:
    """``(peak lower bound per rank in bytes, tokens/s/GPU upper bound)`` of a legal
    candidate, without simulating it.

    Peak: :func:`schedsim.workload.run.peak_bytes` of its program — exactly the peak of
    every run of it when each op takes some time (a rank's bytes depend on the order of
    its ops only). For a cost-aware generator (its order depends on the costs, and the
    bound reads the unit-cost order) or a zero-cost op: the safe floor of each rank's
    static bytes, receive buffers and one microbatch of its largest stage. Throughput:
    the tokens of a step over (the makespan's lower bound,
    :meth:`~schedsim.plan.bounds.ProgramShape.lower_bound`, plus the step boundary), per
    GPU."""
    from schedsim.plan.candidates import program_of
    from schedsim.workload.run import peak_bytes

    d = _derived(lg)
    shape = lg.shape
    lb_ms = shape.lower_bound(d.costs) + d.step_boundary_ms
    ub = d.tokens_per_step / (lb_ms / 1e3) / lg.workload.gpus if lb_ms > 0 else math.inf
    if shape.shortest > 0 and not lg.cost_aware:
        sp = res.space
        peak = peak_bytes(d, program_of(lg.workload, lg.candidate.schedule, sp.comm_policy,
                                        sp.params))
    else:
        pl = shape.placement
        peak = [d.static[r].total + d.recv_bytes[r]
                + max((d.stage_bytes[s].stored for s in pl.stages_of(r)), default=0.0)
                for r in range(pl.ranks)]
    return list(peak), ub


_warm = False


def simulate_candidate(w: Any, schedule: str, comm_policy: str | None, semantics: str,
                       params: dict[str, Any]) -> Any:
    """:func:`schedsim.workload.simulate_workload` of ``w`` (the same steps, the same
    figures) with its program from :func:`~schedsim.plan.candidates.program_of` (reused
    across candidates that share it)."""
    from schedsim.plan.candidates import program_of
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate_run
    from schedsim.workload.run import result_of

    global _warm
    if not _warm:            # many programs in one process: the compiled kernels once
        from schedsim.sim.simulate import warm_up

        warm_up()
        _warm = True
    # the plan ranks by allocated peaks: no caching-allocator replay per candidate
    w = w.check().model_copy(update={"allocator": "none"})
    prog = program_of(w, schedule, comm_policy, params)
    d = derived(w, prog.placement)
    tl, cp, st = simulate_run(prog, d.costs, d.link, CommModel(semantics=semantics))
    return result_of(d, tl, cp, st)


def evaluate(task: tuple) -> PlanRow:
    """Simulate one candidate: ``task`` is ``(candidate, workload, comm_policy,
    semantics, params, mem_limit_bytes)`` (picklable; what an executor ships). A
    simulation that fails (a deadlock, a schedule refusing the size) is a row with
    status ``error`` and the reason."""
    cand, w, policy, semantics, params, limit = task
    kw = {k: v for k, v in params.items()}
    try:
        r = simulate_candidate(w, cand.schedule, policy, semantics, kw)
    except Stopped:
        raise           # a stop is the user's, never a candidate's error row
    except SchedsimError as e:
        return PlanRow(cand, stages=w.stages, microbatches=w.microbatches, status="error",
                       message=str(e).splitlines()[0][:300])
    peaks = [float(p) / GIB for p in r.peak_memory_bytes]
    return PlanRow(cand, stages=r.derived.placement.stages, microbatches=w.microbatches,
                   fits=max(r.peak_memory_bytes) <= limit, step_ms=float(r.step_ms),
                   tokens_per_s_per_gpu=float(r.tokens_per_s_per_gpu), mfu=float(r.mfu),
                   bubble_ratio=float(r.bubble_ratio), peak_gib=peaks)


def evaluate_batch(tasks: list[tuple]) -> list[PlanRow]:
    """:func:`evaluate` of each task, in order (one executor task)."""
    return [evaluate(t) for t in tasks]


def best_timeline(res: Any) -> Any:
    """The Timeline of the best candidate of a :class:`~schedsim.plan.driver.PlanResult`
    (simulated again: rows keep only figures)."""
    best = res.ranking[0]
    sp = res.space
    w = _workload_of(res.resolved, best.candidate)
    r = simulate_candidate(w, best.candidate.schedule, sp.comm_policy, sp.semantics,
                           dict(sp.params))
    r.timeline.params["workload"] = r.summary()
    return r.timeline


def _workload_of(res: Resolved, cand: Any) -> Any:
    """The checked workload of candidate ``cand``."""
    from schedsim.plan.candidates import _placement_chunks, make_workload

    return make_workload(res, cand.tp, cand.pp, cand.cp, cand.ep, cand.micro_batch_size,
                         _placement_chunks(cand.schedule, cand.chunks), cand.recompute,
                         cand.zero).check()

"""Every legal candidate of a :class:`~schedsim.plan.space.PlanSpace`, with each rule's
rejections counted.

Rules, in the order they apply (a candidate is counted once, under the first rule it
breaks):

1. the workload's own rules (:meth:`schedsim.workload.Workload.check`: heads and
   key/value heads divide TP, TP within a node, experts divide EP, the global batch
   divides into ``dp x micro_batch_size``, GPUs are ``tp x cp x dp x pp``, ...), counted
   under the rule's name, on every point of the grid (:func:`grid_points`, before
   anything is generated: :mod:`schedsim.plan.work` bounds the total work from them).
   The layers split over the ``pp x chunks`` stages evenly where the stages divide
   them, else as torchtitan splits them (:func:`make_workload`);
2. the schedule's own constraints, exactly as its generator applies them (a generator
   is asked once per ``(schedule, pp, microbatches, chunks)``; its
   :class:`~schedsim.errors.ScheduleError` names the rule), counted as ``schedule NAME``;
3. the work limits (:mod:`schedsim.util.limits`), counted as ``work limit``.

The generated program of each legal ``(schedule, pp, microbatches, chunks)`` is kept as
a :class:`~schedsim.plan.bounds.ProgramShape` for the bounds (a cost-aware generator's
at unit costs: its ops per rank do not depend on the costs, only their order does).
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from schedsim.errors import LimitError, SchedsimError, ScheduleError, Stopped
from schedsim.plan.bounds import ProgramShape
from schedsim.plan.space import Candidate, Rejections

#: the most candidates (the product of the swept lists) one plan enumerates
MAX_CANDIDATES = 2_000_000


@dataclass
class Resolved:
    """A :class:`PlanSpace` with its defaults filled in: the loaded model and GPU, every
    swept list, the memory limit in bytes."""

    space: Any
    model: Any
    gpu: Any
    seq: int
    global_batch_size: int
    lists: dict[str, list]
    mem_limit_bytes: float
    reserve_gib: float


@dataclass
class Legal:
    """A legal candidate: its workload, and the shape of its program."""

    candidate: Candidate
    workload: Any
    shape: ProgramShape
    cost_aware: bool


@dataclass
class Enumeration:
    legal: list[Legal] = field(default_factory=list)
    rejections: Rejections = field(default_factory=Rejections)
    grid: int = 0


def schedule_chunks(name: str, requested: list[int]) -> list[int | None]:
    """Chunk values to ask schedule ``name`` for: the swept ``requested`` when its
    generator takes ``chunks``, else ``[None]`` (its placement decides)."""
    from schedsim.generators import get

    return list(requested) if "chunks" in get(name).accepted() else [None]


@functools.lru_cache(maxsize=None)
def _placement_chunks(name: str, chunks: int | None) -> int:
    """Stages per rank of schedule ``name`` asked for ``chunks`` (a V placement: 2; a
    loop or dual one: 1, or ``chunks``), read from a small instance of it (2 ranks, 8
    microbatches; 4 x 16 if it refuses that; 1 if it refuses both: its own rules then
    reject every size the plan asks for)."""
    if chunks is not None:
        return chunks
    from schedsim.generators import build_program

    for p, m in ((2, 8), (4, 16)):
        try:
            pl = build_program(name, p, m).placement
        except Stopped:
            raise           # a stop is the user's, never a candidate's rejection
        except SchedsimError:
            continue
        return 1 if pl.kind == "dual" else pl.stages // pl.ranks
    return 1


#: programs kept per process (candidates that differ only in TP, recompute, ZeRO, ...
#: share one: the same schedule, PP, microbatches and chunks)
PROGRAM_CACHE = 64
_programs: dict[tuple, Any] = {}


def cost_aware(schedule: str) -> bool:
    """Whether generator ``schedule`` plans with the costs or links (its order depends on
    them)."""
    from schedsim.generators import get

    takes = get(schedule).accepted()
    return "costs" in takes or "link" in takes


def program_of(w: Any, schedule: str, comm_policy: str | None, params: dict[str, Any],
               *, unit_costs: bool = False) -> Any:
    """:func:`schedsim.workload.run.workload_program` of workload ``w``, built once per
    process and key (the last :data:`PROGRAM_CACHE` kept): a generator that does not
    read the costs gives one program per ``(schedule, pp, microbatches, chunks)``, a
    cost-aware one (zb-1p, zb-2p, zbv) one per workload. ``unit_costs``: a cost-aware
    generator plans at unit costs instead (same ops per rank, another order: what the
    makespan bound reads). Raises what the generator raises."""
    from schedsim.sim.costs import CostModel, LinkModel
    from schedsim.workload.run import workload_program

    aware = cost_aware(schedule)
    kw = dict(params)
    key = (schedule, w.pp, w.microbatches, w.chunks, comm_policy,
           tuple(sorted((k, repr(v)) for k, v in kw.items())),
           "unit" if unit_costs or not aware else w.model_dump_json())
    prog = _programs.get(key)
    if prog is None:
        if aware and unit_costs:
            from schedsim.generators import get

            takes = get(schedule).accepted()
            kw.update({k: v for k, v in (("costs", CostModel()), ("link", LinkModel()))
                       if k in takes})
        if len(_programs) >= PROGRAM_CACHE:
            _programs.pop(next(iter(_programs)))
        # checked once here (a validated value is not checked again by each simulation)
        from schedsim.program.validate import validate_program

        prog = _programs[key] = validate_program(workload_program(w, schedule, comm_policy,
                                                                  **kw))
    return prog


def make_workload(res: Resolved, tp: int, pp: int, cp: int, ep: int, mbs: int,
                  chunks: int, recompute: str = "none", zero: int = 1) -> Any:
    """The :class:`~schedsim.workload.Workload` of one layout of ``res`` (not checked).
    Its layers split evenly over the ``pp x chunks`` stages where the stages divide
    them (Megatron-LM's split), else as torchtitan splits them
    (:func:`~schedsim.workload.layout.torchtitan_llm_split`: the remainder on the first
    stages), so a 126-layer model plans at any PP. Raises
    :class:`~schedsim.workload.WorkloadError` for more stages than that split allows."""
    from schedsim.workload import Workload
    from schedsim.workload.layout import torchtitan_llm_split

    layers, stages = res.model.num_hidden_layers, pp * chunks
    layout = None if layers % stages == 0 else torchtitan_llm_split(layers, stages)
    return Workload(model=res.model, gpu=res.gpu, seq=res.seq,
                    global_batch_size=res.global_batch_size, num_gpus=res.space.gpus,
                    tp=tp, pp=pp, cp=cp, ep=ep, micro_batch_size=mbs, chunks=chunks,
                    recompute=recompute, zero=zero, layout=layout)


def grid_size(res: Resolved) -> int:
    """How many candidates the swept lists make (before any rule)."""
    L = res.lists
    n = 1
    for k in ("tp", "pp", "cp", "ep", "micro_batch_size", "recompute", "zero"):
        n *= len(L[k])
    return n * sum(len(schedule_chunks(s, L["chunks"])) for s in L["schedules"])


@dataclass
class Point:
    """One layout and schedule of the grid before recompute and ZeRO are swept (each
    point stands for ``len(recompute) x len(zero)`` candidates): its degrees, the
    schedule's ``chunks`` as asked (None: its placement decides) and the stages per rank
    that gives, and its checked workload or the
    :class:`~schedsim.workload.WorkloadError` of the rule it breaks."""

    tp: int
    pp: int
    cp: int
    ep: int
    micro_batch_size: int
    dp: int
    schedule: str
    chunks: int | None
    per_rank: int
    workload: Any


def grid_points(res: Resolved) -> list[Point]:
    """Every point of ``res``'s grid (:class:`Point`), in a fixed order, with the
    workload's rules applied (rule 1 of the module docstring) and nothing generated.
    Raises :class:`ScenarioError` when the grid is larger than :data:`MAX_CANDIDATES`."""
    from schedsim.errors import ScenarioError
    from schedsim.workload import WorkloadError

    grid = grid_size(res)
    if grid > MAX_CANDIDATES:
        raise ScenarioError(f"the plan's grid has {grid:,} candidates (more than "
                            f"{MAX_CANDIDATES:,}): narrow --tp, --pp, --schedules, ...")
    L, sp = res.lists, res.space
    checked: dict[tuple, Any] = {}
    out: list[Point] = []
    for tp, pp, cp, ep, mbs in itertools.product(L["tp"], L["pp"], L["cp"], L["ep"],
                                                 L["micro_batch_size"]):
        mp = tp * pp * cp
        dp = sp.gpus // mp if sp.gpus % mp == 0 else 0
        for name in L["schedules"]:
            for chunks in schedule_chunks(name, L["chunks"]):
                per_rank = _placement_chunks(name, chunks)
                key = (tp, pp, cp, ep, mbs, per_rank)
                w = checked.get(key)
                if w is None:
                    try:
                        w = make_workload(res, tp, pp, cp, ep, mbs, per_rank).check()
                    except WorkloadError as e:
                        w = e
                    checked[key] = w
                out.append(Point(tp, pp, cp, ep, mbs, dp, name, chunks, per_rank, w))
    return out


def enumerate_candidates(res: Resolved, points: list[Point] | None = None) -> Enumeration:
    """Every candidate of ``res`` that all the rules allow (module docstring), in a fixed
    order, and the rejections per rule. ``points``: :func:`grid_points` of ``res`` when
    already computed. Raises :class:`ScenarioError` when the grid is larger than
    :data:`MAX_CANDIDATES`."""
    from schedsim.workload import WorkloadError

    if points is None:
        points = grid_points(res)
    out = Enumeration(grid=grid_size(res))
    L, sp = res.lists, res.space
    shapes: dict[tuple, ProgramShape | SchedsimError] = {}
    rej = out.rejections
    n = len(L["recompute"]) * len(L["zero"])
    for pt in points:
        w, name, chunks = pt.workload, pt.schedule, pt.chunks
        if isinstance(w, WorkloadError):
            rej.add(w.rule, str(w), n)
            continue
        m = w.microbatches
        try:
            shape = _shape(shapes, w, name, chunks, sp)
        except Stopped:
            raise
        except LimitError as e:
            rej.add("work limit", str(e), n)
            continue
        except ScheduleError as e:
            rej.add(f"schedule {name}", f"{name} at pp = {pt.pp}, {m} microbatches: "
                    f"{e}", n)
            continue
        except SchedsimError as e:
            rej.add(f"schedule {name}", str(e), n)
            continue
        aware = cost_aware(name)
        for rc, zero in itertools.product(L["recompute"], L["zero"]):
            cand = Candidate(tp=pt.tp, pp=pt.pp, dp=pt.dp, ep=pt.ep, cp=pt.cp,
                             micro_batch_size=pt.micro_batch_size, schedule=name,
                             chunks=chunks, recompute=rc, zero=zero)
            wl = w.model_copy(update={"recompute": rc, "zero": zero})
            out.legal.append(Legal(cand, wl, shape, aware))
    return out


def _shape(shapes: dict, w: Any, name: str, chunks: int | None, sp: Any) -> ProgramShape:
    """The :class:`ProgramShape` of schedule ``name`` for workload ``w`` (or the error its
    generator raised), built once per ``(name, pp, microbatches, chunks)``."""
    key = (name, w.pp, w.microbatches, chunks)
    got = shapes.get(key)
    if got is None:
        try:
            got = ProgramShape(program_of(w, name, sp.comm_policy, sp.params,
                                          unit_costs=True))
        except Stopped:
            raise           # a stop is the user's, never a candidate's rejection
        except SchedsimError as e:
            got = e
        shapes[key] = got
    if isinstance(got, SchedsimError):
        raise got
    return got


def divisors(n: int, limit: int | None = None) -> list[int]:
    """The divisors of ``n`` (at most ``limit``), ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    out = sorted(set(small + [n // d for d in small]))
    return [d for d in out if limit is None or d <= limit]

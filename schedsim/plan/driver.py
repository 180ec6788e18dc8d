"""The planner: enumerate, prune, simulate the survivors in waves, rank.

0. :func:`check_plan`, before anything is generated: :func:`resolve` fills the space's
   defaults and refuses an unknown name (with a suggestion); the workload's rules run
   on every point of the grid (:func:`~schedsim.plan.candidates.grid_points`) and the
   instructions every allowed candidate's simulation would run are summed from closed
   forms and bounded (:mod:`schedsim.plan.work`, ``--max instructions``).
1. :func:`~schedsim.plan.candidates.enumerate_candidates` keeps the legal candidates
   and counts each rule's rejections.
2. Per legal candidate, with the workload's costs and bytes and no simulation:
   - **memory**: a lower bound of its peak per rank (:func:`schedsim.plan.model.
     bounds_of`: static bytes, receive buffers and one microbatch of its largest
     stage). A candidate whose bound exceeds the limit cannot fit: removed
     (``memory``);
   - **throughput upper bound**: tokens per step over the step time at the makespan's
     lower bound (:mod:`schedsim.plan.bounds`).
3. Survivors are sorted by that upper bound (highest first, then by name) and simulated
   in waves of doubling size (:data:`WAVE`, :data:`WAVE_MAX`). Before each wave,
   candidates whose upper bound is below the ``top``-th best simulated throughput are
   removed (``bound``): their true
   throughput is at most their bound, so none of them can enter the top. Since the bound
   is strict (``<``) and only waves already finished set the threshold, the set
   simulated, and so the ranking and every count, is the same on every executor and
   worker count.
4. Rows that ran and fit are ranked by :meth:`~schedsim.plan.rows.PlanRow.rank_key`.

Branch and bound: Land and Doig (1960); the lower bounds are closed forms of the
pipeline's warm-up and cool-down (Narayanan et al., SC'21; Qi et al., ICLR 2024).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from schedsim.errors import ScenarioError
from schedsim.plan.candidates import (
    Enumeration,
    Legal,
    Point,
    Resolved,
    enumerate_candidates,
    grid_points,
)
from schedsim.plan.rows import GIB, PlanRow, RowStream, rank, read_rows
from schedsim.plan.space import PlanSpace, Rejections
from schedsim.util.units import fmt_gib, fmt_gib_pair, fmt_rate_pair

#: the first wave's size (at least ``top``) and the largest wave: wave ``i`` simulates
#: ``min(WAVE_MAX, max(top, WAVE) x 2**i)`` candidates, sizes fixed in advance so that
#: the set simulated does not depend on the executor or its workers
WAVE = 8
WAVE_MAX = 256


@dataclass
class Bounded:
    """A legal candidate with its bounds: ``peak_lb`` per rank (bytes), ``fits_lb``,
    ``ub`` (tokens/s/GPU at most)."""

    legal: Legal
    peak_lb: list[float]
    ub: float

    @property
    def key(self) -> str:
        return self.legal.candidate.key

    @property
    def name(self) -> str:
        from schedsim.plan.names import candidate_name

        return candidate_name(self.legal.candidate, self.legal.shape.stages)


@dataclass
class PlanResult:
    """What :func:`run_plan` found. ``rows``: every candidate simulated (this run's and
    resumed ones); ``ranking``: those that fit, best first; ``grid``: candidates before
    any rule; ``legal``: after the enumeration rules; ``simulated``: simulations run now
    (``resumed``: rows taken from the ``--out`` file); ``rejections``: per rule, pruning
    included; ``smallest_peak``: when nothing fits, ``(GiB, candidate name)`` of the
    smallest peak found."""

    space: PlanSpace
    resolved: Resolved
    rows: list[PlanRow] = field(default_factory=list)
    ranking: list[PlanRow] = field(default_factory=list)
    grid: int = 0
    legal: int = 0
    simulated: int = 0
    resumed: int = 0
    rejections: Rejections = field(default_factory=Rejections)
    smallest_peak: tuple[float, str] | None = None

    @property
    def pruned(self) -> int:
        """Legal candidates removed before simulation (memory and bound)."""
        return sum(self.rejections.counts.get(r, 0) for r in ("memory", "bound"))

    def top(self, k: int) -> list[PlanRow]:
        return self.ranking[:k]


def resolve(space: PlanSpace) -> Resolved:
    """``space`` with its defaults (:mod:`schedsim.plan.space`, :mod:`schedsim.plan.model`)
    filled in. Raises :class:`ScenarioError` for an unknown model, GPU, schedule,
    recompute mode or ZeRO stage."""
    from schedsim.plan.model import resolve_space

    return resolve_space(space)


@dataclass
class Checked:
    """A space :func:`check_plan` let through: resolved, its grid's points, its work."""

    resolved: Resolved
    points: list[Point]
    work: Any


def check_plan(space: PlanSpace, top: int = 5) -> Checked:
    """Everything about ``space`` that is refused before any work (step 0 of the module
    docstring): ``top``, the names and values (:func:`resolve`), the grid's size and its
    total instructions (:func:`schedsim.plan.work.check_plan_work`). Raises
    :class:`ScenarioError` (:class:`~schedsim.errors.LimitError` for the work)."""
    from schedsim.plan.work import check_plan_work

    if top < 1:
        raise ScenarioError(f"--top must be >= 1 (got {top})")
    res = resolve(space)
    points = grid_points(res)
    return Checked(res, points, check_plan_work(res, points))


def _bounded(res: Resolved, enum: Enumeration, rej: Rejections,
             progress: Callable[..., None] | None = None
             ) -> tuple[list[Bounded], tuple[float, str] | None]:
    """The legal candidates that may fit, sorted by upper bound (best first, then name);
    the memory rejections are added to ``rej``. Also the smallest peak bound met among
    those that cannot fit, ``(bytes, key)``."""
    from schedsim.plan.model import bounds_of

    keep: list[Bounded] = []
    smallest: tuple[float, str] | None = None
    for i, lg in enumerate(enum.legal):
        if progress is not None and i % 16 == 0:
            progress(i, len(enum.legal), "bounding")
        peak, ub = bounds_of(lg, res)
        b = Bounded(lg, peak, ub)
        top = max(peak)
        if top > res.mem_limit_bytes:
            top_text, limit_text = fmt_gib_pair(top, res.mem_limit_bytes)
            rej.add("memory", f"{b.name}: at least {top_text} on one rank, over "
                    f"the {limit_text} limit")
            if smallest is None or (top, b.name) < smallest:
                smallest = (top, b.name)
            continue
        keep.append(b)
    keep.sort(key=lambda b: (-b.ub, b.key))
    return keep, smallest


def run_plan(space: PlanSpace, *, top: int = 5, executor: Any = None,
             out: Path | None = None, resume: bool = False,
             progress: Callable[..., None] | None = None,
             checked: Checked | None = None) -> PlanResult:
    """Plan ``space`` (module docstring) and return the :class:`PlanResult`.

    ``executor``: an :class:`~schedsim.plan.executors.Executor` (entered by the caller),
    None to simulate in this process. ``out``: stream each simulated row to this
    ``.jsonl``/``.csv`` file as it finishes; ``resume``: take the rows already in it
    instead of simulating them again. ``progress(done, total, phase)`` is called while
    the legal candidates are bounded (phase ``bounding``) and as they are settled
    (``simulating``: simulated, resumed or pruned by the bound). ``checked``:
    :func:`check_plan` of ``space`` and ``top`` when the caller ran it already (the CLI
    does, before it starts an executor).

    Raises :class:`ScenarioError` when no candidate is legal (naming the rule that removed
    most), for a bad space, or a ``--resume`` file of another sweep;
    :class:`~schedsim.errors.LimitError` for a plan above the ``instructions`` limit.
    """
    from schedsim.plan.executors import Executor

    if checked is None:
        checked = check_plan(space, top)
    res = checked.resolved
    enum = enumerate_candidates(res, checked.points)
    result = PlanResult(space, res, grid=enum.grid, legal=len(enum.legal))
    result.rejections.merge(enum.rejections)
    if not enum.legal:
        raise ScenarioError(_nothing_legal(enum))
    todo, smallest = _bounded(res, enum, result.rejections, progress)
    done = {r.key: r for r in read_rows(out, space.identity())} if out and resume else {}
    stream = RowStream(out, space.identity()).open(list(done.values())) if out else None
    try:
        _waves(result, todo, done, top, executor or Executor(), stream, progress)
    except BaseException:
        if stream is not None:
            stream.abandon()        # an empty file is removed, one with rows kept
        raise
    if stream is not None:
        stream.close()
    _finish(result, smallest)
    return result


def _nothing_legal(enum: Enumeration) -> str:
    """The one line of a space with no legal candidate: the rule that removed most,
    with its example, and the others' counts."""
    rej = enum.rejections
    rule, example = rej.worst()
    others = [f"{r} {n}" for r, n in rej.counts.items() if r != rule]
    return (f"no legal layout: rule '{rule}' removed {rej.counts[rule]} of {enum.grid} "
            f"candidates ({example})" + (f"; also {', '.join(others)}" if others else ""))


def _waves(result: PlanResult, todo: list[Bounded], done: dict[str, PlanRow], top: int,
           ex: Any, stream: RowStream | None,
           progress: Callable[..., None] | None) -> None:
    """Simulate ``todo`` (sorted by upper bound) in waves of doubling size, pruning by the
    bound before each wave; rows in ``done`` (resumed) are taken, not simulated."""
    from schedsim.plan.model import evaluate_batch

    sp, limit = result.space, result.resolved.mem_limit_bytes
    i, settled, wave = 0, 0, max(top, WAVE)
    while i < len(todo):
        ranked = rank(result.rows)
        bar = ranked[top - 1].tokens_per_s_per_gpu if len(ranked) >= top else None
        if bar is not None and todo[i].ub < bar:
            # sorted by ub: every later candidate is below the bar too
            n = len(todo) - i
            ub, last = fmt_rate_pair(todo[i].ub, bar)
            result.rejections.add("bound", f"{todo[i].name}: at most {ub} tokens/s/GPU, "
                                  f"{'below' if ub != last else 'no better than'} the top "
                                  f"{top}'s last ({last})", n)
            settled += n
            break
        batch = []
        while i < len(todo) and len(batch) < wave and (bar is None or todo[i].ub >= bar):
            batch.append(todo[i])
            i += 1
        fresh = []
        for b in batch:
            if b.key in done:
                result.rows.append(done[b.key])
                result.resumed += 1
                settled += 1
            else:
                fresh.append((b.legal.candidate, b.legal.workload, sp.comm_policy,
                              sp.semantics, dict(sp.params), limit))
        for _, rows in ex.map_unordered(evaluate_batch, _batches(fresh, ex.workers)):
            for row in rows:
                result.rows.append(row)
                result.simulated += 1
                settled += 1
                if stream is not None:
                    stream.write(row)
            if progress is not None:
                progress(settled, len(todo), "simulating")
        wave = min(WAVE_MAX, 2 * wave)
    if progress is not None:
        progress(len(todo), len(todo), "simulating")


#: most candidates one executor task simulates
BATCH_MAX = 16


def _batches(tasks: list[tuple], workers: int) -> list[list[tuple]]:
    """``tasks`` cut into about two batches per worker (at most :data:`BATCH_MAX` each):
    one executor task per batch pays its dispatch and result transfer once, and the
    worker's program and cost caches serve the whole batch."""
    n = max(1, min(BATCH_MAX, -(-len(tasks) // (2 * max(1, workers)))))
    return [tasks[i:i + n] for i in range(0, len(tasks), n)]


def _finish(result: PlanResult, smallest: tuple[float, str] | None) -> None:
    """Rank the rows; count the simulated misfits and failures; when nothing fits, the
    smallest peak found (simulated, or the bound of one pruned by memory)."""
    result.ranking = rank(result.rows)
    no_fit = [r for r in result.rows if r.status == "ok" and not r.fits]
    if no_fit:
        result.rejections.add("memory (simulated)", f"{no_fit[0].name}: "
                              f"{fmt_gib(no_fit[0].peak_max_gib * GIB)}", len(no_fit))
    errors = [r for r in result.rows if r.status != "ok"]
    if errors:
        result.rejections.add("simulation failed", f"{errors[0].name}: {errors[0].message}",
                              len(errors))
    if not result.ranking:
        seen = [(r.peak_max_gib * GIB, r.name) for r in result.rows if r.status == "ok"]
        if smallest is not None:
            seen.append(smallest)
        if seen:
            low = min(seen)
            result.smallest_peak = (low[0] / GIB, low[1])

"""``search``: the best per-rank order for the user's costs, links, semantics and memory.

Steps (inside one wall-clock budget, ``time_limit``, except for building the model, the
fixed-rule built-ins and the final simulation: see ``docs/search.md``, "Time"):

1. the built-in schedules of the placement, at the same costs, simulated under the chosen
   semantics and comm policy (:mod:`schedsim.search.baselines`): the comparison table and
   the warm start (the fitting one with the least makespan in the solver's model; if none
   fits, microbatches one at a time);
2. the exact core (:mod:`schedsim.search.cpsat`): CP-SAT on the data-dependency model,
   reporting its best makespan, lower bound and whether it is proven optimal;
3. the refinement (:mod:`schedsim.search.refine`): local search judged by the engine for
   the rest of the time, starting from the better (simulated) of the CP-SAT order and the
   best fitting built-in.

With ``seed`` and ``workers`` fixed the result is the same on every run that is not cut
short by the wall clock (the solver proves optimality or the local search converges):
CP-SAT runs with ``interleave_search`` (deterministic with several workers) and the local
search draws from ``random.Random(seed)``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from schedsim.analysis.memory import MemoryModel, peak_activation
from schedsim.errors import ScenarioError, SchedsimError
from schedsim.program.ir import Placement, Schedule
from schedsim.search.baselines import Baselines, run_baselines, schedule_peak
from schedsim.search.cpsat import SolveResult, require_ortools, solve
from schedsim.search.problem import SearchProblem, build_problem, sequential_order
from schedsim.search.refine import Evaluator, RefineResult, State, better, refine
from schedsim.search.timing import asap, makespan_of
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.timeline import Timeline

#: share of the remaining time the solver gets when the refinement has something to add
#: (semantics other than data, finite bandwidth or a launch cost)
#: share of --time-limit after which no further built-in schedule is started (each one
#: started runs to its end: the overrun is at most one built-in)
BASELINE_SHARE = 0.5
SOLVER_SHARE = 0.5
#: ... and when the solver's model is the engine's (data semantics, no contention)
SOLVER_SHARE_EXACT = 0.9

Progress = Callable[[str, dict[str, Any]], None]


#: the most CP-SAT worker threads ``search`` starts (more is refused: CP-SAT answers
#: MODEL_INVALID far above the core count)
MAX_WORKERS = 256
#: the largest seed: CP-SAT's ``random_seed`` parameter is an int32
MAX_SEED = 2 ** 31 - 1


@dataclass
class SearchSettings:
    """What to search. ``limit``: activation memory per rank in ``memory``'s unit: one
    value, one per rank, a built-in schedule's name (its per-rank peaks) or None (the
    peak of 1F1B, its largest rank). ``fused``: order F and BW instead of F, B, W."""

    ranks: int
    microbatches: int
    placement: str = "loop"
    chunks: int = 1
    fused: bool = False
    costs: CostModel = field(default_factory=CostModel)
    link: LinkModel = field(default_factory=LinkModel)
    comm: CommModel = field(default_factory=CommModel)
    policy: str = "async"
    memory: MemoryModel = field(default_factory=MemoryModel)
    limit: float | list[float] | str | None = None
    time_limit: float = 30.0
    seed: int = 0
    workers: int = 2
    restarts: int = 8

    def check(self) -> None:
        """Refuse settings no search can run, before any work: the size against the work
        limits (ranks; stages x microbatches as instructions,
        :func:`schedsim.util.limits.check_program_size`), ``chunks`` >= 1, a finite
        ``time_limit`` > 0, ``workers`` in 1..:data:`MAX_WORKERS`, a ``seed`` CP-SAT takes
        (0..2**31 - 1, its ``random_seed`` is an int32) and a known comm policy. Raises
        :class:`ScenarioError` (:class:`~schedsim.errors.LimitError` for the size) naming
        the flag."""
        import math

        from schedsim.program.lower import policy_names
        from schedsim.util.limits import check_program_size

        if self.chunks < 1:
            raise ScenarioError(f"--chunks must be >= 1 (got {self.chunks})")
        stages = self.ranks * (2 if self.placement == "v" else self.chunks)
        check_program_size("search", ranks=self.ranks, stages=stages,
                           microbatches=self.microbatches)
        if not (isinstance(self.time_limit, (int, float)) and math.isfinite(self.time_limit)
                and self.time_limit > 0):
            raise ScenarioError(f"--time-limit must be a finite number of seconds > 0 (got "
                                f"{self.time_limit!r})")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ScenarioError(f"--workers must be in 1..{MAX_WORKERS} (got "
                                f"{self.workers:,}): CP-SAT threads on this machine")
        if not 0 <= self.seed <= MAX_SEED:
            raise ScenarioError(f"--seed must be in 0..{MAX_SEED} (CP-SAT's random_seed is a "
                                f"32-bit integer; got {self.seed})")
        if self.policy not in policy_names():
            raise ScenarioError(f"unknown --comm-policy {self.policy!r}: expected one of "
                                f"{', '.join(policy_names())}")

    def make_placement(self) -> Placement:
        """The placement. Raises :class:`ScenarioError` for a bad kind or chunk count."""
        if self.placement == "loop":
            if self.chunks < 1:
                raise ScenarioError(f"--chunks must be >= 1 (got {self.chunks})")
            return Placement(kind="loop", ranks=self.ranks, stages=self.ranks * self.chunks)
        if self.placement == "v":
            if self.chunks not in (1, 2):
                raise ScenarioError(f"v placement has 2 chunks per rank (got --chunks "
                                    f"{self.chunks})")
            return Placement(kind="v", ranks=self.ranks, stages=2 * self.ranks)
        raise ScenarioError(f"unknown --placement {self.placement!r}: expected loop or v")

    def resolve_limit(self) -> list[float]:
        """Per-rank memory limit (see the class docstring)."""
        lim = self.limit
        if lim is None:
            peak = schedule_peak("1f1b", self.ranks, self.microbatches, self.memory)
            return [max(peak)] * self.ranks
        if isinstance(lim, str):
            try:
                return schedule_peak(lim, self.ranks, self.microbatches, self.memory)
            except SchedsimError as e:
                raise ScenarioError(f"--mem-limit {lim}: cannot take that schedule's "
                                    f"memory ({e})") from None
        if isinstance(lim, (int, float)):
            return [float(lim)] * self.ranks
        return [float(x) for x in lim]


@dataclass
class SearchResult:
    """The search's answer. Makespans in the costs' unit; ``makespan``/``bubble``/``peak``
    are the engine's under the chosen semantics and comm policy."""

    schedule: Schedule
    timeline: Timeline
    makespan: float
    bubble: float
    peak: list[float]
    limit: list[float]
    solver: SolveResult | None
    solver_sim_makespan: float | None
    warm_start: str
    warm_start_model_makespan: float | None
    start_label: str
    starts: list[str]
    baselines: Baselines
    evals: int
    improvements: int
    converged: bool
    refined: bool
    seconds: dict[str, float]
    time_limited: bool

    def to_dict(self) -> dict[str, Any]:
        s = self.solver
        return {
            "schedule": self.schedule.model_dump(mode="json"),
            "makespan": self.makespan, "bubble_ratio": self.bubble,
            "peak_activation": self.peak, "mem_limit": self.limit,
            "solver": None if s is None else {
                "status": s.status, "makespan": s.makespan, "bound": s.bound,
                "optimal": s.optimal, "seconds": s.wall,
                "simulated_makespan": self.solver_sim_makespan,
                "trace": [list(t) for t in s.trace]},
            "warm_start": {"schedule": self.warm_start,
                           "model_makespan": self.warm_start_model_makespan},
            "refinement": {"ran": self.refined, "starts": self.starts,
                           "best_from": self.start_label,
                           "evaluations": self.evals, "improvements": self.improvements,
                           "converged": self.converged},
            "baselines": [b.to_dict() for b in self.baselines.rows],
            "skipped": self.baselines.skipped,
            "seconds": self.seconds, "time_limited": self.time_limited,
        }


def _refinement_matters(st: SearchSettings) -> bool:
    import math

    link = st.link
    return (st.comm.semantics != "data" or st.comm.launch_cost > 0
            or not math.isinf(link.bandwidth)
            or any(lk.bandwidth is not None for lk in link.links))


def search(st: SearchSettings, progress: Progress | None = None) -> SearchResult:
    """Run the search (module docstring). Raises :class:`ScenarioError` for bad settings,
    a memory limit no order meets, or OR-Tools missing."""
    t0 = time.perf_counter()
    deadline = t0 + st.time_limit
    note = progress or (lambda phase, info: None)
    st.check()
    require_ortools()
    pl = st.make_placement()
    limit = st.resolve_limit()
    pb = build_problem(pl, st.microbatches, st.costs, st.link, st.memory, limit, st.fused)
    note("baselines", {})
    base = run_baselines(pb, st.costs, st.link, st.comm, st.policy, st.memory,
                         deadline=t0 + BASELINE_SHARE * st.time_limit)
    t_base = time.perf_counter()
    hint_row = base.best_hint()
    if hint_row is not None:
        hint, hint_label, hint_ms = hint_row.order, hint_row.label, hint_row.model_makespan
    else:
        hint, hint_label = sequential_order(pb), "one microbatch at a time"
        hint_ms = makespan_of(pb, asap(pb, hint))
    share = SOLVER_SHARE if _refinement_matters(st) else SOLVER_SHARE_EXACT
    budget = max(0.05, (deadline - time.perf_counter()) * share)
    note("solver", {"warm_start": hint_label, "model_makespan": hint_ms})
    sol = solve(pb, hint, budget, seed=st.seed, workers=st.workers,
                on_progress=lambda t, best, bound: note(
                    "solver", {"seconds": t, "best": best, "bound": bound}))
    if sol.order is None and sol.status == "INFEASIBLE":
        raise ScenarioError("no order meets the memory limit (the solver proved it "
                            "infeasible); raise --mem-limit")
    t_solve = time.perf_counter()
    evaluator = Evaluator(pb, st.costs, st.link, st.comm, st.policy, st.memory)
    starts, sim_solver = _starts(sol, base, hint, hint_label, evaluator)
    refined = not (sol.optimal and not _refinement_matters(st))
    if not refined:
        # the solver's model is the engine's here: nothing left to find
        label, state, _ = starts[0]
        res = RefineResult(state, evaluator(state), evaluator.calls, 0, True)
    else:
        label, res = _refine_all(pb, st, starts, evaluator, deadline, note)
    t_ref = time.perf_counter()
    seconds = {"baselines": t_base - t0, "solver": t_solve - t_base,
               "refine": t_ref - t_solve}
    return _finish(st, pb, sol, sim_solver, WarmStart(hint_label, hint_ms),
                   (label, [x[0] for x in starts]), base, res, refined, limit, seconds,
                   t_ref >= deadline)


def _starts(sol: SolveResult, base: Baselines, hint: list[list[int]], hint_label: str,
            evaluator: Evaluator) -> tuple[list[tuple[str, State, float]], float | None]:
    """Where the refinement starts: the best simulated of the solver's order, the fitting
    built-ins (as they run: fused backward included; their makespans are already known)
    and the warm start; then the solver's order if it is not that one (the local search
    from each can end in a different optimum). Also the solver order's simulated
    makespan."""
    runs: list[tuple[str, State, float]] = []
    sim_solver = None
    if sol.order is not None:
        ev = evaluator(State(sol.order))
        if ev is not None:
            sim_solver = ev.makespan
            runs.append(("solver", State(sol.order), ev.makespan))
    runs += [(b.label, State(b.order, b.fused), b.makespan) for b in base.rows
             if b.fits and b.order is not None and b.makespan is not None]
    if not any(label == hint_label for label, _, _ in runs):
        ev = evaluator(State(hint))
        if ev is not None:
            runs.append((hint_label, State(hint), ev.makespan))
    if not runs:
        raise ScenarioError("no candidate order runs under these semantics and comm policy "
                            "(each deadlocks); try --comm-policy async")
    best = min(runs, key=lambda x: x[2])        # first of the equals: the solver's
    out = [best]
    if runs[0][0] == "solver" and best is not runs[0]:
        out.append(runs[0])
    return out, sim_solver


def _refine_all(pb: SearchProblem, st: SearchSettings,
                starts: list[tuple[str, State, float]], evaluator: Evaluator,
                deadline: float, note: Progress) -> tuple[str, RefineResult]:
    """Refine from each start in turn (each gets an equal share of the time left, a run
    that converges early leaves its time to the next); the best result and its start."""
    best: tuple[str, RefineResult] | None = None
    improvements, converged = 0, True
    for k, (label, state, _) in enumerate(starts):
        now = time.perf_counter()
        until = now + (deadline - now) / (len(starts) - k)
        note("refine", {"start": label})
        res = refine(pb, state, evaluator, until, seed=st.seed, restarts=st.restarts,
                     on_progress=lambda n, b: note("refine", {"evals": n, "best": b}))
        improvements += res.improvements
        converged = converged and res.converged
        if best is None or better(res.evaluation, best[1].evaluation):
            best = (label, res)
    assert best is not None
    label, res = best
    return label, RefineResult(res.state, res.evaluation, evaluator.calls, improvements,
                               converged)


class WarmStart(NamedTuple):
    """The solver's warm start: its label and its makespan in the solver's model."""

    label: str
    model_makespan: float | None


def _finish(st: SearchSettings, pb: SearchProblem, sol: SolveResult,
            sim_solver: float | None, warm: WarmStart, labels: tuple[str, list[str]],
            base: Baselines, res: Any, refined: bool, limit: list[float],
            seconds: dict[str, float], time_limited: bool) -> SearchResult:
    """The :class:`SearchResult` of the refined order ``res``: lowered by the comm
    policy and simulated, with what the search found on the way."""
    from schedsim.program.lower import lower
    from schedsim.sim.simulate import simulate

    params = {"search": {"costs_unit": st.costs.unit, "semantics": st.comm.semantics,
                         "comm_policy": st.policy, "mem_limit": limit, "seed": st.seed,
                         "optimal_in_model": bool(sol.optimal)}}
    sched = pb.schedule(res.order, "search", params, res.state.fused)
    tl = simulate(lower(sched, st.policy), st.costs, st.link, st.comm)
    peak = peak_activation(tl, st.memory)
    return SearchResult(sched, tl, tl.makespan, tl.bubble_ratio(), peak, limit, sol,
                        sim_solver, *warm, *labels, base, res.evals,
                        res.improvements, res.converged, refined, seconds, time_limited)

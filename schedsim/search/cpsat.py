"""The exact core: a CP-SAT model (Google OR-Tools) of the per-rank order of F, B, W (or
F, BW), minimising the makespan under an activation-memory limit.

Model (on the integer view of :class:`~schedsim.search.problem.SearchProblem`):

- one fixed-size interval per op (``start``, cost); ``add_no_overlap`` per rank;
- data inputs: ``start_i >= end_j + lag`` (lag = link cost across ranks, 0 on one rank);
- per stage and kind, microbatches in order (as every built-in and the authors' ILP);
- activation memory as a reservoir per rank: an allocation at its op's start, a release at
  its op's end, level at most the limit at every time (events at one time net out, as a
  release and the next op's allocation do in :func:`schedsim.analysis.memory.memory_curves`);
- ``makespan >= end_i``, minimised; a constant lower bound per rank (earliest start of any
  of its ops + its total work + the shortest tail after its ops) helps the proof;
- warm start: every start time hinted from a valid order (the best built-in schedule that
  fits the limit), so the first solution is at least that good.

This replaces the big-M ILP of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024),
Section 3.1 and appendix (sail-sg/zero-bubble-pipeline-parallelism, branch legacy-main,
``megatron/core/pipeline_parallel/auto_schedule.py:build_ilp``: a binary per unordered
pair of same-stage ops, memory as sums over those binaries) by CP-SAT's scheduling
constraints, which propagate and prove far better. Their objective is the longest stage
span; ours is the makespan (what the engine reports).

OR-Tools is optional (the ``search`` extra); :func:`require_ortools` raises
a one-line :class:`~schedsim.errors.ScenarioError` when it is missing.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schedsim.errors import ScenarioError
from schedsim.search.problem import SearchProblem
from schedsim.search.timing import asap, makespan_of, order_by_start


def require_ortools() -> Any:
    """The ``ortools.sat.python.cp_model`` module. Raises :class:`ScenarioError` with the
    install line when OR-Tools is not installed."""
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        from schedsim.util.install import install_hint

        raise ScenarioError("schedsim search needs OR-Tools: "
                            + install_hint("search", "ortools")) from None
    return cp_model


@dataclass
class SolveResult:
    """What CP-SAT found. Times in the problem's unit (integer solution / time scale).

    ``order``: per-rank op indices of the best solution (None if none was found);
    ``makespan``: its makespan in the model; ``bound``: the proven lower bound;
    ``optimal``: proven optimal; ``status``: CP-SAT's status name; ``wall``: seconds;
    ``trace``: ``(seconds, makespan, bound)`` at each improving solution.
    """

    order: list[list[int]] | None
    makespan: float | None
    bound: float
    optimal: bool
    status: str
    wall: float
    trace: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class _Model:
    model: Any
    start: list[Any]
    makespan: Any
    lower: int
    upper: int
    sizes: list[tuple[Any, int, int]]


def _heads_tails(pb: SearchProblem, d: list[int], lags: list[list[tuple[int, int]]]
                 ) -> tuple[list[int], list[int]]:
    """Earliest start (longest path from any source) and shortest possible time after the
    op's end until the makespan (longest path to any sink) over inputs and chains."""
    from schedsim.search.timing import topo_positions

    n = pb.n
    preds: list[list[tuple[int, int]]] = [list(row) for row in lags]
    for ch in pb.chains:
        for a, b in itertools.pairwise(ch):
            preds[b].append((a, 0))
    order = sorted(range(n), key=topo_positions(pb).__getitem__)
    head = [0] * n
    for i in order:
        for j, lag in preds[i]:
            head[i] = max(head[i], head[j] + d[j] + lag)
    tail = [0] * n
    for i in reversed(order):
        for j, lag in preds[i]:
            tail[j] = max(tail[j], lag + d[i] + tail[i])
    return head, tail


def _memory(m: Any, pb: SearchProblem, mine: list[int], start: list[Any], d: list[int],
            mem: list[int], neg: int, upper: int) -> list[tuple[Any, int, int]]:
    """Rank ``mine``'s activation limit. When every (stage, mb) allocates at its F and
    releases at most that at its backward ends (the zb and inflight models), the memory is
    a sum of intervals (F start -> B end holding B's release, F start -> W end holding W's,
    a leak held to the horizon) and a cumulative constraint states it; otherwise a
    reservoir of the individual events does. Returns each interval's size variable with
    its F op and the op ending it (-1: the horizon), so a warm start can hint them."""
    limit = pb.int_limit(pb.rank[mine[0]])
    iv, dem, sizes = [], [], []
    ok = True
    for i in mine:
        op = pb.ops[i]
        if op.kind != "F":
            ok = ok and mem[i] <= 0
            continue
        if mem[i] < 0:
            ok = False
            break
        left = mem[i]
        for k in (("BW",) if pb.fused else ("B", "W")):
            j = pb.index[(k, op.stage, op.mb)]
            if mem[j] < 0:
                size = m.new_int_var(0, upper, "")
                iv.append(m.new_interval_var(start[i], size, start[j] + d[j], ""))
                sizes.append((size, i, j))
                dem.append(-mem[j])
                left += mem[j]
        if left < 0:
            ok = False
            break
        if left > 0:
            size = m.new_int_var(0, upper, "")
            iv.append(m.new_interval_var(start[i], size, upper, ""))
            sizes.append((size, i, -1))
            dem.append(left)
    if ok:
        if iv:
            m.add_cumulative(iv, dem, limit)
        return sizes
    ev = [(start[i] if mem[i] > 0 else start[i] + d[i], mem[i]) for i in mine if mem[i]]
    if ev:
        m.add_reservoir_constraint([t for t, _ in ev], [x for _, x in ev], neg, limit)
    return []


def _memory_precedences(m: Any, pb: SearchProblem, start: list[Any], d: list[int],
                        mem: list[int]) -> None:
    """Precedences the memory limit implies on one stage (valid for the interval form of
    :func:`_memory`; they make the LP relaxation and the proof much stronger). With ``a``
    allocated per F and ``b``/``w`` released by B/W (b + w <= a), before F of microbatch k
    at most k B's and at most as many W's as B's have run, so the stage holds at least
    ``a(k+1) - x(b+w)`` once x B's are done and ``a(k+1) - kb - yw`` once y W's are done;
    the rank's limit L then needs ``B(x-1)`` and ``W(y-1)`` before ``F(k)`` for the least
    such x, y (the stage's level never exceeds its rank's)."""
    kinds = ("BW",) if pb.fused else ("B", "W")
    for s in range(pb.placement.stages):
        f = [pb.index[("F", s, mb)] for mb in range(pb.microbatches)]
        back = [[pb.index[(k, s, mb)] for mb in range(pb.microbatches)] for k in kinds]
        a = mem[f[0]]
        rel = [-mem[ch[0]] for ch in back]
        if a <= 0 or any(x < 0 for x in rel) or sum(rel) > a:
            return
        limit = pb.int_limit(pb.rank[f[0]])
        b, w = rel[0], (rel[1] if len(rel) > 1 else 0)
        for k in range(pb.microbatches):
            need = a * (k + 1) - limit
            if need <= 0:
                continue
            if b + w > 0:
                x = -(-need // (b + w))
                if 1 <= x <= k:
                    j = back[0][x - 1]
                    m.add(start[f[k]] >= start[j] + d[j])
            if w > 0:
                y = -(-(need - k * b) // w)
                if 1 <= y <= k:
                    j = back[1][y - 1]
                    m.add(start[f[k]] >= start[j] + d[j])


def build_model(pb: SearchProblem, upper: int | None = None) -> _Model:
    """The CP-SAT model of ``pb`` with the makespan at most ``upper`` (integer units;
    default: every op one after another plus every lag, always feasible)."""
    cp_model = require_ortools()
    m = cp_model.CpModel()
    d, lags, mem = pb.int_dur(), pb.int_lags(), pb.int_mem()
    head, tail = _heads_tails(pb, d, lags)
    if upper is None:
        upper = sum(d) + sum(lag for row in lags for _, lag in row)
    upper = max(upper, max(h + x + t for h, x, t in zip(head, d, tail)))
    start = [m.new_int_var(head[i], upper - tail[i] - d[i], f"s{i}") for i in range(pb.n)]
    iv = [m.new_fixed_size_interval_var(start[i], d[i], f"i{i}") for i in range(pb.n)]
    for i, row in enumerate(lags):
        for j, lag in row:
            m.add(start[i] >= start[j] + d[j] + lag)
    for ch in pb.chains:
        for a, b in itertools.pairwise(ch):
            m.add(start[b] >= start[a] + d[a])
    lower = 0
    sizes = []
    neg = -sum(-x for x in mem if x < 0)
    for r in range(pb.ranks):
        mine = pb.ops_of(r)
        if not mine:
            continue
        m.add_no_overlap([iv[i] for i in mine])
        lower = max(lower, min(head[i] for i in mine) + sum(d[i] for i in mine)
                    + min(tail[i] for i in mine))
        sizes += _memory(m, pb, mine, start, d, mem, neg, upper)
    _memory_precedences(m, pb, start, d, mem)
    makespan = m.new_int_var(lower, upper, "makespan")
    for ch in pb.chains:
        m.add(makespan >= start[ch[-1]] + d[ch[-1]])
    m.minimize(makespan)
    return _Model(m, start, makespan, lower, upper, sizes)


def lower_bound(pb: SearchProblem) -> int:
    """The constant lower bound of :func:`build_model` (integer units): for each rank, the
    earliest start of any of its ops + its total work + the shortest tail after them."""
    d, lags = pb.int_dur(), pb.int_lags()
    head, tail = _heads_tails(pb, d, lags)
    lower = 0
    for r in range(pb.ranks):
        mine = pb.ops_of(r)
        if mine:
            lower = max(lower, min(head[i] for i in mine) + sum(d[i] for i in mine)
                        + min(tail[i] for i in mine))
    return lower


#: the largest horizon (integer time units) the CP-SAT model is built with: every start,
#: end and sum of the model stays exact in a float64 and far inside CP-SAT's int64 domains
MAX_HORIZON = 2 ** 53


def _check_int_range(pb: SearchProblem) -> None:
    """Refuse a problem whose horizon (every op one after another plus every lag, in the
    solver's integer units) exceeds :data:`MAX_HORIZON`: CP-SAT cannot hold its variables
    (costs of 1e30 crashed the solver process). Raises :class:`ScenarioError`."""
    d = pb.int_dur()
    horizon = sum(d) + sum(lag for row in pb.int_lags() for _, lag in row)
    if horizon > MAX_HORIZON:
        big = max(pb.dur)
        raise ScenarioError(f"costs too large for the solver: one op costs up to {big:.3g} "
                            f"and all ops in a row {horizon / pb.time_scale:.3g} (at most "
                            f"{MAX_HORIZON / pb.time_scale:.3g} in this cost unit): give the "
                            f"costs in a larger unit")


def solve(pb: SearchProblem, hint: list[list[int]] | None, time_limit: float, *,
          seed: int = 0, workers: int = 2,
          on_progress: Callable[[float, float | None, float], None] | None = None,
          extra: dict[str, Any] | None = None) -> SolveResult:
    """Minimise the makespan of ``pb`` with CP-SAT, warm-started from ``hint`` (a valid
    per-rank order that fits the memory limit, or None).

    CP-SAT runs in a child process that is killed at ``time_limit`` wall seconds (its own
    limit is not checked while it loads a large model), sending each improving solution
    and bound back; so the limit always holds and the best solution found so far is kept.
    With ``seed`` and ``workers`` fixed the search is reproducible when a proof, not the
    wall clock, ends it (``interleave_search``). ``extra``: more CP-SAT parameters;
    ``on_progress(seconds, best, bound)`` is called at each improving solution and bound.
    Raises :class:`ScenarioError` when OR-Tools is missing.
    """
    require_ortools()
    _check_int_range(pb)
    t0 = time.perf_counter()
    k = pb.time_scale
    hint_start = asap(pb, hint, integer=True) if hint is not None else None
    upper = makespan_of(pb, hint_start, integer=True) if hint_start is not None else None
    lower = lower_bound(pb)
    if hint_start is not None and upper is not None and upper <= lower:
        ms = upper / k      # the warm start meets the lower bound: optimal, no search
        if on_progress is not None:
            on_progress(time.perf_counter() - t0, ms, ms)
        return SolveResult(hint, ms, ms, True,
                           "OPTIMAL (warm start meets the lower bound)",
                           time.perf_counter() - t0, [(time.perf_counter() - t0, ms, ms)])
    params = {"num_workers": max(1, workers), "random_seed": seed, "interleave_search": True,
              **(extra or {})}
    run = _ChildSolve(pb, hint_start, upper, params, t0 + time_limit)
    trace: list[tuple[float, float, float]] = []
    bound = lower / k
    best: list[int] | None = None
    for msg in run.messages():
        now = time.perf_counter() - t0
        if msg[0] == "bound":
            bound = max(bound, msg[1] / k)
        elif msg[0] == "solution":
            bound = max(bound, msg[2] / k)
            best = msg[3]
            trace.append((now, msg[1] / k, bound))
        if on_progress is not None and msg[0] in ("bound", "solution"):
            on_progress(now, trace[-1][1] if trace else None, bound)
    status = run.status
    optimal = status == "OPTIMAL"
    wall = time.perf_counter() - t0
    if best is None:
        return SolveResult(None, None, bound, False, status, wall, trace)
    ms = makespan_of(pb, best, integer=True) / k
    bound = ms if optimal else max(bound, run.bound / k)
    return SolveResult(order_by_start(pb, best), ms, min(bound, ms), optimal, status, wall,
                       trace)


class _ChildSolve:
    """CP-SAT on ``pb`` in a child process (see :func:`solve`); :meth:`messages` yields
    ``("solution", objective, bound, starts)`` and ``("bound", bound)`` (integer units)
    until the child ends or ``deadline`` (``time.perf_counter()``) passes, when it is
    killed. Then :attr:`status` is CP-SAT's status name (``"TIME_LIMIT"`` if killed,
    ``"CRASHED"`` if the child died without a word) and :attr:`bound` its last bound."""

    def __init__(self, pb: SearchProblem, hint_start: list[int] | None, upper: int | None,
                 params: dict[str, Any], deadline: float) -> None:
        import multiprocessing as mp
        import sys

        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        self._recv, send = ctx.Pipe(duplex=False)
        params = {**params, "max_time_in_seconds": max(0.01, deadline - time.perf_counter())}
        self._proc = ctx.Process(target=_child, args=(send, pb, hint_start, upper, params),
                                 daemon=True)
        self._proc.start()
        send.close()
        self.deadline = deadline
        self.status, self.bound = "TIME_LIMIT", 0.0

    def messages(self):
        try:
            while True:
                left = self.deadline - time.perf_counter()
                if left <= 0 or not self._recv.poll(min(left, 0.2)):
                    if left > 0 and not self._proc.is_alive() and not self._recv.poll():
                        self.status = "CRASHED"
                        return
                    if left <= 0:
                        return
                    continue
                try:
                    msg = self._recv.recv()
                except EOFError:
                    self.status = "CRASHED"
                    return
                if msg[0] == "done":
                    self.status, self.bound = msg[1], msg[2]
                    return
                yield msg
        finally:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join()
            self._recv.close()


def _child(conn: Any, pb: SearchProblem, hint_start: list[int] | None, upper: int | None,
           params: dict[str, Any]) -> None:
    """The child process of :class:`_ChildSolve`: build, hint, solve, report."""
    cp_model = require_ortools()
    mdl = build_model(pb, upper)
    if hint_start is not None:
        for v, s in zip(mdl.start, hint_start):
            mdl.model.add_hint(v, s)
        d = pb.int_dur()
        for v, i, j in mdl.sizes:
            mdl.model.add_hint(v, (hint_start[j] + d[j] if j >= 0 else mdl.upper)
                               - hint_start[i])
        mdl.model.add_hint(mdl.makespan, mdl.upper)
    solver = cp_model.CpSolver()
    for key, val in params.items():
        setattr(solver.parameters, key, val)

    class _Callback(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            conn.send(("solution", self.objective_value, self.best_objective_bound,
                       [self.value(v) for v in mdl.start]))

    if hasattr(solver, "best_bound_callback"):
        solver.best_bound_callback = lambda b: conn.send(("bound", b))
    status = solver.solve(mdl.model, _Callback())
    conn.send(("done", solver.status_name(status), solver.best_objective_bound))
    conn.close()

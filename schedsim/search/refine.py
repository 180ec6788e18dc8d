"""Semantics-aware refinement: a local search over per-rank orders judged by the engine.

The solver's model knows data dependencies and link costs, not how sends and recvs really
complete. Here every candidate order is lowered with the chosen comm policy
(:func:`schedsim.program.lower.lower`) and simulated under the chosen semantics
(:func:`schedsim.sim.simulate.simulate`, the engine's one entry point, so a faster engine
speeds this up unchanged); a move is kept when the simulated makespan drops (ties: when
the sum of the ranks' last ends drops) and every rank stays within its memory limit.

Moves (first improvement, most promising first): around each idle gap of the current
timeline (largest first), pull one of the next few ops of that rank into the gap, or push
the stalled op past the next few; then seeded random shifts. Only moves that keep the
same-rank order of each op's inputs and of each (stage, kind) microbatch chain are tried;
an order whose inputs form a cycle across ranks is skipped before simulation
(:func:`schedsim.search.timing.asap`), and one that deadlocks in the engine is rejected.
After a local optimum, a few seeded random perturbations restart the descent from the
best order (iterated local search). Work is bounded by the deadline and by ``restarts``.
"""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from schedsim.errors import SchedsimError
from schedsim.search.problem import SearchProblem
from schedsim.search.timing import asap
from schedsim.sim.costs import CommModel, CostModel, LinkModel

Order = list[list[int]]
EPS = 1e-9
#: how far (in positions) a pull or push reaches
WINDOW = 6


@dataclass
class Evaluation:
    """One simulated order: makespan, sum of the ranks' last ends and, per rank, the
    start and end of each op in order."""

    makespan: float
    ends: float
    starts: list[list[float]]
    finishes: list[list[float]]


class Evaluator:
    """Lowers and simulates orders of ``pb`` (see module docstring), with a cache."""

    def __init__(self, pb: SearchProblem, costs: CostModel, link: LinkModel,
                 comm: CommModel, policy: str) -> None:
        self.pb, self.costs, self.link, self.comm, self.policy = pb, costs, link, comm, policy
        self.calls = 0
        self._cache: dict[tuple, Evaluation | None] = {}

    def __call__(self, order: Order) -> Evaluation | None:
        """The simulated evaluation of ``order``, or None when it deadlocks or cannot be
        lowered."""
        key = tuple(tuple(row) for row in order)
        if key in self._cache:
            return self._cache[key]
        res = self._run(order)
        self._cache[key] = res
        return res

    def _run(self, order: Order) -> Evaluation | None:
        from schedsim.program.lower import lower
        from schedsim.sim.simulate import simulate

        self.calls += 1
        pb = self.pb
        try:
            prog = lower(pb.schedule(order), self.policy)
            tl = simulate(prog, self.costs, self.link, self.comm, raise_on_deadlock=False)
        except SchedsimError:
            return None
        if tl.deadlock is not None:
            return None
        pos = {i: (r, k) for r, row in enumerate(order) for k, i in enumerate(row)}
        starts = [[0.0] * len(row) for row in order]
        finishes = [[0.0] * len(row) for row in order]
        for s in tl.spans:
            r, k = pos[pb.index[(s.kind, s.stage, s.mb)]]
            starts[r][k], finishes[r][k] = s.start, s.end
        ends = sum(max(row, default=0.0) for row in finishes)
        return Evaluation(tl.makespan, ends, starts, finishes)


@dataclass
class RefineResult:
    order: Order
    evaluation: Evaluation
    evals: int
    improvements: int
    converged: bool


class _Moves:
    """Same-rank order rules of ``pb``: which ops must stay before which."""

    def __init__(self, pb: SearchProblem) -> None:
        self.pb = pb
        before: list[set[int]] = [set() for _ in range(pb.n)]
        for i, row in enumerate(pb.lags):
            for j, _ in row:
                if pb.rank[j] == pb.rank[i]:
                    before[i].add(j)
        for ch in pb.chains:
            for a, b in itertools.pairwise(ch):
                before[b].add(a)
        self.before = before

    def apply(self, order: Order, r: int, i: int, j: int) -> Order | None:
        """``order`` with rank r's op at position i moved to position j, or None when
        that breaks a same-rank rule or the rank's memory limit."""
        row = order[r]
        x = row[i]
        if j < i:
            if any(y in self.before[x] for y in row[j:i]):
                return None
        elif j > i:
            if any(x in self.before[y] for y in row[i + 1:j + 1]):
                return None
        else:
            return None
        new = row[:i] + row[i + 1:]
        new.insert(j, x)
        pb = self.pb
        level = top = 0.0
        for k in new:
            d = pb.mem[k]
            if d > 0 and level + d > top:
                top = level + d
            level += d
        if top > pb.limit[r] + EPS:
            return None
        out = list(order)
        out[r] = new
        return out


def _gap_moves(ev: Evaluation) -> list[tuple[int, int, int]]:
    """``(rank, from, to)`` moves around idle gaps, largest gaps first."""
    gaps = []
    for r, (st, fin) in enumerate(zip(ev.starts, ev.finishes)):
        for k in range(1, len(st)):
            g = st[k] - fin[k - 1]
            if g > EPS:
                gaps.append((-g, r, k))
    gaps.sort()
    moves = []
    for _, r, k in gaps:
        n = len(ev.starts[r])
        for j in range(k + 1, min(n, k + 1 + WINDOW)):
            moves.append((r, j, k))          # pull a later op into the gap
        for j in range(k + 1, min(n, k + 1 + WINDOW)):
            moves.append((r, k, j))          # push the stalled op later
        moves.append((r, k - 1, k))          # the op before the gap goes after it
    return moves


def refine(pb: SearchProblem, order: Order, evaluate: Evaluator, deadline: float, *,
           seed: int = 0, restarts: int = 8,
           on_progress: Callable[[int, float], None] | None = None) -> RefineResult:
    """Improve ``order`` (valid, within the memory limit) until ``deadline``
    (``time.perf_counter()`` seconds) or a local optimum followed by ``restarts``
    perturbations that found nothing better. Returns the best order and its evaluation.
    Raises :class:`SchedsimError` if ``order`` itself cannot be simulated."""
    rng = random.Random(seed)
    moves = _Moves(pb)
    first = evaluate(order)
    if first is None:
        raise SchedsimError("the starting order deadlocks or cannot be lowered with this "
                            "comm policy")
    best, best_ev = order, first
    cur, cur_ev = order, first
    improvements = fails = 0
    converged = False
    while time.perf_counter() < deadline:
        nxt = _descend_step(pb, moves, cur, cur_ev, evaluate, rng, deadline)
        if nxt is not None:
            cur, cur_ev = nxt
            if better(cur_ev, best_ev):
                best, best_ev = cur, cur_ev
                improvements += 1
                fails = 0
                if on_progress is not None:
                    on_progress(evaluate.calls, best_ev.makespan)
            continue
        if time.perf_counter() >= deadline:
            break
        fails += 1          # a local optimum no better than the best
        if fails > restarts:
            converged = True
            break
        cur, cur_ev = _perturb(pb, moves, best, best_ev, evaluate, rng)
    return RefineResult(best, best_ev, evaluate.calls, improvements, converged)


def _descend_step(pb: SearchProblem, moves: _Moves, cur: Order, cur_ev: Evaluation,
                  evaluate: Evaluator, rng: random.Random, deadline: float
                  ) -> tuple[Order, Evaluation] | None:
    """The first improving move from ``cur`` (gap moves, then random shifts), or None."""
    cands = _gap_moves(cur_ev)
    sizes = [len(row) for row in cur]
    for _ in range(2 * pb.n):
        r = rng.randrange(pb.ranks)
        if sizes[r] < 2:
            continue
        i = rng.randrange(sizes[r])
        j = min(sizes[r] - 1, max(0, i + rng.choice((-1, 1)) * rng.randint(1, WINDOW)))
        cands.append((r, i, j))
    seen: set[tuple[int, int, int]] = set()
    for mv in cands:
        if mv in seen:
            continue
        seen.add(mv)
        if time.perf_counter() >= deadline:
            return None
        new = moves.apply(cur, *mv)
        if new is None or not _may_improve(pb, new, cur_ev):
            continue
        ev = evaluate(new)
        if ev is not None and better(ev, cur_ev):
            return new, ev
    return None


def _may_improve(pb: SearchProblem, order: Order, cur: Evaluation) -> bool:
    """False when ``order`` cannot run (a cycle across ranks) or cannot beat ``cur``: its
    as-soon-as-possible times under data dependencies are a lower bound on any
    semantics' times (the engine only adds waits), so a makespan or sum of last ends
    already no better there stays no better when simulated."""
    start = asap(pb, order)
    if start is None:
        return False
    dur = pb.dur
    ends = [max((start[i] + dur[i] for i in row), default=0.0) for row in order]
    ms = max(ends, default=0.0)
    if ms > cur.makespan + EPS:
        return False
    return ms < cur.makespan - EPS or sum(ends) < cur.ends - EPS


def better(a: Evaluation, b: Evaluation) -> bool:
    """``a`` has a lower makespan than ``b``, or the same and a lower sum of last ends."""
    if a.makespan < b.makespan - EPS:
        return True
    return a.makespan <= b.makespan + EPS and a.ends < b.ends - EPS


def _perturb(pb: SearchProblem, moves: _Moves, order: Order, ev: Evaluation,
             evaluate: Evaluator, rng: random.Random) -> tuple[Order, Evaluation]:
    """``order`` after a few random valid moves (the first that simulates wins)."""
    for _ in range(50):
        cur = order
        for _ in range(rng.randint(2, 4)):
            r = rng.randrange(pb.ranks)
            n = len(cur[r])
            if n < 2:
                continue
            i = rng.randrange(n)
            j = min(n - 1, max(0, i + rng.randint(-WINDOW, WINDOW)))
            new = moves.apply(cur, r, i, j)
            if new is not None:
                cur = new
        if cur is order or asap(pb, cur) is None:
            continue
        got = evaluate(cur)
        if got is not None:
            return cur, got
    return order, ev

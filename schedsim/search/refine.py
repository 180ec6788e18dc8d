"""Semantics-aware refinement: a local search over per-rank orders judged by the engine.

The solver's model knows data dependencies and link costs, not how sends and recvs really
complete. Here every candidate order is lowered with the chosen comm policy
(:func:`schedsim.program.lower.lower`) and simulated under the chosen semantics
(:func:`schedsim.sim.simulate.simulate`, the engine's one entry point, so a faster engine
speeds this up unchanged); a move is kept when the simulated makespan drops (ties: when
the sum of the ranks' last ends drops) and every rank stays within its memory limit.

A state is an order plus, on a split-backward problem, the set of ``B`` ops that run
*fused* with the ``W`` right after them as one ``BW`` (one compute, its gradient sent when
both are done, one launch fewer for the comm policy): fusing costs the data model
nothing it can see, but under rendezvous or a committing policy it can save a wait, and
it lets a fused built-in such as 1F1B start the search as itself.

Moves (first improvement, most promising first): around each idle gap of the current
timeline (largest first), pull one of the next few ops of that rank into the gap, push
the stalled op past the next few, or fuse/split a ``B``/``W`` pair near it; then seeded
random shifts and toggles. A fused pair moves as one. Only moves that keep the same-rank
order of each op's inputs and of each (stage, kind) microbatch chain are tried; a
candidate whose data-dependency timing (a lower bound under every semantics) cannot beat
the current order, or that has a cycle across ranks, is skipped before simulation, and
one that deadlocks in the engine is rejected. After a local optimum, a few seeded random
perturbations restart the descent from the best state (iterated local search). Work is
bounded by the deadline and by ``restarts``.
"""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from schedsim.analysis.memory import MemoryModel
from schedsim.errors import SchedsimError
from schedsim.search.problem import SearchProblem
from schedsim.search.timing import asap
from schedsim.sim.costs import CommModel, CostModel, LinkModel

Order = list[list[int]]
EPS = 1e-9
#: how far (in positions) a pull or push reaches
WINDOW = 6


@dataclass(frozen=True)
class State:
    """An order and the ``B`` ops that run fused with their ``W`` (as ``BW``)."""

    order: Order
    fused: frozenset[int] = frozenset()

    def key(self) -> tuple:
        return (tuple(tuple(row) for row in self.order), self.fused)


@dataclass
class Evaluation:
    """One simulated state: makespan, sum of the ranks' last ends and, per rank, the
    start and end of each op of the order (a fused pair: both ops span the ``BW``)."""

    makespan: float
    ends: float
    starts: list[list[float]]
    finishes: list[list[float]]


class Evaluator:
    """Lowers and simulates states of ``pb`` (see module docstring), with a cache."""

    def __init__(self, pb: SearchProblem, costs: CostModel, link: LinkModel,
                 comm: CommModel, policy: str, memory: MemoryModel | None = None) -> None:
        self.pb, self.costs, self.link, self.comm, self.policy = pb, costs, link, comm, policy
        self.memory = memory or MemoryModel()
        self.calls = 0
        self._cache: dict[tuple, Evaluation | None] = {}

    def __call__(self, state: State | Order) -> Evaluation | None:
        """The simulated evaluation of ``state``, or None when it deadlocks or cannot be
        lowered."""
        if not isinstance(state, State):
            state = State(state)
        key = state.key()
        if key not in self._cache:
            self._cache[key] = self._run(state)
        return self._cache[key]

    def durations(self, fused: frozenset[int]) -> list[float]:
        return self.pb.fused_durations(self.costs, fused) if fused else self.pb.dur

    def _run(self, state: State) -> Evaluation | None:
        from schedsim.program.lower import lower
        from schedsim.sim.simulate import simulate

        self.calls += 1
        pb = self.pb
        try:
            prog = lower(pb.schedule(state.order, fused=state.fused), self.policy)
            tl = simulate(prog, self.costs, self.link, self.comm, raise_on_deadlock=False)
        except SchedsimError:
            return None
        if tl.deadlock is not None:
            return None
        pos = {i: (r, k) for r, row in enumerate(state.order) for k, i in enumerate(row)}
        starts = [[0.0] * len(row) for row in state.order]
        finishes = [[0.0] * len(row) for row in state.order]
        for s in tl.spans:
            kinds = ("B", "W") if s.kind == "BW" and not pb.fused else (s.kind,)
            for k in kinds:
                r, j = pos[pb.index[(k, s.stage, s.mb)]]
                starts[r][j], finishes[r][j] = s.start, s.end
        ends = sum(max(row, default=0.0) for row in finishes)
        return Evaluation(tl.makespan, ends, starts, finishes)


@dataclass
class RefineResult:
    state: State
    evaluation: Evaluation
    evals: int
    improvements: int
    converged: bool

    @property
    def order(self) -> Order:
        return self.state.order


class _Moves:
    """Same-rank order rules of ``pb`` (which ops must stay before which) and the moves."""

    def __init__(self, pb: SearchProblem, evaluate: Evaluator) -> None:
        self.pb, self.evaluate = pb, evaluate
        before: list[set[int]] = [set() for _ in range(pb.n)]
        for i, row in enumerate(pb.lags):
            for j, _ in row:
                if pb.rank[j] == pb.rank[i]:
                    before[i].add(j)
        for ch in pb.chains:
            for a, b in itertools.pairwise(ch):
                before[b].add(a)
        self.before = before
        #: W op of each B op (split problems)
        self.w_of = {} if pb.fused else {
            pb.index[("B", o.stage, o.mb)]: pb.index[("W", o.stage, o.mb)]
            for o in pb.ops if o.kind == "B"}
        self.b_of = {w: b for b, w in self.w_of.items()}

    def shift(self, st: State, r: int, i: int, j: int) -> State | None:
        """``st`` with rank r's op at position i (with its fused partner) moved to
        position j, or None when that breaks a same-rank rule or the memory limit."""
        row = st.order[r]
        x = row[i]
        if x in self.b_of and self.b_of[x] in st.fused:
            i -= 1                      # a fused W moves with its B
        block = row[i:i + 2] if row[i] in st.fused else row[i:i + 1]
        rest = row[:i] + row[i + len(block):]
        if not 0 <= j <= len(rest) or j == i:
            return None
        if j < i:
            if any(y in self.before[b] for b in block for y in rest[j:i]):
                return None
        elif any(b in self.before[y] for b in block for y in rest[i:j]):
            return None
        if j < len(rest) and rest[j] in self.b_of and self.b_of[rest[j]] in st.fused:
            return None                 # would split a fused pair
        new = rest[:j] + block + rest[j:]
        return self._checked(st, r, new, st.fused)

    def toggle(self, st: State, r: int, i: int) -> State | None:
        """Fuse the ``B`` at (r, i) with the ``W`` right after it, or split that pair."""
        row = st.order[r]
        x = row[i]
        if x in self.b_of:
            i, x = i - 1, self.b_of[x]
            if i < 0 or row[i] != x:
                return None
        if x not in self.w_of or i + 1 >= len(row) or row[i + 1] != self.w_of[x]:
            return None
        return self._checked(st, r, row, st.fused ^ {x})

    def _checked(self, st: State, r: int, new: list[int], fused: frozenset[int]
                 ) -> State | None:
        mem = self.pb.fused_memory(self.evaluate.memory, fused)
        level = top = 0.0
        for k in new:
            d = mem[k]
            if d > 0 and level + d > top:
                top = level + d
            level += d
        if top > self.pb.limit[r] + EPS:
            return None
        order = list(st.order)
        order[r] = new
        return State(order, fused)


def better(a: Evaluation, b: Evaluation) -> bool:
    """``a`` has a lower makespan than ``b``, or the same and a lower sum of last ends."""
    if a.makespan < b.makespan - EPS:
        return True
    return a.makespan <= b.makespan + EPS and a.ends < b.ends - EPS


def refine(pb: SearchProblem, start: State | Order, evaluate: Evaluator, deadline: float,
           *, seed: int = 0, restarts: int = 8,
           on_progress: Callable[[int, float], None] | None = None) -> RefineResult:
    """Improve ``start`` (valid, within the memory limit) until ``deadline``
    (``time.perf_counter()`` seconds) or a local optimum followed by ``restarts``
    perturbations that found nothing better. Returns the best state and its evaluation.
    Raises :class:`SchedsimError` if ``start`` itself cannot be simulated."""
    rng = random.Random(seed)
    cur = start if isinstance(start, State) else State(start)
    moves = _Moves(pb, evaluate)
    cur_ev = evaluate(cur)
    if cur_ev is None:
        raise SchedsimError("the starting order deadlocks or cannot be lowered with this "
                            "comm policy")
    best, best_ev = cur, cur_ev
    improvements = fails = 0
    converged = False
    while time.perf_counter() < deadline:
        nxt = _descend_step(pb, moves, cur, cur_ev, rng, deadline)
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
        cur, cur_ev = _perturb(pb, moves, best, best_ev, rng)
    return RefineResult(best, best_ev, evaluate.calls, improvements, converged)


def _candidates(pb: SearchProblem, st: State, ev: Evaluation, rng: random.Random
                ) -> list[tuple]:
    """Moves to try, most promising first: ``("shift", r, i, j)`` / ``("toggle", r, i)``
    around idle gaps (largest first), then random ones."""
    gaps = []
    for r, (sts, fin) in enumerate(zip(ev.starts, ev.finishes)):
        for k in range(1, len(sts)):
            g = sts[k] - fin[k - 1]
            if g > EPS:
                gaps.append((-g, r, k))
    gaps.sort()
    out: list[tuple] = []
    split = not pb.fused
    for _, r, k in gaps:
        n = len(ev.starts[r])
        far = min(n, k + 1 + WINDOW)
        out += [("shift", r, j, k) for j in range(k + 1, far)]   # pull into the gap
        out += [("shift", r, k, j) for j in range(k + 1, far)]   # push the stalled op
        out.append(("shift", r, k - 1, k))                        # the op before it after
        if split:
            out += [("toggle", r, j) for j in range(max(0, k - 2), min(n, k + 2))]
    for _ in range(2 * pb.n):
        r = rng.randrange(pb.ranks)
        n = len(st.order[r])
        if n < 2:
            continue
        i = rng.randrange(n)
        if split and rng.random() < 0.2:
            out.append(("toggle", r, i))
        else:
            out.append(("shift", r, i, min(n - 1, max(0, i + rng.choice((-1, 1))
                                                      * rng.randint(1, WINDOW)))))
    return out


def _apply(moves: _Moves, st: State, mv: tuple) -> State | None:
    return moves.shift(st, *mv[1:]) if mv[0] == "shift" else moves.toggle(st, *mv[1:])


def _descend_step(pb: SearchProblem, moves: _Moves, cur: State, cur_ev: Evaluation,
                  rng: random.Random, deadline: float) -> tuple[State, Evaluation] | None:
    """The first improving move from ``cur``, or None."""
    seen: set[tuple] = set()
    for mv in _candidates(pb, cur, cur_ev, rng):
        if mv in seen:
            continue
        seen.add(mv)
        if time.perf_counter() >= deadline:
            return None
        new = _apply(moves, cur, mv)
        if new is None or not _may_improve(pb, moves.evaluate, new, cur_ev):
            continue
        ev = moves.evaluate(new)
        if ev is not None and better(ev, cur_ev):
            return new, ev
    return None


def _may_improve(pb: SearchProblem, evaluate: Evaluator, st: State, cur: Evaluation
                 ) -> bool:
    """False when ``st`` cannot run (a cycle across ranks) or cannot beat ``cur``: its
    as-soon-as-possible times under data dependencies are a lower bound on any
    semantics' times (the engine only adds waits), so a makespan or sum of last ends
    already no better there stays no better when simulated."""
    dur = evaluate.durations(st.fused)
    start = asap(pb, st.order, dur=dur)
    if start is None:
        return False
    ends = [max((start[i] + dur[i] for i in row), default=0.0) for row in st.order]
    ms = max(ends, default=0.0)
    if ms > cur.makespan + EPS:
        return False
    return ms < cur.makespan - EPS or sum(ends) < cur.ends - EPS


def _perturb(pb: SearchProblem, moves: _Moves, st: State, ev: Evaluation,
             rng: random.Random) -> tuple[State, Evaluation]:
    """``st`` after a few random valid moves (the first such state that simulates)."""
    for _ in range(50):
        cur = st
        for _ in range(rng.randint(2, 4)):
            r = rng.randrange(pb.ranks)
            n = len(cur.order[r])
            if n < 2:
                continue
            i = rng.randrange(n)
            new = moves.shift(cur, r, i, min(n - 1, max(0, i + rng.randint(-WINDOW,
                                                                          WINDOW))))
            if new is not None:
                cur = new
        if cur is st or asap(pb, cur.order, dur=moves.evaluate.durations(cur.fused)) is None:
            continue
        got = moves.evaluate(cur)
        if got is not None:
            return cur, got
    return st, ev

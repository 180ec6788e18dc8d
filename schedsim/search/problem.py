"""The search problem: which ops each rank runs, what they cost, what they need and what
memory they hold, in the plain arrays the solver and the local search work on.

Ops are indexed ``0..n-1``. For every (stage, microbatch) there is one ``F`` and either
``B`` and ``W`` (split backward, zero-bubble style) or one ``BW`` (fused backward). An op
runs on ``placement.rank_of(stage, mb)``; its cost is ``CostModel.cost`` (> 0, so the ops
of a rank never share an instant and memory follows the order); its data inputs
are :func:`schedsim.program.routing.needs` (the one home of producer -> consumer rules); a
cross-rank input arrives ``latency + bytes / bandwidth`` after its producer ends (the
``data`` semantics of the engine, without link contention). Activation memory follows
:class:`schedsim.analysis.memory.MemoryModel` (allocation at op start, release at op end,
deltas scaled by ``ranks / stages``) so that the peak of an order equals what
``schedsim memory`` reports for its timeline.

Times and memory levels are also given as integers (``int_dur``, ``int_lag``,
``int_mem``, ``int_limit``) for CP-SAT: costs are scaled by the smallest factor that makes
them whole (:func:`int_scale`); when none up to ``10**6`` does, they are rounded at a
resolution of about ``1e-6`` of the largest cost and :attr:`SearchProblem.exact_time` is
False (the solver's bound is then approximate; makespans reported are always the engine's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from schedsim.analysis.memory import MemoryModel
from schedsim.errors import ScenarioError
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.program.routing import needs, producer_atoms
from schedsim.sim.costs import CostModel, LinkModel

#: the op kinds the search orders, per backward mode
SPLIT_KINDS = ("F", "B", "W")
FUSED_KINDS = ("F", "BW")


def int_scale(values: list[float], max_den: int = 10**6) -> tuple[int, bool]:
    """``(k, exact)``: the smallest k with every ``v * k`` whole (``exact`` True), or, if
    that needs ``k > max_den``, a power of ten giving ~1e-6 resolution of the largest
    value (``exact`` False). Values must be finite and >= 0."""
    k = 1
    for v in values:
        fr = Fraction(v).limit_denominator(max_den)
        if abs(float(fr) - v) > 1e-12 * max(1.0, abs(v)):
            break
        k = k * fr.denominator // math.gcd(k, fr.denominator)
        if k > max_den:
            break
    else:
        return k, True
    top = max((abs(v) for v in values), default=1.0) or 1.0
    return 10 ** max(0, 6 - math.floor(math.log10(top))), False


@dataclass
class SearchProblem:
    """One search instance (see module docstring). Lists are indexed by op.

    ``lags[i]``: ``(j, lag)`` pairs: op i may start ``lag`` after op j ends (data inputs;
    ``lag`` is the link cost across ranks, 0 on one rank). ``chains``: per (stage, kind) the
    ops in microbatch order, which the search keeps (as every built-in schedule and the
    authors' ILP do). ``mem[i]``: activation delta of op i (memory-model unit x
    ranks/stages), ``limit[r]``: peak allowed on rank r in that unit.
    """

    placement: Placement
    microbatches: int
    fused: bool
    ops: list[Op]
    rank: list[int]
    dur: list[float]
    lags: list[list[tuple[int, float]]]
    chains: list[list[int]]
    mem: list[float]
    limit: list[float]
    index: dict[tuple[str, int, int], int] = field(default_factory=dict)
    time_scale: int = 1
    exact_time: bool = True
    mem_scale: int = 1

    @property
    def n(self) -> int:
        return len(self.ops)

    @property
    def ranks(self) -> int:
        return self.placement.ranks

    def ops_of(self, r: int) -> list[int]:
        """Ops of rank ``r`` (index order)."""
        return [i for i in range(self.n) if self.rank[i] == r]

    # -- integer view for CP-SAT ---------------------------------------------------------
    def int_dur(self) -> list[int]:
        return [round(d * self.time_scale) for d in self.dur]

    def int_lags(self) -> list[list[tuple[int, int]]]:
        k = self.time_scale
        return [[(j, round(lag * k)) for j, lag in row] for row in self.lags]

    def int_mem(self) -> list[int]:
        """Deltas in integer units: allocations rounded up and releases rounded down in
        size, so an order that fits in integers fits in floats too."""
        k = self.mem_scale
        return [math.ceil(m * k - 1e-9) if m > 0 else -math.floor(-m * k + 1e-9)
                for m in self.mem]

    def int_limit(self, r: int) -> int:
        return math.floor(self.limit[r] * self.mem_scale + 1e-9)

    # -- orders --------------------------------------------------------------------------
    def schedule(self, order: list[list[int]], name: str = "search",
                 params: dict | None = None, fused: frozenset[int] = frozenset()
                 ) -> Schedule:
        """The :class:`Schedule` of a per-rank order of op indices; a ``B`` in ``fused``
        and the ``W`` right after it run as one ``BW``."""
        rows = []
        for row in order:
            out = []
            for i in row:
                op = self.ops[i]
                if op.kind == "W" and self.index[("B", op.stage, op.mb)] in fused:
                    continue
                out.append(Op("BW", op.stage, op.mb) if i in fused else op)
            rows.append(out)
        return Schedule(name=name, placement=self.placement, microbatches=self.microbatches,
                        ranks=rows, params=params or {})

    def order_of(self, schedule: Schedule) -> list[list[int]] | None:
        """The per-rank order of op indices of ``schedule`` (each ``BW`` as ``B`` then
        ``W`` when the problem splits the backward: see :meth:`order_and_fused`), or None when
        the schedule runs other ops (``FB`` pairs, a split backward on a fused problem) or
        another placement."""
        got = self.order_and_fused(schedule)
        return None if got is None else got[0]

    def order_and_fused(self, schedule: Schedule
                        ) -> tuple[list[list[int]], frozenset[int]] | None:
        """:meth:`order_of` and the ``B`` ops that ran fused (as ``BW``)."""
        pl = schedule.placement
        if (pl.kind, pl.ranks, pl.stages) != (self.placement.kind, self.ranks,
                                              self.placement.stages):
            return None
        if schedule.microbatches != self.microbatches:
            return None
        out, fused = [], set()
        for row in schedule.ranks:
            cur = []
            for op in row:
                if op.kind == "BW" and not self.fused:
                    keys = [("B", op.stage, op.mb), ("W", op.stage, op.mb)]
                else:
                    keys = [(op.kind, op.stage, op.mb)]
                for key in keys:
                    i = self.index.get(key)
                    if i is None:
                        return None
                    cur.append(i)
                if len(keys) == 2:
                    fused.add(cur[-2])
            out.append(cur)
        if sum(len(r) for r in out) != self.n:
            return None
        return out, frozenset(fused)

    def fused_durations(self, costs: CostModel, fused: frozenset[int]) -> list[float]:
        """Op durations when the ``B`` ops in ``fused`` run as ``BW`` with the ``W`` after
        them: the pair takes the ``BW`` cost, all of it on the ``B`` (whose output leaves
        only when the pair ends), the ``W`` none."""
        dur = list(self.dur)
        for i in fused:
            op = self.ops[i]
            dur[i] = costs.kind_cost("BW", op.stage, op.mb)
            dur[self.index[("W", op.stage, op.mb)]] = 0.0
        return dur

    def fused_memory(self, memory: MemoryModel, fused: frozenset[int]) -> list[float]:
        """Activation deltas when the ``B`` ops in ``fused`` run as ``BW``: the pair
        releases the ``BW`` delta at its end (on the ``W``, the pair's last op)."""
        if not fused:
            return self.mem
        k = memory.factor(self.ranks, self.placement.stages)
        mem = list(self.mem)
        for i in fused:
            op = self.ops[i]
            mem[i] = 0.0
            mem[self.index[("W", op.stage, op.mb)]] = memory.BW * k
        return mem

    def peak(self, order: list[list[int]], mem: list[float] | None = None) -> list[float]:
        """Peak activation per rank of ``order`` (ops of a rank never overlap, so the
        level before op k is the sum of the deltas before it; an allocation counts from
        the op's start). ``mem``: other deltas (e.g. :meth:`fused_memory`)."""
        mem = self.mem if mem is None else mem
        out = []
        for row in order:
            level = top = 0.0
            for i in row:
                d = mem[i]
                if d > 0:
                    top = max(top, level + d)
                level += d
            out.append(top)
        return out

    def fits(self, order: list[list[int]], mem: list[float] | None = None) -> bool:
        return all(p <= lim + 1e-9 for p, lim in zip(self.peak(order, mem), self.limit))


def build_problem(placement: Placement, microbatches: int, costs: CostModel,
                  link: LinkModel, memory: MemoryModel, limit: float | list[float],
                  fused: bool = False) -> SearchProblem:
    """Build the :class:`SearchProblem` for ``placement`` (``loop`` or ``v``) and
    ``microbatches``. ``limit``: peak activation memory allowed per rank in ``memory``'s
    unit, one value for every rank or one per rank.

    Raises :class:`ScenarioError` for a placement the search does not handle or a limit
    below what any order needs (one microbatch's activations on a rank).
    """
    if placement.kind not in ("loop", "v"):
        raise ScenarioError(f"search handles loop and v placements, not {placement.kind!r}")
    S, M = placement.stages, microbatches
    kinds = FUSED_KINDS if fused else SPLIT_KINDS
    factor = memory.factor(placement.ranks, S)
    ops: list[Op] = []
    index: dict[tuple[str, int, int], int] = {}
    for k in kinds:
        for s in range(S):
            for mb in range(M):
                index[(k, s, mb)] = len(ops)
                ops.append(Op(k, s, mb))
    rank = [placement.rank_of(o.stage, o.mb) for o in ops]
    dur = [costs.cost(o) for o in ops]
    zero = next((o for o, d in zip(ops, dur) if d <= 0), None)
    if zero is not None:
        raise ScenarioError(f"search needs every op to cost more than 0 ({zero.kind} of "
                            f"stage {zero.stage}, mb {zero.mb} costs 0): a zero-length op "
                            f"has no place in time (fold W into B with --backward fused)")
    lags: list[list[tuple[int, float]]] = []
    for i, o in enumerate(ops):
        row = []
        for key in needs(o, S):
            j = next(index[a] for a in producer_atoms(key) if a in index)
            lag = 0.0
            if rank[j] != rank[i]:
                lat, bw = link.params(rank[j], rank[i])
                lag = lat + (0.0 if math.isinf(bw) else costs.bytes_of(key[1]) / bw)
            row.append((j, lag))
        lags.append(row)
    chains = [[index[(k, s, mb)] for mb in range(M)] for k in kinds for s in range(S)]
    mem = [getattr(memory, o.kind) * factor for o in ops]
    limits = [float(limit)] * placement.ranks if isinstance(limit, (int, float)) else \
        [float(x) for x in limit]
    if len(limits) != placement.ranks:
        raise ScenarioError(f"memory limit has {len(limits)} values for {placement.ranks} "
                            f"ranks: give one value, or one per rank")
    pb = SearchProblem(placement, M, fused, ops, rank, dur, lags, chains, mem, limits, index)
    for r, (need, lim) in enumerate(zip(min_limit(pb), limits)):
        if lim < need - 1e-9:
            raise ScenarioError(f"memory limit {lim:g} on rank {r} is below what any order "
                                f"needs ({need:g}: one microbatch's activations there); "
                                f"raise --mem-limit")
    times = dur + [lag for row in lags for _, lag in row]
    pb.time_scale, pb.exact_time = int_scale(times)
    pb.mem_scale, _ = int_scale(mem + limits, 10**4)
    return pb


def min_limit(pb: SearchProblem) -> list[float]:
    """Per rank, the least peak any order can have: a rank holds every forward delta of
    one microbatch before its first backward of that microbatch can run (the loss needs
    every forward), and running microbatches one at a time reaches exactly that."""
    need = [0.0] * pb.ranks
    for i, o in enumerate(pb.ops):
        if o.mb == 0 and pb.mem[i] > 0:
            need[pb.rank[i]] += pb.mem[i]
    return need


def sequential_order(pb: SearchProblem) -> list[list[int]]:
    """Every microbatch through all its ops before the next starts (forwards by stage,
    then backwards by stage descending): always valid and at the least peak memory;
    the fallback warm start when no built-in schedule fits the limit."""
    out: list[list[int]] = [[] for _ in range(pb.ranks)]
    S = pb.placement.stages
    bk = ("BW",) if pb.fused else ("B", "W")
    for mb in range(pb.microbatches):
        seq = [("F", s, mb) for s in range(S)]
        seq += [(k, s, mb) for s in reversed(range(S)) for k in bk]
        for key in seq:
            i = pb.index[key]
            out[pb.rank[i]].append(i)
    return out

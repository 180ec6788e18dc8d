"""The zero-bubble automatic scheduling heuristic for one chunk per rank (ZB-1p, ZB-2p).

Source: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 3.1
("Automatic scheduling", the heuristic that seeds the ILP); algorithm as in
sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py`` (``Graph.manual_order``,
``initial_solution``, ``create_scheduled_nodes``), re-implemented here.

Timing model (the one the heuristic plans with): each rank runs its ops back to back; a
pass starts at ``max(end of the previous op on the rank, end of its cross-rank producer +
comm)``. Producers: ``F(s)`` <- ``F(s-1)``, ``B(s)`` <- ``B(s+1)`` (last stage: its own
``F``), ``W(s)`` <- ``B(s)``. Memory (per rank, in one microbatch's activations ``M_B``):
``F`` +1, ``B`` -1/2, ``W`` -1/2 by default, checked against ``max_mem`` before an op is
placed.

The heuristic walks microbatches in order. Microbatch 0 is followed down the pipeline and
each rank gets as many warm-up forwards as fit before the first backward reaches it (and
in memory). Then for each further microbatch every rank places one ``F`` and one ``B``,
deferring ``W`` passes into the gaps where the rank would otherwise wait for its input
(or when memory requires a ``W`` to free activations). Three switches
(``allow_bubble_before_first_b``, ``prioritize_b``, ``no_bubble_greedy``) give eight
variants; the one with the shortest longest-stage span wins (first one on ties, in the
authors' order).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from schedsim.errors import ScheduleError

F, B, W = 0, 1, 2


class MemoryExceeded(Exception):
    """A variant of the heuristic cannot keep a rank under the memory limit."""


@dataclass
class ZBProblem:
    """Inputs of the heuristic. Lists are per stage (= rank); times in the cost unit.

    ``mem`` holds the activation deltas of F, B, W (default 2, -1, -1: one microbatch's
    activations ``M_B`` = 2 units, B and W each free half) and ``max_mem`` the per-stage
    limit in the same unit (None: the authors' default, 3 x m microbatches, i.e. no limit
    in practice).
    """

    stages: int
    microbatches: int
    cost_f: list[float]
    cost_b: list[float]
    cost_w: list[float]
    comm: float = 0.0
    mem: tuple[float, float, float] = (2, -1, -1)
    max_mem: list[float] | None = None


@dataclass
class ZBResult:
    """``order[s]``: stage s's ops as ``(kind, mb)`` with kind 0=F, 1=B, 2=W, sorted by
    completion time; ``end[kind][s][mb]``: planned completion times; ``span``: the longest
    stage span (first F start to last W end), which the heuristic minimises."""

    order: list[list[tuple[int, int]]]
    end: list[list[list[float]]]
    span: float
    variant: tuple[bool, bool, bool]


class _ZBPlanner:
    """One variant of the heuristic (``manual_order`` in the authors' code): the state of
    the walk -- per stage its clock, memory, planned bubble and ops placed -- and its
    phases as methods (:meth:`fill_pipeline`, :meth:`steady`, :meth:`finish`)."""

    def __init__(self, pb: ZBProblem, allow_bubble_before_first_b: bool,
                 prioritize_b: bool, no_bubble_greedy: bool) -> None:
        S, M = self.S, self.M = pb.stages, pb.microbatches
        self.flags = (allow_bubble_before_first_b, prioritize_b, no_bubble_greedy)
        self.cost = (pb.cost_f, pb.cost_b, pb.cost_w)
        self.mem_d, self.comm = pb.mem, pb.comm
        self.limit = pb.max_mem or [pb.mem[F] * M * 3] * S
        self.end = [[[0.0] * M for _ in range(S)] for _ in range(3)]  # unplaced: 0
        self.cnt = [[0] * S for _ in range(3)]   # placed ops per kind and stage
        self.busy_until = [0.0] * S              # end of the stage's last op
        self.mem = [0.0] * S
        self.bubble = [0.0] * S                  # idle time planned after the first F
        self.placed: list[list[tuple[int, int]]] = [[] for _ in range(S)]
        # flags whose test came out differently for the other value (see zb_schedule)
        self.used = [False, False, False]

    def place(self, s: int, k: int) -> None:
        """Place stage s's next op of kind k after the stage's last op and its input
        (F: stage s-1's F, B: stage s+1's B, plus the comm cost)."""
        cnt = self.cnt[k]
        mb = cnt[s]
        c = self.cost[k][s]
        t = packed = self.busy_until[s] + c
        if k == F:
            if s > 0:
                x = self.end[F][s - 1][mb] + self.comm + c
                if x > t:
                    t = x
        elif k == B and s < self.S - 1:
            x = self.end[B][s + 1][mb] + self.comm + c
            if x > t:
                t = x
        if self.cnt[F][s] > 0:
            self.bubble[s] += t - packed
        self.busy_until[s] = t
        self.end[k][s][mb] = t
        self.mem[s] += self.mem_d[k]
        self.placed[s].append((k, mb))
        cnt[s] = mb + 1

    def spare(self, s: int) -> float:
        return max(self.bubble) - self.bubble[s]

    def free_for(self, s: int, delta: float) -> None:
        """Run deferred W passes until ``delta`` more memory fits."""
        _, bc, wc = self.cnt
        while self.mem[s] + delta > self.limit[s]:
            if wc[s] >= bc[s]:
                raise MemoryExceeded
            self.place(s, W)

    def fill_gap(self, s: int, ready: float) -> None:
        """Place deferred W passes that fit before the input arriving at ``ready``."""
        _, bc, wc = self.cnt
        busy, cost_w = self.busy_until, self.cost[W][s]
        while wc[s] < bc[s] and busy[s] + cost_w <= ready:
            self.place(s, W)
        if wc[s] < bc[s] and busy[s] < ready:
            if ready - busy[s] <= self.spare(s):
                self.used[2] = True
                if self.flags[2]:                      # no_bubble_greedy
                    self.place(s, W)
            else:
                self.place(s, W)

    def warmup_counts(self) -> list[int]:
        """Warm-up forwards per stage: as many as fit (in time and memory) before
        microbatch 0's backward comes back, then no more than the stage above."""
        S, M, cost, comm, fc = self.S, self.M, self.cost, self.comm, self.cnt[F]
        warm = [0] * S
        last_t = 0.0
        for s in range(S - 1, -1, -1):
            if s == S - 1:
                last_t = self.end[F][s][0] + cost[B][s]
                continue
            m_s, t_s = self.mem[s], self.busy_until[s]
            while fc[s] + warm[s] < M and m_s + self.mem_d[F] <= self.limit[s]:
                stop_if = (t_s + cost[F][s] > last_t + comm, t_s >= last_t + comm)
                if stop_if[0] != stop_if[1]:
                    self.used[0] = True
                if stop_if[0] if self.flags[0] else stop_if[1]:  # allow_bubble_before_first_b
                    break
                m_s += self.mem_d[F]
                t_s += cost[F][s]
                warm[s] += 1
            last_t = max(t_s, last_t + comm) + cost[B][s]
        for s in range(1, S):
            while warm[s] > 0 and warm[s] >= warm[s - 1] and fc[s] + warm[s] < M:
                warm[s] -= 1
        return warm

    def fill_pipeline(self) -> None:
        """Microbatch 0 down the pipeline, the warm-up forwards, microbatch 0 back up."""
        for s in range(self.S):
            self.place(s, F)
        for s, n in enumerate(self.warmup_counts()):
            for _ in range(n):
                self.place(s, F)
        for s in range(self.S - 1, -1, -1):
            self.place(s, B)

    def wants_forward(self, s: int) -> bool:
        """Whether stage s places a forward this round (``prioritize_b`` may hold it back
        while the stage below is about to hand it a backward)."""
        S, fc = self.S, self.cnt[F]
        if fc[s] >= self.M:
            return False
        if not (s + 1 < S and fc[s] >= fc[s + 1] + 2):
            return True
        held = not self._forward_fits(s)        # prioritize_b holds this forward back
        if held:
            self.used[1] = True
        return not (self.flags[1] and held)

    def _forward_fits(self, s: int) -> bool:
        """``prioritize_b``'s test: whether stage s's forward (and the W passes memory
        requires first) ends before the stage below can hand it a backward, or the wait
        for that backward would exceed the stage's bubble budget."""
        S, cost, (_, bc, wc) = self.S, self.cost, self.cnt
        busy = self.busy_until[s]
        next_ready = self.busy_until[s + 1] + cost[F][s + 1] + cost[B][s + 1] + self.comm
        if busy >= next_ready:
            return False
        w_cost, w_n, m_w = 0.0, 0, self.mem[s] + self.mem_d[F]
        while m_w > self.limit[s] and wc[s] + w_n < bc[s]:
            w_cost += cost[W][s]
            m_w += self.mem_d[W]
            w_n += 1
        if busy + cost[F][s] + w_cost <= next_ready:
            return True
        return not next_ready - busy <= self.spare(s)

    def steady(self, i: int) -> None:
        """Microbatch i: one F (where wanted, never ahead of the stage above's choice)
        then one B per stage, deferred W passes filling the waits."""
        S, fc, (_, bc, wc) = self.S, self.cnt[F], self.cnt
        want = [int(self.wants_forward(s)) for s in range(S)]
        for s in range(S - 2, -1, -1):
            want[s] = min(want[s], want[s + 1])
        for s in range(S):
            if not want[s]:
                continue
            self.free_for(s, self.mem_d[F])
            if s > 0:
                self.fill_gap(s, self.end[F][s - 1][fc[s]] + self.comm)
            self.place(s, F)
        for s in range(S - 1, -1, -1):
            self.free_for(s, self.mem_d[B])
            if s + 1 < S:
                self.fill_gap(s, self.end[B][s + 1][i] + self.comm)
            if s == 0 and fc[s] == self.M:
                while wc[s] < bc[s]:
                    self.place(s, W)
            self.place(s, B)

    def finish(self) -> ZBResult:
        S, M, end, cost = self.S, self.M, self.end, self.cost
        for s in range(S):
            while self.cnt[W][s] < M:
                self.place(s, W)
        span = max(end[W][s][M - 1] - end[F][s][0] + cost[F][s] for s in range(S))
        # the runtime orders each stage by completion time (ties: F < B < W, then mb)
        order = []
        for s, row in enumerate(self.placed):
            keyed = [(end[k][s][mb], k, mb) for k, mb in row]
            keyed.sort()
            order.append([(k, mb) for _, k, mb in keyed])
        return ZBResult(order, end, span, self.flags)

    def run(self) -> ZBResult:
        self.fill_pipeline()
        for i in range(1, self.M):
            self.steady(i)
        return self.finish()


def _plan(pb: ZBProblem, allow_bubble_before_first_b: bool, prioritize_b: bool,
          no_bubble_greedy: bool) -> ZBResult:
    """One variant of the heuristic (``manual_order`` in the authors' code)."""
    return _ZBPlanner(pb, allow_bubble_before_first_b, prioritize_b, no_bubble_greedy).run()


def zb_schedule(pb: ZBProblem) -> ZBResult:
    """Best of the heuristic's eight variants (``initial_solution``): the shortest
    longest-stage span, the first variant in the authors' order on ties.

    A variant that cannot stay under the memory limit is skipped (the authors' code
    stops with "Cannot fit memory"); raises :class:`ScheduleError` if every variant fails.
    """
    best: ZBResult | None = None
    done: dict[tuple[bool, ...], ZBResult | None] = {}
    for flags in product((True, False), repeat=3):
        if flags not in done:
            planner = _ZBPlanner(pb, *flags)
            try:
                res = planner.run()
            except MemoryExceeded:
                res = None
            # a flag whose every test came out the same for both values gives the same
            # walk, step for step, with it flipped: that variant is this one (exact)
            for other in product(*[(f,) if u else (True, False)
                                   for f, u in zip(flags, planner.used)]):
                done.setdefault(other, res)
        res = done[flags]
        if res is None:
            continue
        res = replace(res, variant=flags)
        if best is None or res.span < best.span:
            best = res
    if best is None:
        raise ScheduleError(
            f"zero-bubble heuristic: no schedule keeps every rank under the memory limit "
            f"{_fmt_limit(pb)} M_B for {pb.stages} ranks x {pb.microbatches} microbatches; "
            f"raise --mem-limit")
    return best


def _fmt_limit(pb: ZBProblem) -> str:
    lim = [x / pb.mem[F] for x in pb.max_mem or []]
    vals = sorted(set(lim))
    return "/".join(f"{v:g}" for v in vals) if vals else "default"

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

from dataclasses import dataclass
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


def _plan(pb: ZBProblem, allow_bubble_before_first_b: bool, prioritize_b: bool,
          no_bubble_greedy: bool) -> ZBResult:
    """One variant of the heuristic (``manual_order`` in the authors' code)."""
    S, M = pb.stages, pb.microbatches
    cost = (pb.cost_f, pb.cost_b, pb.cost_w)
    mem_d = pb.mem
    comm = pb.comm
    limit = pb.max_mem or [mem_d[F] * M * 3] * S
    end = [[[0.0] * M for _ in range(S)] for _ in range(3)]   # unplaced ops read as 0
    cnt = [[0] * S for _ in range(3)]          # placed ops per kind and stage
    busy_until = [0.0] * S                     # end of the stage's last op
    mem = [0.0] * S
    bubble = [0.0] * S                         # idle time planned after the first F
    placed: list[list[tuple[int, int]]] = [[] for _ in range(S)]
    fc, bc, wc = cnt

    def place(s: int, k: int) -> None:
        mb = cnt[k][s]
        c = cost[k][s]
        t = busy_until[s] + c
        packed = t
        if k == F and s > 0:
            t = max(t, end[F][s - 1][mb] + comm + c)
        elif k == B and s < S - 1:
            t = max(t, end[B][s + 1][mb] + comm + c)
        if fc[s] > 0:
            bubble[s] += t - packed
        busy_until[s] = t
        end[k][s][mb] = t
        mem[s] += mem_d[k]
        placed[s].append((k, mb))
        cnt[k][s] += 1

    def spare(s: int) -> float:
        return max(bubble) - bubble[s]

    def free_for(s: int, delta: float) -> None:
        while mem[s] + delta > limit[s]:
            if wc[s] >= bc[s]:
                raise MemoryExceeded
            place(s, W)

    def fill_gap(s: int, ready: float) -> None:
        """Place deferred W passes that fit before the input arriving at ``ready``."""
        while wc[s] < bc[s] and busy_until[s] + cost[W][s] <= ready:
            place(s, W)
        if wc[s] < bc[s] and busy_until[s] < ready:
            if ready - busy_until[s] <= spare(s):
                if no_bubble_greedy:
                    place(s, W)
            else:
                place(s, W)

    # microbatch 0: fill the pipeline
    for s in range(S):
        place(s, F)
    warm = [0] * S
    last_t = 0.0
    for s in range(S - 1, -1, -1):
        if s == S - 1:
            last_t = end[F][s][0] + cost[B][s]
            continue
        m_s, t_s = mem[s], busy_until[s]
        while fc[s] + warm[s] < M and m_s + mem_d[F] <= limit[s]:
            if allow_bubble_before_first_b:
                if t_s + cost[F][s] > last_t + comm:
                    break
            elif t_s >= last_t + comm:
                break
            m_s += mem_d[F]
            t_s += cost[F][s]
            warm[s] += 1
        last_t = max(t_s, last_t + comm) + cost[B][s]
    for s in range(1, S):
        while warm[s] > 0 and warm[s] >= warm[s - 1] and fc[s] + warm[s] < M:
            warm[s] -= 1
    for s in range(S):
        for _ in range(warm[s]):
            place(s, F)
    for s in range(S - 1, -1, -1):
        place(s, B)

    # steady state: one F and one B per stage and microbatch
    for i in range(1, M):
        want = [0] * S
        for s in range(S):
            if fc[s] >= M:
                continue
            if prioritize_b and s + 1 < S and fc[s] >= fc[s + 1] + 2:
                next_ready = (busy_until[s + 1] + cost[F][s + 1] + cost[B][s + 1] + comm)
                if busy_until[s] >= next_ready:
                    continue
                w_cost, w_n, m_w = 0.0, 0, mem[s] + mem_d[F]
                while m_w > limit[s] and wc[s] + w_n < bc[s]:
                    w_cost += cost[W][s]
                    m_w += mem_d[W]
                    w_n += 1
                if busy_until[s] + cost[F][s] + w_cost <= next_ready:
                    want[s] = 1
                    continue
                if next_ready - busy_until[s] <= spare(s):
                    continue
            want[s] = 1
        for s in range(S - 2, -1, -1):
            want[s] = min(want[s], want[s + 1])
        for s in range(S):
            if not want[s]:
                continue
            free_for(s, mem_d[F])
            if s > 0:
                fill_gap(s, end[F][s - 1][fc[s]] + comm)
            place(s, F)
        for s in range(S - 1, -1, -1):
            free_for(s, mem_d[B])
            if s + 1 < S:
                fill_gap(s, end[B][s + 1][i] + comm)
            if s == 0 and fc[s] == M:
                while wc[s] < bc[s]:
                    place(s, W)
            place(s, B)

    for s in range(S):
        while wc[s] < M:
            place(s, W)
    span = max(end[W][s][M - 1] - end[F][s][0] + cost[F][s] for s in range(S))
    # the runtime orders each stage by completion time (ties: F < B < W, then mb)
    order = [sorted(row, key=lambda km, s=s: (end[km[0]][s][km[1]], km[0], km[1]))
             for s, row in enumerate(placed)]
    return ZBResult(order, end, span,
                    (allow_bubble_before_first_b, prioritize_b, no_bubble_greedy))


def zb_schedule(pb: ZBProblem) -> ZBResult:
    """Best of the heuristic's eight variants (``initial_solution``): the shortest
    longest-stage span, the first variant in the authors' order on ties.

    A variant that cannot stay under the memory limit is skipped (the authors' code
    stops with "Cannot fit memory"); raises :class:`ScheduleError` if every variant fails.
    """
    best: ZBResult | None = None
    for flags in product((True, False), repeat=3):
        try:
            res = _plan(pb, *flags)
        except MemoryExceeded:
            continue
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

"""The ZB-V heuristic: zero bubble with a V-shaped placement of two chunks per rank.

Source: Qi et al., "Pipeline Parallelism with Controllable Memory" (2024) Section 4 and
the ZB-V schedule of "Zero Bubble Pipeline Parallelism" (ICLR 2024, Section 6 of the
arXiv version); algorithm as in sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py`` (``PipelineGraph.
try_v_schedule`` and ``create_schedule``), re-implemented here.

Each rank s holds chunk 0 (layer group s) and chunk 1 (layer group 2p-1-s): a microbatch's
forward runs down chunk 0 of ranks 0..p-1 and back up chunk 1 of ranks p-1..0; its input
gradient (``B``) runs the V the other way. Passes are indexed here by *leg*: ``F`` leg 0 is
chunk 0 and ``F`` leg 1 chunk 1; ``B`` leg 0 is chunk 1 (it starts at rank 0 after the
loss) and ``B`` leg 1 chunk 0. Leg 0 passes wait for rank s-1, leg 1 passes for rank s+1
(plus the per-hop comm cost); ``W`` waits only for its ``B`` on the same rank.

Phases: (1) warm-up forwards on chunk 0 until the first chunk-1 forward comes back, under
the memory limit; (2) ranks below take forwards alternately from both chunks until they
have as many as the rank above; (3) 2m rounds, each placing one ``B`` and then one ``F``
per rank, deferring ``W`` passes into gaps where the rank would wait for its input (and
flushing them when memory requires), with a per-rank bubble budget. The whole plan is
repeated with the previous run's per-rank bubbles as "approved" budgets while the worst
rank's bubble keeps shrinking, for each of the four ``fill_b``/``fill_f`` switches; the
smallest worst bubble wins (first one on ties).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import product

from schedsim.errors import ScheduleError

F, B, W = 0, 1, 2


class InfeasibleV(Exception):
    """The plan cannot proceed (memory limit, or a pass whose input never comes)."""


@dataclass
class VProblem:
    """Inputs: ranks, microbatches, per-chunk-pass costs ``(F, B, W)``, per-hop comm cost,
    memory deltas per chunk pass and the per-rank limit (same unit; default limit
    ``2 x ranks`` chunk forwards = p microbatches, the 1F1B peak, and the authors'
    default)."""

    ranks: int
    microbatches: int
    cost: tuple[float, float, float]
    comm: float = 0.0
    mem: tuple[float, float, float] = (2, -1, -1)
    max_mem: float | None = None


@dataclass
class VPlan:
    """``order[r]``: rank r's passes as ``(kind, leg, mb)`` in execution order;
    ``bubble[r]``: planned idle time after the rank's first forward; ``worst``: max."""

    order: list[list[tuple[int, int, int]]]
    bubble: list[float]
    worst: float


def _try(pb: VProblem, fill_f: bool, fill_b: bool, approved: list[float] | None) -> VPlan:
    """One plan (``try_v_schedule`` without its recursion)."""
    n, m = pb.ranks, pb.microbatches
    cost, comm, md = pb.cost, pb.comm, pb.mem
    limit = pb.max_mem if pb.max_mem is not None else md[F] * n * 2
    size = 6 * n * m
    # flat end-time table indexed like the authors' (kind, leg, rank, mb) ids, so that
    # "no producer" (-1) reads the last entry, exactly as their code does
    end = [-1.0] * size

    def key(k: int, leg: int, s: int, mb: int) -> int:
        return ((k * 2 + leg) * n + s) * m + mb

    count = [[0] * 6 for _ in range(n)]
    cur = [0.0] * n
    mem = [0.0] * n
    bubble = [0.0] * n
    pending: list[deque[tuple[int, int]]] = [deque() for _ in range(n)]
    order: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    if approved is None:
        approved = [-1.0] * n
    top_approved = max(approved)

    def budget(s: int) -> float:
        return max(max(bubble), top_approved - approved[s])

    def place(k: int, leg: int, s: int) -> None:
        t = packed = cur[s] + cost[k]
        mb = count[s][k * 2 + leg]
        if mb >= m:
            raise InfeasibleV(f"rank {s} has no {'FBW'[k]} left on leg {leg}")
        if mem[s] + md[k] > limit:
            raise InfeasibleV(f"rank {s} would exceed the memory limit")
        if k == W:      # same-rank predecessor: F leg 0 -> F leg 1 -> B leg 0 -> B leg 1
            prev = key(B, leg, s, mb)
        elif k or leg:
            j = k * 2 + leg - 1
            prev = key(j // 2, j % 2, s, mb)
        else:
            prev = -1
        if prev >= 0 and end[prev] < 0:
            raise InfeasibleV(f"rank {s}: {'FBW'[k]} leg {leg} mb {mb} before its input")
        if k < 2:
            if leg == 1 and s < n - 1:
                src = end[key(k, 1, s + 1, mb)]
                if src < 0:
                    raise InfeasibleV(f"rank {s} would run {'FB'[k]} of mb {mb} before "
                                      f"its input is planned")
                t = max(t, src + comm + cost[k])
            elif leg == 0 and s > 0:
                src = end[key(k, 0, s - 1, mb)]
                if src < 0:
                    raise InfeasibleV(f"rank {s} would run {'FB'[k]} of mb {mb} before "
                                      f"its input is planned")
                t = max(t, src + comm + cost[k])
        if count[s][0] > 0:
            bubble[s] += t - packed
        end[key(k, leg, s, mb)] = t
        cur[s] = t
        mem[s] += md[k]
        order[s].append((k, leg, mb))
        if k == B:
            pending[s].append((leg, mb))
        count[s][k * 2 + leg] += 1

    def place_w(s: int) -> None:
        if not pending[s]:
            raise InfeasibleV(f"rank {s} exceeds the memory limit")
        leg, _ = pending[s].popleft()
        place(W, leg, s)

    def fill(s: int, src_id: int, switch: bool) -> None:
        """Defer-W rule before a pass whose input is ``end[src_id]`` (-1: none)."""
        while pending[s] and src_id >= 0 and end[src_id] + comm >= cur[s] + cost[W]:
            place_w(s)
        if pending[s] and end[src_id] + comm - cur[s] > budget(s) - bubble[s] and switch:
            place_w(s)

    # (1) warm-up: forwards on chunk 0 until chunk 1's first forward comes back
    for s in range(n):
        place(F, 0, s)
    for s in range(n - 1, -1, -1):
        if s == n - 1:
            place(F, 1, s)
            continue
        back = end[key(F, 1, s + 1, 0)] + comm
        while (mem[s] + md[F] * (2 + s * 2) <= limit and cur[s] + cost[F] <= back
               and count[s][0] < m):
            for j in range(s + 1):
                place(F, 0, j)
        place(F, 1, s)
    # (2) lower ranks catch up, alternating chunks
    leg = 0
    guard = 4 * n * m + 8
    for s in range(1, n):
        while (count[s][0] + count[s][1] < count[s - 1][0] + count[s - 1][1]
               or count[s][1] <= count[s - 1][1] < m):
            guard -= 1
            if guard < 0:
                raise InfeasibleV("warm-up does not converge")
            for j in range(n - 1, s - 1, -1):
                if count[j][leg] < m:
                    place(F, leg, j)
            leg = 1 - leg
    # (3) steady state and cooldown: one B then one F per rank and round
    for _ in range(2 * m):
        for s in range(n):
            while mem[s] + md[B] > limit:
                place_w(s)
        b_leg0, b_leg1 = [], []
        for s in range(n):
            if count[s][3] >= count[s][2]:
                b_leg0.append(s)
            elif s == n - 1:
                b_leg1.append(s)
            elif end[key(B, 1, s + 1, count[s][3])] >= 0 or count[s][2] >= m:
                b_leg1.append(s)
            else:
                b_leg0.append(s)
        for s, lg in [(s, 1) for s in reversed(b_leg1)] + [(s, 0) for s in b_leg0]:
            src = -1
            if lg == 1 and s < n - 1:
                src = key(B, 1, s + 1, count[s][3])
            if lg == 0 and s > 0:
                src = key(B, 0, s - 1, count[s][2])
            fill(s, src, lg == 1 or fill_b)
            place(B, lg, s)
        for s in range(n):
            if count[s][1] >= m:
                continue
            nxt = None
            if count[s][1] >= count[s][0]:
                nxt = 0
            elif s == n - 1:
                nxt = 1
            elif end[key(F, 1, s + 1, count[s][1])] >= 0:
                nxt = 1
            elif count[s][0] < m and (s == 0 or end[key(F, 0, s - 1, count[s][0])] >= 0):
                nxt = 0
            if nxt is None:
                continue
            while mem[s] + md[F] > limit:
                place_w(s)
            src = -1
            if nxt == 0 and s > 0:
                src = key(F, 0, s - 1, count[s][0])
            if nxt == 1 and s < n - 1:
                src = key(F, 1, s + 1, count[s][1])
            fill(s, src, fill_f)
            place(F, nxt, s)
    for s in range(n):
        while pending[s]:
            place_w(s)
    return VPlan(order, bubble, max(bubble))


def _refined(pb: VProblem, fill_f: bool, fill_b: bool) -> VPlan:
    """A plan re-run with its own per-rank bubbles as approved budgets while the worst
    bubble strictly shrinks (the authors' recursion, unrolled)."""
    best = _try(pb, fill_f, fill_b, None)
    while True:
        nxt = _try(pb, fill_f, fill_b, best.bubble)
        if nxt.worst < best.worst:
            best = nxt
        else:
            return best


def zbv_plan(pb: VProblem) -> VPlan:
    """The ZB-V order: best of ``fill_b`` x ``fill_f`` in {True, False} (authors' order,
    first on ties). Raises :class:`ScheduleError` if no variant is feasible."""
    best: VPlan | None = None
    why = ""
    for fill_b, fill_f in product((True, False), repeat=2):
        try:
            plan = _refined(pb, fill_f, fill_b)
        except InfeasibleV as e:
            why = str(e)
            continue
        if best is None or plan.worst < best.worst:
            best = plan
    if best is None:
        lim = (pb.max_mem if pb.max_mem is not None else pb.mem[F] * pb.ranks * 2) / pb.mem[F]
        raise ScheduleError(
            f"zbv: the ZB-V heuristic finds no plan for {pb.ranks} ranks x "
            f"{pb.microbatches} microbatches under a limit of {lim:g} chunk forwards "
            f"({lim / 2:g} M_B): {why}; raise --mem-limit (the default, ranks, is the "
            f"authors' setting)")
    return best

"""V-Half and V-Min: V-shape schedules with controllable memory (1/2 and 1/3 of 1F1B's).

Source: Qi, Wan, Huang, Lin, "Pipeline Parallelism with Controllable Memory" (2024),
Sections 3-4 (building blocks, "V-Min" and "V-Half", squeezing and reordering); algorithm
as in sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py``
(``stable_pattern_v_min``, ``stable_pattern_v_half``, ``put_w``, ``mem_of_stage``,
``eager_execution_time``, ``reorder``, ``schedule_from_pattern``), re-implemented here.

A schedule is built on a grid of unit time slots. The *building block* gives, for each
rank, the slot offsets (within a period of 6 slots per microbatch) of its four passes:
``F`` (chunk 0 forward), ``f`` (chunk 1 forward), ``B`` (chunk 1 input gradient, the
first backward after the loss at rank 0) and ``b`` (chunk 0 input gradient). Repeating
the block every 6 slots gives a stable pattern whose warm-up and cooldown have holes;
``W`` passes go into the earliest free slots after their ``B``. Then the warm-up and
cooldown are *squeezed*: pass by pass in slot order, each pass moves to the earliest free
slot after its dependencies that does not raise the rank's peak memory (first with ``W``
placed, then again without). Finally ``W`` passes are split per chunk and placed again, and
the rank's order is the slot order. The order does not depend on the costs.
"""
from __future__ import annotations

import heapq

from schedsim.errors import ScheduleError

TYPES = 4        # F, f, B, b ; W lists are appended after these


class InfeasiblePattern(Exception):
    """The pattern cannot be laid out (its dependencies or slots are inconsistent)."""


def pattern_v_min(n: int) -> list[list[int]]:
    """V-Min building block (about 1/3 of 1F1B's activation memory): per rank the slot
    offsets of F, f, B, b. The gap ``interval`` of 2 when 3 divides n keeps the pattern
    free of collisions."""
    gap = 2 if n % 3 == 0 else 0
    return [[i, 2 * n - i - 1, 2 * n + gap + i, 4 * n + gap - i - 1] for i in range(n)]


def pattern_v_half(n: int) -> list[list[int]]:
    """V-Half building block (about 1/2 of 1F1B's activation memory); gap 3 for even n."""
    gap = 3 if n % 2 == 0 else 0
    return [[2 * i, 3 * n - i - 2, 3 * n + gap + 2 * i - 1, 6 * n + gap - i - 2]
            for i in range(n)]


def _slot_kinds(rank: list[list[int]]) -> list[int]:
    """Kind occupying each slot of one rank (-1: free). Slots of a rank are unique: the
    pattern has no collisions and the squeeze only moves a pass into a free slot."""
    bound = max(x[-1] for x in rank if x)
    kinds = [-1] * (bound + 1)
    for t, slots in enumerate(rank):
        for v in slots:
            if kinds[v] != -1:
                raise InfeasiblePattern(f"two passes share slot {v}")
            kinds[v] = t
    return kinds


def put_w(rank: list[list[int]], split: bool = False) -> list[list[int]]:
    """``rank`` (F, f, B, b slot lists) plus W slot lists: one W list, or with ``split``
    one per backward kind (W of ``B`` first, then W of ``b``). Walking the slots, each
    free slot takes the oldest pending W (of ``B`` before ``b`` when split); leftovers go
    after the last slot."""
    out = [list(x) for x in rank[:TYPES]] + ([[], []] if split else [[]])
    kinds = _slot_kinds(out[:TYPES])
    pend = [0, 0]
    for i, kind in enumerate(kinds):
        if kind >= 2:
            pend[kind - 2 if split else 0] += 1
        elif kind < 0:
            for w in range(2):
                if pend[w]:
                    out[TYPES + w].append(i)
                    pend[w] -= 1
                    break
    i = len(kinds) - 1
    for w in range(2):
        while pend[w] > 0:
            i += 1
            out[TYPES + w].append(i)
            pend[w] -= 1
    return out


_MEM = (1, 1, 0, 0, -1)


def peak_memory(rank: list[list[int]]) -> int:
    """Peak activation (in chunk forwards) of one rank's slot lists, walking the slots:
    F/f +1, W -1; without W lists, each free slot retires one pending W."""
    has_w = len(rank) > TYPES
    pend = cur = peak = 0
    for kind in _slot_kinds(rank):
        if kind >= 0:
            cur += _MEM[kind]
            if 2 <= kind < 4:
                pend += 1
        elif not has_w and pend:
            cur -= 1
            pend -= 1
        if cur > peak:
            peak = cur
    return peak


def _slot_order(grid: list[list[list[int]]]):
    """Yield ``(slot, rank, kind, mb)`` over all passes in increasing slot, then rank,
    kind, mb order. Entries not yet yielded must not change while iterating."""
    heap = [(r[t][0], s, t, 0) for s, r in enumerate(grid) for t in range(len(r)) if r[t]]
    heapq.heapify(heap)
    while heap:
        item = heapq.heappop(heap)
        yield item
        _, s, t, mb = item
        if mb + 1 < len(grid[s][t]):
            heapq.heappush(heap, (grid[s][t][mb + 1], s, t, mb + 1))


def eager_times(grid: list[list[list[int]]], cost: list[float], comm: float
                ) -> tuple[list[list[list[float]]], list[list[tuple[int, int]]]]:
    """Run the passes in slot order as early as their inputs allow ("squeeze").

    Returns the start time of every pass (per rank, kind, microbatch) and each rank's
    order as ``(kind, mb)``. Dependencies: F and B wait for rank-1, f and b for rank+1
    (plus ``comm``); f, B, b wait for the previous kind on the rank (the V turn-around);
    every pass waits for the same kind's previous microbatch and the rank's previous pass.
    """
    nt = len(cost)
    n = len(grid)
    done: dict[tuple[int, int, int], float] = {}
    order: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for _, s, t, mb in _slot_order(grid):
        try:
            ready = 0.0
            if t in (0, 2) and s > 0:
                ready = max(ready, done[(s - 1, t, mb)] + comm)
            if t in (1, 3) and s + 1 < n:
                ready = max(ready, done[(s + 1, t, mb)] + comm)
            if 0 < t < 4:
                ready = max(ready, done[(s, t - 1, mb)])
            if mb > 0:
                ready = max(ready, done[(s, t, mb - 1)])
            if order[s]:
                ready = max(ready, done[(s, *order[s][-1])])
        except KeyError:
            raise InfeasiblePattern("a pass comes before its input") from None
        done[(s, t, mb)] = ready + cost[t]
        order[s].append((t, mb))
    start = [[[done[(s, t, mb)] - cost[t] for mb in range(len(grid[s][t]))]
              for t in range(nt)] for s in range(n)]
    return start, order


def _squeeze(grid: list[list[list[int]]], with_w: bool) -> list[list[list[int]]]:
    """One reorder pass (``reorder`` in the authors' code); returns the new slot grid."""
    if with_w:
        grid = [put_w(r) for r in grid]
    else:
        grid = [[list(x) for x in r] for r in grid]
    n = len(grid)
    peak = max(peak_memory(r) for r in grid)
    taken = [[False] * (max(max(x) for x in r) + 1) for r in grid]
    last_f = len(grid[0][0]) - 1
    phase = 0            # 0 warm-up, 1 steady (kept), 2 cooldown
    for slot, s, t, mb in _slot_order(grid):
        if t == 3 and s == 0 and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            if phase == 1 and t == 0 and mb == last_f:
                phase = 2
            taken[s][grid[s][t][mb]] = True
            continue
        dep = -1
        if t in (0, 2) and s > 0:
            dep = max(dep, grid[s - 1][t][mb])
        if t in (1, 3) and s + 1 < n:
            dep = max(dep, grid[s + 1][t][mb])
        if 0 < t < 4:
            dep = max(dep, grid[s][t - 1][mb])
        if t == 4:
            dep = max(dep, sorted(grid[s][2] + grid[s][3])[mb])
        if mb > 0:
            dep = max(dep, grid[s][t][mb - 1])
        dep += 1
        if dep > slot:
            raise InfeasiblePattern("a pass is scheduled before its input")
        for cand_slot in range(dep, slot):
            if not taken[s][cand_slot]:
                grid[s][t][mb] = cand_slot
                if peak_memory(grid[s]) <= peak:
                    break
        else:
            grid[s][t][mb] = slot
        taken[s][grid[s][t][mb]] = True
    if not with_w:
        grid = [put_w(r) for r in grid]
    unit = [1.0] * (TYPES + 1)
    start, _ = eager_times(grid, unit, 0.0)
    return [[[int(round(x)) for x in kind] for kind in r] for r in start]


def greedy_v_order(pattern: list[list[int]], microbatches: int
                   ) -> list[list[tuple[int, int]]]:
    """Per rank, the order of passes as ``(type, mb)``: type 0=F (chunk 0), 1=f (chunk 1),
    2=B (chunk 1), 3=b (chunk 0), 4=W of chunk 1, 5=W of chunk 0
    (``schedule_from_pattern`` with reordering). Raises :class:`ScheduleError` if the
    pattern cannot be laid out for this many microbatches."""
    try:
        grid = [[list(range(x, x + 6 * microbatches, 6)) for x in rank] for rank in pattern]
        g1 = _squeeze(grid, with_w=True)
        g1 = [r[:TYPES] for r in g1]
        g2 = _squeeze(g1, with_w=False)
        g2 = [put_w(r[:TYPES], split=True) for r in g2]
        _, order = eager_times(g2, [1.0] * 6, 0.0)
    except InfeasiblePattern as e:
        raise ScheduleError(f"the V pattern cannot be laid out for {len(pattern)} ranks x "
                            f"{microbatches} microbatches: {e}") from None
    return order

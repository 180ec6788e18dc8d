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

import numpy as np

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


def _slot_kinds(rank: list[list[int]]) -> np.ndarray:
    """Kind occupying each slot of one rank (-1: free), up to the rank's last slot.
    Raises :class:`InfeasiblePattern` naming the first slot (in kind, then list order)
    that two passes share."""
    bound = max(x[-1] for x in rank if x)
    lens = [len(x) for x in rank]
    vals = np.fromiter((v for x in rank for v in x), dtype=np.int64, count=sum(lens))
    by_slot = np.argsort(vals, kind="stable")
    ordered = vals[by_slot]
    again = by_slot[1:][ordered[1:] == ordered[:-1]]
    if len(again):
        raise InfeasiblePattern(f"two passes share slot {int(vals[again.min()])}")
    kinds = np.full(bound + 1, -1, dtype=np.int64)
    kinds[vals] = np.repeat(np.arange(len(rank), dtype=np.int64), lens)
    return kinds


def _backlog(arrive: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Queue length after each slot: one arrival per ``arrive`` slot, one departure per
    ``free`` slot while the queue is not empty, ``q(i) = max(0, q(i-1) + arrive(i) -
    free(i))``; in closed form (Lindley's recursion) ``X(i) - min(0, min_{j<=i} X(j))``
    with ``X`` the running sum of ``arrive - free``."""
    x = np.cumsum(arrive.astype(np.int64) - free)
    return x - np.minimum(np.minimum.accumulate(x), 0)


def put_w(rank: list[list[int]], split: bool = False) -> list[list[int]]:
    """``rank`` (F, f, B, b slot lists) plus W slot lists: one W list, or with ``split``
    one per backward kind (W of ``B`` first, then W of ``b``). Walking the slots, each
    free slot takes the oldest pending W (of ``B`` before ``b`` when split); leftovers go
    after the last slot.

    The pending Ws are queues (:func:`_backlog`): a free slot takes a W when any is
    pending after the slot before, one of ``B`` when one of those is (the ``B`` queue is
    served at every free slot, so it is a queue of its own)."""
    out = [list(x) for x in rank[:TYPES]]
    kinds = _slot_kinds(out)
    free = kinds < 0
    arrive = np.zeros(len(kinds), dtype=bool)    # Ws of this kind and of those served first
    served = np.zeros(len(kinds), dtype=bool)
    lefts, before = [], 0
    for queue in ([kinds == 2, kinds == 3] if split else [kinds >= 2]):
        arrive |= queue
        back = _backlog(arrive, free)
        takes = np.zeros(len(kinds), dtype=bool)
        takes[1:] = free[1:] & (back[:-1] > 0)
        out.append(np.flatnonzero(takes & ~served).tolist())
        served |= takes
        lefts.append(int(back[-1]) - before)
        before = int(back[-1])
    i = len(kinds)          # leftovers after the last slot, the B queue's first
    for w, k in enumerate(lefts):
        out[TYPES + w].extend(range(i, i + k))
        i += k
    return out


_MEM = (1, 1, 0, 0, -1)
#: activation delta of each kind when W passes are in the grid (index -1: a free slot)
_MEM_W = np.array([*_MEM, 0], dtype=np.int64)


def _no_w_profile(kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(X, base)`` of one rank's slots without W lists: ``X`` the running sum of
    B - free, ``base`` = F's - B's + ``X`` so far; the activation after slot i is
    ``base(i) - min(0, min_{j<=i} X(j))`` (:func:`_backlog`: the pending Ws are
    ``X - min(0, min X)``)."""
    x = np.cumsum(((kinds == 2) | (kinds == 3)).astype(np.int64) - (kinds < 0))
    fwd = np.cumsum((kinds == 0) | (kinds == 1))
    bwd = np.cumsum((kinds == 2) | (kinds == 3))
    return x, fwd - bwd + x


def _peak_without_w(kinds: np.ndarray) -> int:
    """:func:`peak_memory` of one rank's slot kinds (-1: free) without W lists: a B/b
    leaves a W pending, each free slot retires the oldest pending one (the pending count
    is a queue, :func:`_backlog`; :func:`_no_w_profile` in closed form)."""
    x, base = _no_w_profile(kinds)
    cur = base - np.minimum(np.minimum.accumulate(x), 0)
    return max(0, int(cur.max())) if len(cur) else 0


def peak_memory(rank: list[list[int]]) -> int:
    """Peak activation (in chunk forwards) of one rank's slot lists, walking the slots:
    F/f +1, W -1; without W lists, each free slot retires one pending W."""
    kinds = _slot_kinds(rank)
    if len(rank) > TYPES:
        return max(0, int(np.cumsum(_MEM_W[kinds]).max()))
    return _peak_without_w(kinds)


def _slot_order(grid: list[list[list[int]]]):
    """Every pass as ``(slot, rank, kind, mb)``, in increasing slot, then rank, kind, mb
    order (one sort of the grid as it is now; the caller may move a pass once it has been
    reached, which does not change the order of those after it)."""
    lists = [slots for r in grid for slots in r]
    lens = np.array([len(x) for x in lists], dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return iter(())
    slot = np.fromiter((v for x in lists for v in x), dtype=np.int64, count=total)
    seg = np.repeat(np.arange(len(lists), dtype=np.int64), lens)
    nt = len(grid[0])
    rank, kind = seg // nt, seg % nt
    mb = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    idx = np.lexsort((mb, kind, rank, slot))
    return zip(slot[idx].tolist(), rank[idx].tolist(), kind[idx].tolist(), mb[idx].tolist())


def eager_times(grid: list[list[list[int]]], cost: list[float], comm: float
                ) -> tuple[list[list[list[float]]], list[list[tuple[int, int]]]]:
    """Run the passes in slot order as early as their inputs allow ("squeeze").

    Returns the start time of every pass (per rank, kind, microbatch) and each rank's
    order as ``(kind, mb)``. Dependencies: F and B wait for rank-1, f and b for rank+1
    (plus ``comm``); f, B, b wait for the previous kind on the rank (the V turn-around);
    every pass waits for the same kind's previous microbatch and the rank's previous pass.
    Raises :class:`InfeasiblePattern` when a pass comes before one of its inputs.
    """
    nt = len(cost)
    n = len(grid)
    # end[s][t][mb]: end time of a placed pass, None while it is not placed (a read of
    # None, or past a list's end, is an input that is not placed: TypeError/IndexError)
    end: list[list[list[float | None]]] = [[[None] * len(grid[s][t]) for t in range(nt)]
                                           for s in range(n)]
    order: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    last = [0.0] * n            # end of each rank's last pass (times are >= 0)
    try:
        for _, s, t, mb in _slot_order(grid):
            e = end[s]
            ready = last[s]
            if mb:
                x = e[t][mb - 1]
                if x > ready:
                    ready = x
            if 0 < t < 4:
                x = e[t - 1][mb]
                if x > ready:
                    ready = x
            if t < 4:
                if t & 1:       # f, b: from rank s+1
                    if s + 1 < n:
                        x = end[s + 1][t][mb] + comm
                        if x > ready:
                            ready = x
                elif s > 0:     # F, B: from rank s-1
                    x = end[s - 1][t][mb] + comm
                    if x > ready:
                        ready = x
            done = ready + cost[t]
            e[t][mb] = done
            last[s] = done
            order[s].append((t, mb))
    except (TypeError, IndexError):
        raise InfeasiblePattern("a pass comes before its input") from None
    start = [[[x - cost[t] for x in end[s][t]] for t in range(nt)] for s in range(n)]
    return start, order


def _first_fit_w(kinds: list[int], cur: list[int], t: int, lo: int, slot: int,
                 peak: int) -> int:
    """The earliest free slot in ``[lo, slot)`` where the pass of kind ``t`` now at
    ``slot`` keeps the rank's peak activation <= ``peak``, else ``slot``, with W lists in
    the grid (the authors' ``reorder`` candidate loop, which re-walked the rank for each
    candidate slot). ``kinds``: the rank's slot kinds (-1: free); ``cur``: the running
    activation sum after each slot.

    Moving a pass of delta d from ``slot`` to c adds d on ``[c, slot)``. d <= 0 cannot
    raise the peak (the rank is within ``peak`` before the move), so the first free slot
    wins; for d = 1 (F/f) c must come after the last slot before ``slot`` whose running
    sum is already ``peak``."""
    if _MEM[t] > 0:
        j = slot - 1
        while j >= lo and cur[j] < peak:
            j -= 1
        lo = j + 1
    for c in range(lo, slot):
        if kinds[c] < 0:
            return c
    return slot


def _move_deltas(t: int) -> tuple[int, int]:
    """What moving a pass of kind t (F/f/B/b) from slot a into a free slot c < a adds on
    ``[c, a)`` to ``X`` and to ``base`` (:func:`_no_w_profile`): slot c stops being free
    and slot a becomes free, so ``X`` gains 1 (plus 1 for a B/b's pending W) and ``base``
    gains 1 (plus 1 for an F/f's activation)."""
    is_b = 1 if t in (2, 3) else 0
    return 1 + is_b, 2 - is_b


def _first_fit(kinds: np.ndarray, x: np.ndarray, base: np.ndarray, t: int, lo: int,
               slot: int, peak: int) -> int:
    """:func:`_first_fit_w` without W lists: the retirements depend on which slots are
    free, so each free candidate's peak is computed, from the rank's profile
    (:func:`_no_w_profile`) and the move's deltas (:func:`_move_deltas`)."""
    if lo >= slot:
        return slot
    dx, db = _move_deltas(t)
    for c in (lo + np.flatnonzero(kinds[lo:slot] < 0)).tolist():
        xs = x.copy()
        xs[c:slot] += dx
        cur = base.copy()
        cur[c:slot] += db
        np.minimum.accumulate(xs, out=xs)
        np.minimum(xs, 0, out=xs)
        cur -= xs
        if int(cur.max()) <= peak:
            return c
    return slot


def _squeeze(grid: list[list[list[int]]], with_w: bool) -> list[list[list[int]]]:
    """One reorder pass (``reorder`` in the authors' code); returns the new slot grid."""
    if with_w:
        grid = [put_w(r) for r in grid]
    else:
        grid = [[list(x) for x in r] for r in grid]
    n = len(grid)
    peak = max(peak_memory(r) for r in grid)     # also checks that no two passes collide
    kinds = [_slot_kinds(r) for r in grid]
    if with_w:          # lists, and the running activation sums (see _first_fit_w)
        cur = [np.cumsum(_MEM_W[k]).tolist() for k in kinds]
        kinds = [k.tolist() for k in kinds]
    else:
        prof = [_no_w_profile(k) for k in kinds]
    last_f = len(grid[0][0]) - 1
    phase = 0            # 0 warm-up, 1 steady (kept), 2 cooldown
    for slot, s, t, mb in _slot_order(grid):
        if t == 3 and s == 0 and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            if phase == 1 and t == 0 and mb == last_f:
                phase = 2
            continue
        g = grid[s]
        dep = -1
        if t in (0, 2) and s > 0:
            dep = grid[s - 1][t][mb]
        elif t in (1, 3) and s + 1 < n:
            dep = grid[s + 1][t][mb]
        if 0 < t < 4 and g[t - 1][mb] > dep:
            dep = g[t - 1][mb]
        if t == 4:
            dep = max(dep, sorted(g[2] + g[3])[mb])
        if mb > 0 and g[t][mb - 1] > dep:
            dep = g[t][mb - 1]
        dep += 1
        if dep > slot:
            raise InfeasiblePattern("a pass is scheduled before its input")
        if with_w:
            new = _first_fit_w(kinds[s], cur[s], t, dep, slot, peak)
            if new != slot and _MEM[t]:
                c = cur[s]
                for i in range(new, slot):
                    c[i] += _MEM[t]
        else:
            x, base = prof[s]
            new = _first_fit(kinds[s], x, base, t, dep, slot, peak)
            if new != slot:
                dx, db = _move_deltas(t)
                x[new:slot] += dx
                base[new:slot] += db
        if new != slot:
            kinds[s][slot] = -1
            kinds[s][new] = t
            g[t][mb] = new
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
    except InfeasiblePattern as e:
        raise ScheduleError(f"the V pattern cannot be laid out for {len(pattern)} ranks x "
                            f"{microbatches} microbatches: {e}") from None
    return _rank_orders(g2)


def _rank_orders(grid: list[list[list[int]]]) -> list[list[tuple[int, int]]]:
    """Each rank's passes ``(kind, mb)`` in slot order: the order :func:`eager_times`
    gives for a grid whose F/f/B/b slots are the start times of an eager run (each
    input's slot is below its consumer's, so every pass is placed; W lists are sorted and
    wait only for their own previous entry)."""
    order = []
    for r in grid:
        slots = [(v, t, mb) for t, x in enumerate(r) for mb, v in enumerate(x)]
        slots.sort()
        order.append([(t, mb) for _, t, mb in slots])
    return order

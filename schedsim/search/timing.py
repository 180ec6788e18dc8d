"""As-soon-as-possible timing of a per-rank order under the search model (``data``
semantics without link contention): each op starts when its rank's previous op has ended
and each input has arrived (producer end + lag). The warm start's times and a quick check
that an order is runnable at all; the engine (:func:`schedsim.sim.simulate.simulate`)
stays the judge of makespans under the chosen semantics.
"""
from __future__ import annotations

import itertools
from collections import deque

from schedsim.search.problem import SearchProblem


def asap(pb: SearchProblem, order: list[list[int]], integer: bool = False,
         dur: list[float] | None = None) -> list[float] | None:
    """Start time of every op when ``order`` runs as early as possible, or None when the
    order cannot run (an op waits on an op its rank runs later: a cycle). Times in the
    problem's unit, or in CP-SAT's integer unit when ``integer``; ``dur`` overrides the
    durations (e.g. :meth:`~schedsim.search.problem.SearchProblem.fused_durations`).

    Ranks are swept in turn, each running ahead until its next op lacks an input; a sweep
    in which no rank moves means a cycle. O(ops + inputs + ranks x sweeps)."""
    if integer:
        dur = pb.int_dur()
        lags: list = pb.int_lags()
    else:
        dur, lags = dur or pb.dur, pb.lags
    n = pb.n
    end: list = [None] * n
    start: list = [0] * n
    pos = [0] * len(order)
    clock = [0] * len(order)
    left = n
    moved = True
    while moved and left:
        moved = False
        for r, row in enumerate(order):
            k, t = pos[r], clock[r]
            while k < len(row):
                i = row[k]
                s = t
                for j, lag in lags[i]:
                    e = end[j]
                    if e is None:
                        break
                    e += lag
                    s = max(s, e)
                else:
                    start[i] = s
                    t = end[i] = s + dur[i]
                    k += 1
                    continue
                break
            if k != pos[r]:
                left -= k - pos[r]
                pos[r], clock[r] = k, t
                moved = True
    return start if not left else None


def makespan_of(pb: SearchProblem, start: list, integer: bool = False) -> float:
    """End of the last op for the start times ``start``."""
    dur = pb.int_dur() if integer else pb.dur
    return max((s + d for s, d in zip(start, dur)), default=0)


def order_by_start(pb: SearchProblem, start: list) -> list[list[int]]:
    """Per-rank order of ops sorted by start time (ties, possible only with zero-length
    ops: zero-length first, then in a topological order of the data inputs)."""
    topo = topo_positions(pb)
    out: list[list[int]] = [[] for _ in range(pb.ranks)]
    for i in sorted(range(pb.n), key=lambda i: (start[i], pb.dur[i] > 0, topo[i])):
        out[pb.rank[i]].append(i)
    return out


def topo_positions(pb: SearchProblem) -> list[int]:
    """Position of each op in a topological order of the data inputs and chains."""
    n = pb.n
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i in range(n):
        for j, _ in pb.lags[i]:
            succ[j].append(i)
            indeg[i] += 1
    for ch in pb.chains:
        for a, b in itertools.pairwise(ch):
            succ[a].append(b)
            indeg[b] += 1
    ready = deque(i for i in range(n) if indeg[i] == 0)
    pos = [0] * n
    k = 0
    while ready:
        i = ready.popleft()
        pos[i] = k
        k += 1
        for c in succ[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    return pos

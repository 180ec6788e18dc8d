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


def asap(pb: SearchProblem, order: list[list[int]], integer: bool = False
         ) -> list[float] | None:
    """Start time of every op when ``order`` runs as early as possible, or None when the
    order cannot run (an op waits on an op its rank runs later: a cycle). Times in the
    problem's unit, or in CP-SAT's integer unit when ``integer``. O(ops + inputs)."""
    n = pb.n
    if integer:
        dur: list = pb.int_dur()
        lags: list = pb.int_lags()
    else:
        dur, lags = pb.dur, pb.lags
    succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i in range(n):
        for j, lag in lags[i]:
            succ[j].append((i, lag))
            indeg[i] += 1
    nxt = [-1] * n
    for row in order:
        for a, b in itertools.pairwise(row):
            nxt[a] = b
            indeg[b] += 1
    start = [0] * n if integer else [0.0] * n
    ready = deque(i for i in range(n) if indeg[i] == 0)
    done = 0
    while ready:
        i = ready.popleft()
        done += 1
        end = start[i] + dur[i]
        b = nxt[i]
        if b >= 0:
            start[b] = max(start[b], end)
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
        for c, lag in succ[i]:
            t = end + lag
            start[c] = max(start[c], t)
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    return start if done == n else None


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

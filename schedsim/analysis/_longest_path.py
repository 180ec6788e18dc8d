"""Topological orders and longest-path passes over a DAG given as edge arrays.

:func:`run_order` orders the nodes of a run's dependency graph with numpy from the times
the run recorded (ties broken by the depth of same-time chains, computed level by level);
:func:`kahn_order` is the general fallback (Kahn, "Topological sorting of large
networks", CACM 1962). :class:`PassEdges` then relaxes every edge once, forward (earliest
times) or backward (longest delay to a sink), in that order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedsim.errors import ProgramError


def kahn_order(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """A topological order (int64 [n]) of the graph ``src -> dst`` by Kahn's algorithm
    in Python (the general fallback of :func:`run_order`). Raises
    :class:`ProgramError` if the graph has a cycle."""
    o = np.argsort(src, kind="stable")
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    indeg_np = np.bincount(dst, minlength=n)
    od, offs, indeg = dst[o].tolist(), off.tolist(), indeg_np.tolist()
    order = np.flatnonzero(indeg_np == 0).tolist()
    push = order.append
    for v in order:          # the list grows while it is walked
        for x in od[offs[v]:offs[v + 1]]:
            k = indeg[x] - 1
            indeg[x] = k
            if not k:
                push(x)
    if len(order) < n:
        raise _cycle()
    return np.array(order, dtype=np.int64)


def _cycle() -> ProgramError:
    """The error for a graph that is not a DAG."""
    return ProgramError("the dependency graph has a cycle: the run cannot be explained as "
                        "a max-plus system (was it simulated from this program?)")


def _level_depth(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Longest path in edges to every node of the DAG ``src -> dst`` (int64 [n]),
    computed generation by generation with numpy; None if it has a cycle."""
    depth = np.zeros(n, dtype=np.int64)
    if not len(src):
        return depth
    indeg = np.bincount(dst, minlength=n)
    o = np.argsort(src, kind="stable")
    od = dst[o]
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    front = np.flatnonzero((indeg == 0) & (off[1:] > off[:-1]))
    level, seen = 0, 0
    while front.size:
        a = off[front]
        cnt = off[front + 1] - a
        tot = int(cnt.sum())
        idx = np.repeat(a - (np.cumsum(cnt) - cnt), cnt) + np.arange(tot)
        d = od[idx]
        seen += tot
        level += 1
        if tot * 16 < n:
            d, k = np.unique(d, return_counts=True)
            indeg[d] -= k
            front = d[indeg[d] == 0]
        else:
            k = np.bincount(d, minlength=n)
            indeg -= k
            front = np.flatnonzero((k > 0) & (indeg == 0))
        depth[front] = level
    return depth if seen == len(src) else None


def run_order(t_run: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """A topological order from the times the run recorded (int64 [n]): by time, and
    among nodes at one time by the depth of their chain of same-time edges (computed
    with numpy, level by level). None when a recorded time contradicts an edge."""
    ts, td = t_run[src], t_run[dst]
    if (td < ts).any():
        return None
    eq = td == ts
    depth = _level_depth(len(t_run), src[eq], dst[eq])
    if depth is None:
        return None
    return np.lexsort((depth, t_run))


#: edges relaxed per chunk of Python lists (bounds the transient memory)
_CHUNK = 1 << 18


@dataclass
class PassEdges:
    """The edges renumbered by topological position and sorted by source position:
    ``a`` (source), ``b`` (destination; int32) and ``w`` (weight), so that a forward pass
    walks them in order and a backward pass in reverse, both through memory in order."""

    order: np.ndarray
    a: np.ndarray
    b: np.ndarray
    w: np.ndarray

    @classmethod
    def of(cls, order: np.ndarray, src: np.ndarray, dst: np.ndarray,
           weight: np.ndarray) -> "PassEdges":
        pos = np.empty(len(order), dtype=np.int32)
        pos[order] = np.arange(len(order), dtype=np.int32)
        ps = pos[src]
        o = np.argsort(ps, kind="stable")
        return cls(order, ps[o], pos[dst][o], weight[o])

    def forward(self, init: np.ndarray) -> np.ndarray:
        """Longest-path times (float64 [n]): ``x[b] = max(x[b], x[a] + w)`` from
        ``init``, each source final before its out-edges are relaxed."""
        x = init[self.order].tolist()
        for k in range(0, len(self.a), _CHUNK):
            sl = slice(k, k + _CHUNK)
            for u, v, d in zip(self.a[sl].tolist(), self.b[sl].tolist(),
                               self.w[sl].tolist()):
                y = x[u] + d
                if y > x[v]:
                    x[v] = y
        return self._back(x)

    def backward(self, init: np.ndarray) -> np.ndarray:
        """Longest delay to a sink (float64 [n]): ``x[a] = max(x[a], x[b] + w)`` from
        ``init``, in reverse topological order."""
        x = init[self.order].tolist()
        for k in reversed(range(0, len(self.a), _CHUNK)):
            sl = slice(k, k + _CHUNK)
            for u, v, d in zip(reversed(self.a[sl].tolist()), reversed(self.b[sl].tolist()),
                               reversed(self.w[sl].tolist())):
                y = x[v] + d
                if y > x[u]:
                    x[u] = y
        return self._back(x)

    def _back(self, x: list[float]) -> np.ndarray:
        out = np.empty(len(self.order))
        out[self.order] = x
        return out

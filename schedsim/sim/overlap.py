"""Inside one op: pieces (compute and collectives) on a rank's two streams.

Each rank has a **compute stream** and a **collective stream**; a piece occupies its
stream for its duration and starts once its stream is free and every piece it depends on
has ended. Which piece a free stream takes next is decided by list scheduling (Graham,
"Bounds on multiprocessing timing anomalies", 1969): the piece that can start earliest,
ties to the one with the longest remaining path to the end of the op (its *level*: the
HLFET priority of Adam, Chandy & Dickson 1974), then to the earlier piece in program
order. A chain (every piece depends on the previous one) is therefore executed in order
and costs the sum of its pieces; independent chains interleave, so one chain's
collective runs while another chain's compute does — which is what DeepSpeed Domino
(two halves of a microbatch) and DualPipe (a forward and a backward chunk) arrange by
hand.

Plain Python (no torch). Units: the cost unit of ``[costs]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

COMPUTE = "compute"
COLLECTIVE = "collective"
STREAMS = (COMPUTE, COLLECTIVE)


@dataclass(frozen=True, slots=True)
class Piece:
    """One piece of an op.

    ``stream``: :data:`COMPUTE` or :data:`COLLECTIVE`; ``duration`` in the cost unit;
    ``deps``: indices of earlier pieces of the same op that must end first. ``name`` is
    what the piece does (``attention``, ``proj all-reduce``...); ``part`` the op kind it
    belongs to (``F``, ``B`` or ``W``) and ``which`` the part of an ``FB`` pair (0: the
    forward part, 1: the backward part); ``layer``; ``half`` the Domino half (None when
    the microbatch is not split); ``collective``/``group``/``nbytes`` describe a
    collective (``all-reduce``..., ``tp``/``ep``, bytes ``S``).
    """

    name: str
    stream: str
    duration: float
    deps: tuple[int, ...] = ()
    part: str = "F"
    which: int = 0
    layer: int = 0
    half: int | None = None
    collective: str | None = None
    group: str | None = None
    nbytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Placed:
    """A :class:`Piece` with its start and end, relative to the op's start."""

    piece: Piece
    start: float
    end: float


@dataclass(frozen=True)
class OpCost:
    """An op's derived cost and what it is made of (times in the cost unit).

    ``cost``: end of its last piece; ``compute``: sum of its compute pieces (the cost if
    every collective were free); ``collective``: sum of its collectives; ``exposed``:
    ``cost - compute``, the time the compute stream waits for collectives (the
    collective time not hidden behind compute); ``hidden = collective - exposed``.
    """

    cost: float
    compute: float
    collective: float
    exposed: float
    pieces: tuple[Placed, ...] = field(default=(), repr=False)

    @property
    def hidden(self) -> float:
        h = self.collective - self.exposed
        return h if h > 1e-12 * max(1.0, self.cost) else 0.0


def levels(pieces: list[Piece]) -> list[float]:
    """Longest path from each piece to the end of the op, its own duration included."""
    lv = [p.duration for p in pieces]
    for i in range(len(pieces) - 1, -1, -1):
        for d in pieces[i].deps:
            lv[d] = max(lv[d], pieces[d].duration + lv[i])
    return lv


def schedule(pieces: list[Piece]) -> OpCost:
    """Place ``pieces`` on the two streams (module docstring) and return the op's cost.

    Raises ValueError when a piece depends on itself or a later piece (``deps`` must point
    backwards, so the pieces are listed in a topological order) or names an unknown
    stream.
    """
    n = len(pieces)
    for i, p in enumerate(pieces):
        if p.stream not in STREAMS:
            raise ValueError(f"piece {p.name!r}: unknown stream {p.stream!r}")
        if any(not 0 <= d < i for d in p.deps):
            raise ValueError(f"piece {i} ({p.name}) depends on a piece not before it")
    lv = levels(pieces)
    users: list[list[int]] = [[] for _ in range(n)]
    missing = [len(set(p.deps)) for p in pieces]
    for i, p in enumerate(pieces):
        for d in set(p.deps):
            users[d].append(i)
    ready_at = [0.0] * n          # max end of the deps (valid once missing == 0)
    ready = [i for i in range(n) if missing[i] == 0]
    free = {COMPUTE: 0.0, COLLECTIVE: 0.0}
    start = [0.0] * n
    end = [0.0] * n
    for _ in range(n):
        best = min(ready, key=lambda i: (max(ready_at[i], free[pieces[i].stream]),
                                         -lv[i], i))
        ready.remove(best)
        p = pieces[best]
        t0 = max(ready_at[best], free[p.stream])
        start[best], end[best] = t0, t0 + p.duration
        free[p.stream] = end[best]
        for u in users[best]:
            ready_at[u] = max(ready_at[u], end[best])
            missing[u] -= 1
            if missing[u] == 0:
                ready.append(u)
    cost = max(end, default=0.0)
    compute = sum(p.duration for p in pieces if p.stream == COMPUTE)
    coll = sum(p.duration for p in pieces if p.stream == COLLECTIVE)
    placed = tuple(Placed(p, start[i], end[i]) for i, p in enumerate(pieces))
    exposed = cost - compute
    return OpCost(cost, compute, coll, exposed if exposed > 1e-12 * max(1.0, cost) else 0.0,
                  placed)


def chained(pieces: list[Piece]) -> list[Piece]:
    """``pieces`` as one chain: each depends on the previous one only (no overlap)."""
    from dataclasses import replace

    return [replace(p, deps=(i - 1,) if i else ()) for i, p in enumerate(pieces)]


def union(a: list[Piece], b: list[Piece]) -> list[Piece]:
    """The pieces of two ops as one op (``b`` after ``a``, its deps shifted): both
    parts' dependencies kept, none between them, ``which`` set to 0 and 1."""
    from dataclasses import replace

    k = len(a)
    return ([replace(p, which=0) for p in a]
            + [replace(p, which=1, deps=tuple(d + k for d in p.deps)) for p in b])

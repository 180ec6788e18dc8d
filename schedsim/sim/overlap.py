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

Two device effects change that picture (:func:`schedule` with ``in_order``,
``connections`` or ``slowdown``; an event-driven pass, :func:`_dispatch`):

- **launch order**: CUDA runs each stream's kernels in the order the host launched them.
  ``in_order=True`` places the pieces so (each stream takes its pieces in program
  order, the order a framework that interleaves them by hand, such as Megatron's
  combined 1F1B, launches them) instead of by list-scheduling priority;
- **one hardware queue** (``connections=1``, ``CUDA_DEVICE_MAX_CONNECTIONS=1``): the
  kernels of all streams of a rank go through one in-order work queue, so a piece is
  dispatched only after every piece launched before it was, on whichever stream: a
  kernel waiting at the head of the queue for its inputs blocks the others (Megatron-LM
  PRs #2719, #2730, #6311). With 2 or more connections the two streams are independent
  (CUDA's default is 8);
- **compute slowed by communication** (``slowdown`` >= 1): while a collective kernel is
  resident (NCCL kernels occupy SMs) compute pieces progress at ``1 / slowdown`` of
  their rate, so a compute piece overlapped by collectives for time ``t`` takes
  ``t (slowdown - 1)`` longer.
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
    """A :class:`Piece` with its start and end, relative to the op's start; ``queued``:
    under one hardware queue, the time it could have started (its inputs ready, its
    stream free) when that was before ``start`` (it waited behind the head of the
    queue), else None."""

    piece: Piece
    start: float
    end: float
    queued: float | None = None


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


def schedule(pieces: list[Piece], *, in_order: bool = False, connections: int = 8,
             slowdown: float = 1.0) -> OpCost:
    """Place ``pieces`` on the two streams (module docstring) and return the op's cost.

    ``in_order``: each stream runs its pieces in program order (launch order) rather than
    by list-scheduling priority; ``connections`` (>= 1): hardware queues of the rank, 1 =
    every piece dispatched in program order (implies ``in_order``); ``slowdown`` (>= 1):
    compute runs that many times slower while a collective runs.

    Raises ValueError when a piece depends on itself or a later piece (``deps`` must point
    backwards, so the pieces are listed in a topological order), names an unknown
    stream, or for ``connections < 1`` or ``slowdown < 1``.
    """
    n = len(pieces)
    for i, p in enumerate(pieces):
        if p.stream not in STREAMS:
            raise ValueError(f"piece {p.name!r}: unknown stream {p.stream!r}")
        if any(not 0 <= d < i for d in p.deps):
            raise ValueError(f"piece {i} ({p.name}) depends on a piece not before it")
    if connections < 1 or not slowdown >= 1:
        raise ValueError(f"connections must be >= 1 and slowdown >= 1 (got {connections}, "
                         f"{slowdown})")
    lv = levels(pieces)
    if in_order or connections == 1 or slowdown != 1:
        start, end, queued = _dispatch(pieces, lv, in_order or connections == 1,
                                       connections == 1, slowdown)
        return _op_cost(pieces, start, end, queued)
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
    return _op_cost(pieces, start, end, [None] * n)


def _op_cost(pieces: list[Piece], start: list[float], end: list[float],
             queued: list[float | None]) -> OpCost:
    cost = max(end, default=0.0)
    compute = sum(p.duration for p in pieces if p.stream == COMPUTE)
    coll = sum(p.duration for p in pieces if p.stream == COLLECTIVE)
    placed = tuple(Placed(p, start[i], end[i], queued[i]) for i, p in enumerate(pieces))
    exposed = cost - compute
    return OpCost(cost, compute, coll, exposed if exposed > 1e-12 * max(1.0, cost) else 0.0,
                  placed)


def _dispatch(pieces: list[Piece], lv: list[float], in_order: bool, one_queue: bool,
              slowdown: float) -> tuple[list[float], list[float], list[float | None]]:
    """Event-driven placement: at each event time every free stream takes a piece whose
    inputs have ended — the next of its own in program order (``in_order``), the next of
    all (``one_queue``: and only once every earlier piece started), or the ready one of
    highest level, then lowest index (the list scheduler's rule: the same placement as
    :func:`schedule` without the options, tests/test_overlap_modes.py) — and compute
    progresses at ``1 / slowdown`` while a collective runs. Returns per piece its start,
    end and ``queued`` time (:class:`Placed`)."""
    d = _Dispatch(pieces, lv, in_order, one_queue)
    run = d.run
    t = 0.0
    while d.done < d.n:
        d.start_ready(t)
        if d.done == d.n:
            break
        if not run:                # deps point backwards, so something always runs
            raise ValueError("pieces cannot be placed (a dependency never ends)")
        slow = COMPUTE in run and COLLECTIVE in run and slowdown != 1
        fin = {}
        for s, r in run.items():   # the next end at the current rates (exact when unslowed)
            i, left, asof, slowed = r
            if not slowed and not (slow and s == COMPUTE):
                fin[s] = d.start[i] + pieces[i].duration
            else:
                fin[s] = asof + left * (slowdown if slow and s == COMPUTE else 1.0)
        t = min(fin.values())
        for s in list(run):        # progress up to t, then retire what ended
            r = run[s]
            sl = slow and s == COMPUTE
            r[1] -= (t - r[2]) / (slowdown if sl else 1.0)
            r[2], r[3] = t, r[3] or (sl and t > d.start[r[0]])
            if fin[s] <= t:
                d.retire(run.pop(s)[0], t)
    return d.start, d.end, d.queued


class _Dispatch:
    """The state of :func:`_dispatch`: which pieces started, ended, wait for inputs."""

    def __init__(self, pieces: list[Piece], lv: list[float], in_order: bool,
                 one_queue: bool) -> None:
        n = self.n = len(pieces)
        self.pieces, self.lv, self.in_order, self.one_queue = pieces, lv, in_order, one_queue
        self.users: list[list[int]] = [[] for _ in range(n)]
        self.missing = [len(set(p.deps)) for p in pieces]
        for i, p in enumerate(pieces):
            for d in set(p.deps):
                self.users[d].append(i)
        self.start, self.end = [0.0] * n, [0.0] * n
        self.queued: list[float | None] = [None] * n
        self.ready_at = [0.0] * n   # when its inputs had all ended (once missing == 0)
        self.order = {s: [i for i, p in enumerate(pieces) if p.stream == s] for s in STREAMS}
        self.started = [False] * n
        self.nxt = {s: 0 for s in STREAMS}   # first unstarted position in order[s]
        self.head = 0                        # first unstarted piece in program order
        self.free_at = {s: 0.0 for s in STREAMS}
        self.run: dict[str, list] = {}       # stream -> [piece, work left, as of, slowed]
        self.done = 0

    def candidates(self) -> list[int]:
        out: list[int] = []
        for s in STREAMS:
            if s in self.run:
                continue
            if self.one_queue:
                h = self.head
                out += [h] if h < self.n and self.pieces[h].stream == s else []
            elif self.in_order:
                out += self.order[s][self.nxt[s]:self.nxt[s] + 1]
            else:
                out += [i for i in self.order[s][self.nxt[s]:] if not self.started[i]]
        return [i for i in out if self.missing[i] == 0]

    def start_ready(self, t: float) -> None:
        """Start at ``t`` what can start, one piece at a time (an empty piece ends at
        once, which may let another start)."""
        while cand := self.candidates():
            pick = min(cand, key=lambda i: (-self.lv[i], i))
            p = self.pieces[pick]
            s = p.stream
            self.started[pick], self.start[pick] = True, t
            own = max(self.ready_at[pick], self.free_at[s])
            if self.one_queue and own < t - 1e-12 * max(1.0, t):
                self.queued[pick] = own
            while self.nxt[s] < len(self.order[s]) and self.started[self.order[s][self.nxt[s]]]:
                self.nxt[s] += 1
            while self.head < self.n and self.started[self.head]:
                self.head += 1
            if p.duration > 0:
                self.run[s] = [pick, p.duration, t, False]
            else:
                self.retire(pick, t)

    def retire(self, i: int, t: float) -> None:
        self.end[i] = self.free_at[self.pieces[i].stream] = t
        self.done += 1
        for u in self.users[i]:
            self.missing[u] -= 1
            if self.missing[u] == 0:
                self.ready_at[u] = t


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

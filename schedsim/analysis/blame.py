"""Which rank's comm stream held a transfer back, and behind which op.

With a shared comm stream (``--comm-stream per-rank`` or ``per-peer``) a rank's P2P
launches run one after another: an op posted while the stream is busy becomes *active*
(``Message.send_active`` / ``recv_active``) only when the launch ahead of it completes. A
transfer then cannot start until both of its sides are active (rendezvous), so a rank
waiting for a recv may be held by the *sender's* stream, queued behind an op the sender
launched earlier — which may itself wait for a third rank. This module names that rank,
its stream and the op at the head of its queue, for :mod:`.stalls`, :mod:`.align` and the
critical path.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schedsim.analysis._index import EPS
from schedsim.program.ops import recv_comm, send_comm
from schedsim.timeline import Message, Timeline
from schedsim.util.units import fmt_time


@dataclass
class Side:
    """One side of a message as its rank posted it."""

    msg: Message
    is_send: bool

    @property
    def rank(self) -> int:
        return self.msg.src if self.is_send else self.msg.dst

    @property
    def peer(self) -> int:
        return self.msg.dst if self.is_send else self.msg.src

    @property
    def posted(self) -> float | None:
        return self.msg.send_posted if self.is_send else self.msg.recv_posted

    @property
    def active(self) -> float | None:
        return self.msg.send_active if self.is_send else self.msg.recv_active

    @property
    def done(self) -> float | None:
        return self.msg.send_done if self.is_send else self.msg.recv_done

    @property
    def index(self) -> int:
        return self.msg.send_index if self.is_send else self.msg.recv_index

    @property
    def token(self) -> str:
        key = self.msg.key
        return str(send_comm(key) if self.is_send else recv_comm(key))

    def queued(self) -> bool:
        """True if the op became active later than it was posted (a busy stream)."""
        p, a = self.posted, self.active
        return p is not None and a is not None and a > p + EPS


@dataclass
class Blocker:
    """A side held on its rank's comm stream: ``stream`` describes the stream, ``head``
    the op whose completion let it start (None when not found)."""

    side: Side
    stream: str
    head: Side | None

    def sentence(self) -> str:
        """``rank 1's per-rank comm stream, queued behind 1SEND_B0 (posted 3, active 3,
        done 7; the head of that stream when 1RECV_F2 was posted at 4)``."""
        s = self.side
        txt = (f"{s.token} was posted at {fmt_time(s.posted)} (instr {s.index}) but queued on "
               f"{self.stream} until {fmt_time(s.active)}")
        if self.head is not None:
            h = self.head
            txt += (f", behind {h.token} (instr {h.index}, active from "
                    f"{fmt_time(h.active)}, done {fmt_time(h.done)}), the op at the head of that "
                    f"queue")
        return txt


class StreamIndex:
    """The ops of every comm stream of a timeline, for :meth:`blocker` lookups."""

    def __init__(self, tl: Timeline) -> None:
        self.tl = tl
        self.mode = tl.comm_stream
        self._by: dict[tuple[int, int], list[tuple[float, Side]]] = {}
        if self.mode == "none":
            return
        for m in tl.messages:
            for is_send in (True, False):
                s = Side(m, is_send)
                if s.done is None or s.active is None:
                    continue
                key = (s.rank, s.peer if self.mode == "per-peer" else -1)
                self._by.setdefault(key, []).append((s.done, s))
        for lst in self._by.values():
            lst.sort(key=lambda x: x[0])

    def stream_name(self, rank: int, peer: int) -> str:
        if self.mode == "per-peer":
            return f"rank {rank}'s comm stream to rank {peer}"
        return f"rank {rank}'s comm stream"

    def blocker(self, side: Side) -> Blocker | None:
        """Why ``side`` was active only after it was posted: the op ahead of it on its
        rank's stream, whose completion (at ``side.active``) let it start; None when the
        side was not queued."""
        if self.mode == "none" or not side.queued():
            return None
        key = (side.rank, side.peer if self.mode == "per-peer" else -1)
        lst = self._by.get(key, [])
        a = side.active
        k = bisect_left(lst, a - EPS, key=lambda x: x[0])
        head = None
        while k < len(lst) and lst[k][0] <= a + EPS:
            cand = lst[k][1]
            if cand.active is not None and cand.active < a - EPS and cand.msg is not side.msg:
                if head is None or (cand.posted or 0.0) < (head.posted or 0.0):
                    head = cand
            k += 1
        return Blocker(side, self.stream_name(side.rank, side.peer), head)

    def transfer_blocker(self, msg: Message, waiting_rank: int = -1) -> Blocker | None:
        """The side of ``msg`` whose late activation set its transfer's start (the
        sender's for an eager send; under rendezvous either), when that side was queued
        on its stream; the side of the rank other than ``waiting_rank`` first (the peer
        that held the waiting rank back). None when no queued side explains the start."""
        if self.mode == "none" or msg.start is None:
            return None
        sides = [Side(msg, True)]
        if self.tl.semantics == "rendezvous":
            sides.append(Side(msg, False))
        bound = [s for s in sides if s.queued() and s.active is not None
                 and abs(s.active - msg.start) <= EPS]
        bound.sort(key=lambda s: s.rank == waiting_rank)
        return self.blocker(bound[0]) if bound else None


def streams_of(idx: object) -> StreamIndex:
    """The :class:`StreamIndex` of a :class:`~schedsim.analysis._index.TimelineIndex`
    (built once per index)."""
    si = getattr(idx, "_stream_index", None)
    if si is None:
        si = StreamIndex(idx.tl)  # type: ignore[attr-defined]
        idx._stream_index = si  # type: ignore[attr-defined]
    return si


#: who caused a stall: ``(rank, instruction index, token)``; ``(-1, -1, "")`` when unknown
Culprit = tuple[int, int, str]
NOBODY: Culprit = (-1, -1, "")


def culprit(idx: object, msg: Message | None, is_send: bool, cause: str) -> Culprit:
    """The other rank's instruction that made a member of a wait late, by ``cause``:
    the op at the head of the comm stream that held the transfer (``head-of-line``; the
    message ahead on the link when no stream held it), the partner's post (``wait-recv``:
    the send; ``wait-send``: the recv; ``transfer``: the other side)."""
    if msg is None:
        return NOBODY
    own = Side(msg, is_send)
    other = Side(msg, not is_send)
    if cause == "head-of-line":
        si = streams_of(idx)
        blk = si.transfer_blocker(msg, own.rank) or si.blocker(own)
        if blk is not None:
            h = blk.head or blk.side
            return (h.rank, h.index, h.token)
        tl = idx.tl  # type: ignore[attr-defined]
        ahead = [m for m in tl.messages if m is not msg and m.src == msg.src
                 and m.dst == msg.dst and m.start is not None and msg.start is not None
                 and m.start < msg.start - EPS and (m.arrival or 0.0) > msg.start - EPS]
        if ahead:
            a = Side(min(ahead, key=lambda m: m.start), True)
            return (a.rank, a.index, a.token)
        return NOBODY
    if cause in ("wait-recv", "wait-send", "transfer", "deadlock"):
        return (other.rank, other.index, other.token)
    if cause == "atomic-batch" and msg.start is not None:
        held = atomic_hold(idx, msg, -float("inf"))
        return held[1] if held is not None else NOBODY
    return NOBODY


def _matched_at(m: Message) -> float:
    """When both sides of ``m`` were active (posted, without a comm stream); inf when a
    side never was."""
    a = m.send_active if m.send_active is not None else m.send_posted
    b = m.recv_active if m.recv_active is not None else m.recv_posted
    return float("inf") if a is None or b is None else max(a, b)


def batch_mates(idx: object) -> dict[tuple[int, int], list[Message]]:
    """``(rank, instruction index) ->`` the messages a launch posts (either side), built
    once per :class:`~schedsim.analysis._index.TimelineIndex`."""
    out = getattr(idx, "_batch_mates", None)
    if out is None:
        out = {}
        for m in idx.tl.messages:  # type: ignore[attr-defined]
            out.setdefault((m.src, m.send_index), []).append(m)
            out.setdefault((m.dst, m.recv_index), []).append(m)
        idx._batch_mates = out  # type: ignore[attr-defined]
    return out


def atomic_hold(idx: object, msg: Message, ready: float) -> tuple[str, Culprit] | None:
    """Atomic groups (``Timeline.group_semantics``, :mod:`schedsim.sim.groups`): when
    ``msg`` started after ``ready`` because a batch holding one of its sides waited for
    another member to be matched, the sentence naming that batch and member and the
    culprit (the post that matched it last); None otherwise."""
    tl = idx.tl  # type: ignore[attr-defined]
    if tl.group_semantics != "atomic" or msg.start is None:
        return None
    mates = batch_mates(idx)
    best = None
    for rank, index in ((msg.src, msg.send_index), (msg.dst, msg.recv_index)):
        for m in mates.get((rank, index), ()):
            if m is not msg:
                t = _matched_at(m)
                if best is None or t > best[0]:
                    best = (t, rank, index, m)
    if best is None or best[0] <= ready + EPS:
        return None
    t, rank, index, m = best
    mine = Side(m, m.src == rank and m.send_index == index)
    other = Side(m, not mine.is_send)
    when = ("never" if t == float("inf") else
            f"only at {fmt_time(t)}, when rank {other.rank} posted {other.token} (instr "
            f"{other.index})")
    return (f"its atomic batch on rank {rank} (instr {index}) also holds {mine.token}, "
            f"matched {when}: no member of a batch moves before all are matched",
            (other.rank, other.index, other.token))


def init_wait(tl: Timeline, rank: int, index: int, token: str, end: float,
              start: float | None = None) -> tuple[str, Culprit]:
    """A bare post blocked in a lazy communicator init from ``start`` until ``end``: the
    sentence and the peer's instruction that completed the rendezvous (its first bare
    post to this rank: the peer's op to this rank with the lowest index posted at or
    after ``end``). The sentence says whether the peer arrived late (its own init wait
    began after ``start``) or the wait was the communicator's creation alone (the init
    cost: both ranks were there)."""
    peer = -1
    for m in tl.messages:
        for is_send in (True, False):
            s = Side(m, is_send)
            if s.rank == rank and s.index == index:
                peer = s.peer
    best: Side | None = None
    for m in tl.messages:
        for is_send in (True, False):
            s = Side(m, is_send)
            if s.rank == peer and s.peer == rank and s.posted is not None \
                    and s.posted >= end - EPS and (best is None or s.index < best.index):
                best = s
    if best is None:
        return (f"{token} (instr {index}) is rank {rank}'s first bare P2P with rank {peer}: "
                f"under lazy communicator init it waited for rank {peer} to reach its own "
                f"until {fmt_time(end)}", (peer, -1, ""))
    head = (f"{token} (instr {index}) is rank {rank}'s first bare P2P with rank {peer}: "
            f"under lazy communicator init both ranks create their communicator together")
    there = next((w.start for w in tl.waits if w.rank == peer and w.index == best.index
                  and w.kind == "INIT"), best.posted)
    both = max(there, start) if start is not None else there
    cost = end - both
    tail = f", then creating it took {fmt_time(cost)}" if cost > EPS else ""
    if start is not None and there <= start + EPS:
        return (f"{head}; rank {peer} was already at {best.token} (instr {best.index}) "
                f"since {fmt_time(there)}, so the wait is the creation itself: "
                f"{fmt_time(cost)} (the init cost)", (peer, best.index, best.token))
    return (f"{head}, and rank {peer} reached its own first bare P2P with rank {rank}, "
            f"{best.token} (instr {best.index}), only at {fmt_time(there)}{tail}",
            (peer, best.index, best.token))


def unit_text(ranks: int, unit_stream: np.ndarray, handles: Callable[[int], list[int]],
              token: Callable[[int], str], u: int, t: float | None) -> tuple[int, str, str]:
    """A comm-stream unit ``u`` of a compiled program that starts at ``t``: ``(rank, its
    ops' tokens, a sentence naming the rank, its stream and the unit ahead of it on that
    stream, whose completion let it start)``. ``unit_stream``: the stream of each unit
    (a rank r's per-rank stream is r, its stream to peer q is ``ranks + r * ranks + q``);
    ``handles(u)``: the unit's handles; ``token(h)``: a handle's program token."""
    sid = int(unit_stream[u])
    rank = sid if sid < ranks else (sid - ranks) // ranks
    stream = (f"rank {rank}'s comm stream" if sid < ranks else
              f"rank {rank}'s comm stream to rank {(sid - ranks) % ranks}")
    toks = "+".join(token(h) for h in handles(u))
    prev = np.flatnonzero(unit_stream[:u] == sid)
    txt = f"{stream} starts {toks} at {fmt_time(t)}"
    if len(prev):
        ahead = "+".join(token(h) for h in handles(int(prev[-1])))
        txt += f", once {ahead} ahead of it at the head of that stream completed"
    return rank, toks, txt

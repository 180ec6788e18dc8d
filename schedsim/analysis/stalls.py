"""Stall attribution: every idle interval of every rank, with a named cause.

A rank is *idle* whenever its compute stream runs no op, between time 0 and the makespan.
Each idle interval is cut at the blocking instructions the engine recorded
(``Timeline.waits``: the rank reached a ``COMMIT``/``WAIT``/``END`` or, under ``data``
semantics, an op waited for its inputs) and each piece gets one cause:

==============  ===========================================================================
``warmup``      before the rank's first op: no op could run yet (the detail says which
                message the first op waited for)
``cooldown``    after the rank's last op: no op left to run while other ranks finish
``wait-recv``   the next op's input had not arrived: which message, from which rank, made
                by which op, and when the sender posted it
``wait-send``   a send not yet accepted: under rendezvous it completes only once the
                receiver posts the matching recv
``wait-batch``  a commit-and-wait (a wait on several P2P ops) held by a member the next op
                does not itself need
``head-of-line`` the awaited transfer was queued behind another one on the same link, or
                one of its sides behind earlier P2P ops on its rank's comm stream: the
                detail names that rank, its stream and the op at the head of the queue
                (often the *peer's* stream, :mod:`schedsim.analysis.blame`)
``atomic-batch`` an atomic batch (``--group-semantics atomic``, NCCL groups) held the
                transfer until another member was matched, or the op completed only with
                its whole batch: the detail names the batch and the member
``transfer``    a send whose bytes were still on the wire (finite bandwidth or latency)
``comm-init``   a bare post that creates its rank pair's communicator (lazy init) and
                waited for the peer to reach its own first bare post to this rank
``deadlock``    the rank is blocked for ever (the timeline ends in a deadlock)
``host``        idle time no recorded wait explains (measured timelines: host overhead)
==============  ===========================================================================

The binding member of a wait is the op that completed last (at the wait's release time);
``detail`` names it and the mechanism that made it late.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from schedsim.analysis._index import (
    EPS,
    TimelineIndex,
    comm_of,
    key_label,
    partner_token,
    span_token,
)
from schedsim.analysis._rows import instr_token
from schedsim.analysis.blame import (
    NOBODY,
    Culprit,
    Side,
    atomic_hold,
    culprit,
    init_wait,
    streams_of,
)
from schedsim.program.ir import Program
from schedsim.timeline import Message, Span, Timeline, WaitRecord
from schedsim.util.units import fmt_time, with_unit

#: cause -> one-line meaning (shown by ``schedsim stalls --help`` and the README)
CAUSES: dict[str, str] = {
    "warmup": "before the rank's first op: no op could run yet",
    "cooldown": "after the rank's last op: nothing left to run",
    "wait-recv": "the next op's input had not arrived",
    "wait-send": "a send not yet accepted by its receiver (rendezvous)",
    "wait-batch": "a commit-and-wait held by a member the next op does not need",
    "head-of-line": "a transfer queued behind another on the same link or comm stream",
    "atomic-batch": "an atomic batch (NCCL group) held the transfer until all its ops "
                    "were matched",
    "transfer": "a send whose bytes were still on the wire",
    "comm-init": "a lazy communicator init: the first bare P2P of two ranks waits for both",
    "deadlock": "blocked for ever",
    "host": "idle time no recorded wait explains",
}


@dataclass
class Stall:
    """One idle interval ``[start, end)`` of ``rank`` (times in the timeline's unit).

    ``cause`` is a key of :data:`CAUSES`; ``detail`` explains it in one sentence.
    ``index``/``instruction`` name the blocking instruction (-1/"" when none), ``comms``
    its binding members (program tokens such as ``5RECV_F3``); ``peer``/``peer_index``/
    ``peer_instruction`` the other rank's instruction that made it late (the partner's
    post, or the op at the head of the comm stream or link that held the transfer;
    -1/-1/"" when there is none).
    """

    rank: int
    start: float
    end: float
    cause: str
    detail: str
    index: int = -1
    instruction: str = ""
    comms: list[str] = field(default_factory=list)
    peer: int = -1
    peer_index: int = -1
    peer_instruction: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        """Every field, as a JSON-ready dict (``comms`` copied)."""
        d = {f: getattr(self, f) for f in _STALL_FIELDS}
        d["comms"] = list(self.comms)
        return d


_STALL_FIELDS = tuple(f.name for f in fields(Stall))


@dataclass
class Member:
    """One comm op a wait waited for, with its message."""

    token: str
    key: tuple[str, int, int]
    is_send: bool
    msg: Message | None
    done: float | None


def _members(idx: TimelineIndex, w: WaitRecord) -> list[Member]:
    out = []
    for tok in w.comms:
        _, key, is_send = comm_of(tok)
        msg = idx.msgs.get(key)
        done = None if msg is None else (msg.send_done if is_send else msg.recv_done)
        out.append(Member(tok, key, is_send, msg, done))
    return out


def transfer_ready(tl: Timeline, msg: Message) -> float | None:
    """When ``msg`` could start moving: its send post (eager, data) or, when the transfer
    waited for the recv (rendezvous), the later of the two posts; in a measured timeline
    its ``start`` (when both sides had posted: gloo and NCCL are rendezvous)."""
    sp, rp, st = msg.send_posted, msg.recv_posted, msg.start
    if tl.source == "measured" and st is not None:
        return st       # measured: start is when both sides had posted (Message)
    if sp is None:
        return None
    if tl.semantics == "rendezvous" and rp is not None and st is not None and st >= rp - EPS:
        return max(sp, rp)
    return sp


def queued_behind(tl: Timeline, msg: Message) -> list[Message]:
    """Messages on the same directed link that started before ``msg`` and were still
    moving after ``msg`` was ready (what it queued behind)."""
    ready = transfer_ready(tl, msg)
    if ready is None or msg.start is None:
        return []
    return [m for m in tl.messages
            if m is not msg and m.src == msg.src and m.dst == msg.dst and m.start is not None
            and m.start < msg.start - EPS and (m.arrival or 0) > ready + EPS]


def mechanism(idx: TimelineIndex, m: Member) -> tuple[str, str]:
    """``(cause, sentence)`` explaining why member ``m`` completed when it did."""
    tl = idx.tl
    msg = m.msg
    if msg is None:
        return "wait-recv", f"{m.token}: no such message in the timeline"
    prod = idx.producer(m.key)
    made = (f"made by {span_token(prod)} on rank {msg.src}, ended {fmt_time(prod.end)}"
            if prod is not None else f"from rank {msg.src}, never made")
    if m.done is None:
        return "deadlock", f"{m.token} ({key_label(m.key)}) never completes"
    ready = transfer_ready(tl, msg)
    owner = msg.src if m.is_send else msg.dst
    if msg.start is not None and ready is not None and msg.start > ready + EPS:
        held = atomic_hold(idx, msg, ready)
        if held is not None:
            return "atomic-batch", (f"{m.token} ({key_label(m.key)}, {made}) was ready to "
                                    f"move at {fmt_time(ready)} but started only at "
                                    f"{fmt_time(msg.start)}: {held[0]}")
        blk = streams_of(idx).transfer_blocker(msg, owner)
        if blk is not None:        # a side queued on its rank's comm stream
            return "head-of-line", (f"{m.token} ({key_label(m.key)}, {made}) was ready to "
                                    f"move at {fmt_time(ready)} but started only at "
                                    f"{fmt_time(msg.start)}: {blk.sentence()}")
        behind = queued_behind(tl, msg)
        what = (", ".join(f"{b.label()} (started {fmt_time(b.start)})" for b in behind[:3])
                if behind else f"earlier P2P ops on rank {owner}'s comm stream")
        return "head-of-line", (f"{m.token} ({key_label(m.key)}, {made}) was ready to move "
                                f"at {fmt_time(ready)} but started only at {fmt_time(msg.start)}, "
                                f"queued behind {what}")
    own = Side(msg, m.is_send)
    blk = streams_of(idx).blocker(own)
    if blk is not None and m.done >= (own.active or 0.0) - EPS and (
            msg.arrival is None or own.active > msg.arrival + EPS):
        # the op itself was queued on its own rank's stream past the data's arrival
        return "head-of-line", (f"{m.token} ({key_label(m.key)}, {made}) arrived at "
                                f"{fmt_time(msg.arrival)} but {blk.sentence()}; it completed "
                                f"at {fmt_time(m.done)}")
    if not m.is_send:
        sp = msg.send_posted
        txt = f"{m.token} waits for the {key_label(m.key)} from rank {msg.src} ({made})"
        if (tl.semantics != "data" and prod is not None and sp is not None
                and sp > prod.end + EPS):
            txt += (f"; rank {msg.src} posted {partner_token(m.token)} only at {fmt_time(sp)} "
                    f"(instr {msg.send_index}), {fmt_time(sp - prod.end)} after the data was "
                    f"ready")
        elif sp is not None and tl.semantics != "data":
            txt += f"; rank {msg.src} posted {partner_token(m.token)} at {fmt_time(sp)}"
        txt += f"; it completed at {fmt_time(m.done)}"
        return "wait-recv", txt
    rp, sp = msg.recv_posted, msg.send_posted
    if (rp is not None and sp is not None and rp > sp + EPS and m.done >= rp - EPS
            and (msg.start is None or msg.start >= rp - EPS)):
        return "wait-send", (f"{m.token} ({key_label(m.key)}) was not accepted until rank "
                             f"{msg.dst} posted {partner_token(m.token)} at {fmt_time(rp)} "
                             f"(instr {msg.recv_index}); it completed at {fmt_time(m.done)}")
    return "transfer", (f"{m.token} ({key_label(m.key)}) was on the wire from "
                        f"{fmt_time(msg.start if msg.start is not None else sp)} to "
                        f"{fmt_time(m.done)}")


def explain_wait(idx: TimelineIndex, w: WaitRecord, next_span: Span | None
                 ) -> tuple[str, str, list[str], Culprit]:
    """``(cause, detail, binding tokens, culprit)`` of one recorded wait (the culprit:
    :func:`schedsim.analysis.blame.culprit`)."""
    if w.kind == "INIT":
        tok = w.comms[0] if w.comms else "?"
        txt, who = init_wait(idx.tl, w.rank, w.index, tok, w.end, w.start)
        return "comm-init", txt, list(w.comms), who
    members = _members(idx, w)
    if not members:
        return "host", f"{w.kind} at instr {w.index} with nothing to wait for", [], NOBODY
    # the member(s) that completed last bound the wait (in a simulated run they complete
    # exactly at its release; in a measured one the wait returns a little later)
    last = max((float("inf") if m.done is None else m.done) for m in members)
    binding = [m for m in members if m.done is None or m.done >= last - EPS]
    needed = idx.needs_of(next_span) if next_span is not None else set()
    needed_binding = [m for m in binding if not m.is_send and m.key in needed]
    where = f"{w.kind} at instr {w.index}" if w.kind != "DATA" else "its inputs"
    toks = [m.token for m in binding]
    if len(members) > 1 and next_span is not None and not needed_binding:
        mechs = [mechanism(idx, m) for m in binding]
        parts = "; ".join(t for _, t in mechs)
        who = culprit(idx, binding[0].msg, binding[0].is_send, mechs[0][0])
        return "wait-batch", (f"{where} waits for {len(members)} P2P ops and is held by "
                              f"{', '.join(toks)}, which the next op "
                              f"{span_token(next_span)} does not need: {parts}"), toks, who
    m = needed_binding[0] if needed_binding else binding[0]
    cause, txt = mechanism(idx, m)
    who = culprit(idx, m.msg, m.is_send, cause)
    if (next_span is not None and not m.is_send and m.key not in needed
            and cause == "wait-recv"):
        txt += f" (the next op {span_token(next_span)} does not need it)"
    if len(binding) > 1:
        txt += f"; completing at the same time: {', '.join(t for t in toks if t != m.token)}"
    return cause, f"{where}: {txt}" if w.kind != "DATA" else txt, toks, who


def _pieces(a: float, b: float, waits: list[WaitRecord]) -> list[tuple[float, float,
                                                                         WaitRecord | None]]:
    """Cut ``[a, b)`` at the waits overlapping it; uncovered parts get ``None``."""
    out: list[tuple[float, float, WaitRecord | None]] = []
    t = a
    for w in waits:
        s, e = max(w.start, a), min(w.end, b)
        if e <= s + EPS or e <= t + EPS:
            continue
        s = max(s, t)
        if s > t + EPS:
            out.append((t, s, None))
        out.append((s, e, w))
        t = e
    if b > t + EPS:
        out.append((t, b, None))
    return out


def attribute_stalls(tl: Timeline, program: Program | None = None) -> list[Stall]:
    """Classify every idle interval of every rank in ``[0, makespan]``.

    Returns the stalls sorted by (rank, start); on each rank they and the spans tile
    ``[0, makespan]`` exactly. ``program`` (optional) lets details quote the blocking
    instruction's token; everything else comes from the timeline's spans, messages and
    waits. Causes are listed in :data:`CAUSES` (module docstring).
    """
    idx = TimelineIndex(tl)
    M = tl.makespan
    blocked = {b.rank: b for b in (tl.deadlock.blocked if tl.deadlock else [])}
    out: list[Stall] = []
    for r in range(tl.ranks):
        spans = idx.rank_spans[r]
        waits = idx.rank_waits[r]
        gaps: list[tuple[float, float, Span | None, str]] = []
        t = 0.0
        for k, s in enumerate(spans):
            if s.start > t + EPS:
                gaps.append((t, s.start, s, "warmup" if k == 0 else ""))
            t = max(t, s.end)
        if M > t + EPS:
            gaps.append((t, M, None, "deadlock" if r in blocked else
                         ("cooldown" if spans else "warmup")))
        for a, b, nxt, pos in gaps:
            for s0, s1, w in _pieces(a, b, waits):
                out.append(_stall(idx, program, r, s0, s1, w, nxt, pos, spans, blocked))
    out.sort(key=lambda s: (s.rank, s.start))
    return out


def _instr_token(program: Program | None, r: int, i: int, fallback: str) -> str:
    tok = None if program is None else instr_token(program, r, i)
    return fallback if tok is None else tok


def _stall(idx: TimelineIndex, program: Program | None, r: int, s0: float, s1: float,
           w: WaitRecord | None, nxt: Span | None, pos: str, spans: list[Span],
           blocked: dict) -> Stall:
    if pos == "deadlock":
        b = blocked[r]
        who = NOBODY
        for c in (idx.tl.deadlock.cycle if idx.tl.deadlock else []):
            if c.rank == r and c.peer in blocked:     # the rank it waits for, where stuck
                who = (c.peer, blocked[c.peer].index, blocked[c.peer].instruction)
        return Stall(r, s0, s1, "deadlock",
                     f"blocked at instr {b.index} ({b.instruction}) since {fmt_time(b.since)}, "
                     f"waiting for " + "; ".join(b.waiting_for), b.index, b.instruction,
                     [], *who)
    if w is None:
        cause = pos or "host"
        if pos == "cooldown":
            detail = (f"no op left on rank {r}: its last op "
                      f"{span_token(spans[-1])} ended at {fmt_time(s0)}")
        elif pos == "warmup":
            detail = ("no op could run yet" if nxt is None else
                      f"no op could run yet; first op {span_token(nxt)} starts at "
                      f"{fmt_time(nxt.start)}")
        else:
            detail = "no recorded wait covers this interval (host-side time between ops)"
            launch = _launching(idx.tl, program, r, s0, s1)
            if launch:
                detail += f"; {launch}"
        return Stall(r, s0, s1, cause, detail)
    cause, detail, toks, who = explain_wait(idx, w, nxt)
    tok = ("DATA" if w.kind == "DATA" else
           _instr_token(program, r, w.index, w.kind if w.kind != "WAIT" else
                        "WAIT[" + "+".join(w.comms) + "]"))
    if pos == "warmup":
        detail = (f"before its first op {span_token(nxt)}: {detail}" if nxt is not None
                  else detail)
        cause = "warmup"
    elif pos == "cooldown":
        detail = (f"after its last op {span_token(spans[-1])} (ended "
                  f"{fmt_time(spans[-1].end)}), the rank only waits: {detail}")
        cause = "cooldown"
    return Stall(r, s0, s1, cause, detail, w.index, tok, toks, *who)


def _launching(tl: Timeline, program: Program | None, r: int, s0: float, s1: float
               ) -> str:
    """For a measured timeline with launch records (``posts``): which launches took the
    host's time in ``[s0, s1)`` (the longest named), or ""."""
    mine = [(min(p["end"], s1) - max(p["start"], s0), p["index"])
            for p in getattr(tl, "posts", None) or []
            if p["rank"] == r and p["end"] > s0 and p["start"] < s1]
    mine = [x for x in mine if x[0] > EPS]
    if not mine:
        return ""
    t, i = max(mine)
    tok = _instr_token(program, r, i, f"instr {i}")
    more = f" (and {len(mine) - 1} more launches)" if len(mine) > 1 else ""
    return (f"{fmt_time(sum(x[0] for x in mine))} of it launching sends/recvs: "
            f"{tok} (instr {i}) {fmt_time(t)}{more}")


def stalls_summary(stalls: list[Stall], ranks: int) -> dict[str, list[float]]:
    """Total stalled time per cause per rank: ``{cause: [time of rank 0, ...]}``."""
    out: dict[str, list[float]] = {}
    for s in stalls:
        out.setdefault(s.cause, [0.0] * ranks)[s.rank] += s.duration
    return out


def stalls_headline(stalls: list[Stall], tl: Timeline, rank: int | None = None) -> str:
    """One line: how much of the run is idle and why, and the longest stall (of
    ``rank`` when given, else of all ranks)."""
    sel = [s for s in stalls if rank is None or s.rank == rank]
    ranks = 1 if rank is not None else tl.ranks
    total = ranks * tl.makespan
    idle = sum(s.duration for s in sel)
    by: dict[str, float] = {}
    for s in sel:
        by[s.cause] = by.get(s.cause, 0.0) + s.duration
    u = tl.unit
    causes = ", ".join(f"{c} {with_unit(v, u)}" for c, v in sorted(by.items(),
                                                                   key=lambda kv: -kv[1]))
    who = f"rank {rank}" if rank is not None else "all ranks"
    pct = f" ({100 * idle / total:.1f}%)" if total > 0 else ""
    head = (f"idle by cause ({who}): {causes or 'none'} = {with_unit(idle, u)} of "
            f"{with_unit(total, u)}{pct} in {len(sel)} stalls")
    if not sel:
        return head
    top = max(sel, key=lambda s: (s.duration, -s.rank, -s.start))
    return (f"{head}; longest: rank {top.rank} {fmt_time(top.start)}-"
            f"{with_unit(top.end, u)} {top.cause}")


def stalls_of(tl: Timeline, stalls: Any) -> list[Any]:
    """Normalise a figure's or trace's ``stalls`` option: None/False -> none; True -> the
    stalls of :func:`attribute_stalls`; a list -> itself (objects with ``rank, start,
    end, cause``)."""
    if stalls is None or stalls is False:
        return []
    if stalls is True:
        return list(attribute_stalls(tl))
    return list(stalls)

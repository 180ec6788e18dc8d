"""Send/recv alignment: for every message, the life of its data from producer to consumer.

One row per message: when the data was *ready* (its producer op ended), when the sender
*posted* the send, when the receiver posted the recv, when the transfer *started* and
*arrived*, when the recv *completed* and when the *consumer* op started. With whole-number
costs the slot view names instants the way papers draw them: data ready at 11 is "end of
T10", a consumer starting at 12 runs "in T12".

Flags:

- ``late-send``: the send was posted after the data was ready (by ``send_posted - ready``);
- ``late-recv``: under rendezvous the transfer waited for the receiver to post its recv;
- ``queued``: the transfer started after it could have (link FIFO or comm stream);
  ``queued_behind`` then names what held it: the rank whose comm stream held a side (often
  the peer's), its stream and the op at the head of its queue
  (:mod:`schedsim.analysis.blame`), or the message ahead of it on the link.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from schedsim.analysis._index import EPS, TimelineIndex, span_token
from schedsim.analysis.blame import streams_of
from schedsim.analysis.stalls import queued_behind, transfer_ready
from schedsim.timeline import Message, Timeline
from schedsim.util.units import fmt_time


@dataclass
class AlignRow:
    """One message's timeline (times in the timeline's unit; None when not recorded)."""

    kind: str
    mb: int
    stage: int
    src: int
    dst: int
    producer: str
    ready: float | None
    send_posted: float | None
    recv_posted: float | None
    start: float | None
    arrival: float | None
    recv_done: float | None
    consumer: str
    consumer_start: float | None
    send_index: int = -1
    recv_index: int = -1
    flags: list[str] = field(default_factory=list)
    queued_behind: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind} mb{self.mb} {self.src}->{self.dst}"

    @property
    def send_delay(self) -> float:
        """How long after the data was ready the send was posted."""
        if self.ready is None or self.send_posted is None:
            return 0.0
        return max(0.0, self.send_posted - self.ready)

    def to_dict(self) -> dict:
        """The row as a JSON-ready dict (every field; ``flags`` copied)."""
        d = {n: getattr(self, n) for n in _FIELDS}
        d["flags"] = list(self.flags)
        return d


_FIELDS = tuple(f.name for f in fields(AlignRow))


def alignment(tl: Timeline, late_threshold: float = 0.0) -> list[AlignRow]:
    """One :class:`AlignRow` per message, in order of data-ready time.

    ``late_threshold``: a send posted more than this after its data was ready is flagged
    ``late-send``.
    """
    idx = TimelineIndex(tl)
    rows = []
    for m in tl.messages:
        key = m.key
        prod, cons = idx.producer(key), idx.consumer(key)
        row = AlignRow(m.kind, m.mb, m.stage, m.src, m.dst,
                       span_token(prod) if prod else "-", prod.end if prod else None,
                       m.send_posted, m.recv_posted, m.start, m.arrival, m.recv_done,
                       span_token(cons) if cons else "-", cons.start if cons else None,
                       m.send_index, m.recv_index)
        if row.send_delay > late_threshold + EPS:
            row.flags.append("late-send")
        rp, sp = m.recv_posted, m.send_posted
        if (tl.semantics == "rendezvous" and rp is not None and sp is not None
                and rp > sp + EPS and m.start is not None and m.start >= rp - EPS):
            row.flags.append("late-recv")
        ready = transfer_ready(tl, m)
        if m.start is not None and ready is not None and m.start > ready + EPS:
            row.flags.append("queued")
            row.queued_behind = _queued_behind(idx, m)
        rows.append(row)
    rows.sort(key=lambda r: (r.ready if r.ready is not None else float("inf"), r.src,
                             r.dst))
    return rows


def _queued_behind(idx: TimelineIndex, m: Message) -> str:
    """What held a queued transfer: ``rank 0's comm stream: 0SEND_F1 (instr 4) behind
    3RECV_F0 (instr 3)``, or ``link 0->1 behind F mb0 0->1``."""
    blk = streams_of(idx).transfer_blocker(m)
    if blk is not None:
        s, h = blk.side, blk.head
        return (f"{blk.stream}: {s.token} (instr {s.index})"
                + (f" behind {h.token} (instr {h.index})" if h is not None else ""))
    ahead = queued_behind(idx.tl, m)
    if ahead:
        return f"link {m.src}->{m.dst} behind {ahead[0].label()}"
    return ""


def is_slotted(tl: Timeline) -> bool:
    """True if every span starts and ends on a whole number (the T0, T1, ... view)."""
    return all(float(s.start).is_integer() and float(s.end).is_integer() for s in tl.spans)


def slot_end(t: float | None) -> str:
    """An instant that ends a slot: 11 -> ``end T10``."""
    if t is None:
        return "-"
    return "start" if t == 0 else f"end T{int(t) - 1}"


def slot_at(t: float | None) -> str:
    """An instant at which an op starts: 12 -> ``T12``."""
    return "-" if t is None else f"T{int(t)}"


def row_cells(r: AlignRow, slotted: bool) -> list[str]:
    """Table cells of one row: message, producer, ready, posts, transfer, consumer, flags."""
    if slotted and r.ready is not None and float(r.ready).is_integer():
        ready = f"{fmt_time(r.ready)} ({slot_end(r.ready)})"
        cons = (f"{r.consumer} {fmt_time(r.consumer_start)} ({slot_at(r.consumer_start)})"
                if r.consumer_start is not None else r.consumer)
    else:
        ready = fmt_time(r.ready)
        cons = f"{r.consumer} {fmt_time(r.consumer_start)}"
    flags = [f if f != "queued" or not r.queued_behind else f"queued ({r.queued_behind})"
             for f in r.flags]
    return [r.label, r.producer, ready, fmt_time(r.send_posted), fmt_time(r.recv_posted),
            f"{fmt_time(r.start)}-{fmt_time(r.arrival)}", fmt_time(r.recv_done), cons,
            ", ".join(flags)]


ALIGN_COLUMNS = ("message", "producer", "data ready", "send posted", "recv posted",
                 "transfer", "recv done", "consumer start", "flags")

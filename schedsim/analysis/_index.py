"""Lookup tables over one Timeline shared by the analysis modules.

A message is identified by its key ``(kind, producing stage, mb)`` (see
:mod:`schedsim.program.routing`); an op atom by ``(kind, stage, mb)``, FB spans being indexed by
both of their parts.
"""
from __future__ import annotations

from bisect import bisect_right
from functools import cached_property

from schedsim.program.ir import Comm, Op
from schedsim.program.ops import recv_comm, send_comm
from schedsim.program.routing import Key, consumer_atoms, needs, producer_atoms
from schedsim.program.tokens import parse_comm
from schedsim.timeline import Message, Span, Timeline

EPS = 1e-9


def span_atoms(s: Span) -> list[tuple[str, int, int]]:
    """``(kind, stage, mb)`` of each non-overlapped op a span performs."""
    if s.parts:
        return [(p.kind, p.stage, p.mb) for p in s.parts]
    return [(s.kind, s.stage, s.mb)]


def span_token(s: Span) -> str:
    """Program token of a span's op: ``5W0``, ``(2F15;5BW1)``."""
    if s.parts:
        f, b = s.parts
        return f"({f.stage}F{f.mb};{b.stage}{b.kind}{b.mb})"
    return f"{s.stage}{s.kind}{s.mb}"


def key_label(key: Key) -> str:
    """``F mb3 (stage 4 output)`` / ``B mb0 (input grad of stage 5)``."""
    kind, s, mb = key[:3]
    to = f" for stage {key[3]}" if len(key) == 4 else ""
    if kind == "F":
        return f"activation of stage {s} mb {mb}{to}"
    return f"input gradient of stage {s} mb {mb}{to}"


def _first(index: dict, keys: tuple) -> Span | None:
    for k in keys:
        s = index.get(k)
        if s is not None:
            return s
    return None


def rank_atom_index(tl: Timeline) -> dict[tuple[int, str, int, int], Span]:
    """``(rank, kind, stage, mb) -> span`` for every op (FB spans under both parts)."""
    idx: dict[tuple[int, str, int, int], Span] = {}
    for s in tl.spans:
        for kind, stage, mb in span_atoms(s):
            idx[(s.rank, kind, stage, mb)] = s
    return idx


def message_consumer(m: Message, idx: dict[tuple[int, str, int, int], Span]) -> Span | None:
    """The span on ``m.dst`` that consumes message ``m`` (``idx``: :func:`rank_atom_index`),
    or None if the timeline has none."""
    return _first(idx, tuple((m.dst, *a) for a in consumer_atoms(m.key)))


def recv_token(m: Message) -> str:
    """The receiver's comm token for ``m`` (``4RECV_B0``), as wait records name it."""
    return str(recv_comm(m.key))


class TimelineIndex:
    """Spans by (rank, index) and by atom, messages by key, spans and waits by rank.

    Each table is built on first use (a stall analysis that never asks for a message
    does not index a million of them).
    """

    def __init__(self, tl: Timeline) -> None:
        self.tl = tl

    @cached_property
    def by_instr(self) -> dict[tuple[int, int], Span]:
        """``(rank, instruction index) -> span``."""
        return {(s.rank, s.index): s for s in self.tl.spans}

    @cached_property
    def by_atom(self) -> dict[tuple[str, int, int], Span]:
        """``(kind, stage, mb) -> span`` (an FB span under both of its parts)."""
        out: dict[tuple[str, int, int], Span] = {}
        for s in self.tl.spans:
            if s.parts:
                for p in s.parts:
                    out[(p.kind, p.stage, p.mb)] = s
            else:
                out[(s.kind, s.stage, s.mb)] = s
        return out

    @cached_property
    def rank_spans(self) -> list[list[Span]]:
        """Per rank, its spans by (start, index)."""
        rows: list[list[Span]] = [[] for _ in range(self.tl.ranks)]
        for s in self.tl.spans:
            rows[s.rank].append(s)
        for row in rows:
            row.sort(key=lambda s: (s.start, s.index))
        return rows

    @cached_property
    def msgs(self) -> dict[Key, Message]:
        """Message key -> message."""
        return {m.key: m for m in self.tl.messages}

    @cached_property
    def rank_waits(self) -> list[list]:
        """Per rank, its recorded waits by (start, index)."""
        rows: list[list] = [[] for _ in range(self.tl.ranks)]
        for w in self.tl.waits:
            rows[w.rank].append(w)
        for row in rows:
            row.sort(key=lambda w: (w.start, w.index))
        return rows

    @cached_property
    def _by_index(self) -> list[tuple[list[int], list[Span]]]:
        out = []
        for row in self.rank_spans:
            srt = sorted(row, key=lambda s: s.index)
            out.append(([s.index for s in srt], srt))
        return out

    def span_after(self, rank: int, index: int) -> Span | None:
        """The first compute span of ``rank`` whose instruction index is > ``index``."""
        keys, spans = self._by_index[rank]
        k = bisect_right(keys, index)
        return spans[k] if k < len(spans) else None

    def producer(self, key: Key) -> Span | None:
        """The span that produced message ``key`` (F for an activation, B/BW a gradient)."""
        return _first(self.by_atom, producer_atoms(key))

    def consumer(self, key: Key) -> Span | None:
        """The span that consumes message ``key`` on the receiving rank."""
        return _first(self.by_atom, consumer_atoms(key))

    @cached_property
    def skip_needs(self) -> dict[tuple[str, int, int], list[Key]]:
        """``(consumer kind F/B, consuming stage, mb) ->`` keys of the skip-edge messages
        (``Message.to_stage``) that a forward (F) or backward (B, BW) consumes."""
        out: dict[tuple[str, int, int], list[Key]] = {}
        for m in self.tl.messages:
            if m.to_stage is not None:
                out.setdefault((m.kind, m.to_stage, m.mb), []).append(m.key)
        return out

    def needs_of(self, span: Span) -> set[Key]:
        """Message keys ``span`` consumes (cross-rank or not; skip edges included)."""
        out: set[Key] = set()
        skip = self.skip_needs
        for k, st, mb in span_atoms(span):
            out.update(needs(Op(k, st, mb), self.tl.stages))
            if skip and k != "W":
                out.update(skip.get(("F" if k == "F" else "B", st, mb), ()))
        return out


def comm_of(token: str) -> tuple[Comm, Key, bool]:
    """Parse a comm token: ``(Comm, message key, is_send)``."""
    c = parse_comm(token)
    return c, c.message_key(), c.is_send


def partner_token(token: str) -> str:
    """The token of the other side of a comm (``5SEND_B0`` -> ``4RECV_B0``)."""
    c, key, is_send = comm_of(token)
    return str(recv_comm(key) if is_send else send_comm(key))

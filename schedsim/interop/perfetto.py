"""Perfetto / Chrome trace JSON (the Trace Event Format, JSON object form).

One file holds one or more timelines (e.g. predicted and measured) as separate process
groups: timeline ``g`` (0-based, in the order given) owns processes
``pid = g * PID_STRIDE + rank + 1`` named ``"<name> · rank <r>"`` and sorted group by group.
Inside each rank's process:

- thread ``compute`` (tid 1; ``compute #2``... if spans overlap, as measured ones may):
  one complete event (``ph: "X"``) per compute op, args ``kind, mb, stage, chunk, index,
  start, end`` (and ``parts`` for ``FB``);
- threads ``send → rank d`` / ``recv ← rank s`` (one more lane, ``#2``..., whenever two
  transfers on that link overlap in time): one slice per message on the sender from the
  transfer start to its arrival, and one on the receiver from the recv post (or the
  arrival when no recv was posted, as under ``data`` semantics) to the recv's completion;
  args ``kind, mb, stage, src, dst, bytes, send_posted, recv_posted, start, arrival,
  send_done, recv_done``;
- flow events (``ph: "s"`` then ``ph: "f"`` with ``bp: "e"``) from the op that produced
  each message (on the sender's compute thread) to the op that consumed it (on the
  receiver's), each placed at the middle of its op so that it binds to that slice;
- a counter track ``activation memory`` (``ph: "C"``, unit ``M_B``, see
  :mod:`schedsim.analysis.memory`);
- thread ``stalls``: an instant event (``ph: "i"``, ``s: "t"``) at the start of each stall
  with args ``cause, detail, start, end, duration``;
- thread ``collectives`` (``collectives tp N`` per tensor-parallel rank of a measured TP
  replay), when the timeline has ``pieces`` (:mod:`schedsim.sim.pieces`): one slice per
  TP/EP collective inside an op, args ``collective, group, bytes, kind, mb, stage, layer,
  half, index``.

The file is streamed: timestamps are computed per timeline with numpy and each event is
formatted straight to JSON text, so a million-op timeline never exists as event dicts.
:func:`trace_events` parses that same text back into a dict (for small traces and tests).

Time: the format wants microseconds. A timeline's times are in its ``unit``: ``us``/``µs``
map 1:1, ``ms`` x1000, ``s`` x1e6, ``ns`` x1e-3, and ``slot`` (and any other unit) x1000,
i.e. **one slot is shown as 1 ms** (``us_per_unit`` overrides this). Original times are
kept in the args. Timestamps are rounded to 1 ns. ``otherData`` records the mapping.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import lru_cache
from operator import attrgetter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from schedsim.errors import ScenarioError
from schedsim.timeline import Span, Timeline

#: microseconds per time unit; any other unit (``slot`` included) counts as 1000 us
US_PER_UNIT = {"us": 1.0, "µs": 1.0, "ms": 1000.0, "s": 1e6, "ns": 1e-3, "slot": 1000.0}
#: pids of timeline g are ``g * PID_STRIDE + rank + 1``
PID_STRIDE = 1000
TID_COMPUTE = 1
TID_STALLS = 2
TID_LINKS = 10          # first tid of the send/recv tracks
TID_COLLECTIVES = 3     # collective tracks: 3, then 800 + tp rank for TP ranks >= 1
TID_EXTRA_COMPUTE = 900  # compute lanes 2, 3, ... (overlapping measured spans)
_TO = "\\u2192"         # "→" and "←" as JSON escapes (the file is ASCII)
_FROM = "\\u2190"


def us_per_unit(unit: str) -> float:
    """Microseconds per unit of ``unit`` (1000 for ``slot`` and for unknown units)."""
    return US_PER_UNIT.get(unit, 1000.0)


def _lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: a lane per interval so that intervals in one lane do
    not overlap (touching ends are allowed). Lane 0 is used first."""
    if not intervals:
        return []
    iv = np.asarray(intervals, dtype=np.float64)
    o = np.lexsort((iv[:, 1], iv[:, 0]))
    if (iv[o[1:], 0] >= np.maximum.accumulate(iv[o, 1])[:-1]).all():
        return [0] * len(intervals)          # no overlap: one lane (the common case)
    ends: list[float] = []
    out = [0] * len(intervals)
    for i in o.tolist():
        s, e = intervals[i]
        for lane, end in enumerate(ends):
            if end <= s:
                ends[lane] = e
                out[i] = lane
                break
        else:
            ends.append(e)
            out[i] = len(ends) - 1
    return out


def _default_names(timelines: Sequence[Timeline]) -> list[str]:
    base = ["predicted" if t.source == "simulated" else "measured" for t in timelines]
    if len(set(base)) < len(base):
        base = [f"{b} {i}" for i, b in enumerate(base)]
    return base


def _span_name(s: Span) -> str:
    if s.parts:
        return " + ".join(f"{p.kind} mb{p.mb}" for p in s.parts)
    return f"{s.kind} mb{s.mb}"


def _s_op(kind: str, mb: int) -> str:
    """``"F mb3"`` as JSON."""
    return f'"{_sjs(kind)} mb{mb}"'


def _sjs(text: str) -> str:
    """The inside of a JSON string for ``text``: as is when it needs no escape."""
    return text if _PLAIN.fullmatch(text) else json.dumps(text)[1:-1]


_PLAIN = re.compile(r"[A-Za-z0-9_ #+().:;-]*")


def _json(x: Any) -> str:
    """Any JSON value, compact (as the file is written)."""
    return json.dumps(x, allow_nan=False, separators=(",", ":"))


def _n(x: Any) -> str:
    """A JSON number (or null), as ``json.dumps`` writes it."""
    return "null" if x is None else repr(x)


@lru_cache(maxsize=4096)
def _s(text: str) -> str:
    """A JSON string (ASCII, escaped), memoized: kinds, units and names repeat."""
    return json.dumps(text)


def _meta(what: str, pid: int, tid: int | None, **args: Any) -> str:
    a = ",".join(f"{_s(k)}:{_s(v) if isinstance(v, str) else _n(v)}"
                 for k, v in args.items())
    tail = "" if tid is None else f',"tid":{tid}'
    return f'{{"name":"{what}","ph":"M","pid":{pid},"args":{{{a}}}{tail}}}'


class _Clock:
    """Timestamps of one timeline: ``round(t * scale, 3)`` (as the format's
    microseconds), computed for whole arrays."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def ts(self, t: float) -> float:
        return round(t * self.scale, 3)

    def many(self, ts: list[float]) -> list[float]:
        scaled = np.asarray(ts, dtype=np.float64) * self.scale
        if (scaled == np.rint(scaled)).all():     # whole microseconds: round() keeps them
            return scaled.tolist()
        return [round(x, 3) for x in scaled.tolist()]


def _check(tls: list[Timeline], names: Sequence[str] | None) -> list[str]:
    if not tls:
        raise ScenarioError("a trace needs at least one timeline")
    names = list(names) if names is not None else _default_names(tls)
    if len(names) != len(tls) or len(set(names)) != len(names):
        raise ScenarioError(f"trace names {names!r}: give one distinct name per timeline "
                            f"({len(tls)})")
    if max(t.ranks for t in tls) >= PID_STRIDE:
        raise ScenarioError(f"a trace holds at most {PID_STRIDE - 1} ranks per timeline")
    return names


def trace_chunks(timelines: Sequence[Timeline], names: Sequence[str] | None = None, *,
                 memory: Any = True, stalls: Any = True,
                 us_per_unit_override: float | None = None) -> Iterator[str]:
    """The trace JSON as text chunks (see :func:`trace_events` for the options and
    errors; the errors are raised before the first chunk)."""
    tls = list(timelines)
    names = _check(tls, names)
    return _chunks(tls, names, memory, stalls, us_per_unit_override)


def _chunks(tls: list[Timeline], names: list[str], memory: Any, stalls: Any,
            override: float | None) -> Iterator[str]:
    yield '{"traceEvents":['
    flows = 0
    info = []
    first = True
    for g, (tl, name) in enumerate(zip(tls, names)):
        scale = override or us_per_unit(tl.unit)
        tl_stalls = stalls[g] if isinstance(stalls, (list, tuple)) else stalls
        one = _TimelineEvents(tl, name, g, _Clock(scale), flows)
        for batch in one.events(memory, tl_stalls):
            if batch:
                yield ("" if first else ",") + ",".join(batch)
                first = False
        flows = one.flow_id
        info.append({"name": name, "schedule": tl.schedule, "source": tl.source,
                     "semantics": tl.semantics, "ranks": tl.ranks,
                     "microbatches": tl.microbatches, "unit": tl.unit,
                     "us_per_unit": scale, "makespan": tl.makespan,
                     "bubble_ratio": tl.bubble_ratio(), "pids": [g * PID_STRIDE + 1,
                                                                 g * PID_STRIDE + tl.ranks]})
    other = _json({"generator": "schedsim", "timelines": json.dumps(info)})
    yield f'],"displayTimeUnit":"ms","otherData":{other}}}'


class _TimelineEvents:
    """The events of one timeline ``g``, as lists of JSON texts (module docstring)."""

    def __init__(self, tl: Timeline, name: str, g: int, clock: _Clock,
                 flow_id: int) -> None:
        self.tl, self.name, self.base, self.clock = tl, name, g * PID_STRIDE, clock
        self.flow_id = flow_id
        self.unit = _s(tl.unit)
        spans = tl.spans
        self.t0 = clock.many([s.start for s in spans])
        self.t1 = clock.many([s.end for s in spans])
        self.span_tid: list[int] = [TID_COMPUTE] * len(spans)

    def events(self, memory: Any, stalls: Any) -> Iterator[list[str]]:
        yield self._processes()
        yield self._compute()
        yield from self._messages()
        yield self._flows()
        yield self._collectives()
        if memory is not False and memory is not None:
            yield self._memory(memory)
        if stalls is not False and stalls is not None:
            yield self._stalls(stalls)

    def _processes(self) -> list[str]:
        out = []
        for r in range(self.tl.ranks):
            pid = self.base + r + 1
            out += [_meta("process_name", pid, None, name=f"{self.name} · rank {r}"),
                    _meta("process_sort_index", pid, None, sort_index=pid),
                    _meta("thread_name", pid, TID_COMPUTE, name="compute"),
                    _meta("thread_sort_index", pid, TID_COMPUTE, sort_index=0)]
        return out

    def _compute(self) -> list[str]:
        """Compute slices, rank by rank (lanes only where spans of a rank overlap)."""
        tl, t0, t1, base = self.tl, self.t0, self.t1, self.base
        by_rank: list[list[int]] = [[] for _ in range(tl.ranks)]
        for i, s in enumerate(tl.spans):
            by_rank[s.rank].append(i)
        out = []
        for r, ids in enumerate(by_rank):
            pid = base + r + 1
            lanes = _lanes([(t0[i], t1[i]) for i in ids])
            for lane in sorted(set(lanes) - {0}):
                out += [_meta("thread_name", pid, TID_EXTRA_COMPUTE + lane,
                              name=f"compute #{lane + 1}"),
                        _meta("thread_sort_index", pid, TID_EXTRA_COMPUTE + lane,
                              sort_index=lane)]
            for i, lane in zip(ids, lanes):
                tid = TID_COMPUTE if lane == 0 else TID_EXTRA_COMPUTE + lane
                self.span_tid[i] = tid
                out.append(self._span(tl.spans[i], i, pid, tid))
        return out

    def _span(self, s: Span, i: int, pid: int, tid: int) -> str:
        ts = self.t0[i]
        dur = max(0.0, round(self.t1[i] - ts, 3))
        parts = ("" if not s.parts else ',"parts":[' + ",".join(
            f'{{"kind":{_s(p.kind)},"mb":{p.mb},"stage":{p.stage},"chunk":{p.chunk}}}'
            for p in s.parts) + "]")
        return (f'{{"name":{_s(_span_name(s)) if s.parts else _s_op(s.kind, s.mb)},'
                f'"cat":"compute","ph":"X","ts":{ts!r},'
                f'"dur":{dur!r},"pid":{pid},"tid":{tid},"args":{{"kind":{_s(s.kind)},'
                f'"mb":{s.mb},"stage":{s.stage},"chunk":{s.chunk},"index":{s.index},'
                f'"start":{s.start!r},"end":{s.end!r},"unit":{self.unit}{parts}}}}}')

    def _messages(self) -> Iterator[list[str]]:
        """Send and recv slices on per-link tracks (a lane per overlap)."""
        tl, base = self.tl, self.base
        tracks: dict[tuple[int, str, int], list[tuple[float, float, int]]] = {}
        for k, m in enumerate(tl.messages):
            if m.start is not None and m.arrival is not None:
                tracks.setdefault((m.src, "send", m.dst), []).append((m.start, m.arrival, k))
            r0 = m.recv_posted if m.recv_posted is not None else m.arrival
            r1 = m.recv_done if m.recv_done is not None else m.arrival
            if r0 is not None and r1 is not None:
                tracks.setdefault((m.dst, "recv", m.src), []).append((r0, max(r0, r1), k))
        args = self._message_args()
        next_tid: dict[int, int] = {}
        for (rank, side, peer) in sorted(tracks):
            items = tracks[(rank, side, peer)]
            pid = base + rank + 1
            a = self.clock.many([t for t, _, _ in items])
            b = self.clock.many([t for _, t, _ in items])
            lanes = _lanes(list(zip(a, b)))
            first = next_tid.get(rank, TID_LINKS)
            next_tid[rank] = first + max(lanes) + 1
            arrow = f"send {_TO} rank {peer}" if side == "send" else f"recv {_FROM} rank {peer}"
            out = []
            for lane in range(max(lanes) + 1):
                out += [_meta_raw("thread_name", pid, first + lane,
                                  arrow + ("" if lane == 0 else f" #{lane + 1}")),
                        _meta("thread_sort_index", pid, first + lane,
                              sort_index=first + lane)]
            head = ('{"name":"SEND_%s mb%d ' + _TO + ' rank %d","cat":"comm","ph":"X",'
                    if side == "send" else
                    '{"name":"RECV_%s mb%d ' + _FROM + ' rank %d","cat":"comm","ph":"X",')
            fmt = head + '"ts":%r,"dur":%r,"pid":' + str(pid) + ',"tid":%d,"args":%s}'
            msgs = tl.messages
            out += [fmt % (_sjs((m := msgs[k]).kind), m.mb, m.dst if side == "send" else m.src,
                           x, max(0.0, round(y - x, 3)), first + lane, args[k])
                    for (_, _, k), lane, x, y in zip(items, lanes, a, b)]
            yield out

    def _message_args(self) -> list[str]:
        """Per message, the args of its send and recv slices (JSON)."""
        unit = self.unit
        cols = [[("null" if x is None else repr(x)) for x in map(attrgetter(f), self.tl.messages)]
                for f in ("send_posted", "recv_posted", "start", "arrival", "send_done",
                          "recv_done")]
        return [f'{{"kind":{_s(m.kind)},"mb":{m.mb},"stage":{m.stage},"src":{m.src},'
                f'"dst":{m.dst},"bytes":{m.bytes!r},"send_posted":{sp},"recv_posted":{rp},'
                f'"start":{st},"arrival":{ar},"send_done":{sd},"recv_done":{rd},'
                f'"unit":{unit}}}'
                for m, sp, rp, st, ar, sd, rd in zip(self.tl.messages, *cols)]

    def _flows(self) -> list[str]:
        """A flow per message from its producer op to its consumer op, each end at the
        middle of its op (a zero-length op has no inside to bind to: no flow)."""
        from schedsim.analysis._index import span_atoms
        from schedsim.program.routing import consumer_atoms, producer_atoms

        tl, t0, t1, base, tid = self.tl, self.t0, self.t1, self.base, self.span_tid
        at = {(s.rank, *a): i for i, s in enumerate(tl.spans) for a in span_atoms(s)}
        get = at.get
        mid = [round((x + y) / 2, 3) for x, y in zip(t0, t1)]
        out = []
        fs = ('{"name":"%s mb%d %d' + _TO + '%d","cat":"message","ph":"s","id":%d,"ts":%r,'
              '"pid":%d,"tid":%d}')
        ff = ('{"name":"%s mb%d %d' + _TO + '%d","cat":"message","ph":"f","id":%d,"ts":%r,'
              '"pid":%d,"tid":%d,"bp":"e"}')
        fid = self.flow_id
        for m in tl.messages:
            key = m.key
            i = j = None
            for a in producer_atoms(key):
                if (i := get((m.src, *a))) is not None:
                    break
            for a in consumer_atoms(key):
                if (j := get((m.dst, *a))) is not None:
                    break
            if i is None or j is None or t1[i] <= t0[i] or t1[j] <= t0[j]:
                continue
            fid += 1
            kind = _sjs(m.kind)
            out.append(fs % (kind, m.mb, m.src, m.dst, fid, mid[i], base + m.src + 1, tid[i]))
            out.append(ff % (kind, m.mb, m.src, m.dst, fid, mid[j], base + m.dst + 1, tid[j]))
        self.flow_id = fid
        return out

    def _collectives(self) -> list[str]:
        """One track per rank (and TP rank) with the collectives of ``tl.pieces``."""
        tl, base = self.tl, self.base
        recs = [p for p in (getattr(tl, "pieces", None) or [])
                if p.get("stream") == "collective"]
        named: set[tuple[int, int]] = set()
        several = len({int(q.get("tp_rank") or 0) for q in recs}) > 1
        out = []
        for p in recs:
            tpr = int(p.get("tp_rank") or 0)
            pid = base + p["rank"] + 1
            tid = TID_COLLECTIVES if tpr == 0 else 800 + tpr
            if (pid, tid) not in named:
                named.add((pid, tid))
                out += [_meta("thread_name", pid, tid,
                              name="collectives" + (f" tp {tpr}" if several else "")),
                        _meta("thread_sort_index", pid, tid, sort_index=2 + tpr)]
            ts = self.clock.ts(p["start"])
            dur = max(0.0, round(self.clock.ts(p["end"]) - ts, 3))
            args = {k: p.get(k) for k in ("collective", "group", "bytes", "kind", "mb",
                                          "stage", "layer", "half", "index", "tp_rank")}
            args["unit"] = tl.unit
            name = json.dumps(f"{p['name']} mb{p['mb']}")
            out.append(f'{{"name":{name},"cat":"collective","ph":"X","ts":{ts!r},'
                       f'"dur":{dur!r},"pid":{pid},"tid":{tid},"args":{_json(args)}}}')
        return out

    def _memory(self, memory: Any) -> list[str]:
        from schedsim.analysis.memory import MemoryModel, memory_curves

        out = []
        for r, curve in enumerate(memory_curves(self.tl, MemoryModel.from_spec(memory))):
            last: dict[float, float] = {}
            for ts, (_, v) in zip(self.clock.many([t for t, _ in curve]), curve):
                last[ts] = v          # several changes at one time: keep the final level
            pid = self.base + r + 1
            out += [f'{{"name":"activation memory","ph":"C","ts":{ts!r},"pid":{pid},'
                    f'"args":{{"M_B":{round(v, 9)!r}}}}}' for ts, v in sorted(last.items())]
        return out

    def _stalls(self, stalls: Any) -> list[str]:
        from schedsim.analysis.stalls import stalls_of

        items = stalls_of(self.tl, stalls)
        out = []
        for r in sorted({st.rank for st in items}):
            out += [_meta("thread_name", self.base + r + 1, TID_STALLS, name="stalls"),
                    _meta("thread_sort_index", self.base + r + 1, TID_STALLS, sort_index=1)]
        for st in items:
            args = _json({"cause": st.cause, "detail": str(getattr(st, "detail", "")),
                          "start": st.start, "end": st.end, "duration": st.end - st.start,
                          "unit": self.tl.unit})
            out.append(f'{{"name":{_s("stall: " + st.cause)},"cat":"stall","ph":"i",'
                       f'"s":"t","ts":{self.clock.ts(st.start)!r},'
                       f'"pid":{self.base + st.rank + 1},"tid":{TID_STALLS},"args":{args}}}')
        return out


def _meta_raw(what: str, pid: int, tid: int, name_json_body: str) -> str:
    """A thread name whose text is already JSON-escaped (the link tracks' arrows)."""
    return (f'{{"name":"{what}","ph":"M","pid":{pid},"args":{{"name":"{name_json_body}"}},'
            f'"tid":{tid}}}')


def trace_events(timelines: Sequence[Timeline], names: Sequence[str] | None = None, *,
                 memory: Any = True, stalls: Any = True,
                 us_per_unit_override: float | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ms",
    "otherData": {...}}`` (the text :func:`write_trace` streams, parsed back).

    ``memory``: True (``zb`` model), a :class:`~schedsim.analysis.memory.MemoryModel` or preset
    name, or False for no counter tracks. ``stalls``: True (the analysis' stalls, see
    :func:`schedsim.analysis.stalls.stalls_of`), a list per timeline, or False. Raises
    :class:`ScenarioError` when ``names`` does not give one distinct name per timeline.
    """
    return json.loads("".join(trace_chunks(timelines, names, memory=memory, stalls=stalls,
                                           us_per_unit_override=us_per_unit_override)))


def write_trace(path: str | Path, timelines: Sequence[Timeline],
                names: Sequence[str] | None = None, **kwargs: Any) -> None:
    """Write ``timelines`` (e.g. ``[predicted, measured]``) as one Perfetto / Chrome trace
    JSON file, atomically, streaming it. Open it at ui.perfetto.dev (or chrome://tracing).

    ``names`` label the process groups (default ``predicted``/``measured`` by each
    timeline's ``source``); other keyword arguments go to :func:`trace_events`. Raises
    :class:`ScenarioError` for bad names or a path not ending in ``.json``.
    """
    from schedsim.util.files import atomic_path

    path = Path(path)
    if path.suffix.lower() != ".json":
        raise ScenarioError(f"{path}: a trace is written as JSON: use a .json file name")
    chunks = trace_chunks(timelines, names, **kwargs)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="ascii") as f:
        for chunk in chunks:
            f.write(chunk)

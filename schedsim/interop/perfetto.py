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

Time: the format wants microseconds. A timeline's times are in its ``unit``: ``us``/``µs``
map 1:1, ``ms`` x1000, ``s`` x1e6, ``ns`` x1e-3, and ``slot`` (and any other unit) x1000,
i.e. **one slot is shown as 1 ms** (``us_per_unit`` overrides this). Original times are
kept in the args. Timestamps are rounded to 1 ns. ``otherData`` records the mapping.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

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


def us_per_unit(unit: str) -> float:
    """Microseconds per unit of ``unit`` (1000 for ``slot`` and for unknown units)."""
    return US_PER_UNIT.get(unit, 1000.0)


def _lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: a lane per interval so that intervals in one lane do
    not overlap (touching ends are allowed). Lane 0 is used first."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    ends: list[float] = []
    out = [0] * len(intervals)
    for i in order:
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


class _Builder:
    def __init__(self, scale: float) -> None:
        self.events: list[dict[str, Any]] = []
        self.scale = scale
        self.flow_id = 0

    def ts(self, t: float) -> float:
        return round(t * self.scale, 3)

    def meta(self, what: str, pid: int, tid: int | None, **args: Any) -> None:
        ev: dict[str, Any] = {"name": what, "ph": "M", "pid": pid, "args": args}
        if tid is not None:
            ev["tid"] = tid
        self.events.append(ev)

    def slice(self, name: str, cat: str, pid: int, tid: int, t0: float, t1: float,
              args: dict[str, Any]) -> None:
        ts = self.ts(t0)
        self.events.append({"name": name, "cat": cat, "ph": "X", "ts": ts,
                            "dur": max(0.0, round(self.ts(t1) - ts, 3)), "pid": pid,
                            "tid": tid, "args": args})


def trace_events(timelines: Sequence[Timeline], names: Sequence[str] | None = None, *,
                 memory: Any = True, stalls: Any = True,
                 us_per_unit_override: float | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ms",
    "otherData": {...}}``.

    ``memory``: True (``zb`` model), a :class:`~schedsim.analysis.memory.MemoryModel` or preset
    name, or False for no counter tracks. ``stalls``: True (the analysis' stalls, see
    :func:`schedsim.analysis.stalls.stalls_of`), a list per timeline, or False. Raises
    :class:`ScenarioError` when ``names`` does not give one distinct name per timeline.
    """
    tls = list(timelines)
    if not tls:
        raise ScenarioError("a trace needs at least one timeline")
    names = list(names) if names is not None else _default_names(tls)
    if len(names) != len(tls) or len(set(names)) != len(names):
        raise ScenarioError(f"trace names {names!r}: give one distinct name per timeline "
                            f"({len(tls)})")
    if max(t.ranks for t in tls) >= PID_STRIDE:
        raise ScenarioError(f"a trace holds at most {PID_STRIDE - 1} ranks per timeline")
    events: list[dict[str, Any]] = []
    info = []
    for g, (tl, name) in enumerate(zip(tls, names)):
        scale = us_per_unit_override or us_per_unit(tl.unit)
        b = _Builder(scale)
        b.flow_id = sum(1 for e in events if e["ph"] == "s")
        tl_stalls = stalls[g] if isinstance(stalls, (list, tuple)) else stalls
        _one_timeline(b, tl, name, g, memory, tl_stalls)
        events += b.events
        info.append({"name": name, "schedule": tl.schedule, "source": tl.source,
                     "semantics": tl.semantics, "ranks": tl.ranks,
                     "microbatches": tl.microbatches, "unit": tl.unit,
                     "us_per_unit": scale, "makespan": tl.makespan,
                     "bubble_ratio": tl.bubble_ratio(), "pids": [g * PID_STRIDE + 1,
                                                                 g * PID_STRIDE + tl.ranks]})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "schedsim", "timelines": json.dumps(info)}}


def _one_timeline(b: _Builder, tl: Timeline, name: str, g: int, memory: Any,
                  stalls: Any) -> None:
    base = g * PID_STRIDE
    n = tl.ranks
    for r in range(n):
        pid = base + r + 1
        b.meta("process_name", pid, None, name=f"{name} · rank {r}")
        b.meta("process_sort_index", pid, None, sort_index=pid)
        b.meta("thread_name", pid, TID_COMPUTE, name="compute")
        b.meta("thread_sort_index", pid, TID_COMPUTE, sort_index=0)
    # compute slices (lanes only if spans of a rank overlap)
    span_tid: dict[int, tuple[int, int]] = {}
    by_rank: list[list[int]] = [[] for _ in range(n)]
    for i, s in enumerate(tl.spans):
        by_rank[s.rank].append(i)
    for r, ids in enumerate(by_rank):
        lanes = _lanes([(b.ts(tl.spans[i].start), b.ts(tl.spans[i].end)) for i in ids])
        for lane in sorted(set(lanes) - {0}):
            b.meta("thread_name", base + r + 1, TID_EXTRA_COMPUTE + lane,
                   name=f"compute #{lane + 1}")
            b.meta("thread_sort_index", base + r + 1, TID_EXTRA_COMPUTE + lane,
                   sort_index=lane)
        for i, lane in zip(ids, lanes):
            s = tl.spans[i]
            tid = TID_COMPUTE if lane == 0 else TID_EXTRA_COMPUTE + lane
            span_tid[i] = (base + s.rank + 1, tid)
            args: dict[str, Any] = {"kind": s.kind, "mb": s.mb, "stage": s.stage,
                                    "chunk": s.chunk, "index": s.index, "start": s.start,
                                    "end": s.end, "unit": tl.unit}
            if s.parts:
                args["parts"] = [{"kind": p.kind, "mb": p.mb, "stage": p.stage,
                                  "chunk": p.chunk} for p in s.parts]
            b.slice(_span_name(s), "compute", base + s.rank + 1, tid, s.start, s.end, args)
    _messages(b, tl, base, span_tid)
    _collectives(b, tl, base)
    if memory is not False and memory is not None:
        _memory(b, tl, base, memory)
    if stalls is not False and stalls is not None:
        _stalls(b, tl, base, stalls)


def _messages(b: _Builder, tl: Timeline, base: int,
              span_tid: dict[int, tuple[int, int]]) -> None:
    from schedsim.analysis._index import (
        message_consumer,
        message_producer,
        rank_atom_index,
    )

    idx = rank_atom_index(tl)
    pos = {id(s): i for i, s in enumerate(tl.spans)}
    # (rank, "send"|"recv", peer) -> [(t0, t1, message index)]
    tracks: dict[tuple[int, str, int], list[tuple[float, float, int]]] = {}
    for k, m in enumerate(tl.messages):
        if m.start is not None and m.arrival is not None:
            tracks.setdefault((m.src, "send", m.dst), []).append((m.start, m.arrival, k))
        r0 = m.recv_posted if m.recv_posted is not None else m.arrival
        r1 = m.recv_done if m.recv_done is not None else m.arrival
        if r0 is not None and r1 is not None:
            tracks.setdefault((m.dst, "recv", m.src), []).append((r0, max(r0, r1), k))
    next_tid: dict[int, int] = {}
    for (rank, side, peer) in sorted(tracks):
        items = tracks[(rank, side, peer)]
        pid = base + rank + 1
        lanes = _lanes([(b.ts(t0), b.ts(t1)) for t0, t1, _ in items])
        first = next_tid.get(rank, TID_LINKS)
        next_tid[rank] = first + max(lanes) + 1
        arrow = f"send → rank {peer}" if side == "send" else f"recv ← rank {peer}"
        for lane in range(max(lanes) + 1):
            b.meta("thread_name", pid, first + lane,
                   name=arrow + ("" if lane == 0 else f" #{lane + 1}"))
            b.meta("thread_sort_index", pid, first + lane, sort_index=first + lane)
        for (t0, t1, k), lane in zip(items, lanes):
            m = tl.messages[k]
            op = ("SEND_" if side == "send" else "RECV_") + m.kind
            name = f"{op} mb{m.mb} " + (f"→ rank {m.dst}" if side == "send"
                                        else f"← rank {m.src}")
            b.slice(name, "comm", pid, first + lane, t0, t1,
                    {"kind": m.kind, "mb": m.mb, "stage": m.stage, "src": m.src,
                     "dst": m.dst, "bytes": m.bytes, "send_posted": m.send_posted,
                     "recv_posted": m.recv_posted, "start": m.start, "arrival": m.arrival,
                     "send_done": m.send_done, "recv_done": m.recv_done, "unit": tl.unit})
    # flows: producer op -> consumer op, bound at the middle of each slice
    for m in tl.messages:
        prod = message_producer(m, idx)
        cons = message_consumer(m, idx)
        if prod is None or cons is None:
            continue
        if b.ts(prod.end) <= b.ts(prod.start) or b.ts(cons.end) <= b.ts(cons.start):
            continue    # a zero-length op has no inside to bind a flow to
        b.flow_id += 1
        name = f"{m.kind} mb{m.mb} {m.src}→{m.dst}"
        for ph, sp in (("s", prod), ("f", cons)):
            pid, tid = span_tid[pos[id(sp)]]
            ev = {"name": name, "cat": "message", "ph": ph, "id": b.flow_id,
                  "ts": round((b.ts(sp.start) + b.ts(sp.end)) / 2, 3), "pid": pid,
                  "tid": tid}
            if ph == "f":
                ev["bp"] = "e"
            b.events.append(ev)


def _collectives(b: _Builder, tl: Timeline, base: int) -> None:
    """One track per rank (and TP rank) with the collectives of ``tl.pieces``."""
    recs = [p for p in (getattr(tl, "pieces", None) or []) if p.get("stream") == "collective"]
    named: set[tuple[int, int]] = set()
    several = len({int(q.get("tp_rank") or 0) for q in recs}) > 1
    for p in recs:
        tpr = int(p.get("tp_rank") or 0)
        pid = base + p["rank"] + 1
        tid = TID_COLLECTIVES if tpr == 0 else 800 + tpr
        if (pid, tid) not in named:
            named.add((pid, tid))
            b.meta("thread_name", pid, tid,
                   name="collectives" + (f" tp {tpr}" if several else ""))
            b.meta("thread_sort_index", pid, tid, sort_index=2 + tpr)
        b.slice(f"{p['name']} mb{p['mb']}", "collective", pid, tid, p["start"], p["end"],
                {k: p.get(k) for k in ("collective", "group", "bytes", "kind", "mb", "stage",
                                       "layer", "half", "index", "tp_rank")}
                | {"unit": tl.unit})


def _memory(b: _Builder, tl: Timeline, base: int, memory: Any) -> None:
    from schedsim.analysis.memory import MemoryModel, memory_curves

    for r, curve in enumerate(memory_curves(tl, MemoryModel.from_spec(memory))):
        last: dict[float, float] = {}
        for t, v in curve:
            last[b.ts(t)] = v          # several changes at one time: keep the final level
        for ts, v in sorted(last.items()):
            b.events.append({"name": "activation memory", "ph": "C", "ts": ts,
                             "pid": base + r + 1, "args": {"M_B": round(v, 9)}})


def _stalls(b: _Builder, tl: Timeline, base: int, stalls: Any) -> None:
    from schedsim.analysis.stalls import stalls_of

    items = stalls_of(tl, stalls)
    for r in sorted({st.rank for st in items}):
        b.meta("thread_name", base + r + 1, TID_STALLS, name="stalls")
        b.meta("thread_sort_index", base + r + 1, TID_STALLS, sort_index=1)
    for st in items:
        b.events.append({"name": f"stall: {st.cause}", "cat": "stall", "ph": "i", "s": "t",
                         "ts": b.ts(st.start), "pid": base + st.rank + 1, "tid": TID_STALLS,
                         "args": {"cause": st.cause, "detail": str(getattr(st, "detail", "")),
                                  "start": st.start, "end": st.end,
                                  "duration": st.end - st.start, "unit": tl.unit}})


def write_trace(path: str | Path, timelines: Sequence[Timeline],
                names: Sequence[str] | None = None, **kwargs: Any) -> None:
    """Write ``timelines`` (e.g. ``[predicted, measured]``) as one Perfetto / Chrome trace
    JSON file, atomically. Open it at ui.perfetto.dev (or chrome://tracing).

    ``names`` label the process groups (default ``predicted``/``measured`` by each
    timeline's ``source``); other keyword arguments go to :func:`trace_events`. Raises
    :class:`ScenarioError` for bad names or a path not ending in ``.json``.
    """
    from schedsim.util.files import atomic_write_text

    path = Path(path)
    if path.suffix.lower() != ".json":
        raise ScenarioError(f"{path}: a trace is written as JSON: use a .json file name")
    data = trace_events(timelines, names, **kwargs)
    atomic_write_text(path, json.dumps(data, allow_nan=False, separators=(",", ":")))

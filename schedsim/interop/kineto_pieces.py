"""Stage-internal piece traces: Kineto ``user_annotation`` ranges named ``block(F|B|W)``
with the GPU kernels they launched, into a measured Timeline and per-piece costs. No torch.

A *piece trace* profiles what runs inside one stage's op, as DeepSeek's public
``profile-data/train.json`` does (github.com/deepseek-ai/profile-data: one overlapped
forward + backward chunk pair of DeepSeek-V3 training, ranges ``attn(F)``, ``mlp(B)``,
``dispatch(F)``, ``combine(B)``, ...). Reading one:

- **pieces**: every ``"cat": "user_annotation"`` range whose name is ``BLOCK(PHASE)``
  (``PHASE`` = ``F``, ``B`` or ``W``). Pieces must not overlap each other on the host (they
  are consecutive sections of the program); the other ranges (``ProfilerStep#1``, an
  outer ``1F1B``) are context, listed in the notes;
- **kernels**: every ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` event belongs to the
  piece whose host range holds the ``cuda_runtime`` / ``cuda_driver`` call with the same
  ``correlation`` id (any thread of the process: autograd runs the backward on its own
  thread while the main thread sits in the range); its stream is ``args.stream``;
- **per stream**, each piece gets its kernels' count, busy time (union of the kernel
  intervals, ms) and first start / last end; the piece's GPU time (its *cost*) is the
  union of its kernel intervals over all streams (two compute streams running at once
  count once). The host range's own duration is not a cost (a host that waits for the GPU
  stretches it: DeepSeek's ``dispatch(F)`` is 20 ms on the host, 6 ms on the GPU);
- **layers**: the k-th ``BLOCK(PHASE)`` in time order is layer k of that block and phase;
- **collective pieces**: a block named for communication (``dispatch``, ``combine``,
  ``all-to-all``, ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``send``,
  ``recv``; any spelling with ``-``, ``_`` or none) is a collective: ``dispatch`` and
  ``combine`` are the MoE all-to-alls (DeepSeek-V3 report, section 3.2.1).

The Timeline (:func:`pieces_timeline`) has one rank and one op: ``FB`` (forward part
microbatch 0, backward part ``BW`` of microbatch 1, or ``B`` without W pieces) when the
trace holds forward and backward pieces, else ``F`` / ``BW``; the op spans its first to
last kernel. ``pieces`` (:mod:`schedsim.sim.pieces`) has one record per piece and CUDA
stream (``device_stream``, ``busy``, ``kernels`` added), so the streams stay apart.
``import_notes`` lists everything that was not read.

:func:`piece_costs` gives the mean cost of each block and phase over the layers;
:mod:`schedsim.interop.piece_model` puts them into the stage model.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from schedsim.errors import ScenarioError
from schedsim.util.units import with_unit

PIECE_NAME = re.compile(r"^(?P<block>[A-Za-z][\w .\-]{0,63})\((?P<phase>F|B|W)\)$")
_KERNELS = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCHES = ("cuda_runtime", "cuda_driver")
#: block names that are communication, the collective they are (None: point-to-point)
_COMM_WORDS = (("dispatch", "all-to-all"), ("combine", "all-to-all"),
               ("alltoall", "all-to-all"), ("allreduce", "all-reduce"),
               ("allgather", "all-gather"), ("reducescatter", "reduce-scatter"),
               ("send", None), ("recv", None))


def collective_of(block: str) -> tuple[bool, str | None]:
    """``(is communication, collective kind or None)`` of a piece's block name."""
    flat = re.sub(r"[-_ ]", "", block.lower())
    for word, kind in _COMM_WORDS:
        if word in flat:
            return True, kind
    return False, None


@dataclass
class StreamUse:
    """What one piece ran on one CUDA stream (µs on the trace clock; busy in µs)."""

    kernels: int = 0
    busy: float = 0.0
    start: float = float("inf")
    end: float = float("-inf")


@dataclass
class TracePiece:
    """One ``BLOCK(PHASE)`` range and its kernels (times µs on the trace clock)."""

    block: str
    phase: str
    layer: int
    host_start: float
    host_end: float
    intervals: list[tuple[float, float, Any]] = field(default_factory=list)
    streams: dict[Any, StreamUse] = field(default_factory=dict)
    busy: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.block}({self.phase})"

    @property
    def is_comm(self) -> bool:
        return collective_of(self.block)[0]

    @property
    def start(self) -> float:
        return min((a for a, _, _ in self.intervals), default=self.host_start)

    @property
    def end(self) -> float:
        return max((b for _, b, _ in self.intervals), default=self.host_start)


@dataclass
class PieceTrace:
    """A read piece trace: its pieces in host order, notes, and where it came from."""

    path: Path
    pieces: list[TracePiece]
    notes: list[str]
    rank: int | None = None
    world_size: int | None = None
    device: str | None = None


def union_length(iv: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals ``iv`` (overlaps counted once)."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(iv):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + (cur_b - cur_a if cur_b is not None else 0.0)


def has_pieces(events: list[dict[str, Any]]) -> bool:
    """Whether a trace's complete events hold piece ranges (module docstring)."""
    return any(e.get("cat") == "user_annotation" and PIECE_NAME.match(e["name"])
               for e in events)


def _ranges(events: list[dict[str, Any]], path: Path) -> tuple[list[TracePiece], list[str]]:
    """The piece ranges in host order and the names of the other annotation ranges."""
    from schedsim.interop.kineto_events import event_times

    pieces, other = [], []
    seen: dict[tuple[str, str], int] = {}
    for e in sorted((e for e in events if e.get("cat") == "user_annotation"),
                    key=lambda e: e["ts"]):
        m = PIECE_NAME.match(e["name"])
        if not m:
            other.append(e["name"])
            continue
        ts, dur = event_times(e, path)
        key = (m["block"], m["phase"])
        seen[key] = seen.get(key, -1) + 1
        pieces.append(TracePiece(m["block"], m["phase"], seen[key], ts, ts + dur))
    for a, b in zip(pieces, pieces[1:]):
        if b.host_start < a.host_end:
            raise ScenarioError(f"{path}: pieces {a.name} and {b.name} overlap on the host "
                                f"(at {with_unit(b.host_start, 'µs')}): a piece trace's "
                                f"ranges must "
                                f"be consecutive, not nested")
    return pieces, other


def _attach(pieces: list[TracePiece], events: list[dict[str, Any]], path: Path
            ) -> tuple[int, float, int]:
    """Give each piece its kernels (module docstring). Returns the kernels launched
    outside every piece (count, GPU µs) and those without a launch record."""
    from schedsim.interop.kineto_events import event_times

    launch_at = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in _LAUNCHES and corr is not None:
            launch_at[corr] = event_times(e, path)[0]
    starts = [p.host_start for p in pieces]
    outside, outside_us, unlinked = 0, 0.0, 0
    for e in events:
        if e.get("cat") not in _KERNELS:
            continue
        args = e.get("args") or {}
        ts, dur = event_times(e, path)
        t = launch_at.get(args.get("correlation"))
        if t is None:
            unlinked += 1
            continue
        i = bisect_right(starts, t) - 1
        if i < 0 or t > pieces[i].host_end:
            outside, outside_us = outside + 1, outside_us + dur
            continue
        p = pieces[i]
        stream = args.get("stream", e.get("tid"))
        p.intervals.append((ts, ts + dur, stream))
        use = p.streams.setdefault(stream, StreamUse())
        use.kernels += 1
        use.start, use.end = min(use.start, ts), max(use.end, ts + dur)
    for p in pieces:
        for s, use in p.streams.items():
            use.busy = union_length([(a, b) for a, b, st in p.intervals if st == s])
        p.busy = union_length([(a, b) for a, b, _ in p.intervals])
    return outside, outside_us, unlinked


def pieces_from_trace(tr: Any) -> PieceTrace:
    """The pieces of a read :class:`~schedsim.interop.kineto.Trace` (module docstring;
    :func:`schedsim.interop.kineto.read_piece_trace` reads the file).

    Raises :class:`ScenarioError` for a trace without piece ranges or without kernels in
    them, or pieces that overlap on the host.
    """
    pieces, other = _ranges(tr.events, tr.path)
    if not pieces:
        raise ScenarioError(f"{tr.path}: no piece ranges (user_annotation 'BLOCK(F)', "
                            f"'BLOCK(B)', 'BLOCK(W)'): not a stage-internal piece trace")
    outside, outside_us, unlinked = _attach(pieces, tr.events, tr.path)
    if not any(p.intervals for p in pieces):
        raise ScenarioError(f"{tr.path}: its {len(pieces)} piece ranges launched no GPU "
                            f"kernel (none linked by correlation id): a piece's cost is its "
                            f"kernels' GPU time, so a CPU-only trace cannot be read this way")
    return PieceTrace(tr.path, pieces, _notes(tr, pieces, other, outside, outside_us,
                                              unlinked), tr.rank, tr.world_size)


def _notes(tr: Any, pieces: list[TracePiece], other: list[str], outside: int,
           outside_us: float, unlinked: int) -> list[str]:
    """What the import did not read (``import_notes``)."""
    cats: dict[str, int] = {}
    for e in tr.events:
        c = e.get("cat") or "?"
        if c not in (*_KERNELS, *_LAUNCHES, "user_annotation"):
            cats[c] = cats.get(c, 0) + 1
    notes = []
    if other:
        names = sorted(set(other))
        notes.append(f"{len(other)} annotation ranges that are not pieces, kept out (context "
                     f"only): " + ", ".join(repr(n) for n in names[:6])
                     + (" ..." if len(names) > 6 else ""))
    if cats:
        notes.append("not read: " + ", ".join(f"{n} {c} events" for c, n in
                                               sorted(cats.items(), key=lambda x: -x[1]))
                     + " (operators and their Python stack; only the pieces' kernels count)")
    notes.append("not read: the trace's non-complete events (flows, instants, metadata)")
    if outside:
        notes.append(f"{outside} kernels launched outside every piece "
                     f"({with_unit(outside_us / 1e3, 'ms')} of GPU time) left out")
    if unlinked:
        notes.append(f"{unlinked} kernels without a launch record (no matching correlation "
                     f"id) left out")
    worst = max(pieces, key=lambda p: (p.host_end - p.host_start) - p.busy)
    notes.append(f"host range durations are not costs (the GPU time of each piece's kernels "
                 f"is): e.g. {worst.name} layer {worst.layer} spans "
                 f"{with_unit((worst.host_end - worst.host_start) / 1e3, 'ms')} on the host, "
                 f"{with_unit(worst.busy / 1e3, 'ms')} on the GPU")
    empty = [p.name for p in pieces if not p.intervals]
    if empty:
        notes.append(f"{len(empty)} pieces launched no kernel (cost 0): "
                     + ", ".join(sorted(set(empty))[:6]))
    if tr.world_size:
        notes.append(f"rank {tr.rank} of {tr.world_size} traced; shown as the one rank of "
                     f"the timeline (the trace holds one stage's op, not the pipeline)")
    return notes


def piece_costs(pt: PieceTrace) -> dict[str, dict[str, Any]]:
    """Per ``BLOCK(PHASE)``: ``{"block", "phase", "layers", "mean", "min", "max",
    "is_comm", "collective"}``, GPU time in ms over its layers (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for p in pt.pieces:
        out.setdefault(p.name, {"block": p.block, "phase": p.phase, "samples": []})[
            "samples"].append(p.busy / 1e3)
    for v in out.values():
        xs = v.pop("samples")
        comm, kind = collective_of(v["block"])
        v.update(layers=len(xs), mean=fmean(xs), min=min(xs), max=max(xs), is_comm=comm,
                 collective=kind)
    return out


def pieces_timeline(pt: PieceTrace, name: str = "imported") -> Any:
    """The measured Timeline of a piece trace (module docstring), in ms from its first
    kernel."""
    from schedsim.program.ir import Placement, Program
    from schedsim.program.tokens import parse_instr
    from schedsim.timeline_build import SpanColumns, TimelineHeader, timeline_from_columns

    phases = {p.phase for p in pt.pieces}
    fwd, bwd = "F" in phases, bool(phases & {"B", "W"})
    back = "BW" if "W" in phases else "B"
    tok = f"(0F0;0{back}1)" if fwd and bwd else ("0F0" if fwd else f"0{back}0")
    instr = parse_instr(tok)
    timed = [p for p in pt.pieces if p.intervals]
    t0 = min(p.start for p in timed)
    t1 = max(p.end for p in timed)
    pl = Placement(kind="loop", ranks=1, stages=1)
    mbs = 2 if fwd and bwd else 1
    prog = Program(name=name, placement=pl, microbatches=mbs, ranks=[[instr]])
    recs = []
    for p in timed:
        mb = 0 if (p.phase == "F" or not fwd) else 1
        comm, kind = collective_of(p.block)
        for s, use in sorted(p.streams.items(), key=lambda x: str(x[0])):
            recs.append({"rank": 0, "index": 0, "stream": "collective" if comm else "compute",
                         "name": p.block, "kind": p.phase, "mb": mb, "stage": 0,
                         "layer": p.layer, "half": None, "collective": kind,
                         "group": "ep" if kind == "all-to-all" else None, "bytes": None,
                         "start": (use.start - t0) / 1e3, "end": (use.end - t0) / 1e3,
                         "tp_rank": 0, "device_stream": s, "busy": use.busy / 1e3,
                         "kernels": use.kernels})
    return timeline_from_columns(
        TimelineHeader(pl, name, mbs, "trace", "ms", "measured"),
        SpanColumns([0], [instr.op], [0.0], [(t1 - t0) / 1e3], [0]), trace_source="pieces",
        import_notes=list(pt.notes),
        pieces=recs, program=prog.model_dump(mode="json"),
        p2p={"messages": 0, "paired": 0, "one_sided": 0, "calls": 0})

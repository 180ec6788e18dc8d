"""Per-rank Kineto / Chrome traces (``torch.profiler``'s ``export_chrome_trace``) to a
measured :class:`~schedsim.timeline.Timeline` and the program the run executed. No torch.

Pipeline: read each file (:func:`read_trace`) -> recognise its pipeline ranges and P2P
calls (:mod:`.kineto_events`: ``schedsim:<token>``, ``PP:<action>``, ``Forward i`` /
``Backward i``; ``c10d::send``/``c10d::recv_`` with their ``gloo:*``/``nccl:*`` work
ranges and NCCL kernels) -> tell the placement (:mod:`.kineto_placement`) -> rebuild each
rank's program and timed records (:mod:`.kineto_program`) -> pair the two sides of every
message -> one Timeline through :func:`schedsim.timeline_build.timeline_from_columns`.

The rank of a file is its ``distributedInfo.rank`` (Kineto writes it when a process
group exists), else its position in the argument list; the world size is
``distributedInfo.world_size``, else the fewest ranks that explain the files.

**Messages.** A message's sides are named by the comm ops of the ranges that launched
them; on each directed link the k-th send and the k-th recv (in posting order) must name
the same message, as gloo and NCCL match them (else :class:`ScenarioError`). A message
gets both post times (the end of the launch holding each side), both completions (when
the wait for each side returned: its ``gloo:``/``nccl:`` work range's end, else the end of
the wait that covered it), ``bytes`` when the trace recorded shapes, and the builder's
split of each side into waiting for the peer and transferring (``start`` = both sides
posted, ``arrival`` = receiver done; :class:`~schedsim.timeline.Message`).

**Extra Timeline fields**: ``program`` (the Program JSON the traces show, when every
rank was traced), ``posts`` (one ``{rank, index, last_index, start, end}`` per launch:
its host time), ``trace_source`` (``schedsim`` | ``torch-runtime`` | ``torch-single``),
``p2p`` (``{messages, paired, one_sided, calls}``), ``import_notes`` (what the traces do
not show) and ``missing_ranks`` (ranks without a trace: their rows are empty).
``semantics`` is the backend named in ``distributedInfo`` (``gloo``, ``nccl``), else
``trace``.

**Times**: event ``ts``/``dur`` are µs (offset by ``baseTimeNanoseconds`` when the file
has it); the Timeline is in ms from the earliest recognised event of all files (the
bookkeeping ranges left aside), so the
files must come from one host (or hosts with synchronised clocks). A span's ``index`` is
its instruction's position in the rebuilt program.

**Errors** (:class:`ScenarioError` naming the file and what is wrong): not JSON / no
``traceEvents``; a bad ``distributedInfo`` or ``baseTimeNanoseconds``; a recognised event
with a non-numeric or negative ``ts``/``dur``; two files of one rank; files of runs of
different sizes; a trace with no pipeline ranges (saying what it holds: P2P calls without
compute ranges are what torch 2.13's ``Schedule1F1B`` records); an op twice in one file
without ``ProfilerStep#`` ranges to tell the steps apart; ranges of two executors on one
rank; a message to a stage that cannot exist; a placement that cannot be told; sends and recvs that do not
pair in order on a link.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from schedsim.errors import ScenarioError
from schedsim.interop.kineto_events import RankEvents, classify_rank, select_step
from schedsim.interop.kineto_steps import pick_median, profiler_steps
from schedsim.interop.kineto_placement import infer_placement
from schedsim.interop.kineto_program import RankRun, build_rank
from schedsim.program.ir import Comm, Op, Placement, Program
from schedsim.program.ops import launched
from schedsim.program.routing import consumer_stage, route
from schedsim.sim.identity import ordinal
from schedsim.timeline import Message, Timeline, WaitRecord
from schedsim.timeline_build import SpanColumns, TimelineHeader, timeline_from_columns

#: the ranges and events import understands, for messages about traces it cannot read
RECOGNISED = ("schedsim:<token>, PP:<action> or 'Forward N'/'Backward N' ranges")
_NO_COMPUTE = ("torch 2.13's Schedule1F1B records no compute ranges (ScheduleGPipe records "
               "'Forward N'/'Backward N', the multi-stage schedules such as "
               "ScheduleInterleaved1F1B 'PP:<action>'): profile a schedule that records "
               "them, wrap the step's forward and backward of each microbatch in "
               "record_function('Forward N') / ('Backward N'), or replay the schedule with "
               "'schedsim replay --profile-dir'")


class Trace(NamedTuple):
    """One trace file: its rank and world size (None when the file does not say), its
    complete (``"ph": "X"``) events with a string name and a ``ts``, the base time in ns
    that their ``ts`` are relative to, and the backend ``distributedInfo`` names."""

    path: Path
    rank: int | None
    world_size: int | None
    events: list[dict[str, Any]]
    base_ns: int
    backend: str | None = None


def _count(value: Any, what: str, path: Path, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ScenarioError(f"{path}: {what} is {value!r}: expected an integer >= {low}")
    return value


def _load(path: Path) -> Any:
    """The decoded JSON of a trace file, read through the bounded reader
    (:mod:`schedsim.util.inputs`: a regular file, at most ``file_mb``, gzip decompressed
    to at most that, UTF-8)."""
    from schedsim.util.inputs import decode_text, read_input_bytes

    if path.is_dir():
        raise ScenarioError(f"{path}: is a directory; give the trace files")
    raw = read_input_bytes(path, "trace file", gzip=True)
    try:
        return json.loads(decode_text(raw, path, "trace file"))
    except ValueError as e:
        raise ScenarioError(f"{path}: not a Chrome/Kineto trace JSON "
                            f"({str(e).splitlines()[0][:120]})") from None


#: longest event name that can be one of ours (a schedsim token, a torch action, a P2P
#: call); longer names are left out unread
MAX_EVENT_NAME = 8192
MAX_PP_NAME = 256


def read_trace(path: str | Path) -> Trace:
    """The :class:`Trace` of one Chrome/Kineto trace file (.json or .json.gz).

    Raises :class:`ScenarioError` for an unreadable file, one without trace events, or a
    bad ``distributedInfo`` / ``baseTimeNanoseconds``.
    """
    from schedsim.util.inputs import loading

    path = Path(path)
    with loading(path, "Chrome/Kineto trace"):
        return _trace(path, _load(path))


def read_piece_trace(path: str | Path) -> Any:
    """The :class:`~schedsim.interop.kineto_pieces.PieceTrace` of a stage-internal piece
    trace file (:func:`read_trace`, then
    :func:`~schedsim.interop.kineto_pieces.pieces_from_trace`)."""
    from schedsim.interop.kineto_pieces import pieces_from_trace

    return pieces_from_trace(read_trace(path))


def _trace(path: Path, data: Any) -> Trace:
    """The :class:`Trace` of a decoded trace file (:func:`read_trace`), within the limits
    (:mod:`schedsim.util.limits`: world size and rank, event count)."""
    from schedsim.util.limits import check
    from schedsim.util.text import excerpt

    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ScenarioError(f"{path}: no 'traceEvents' list: not a Chrome/Kineto trace")
    rank = world = backend = None
    base = 0
    if isinstance(data, dict):
        info = data.get("distributedInfo")
        if info is not None and not isinstance(info, dict):
            raise ScenarioError(f"{path}: 'distributedInfo' is not an object")
        if info:
            rank = _count(info.get("rank"), "distributedInfo.rank", path, 0)
            world = _count(info.get("world_size"), "distributedInfo.world_size", path, 1)
            if rank is not None and world is not None and rank >= world:
                raise ScenarioError(f"{path}: distributedInfo.rank {rank} is not below its "
                                    f"world_size {world}")
            b = info.get("backend")
            backend = b if isinstance(b, str) and b else None
        b = data.get("baseTimeNanoseconds")
        if b is not None:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or \
                    not math.isfinite(b) or abs(b) > 2 ** 63:
                shown = excerpt(b) if isinstance(b, str) else repr(b)[:40]
                raise ScenarioError(f"{path}: baseTimeNanoseconds is {shown}: expected an "
                                    f"integer (ns)")
            base = int(b)
    if world is not None:
        check("ranks", world, f"{path} with world_size {world:,}")
    if rank is not None:
        check("ranks", rank + 1, f"{path} of rank {rank:,}")
    check("instructions", len(events), f"{path} with {len(events):,} trace events")
    # a name longer than any schedsim token or torch action is not one of ours
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
          and isinstance(e.get("name"), str) and "ts" in e
          and len(e["name"]) <= (MAX_PP_NAME if e["name"].startswith("PP:")
                                 else MAX_EVENT_NAME)]
    return Trace(path, rank, world, xs, base, backend)


def _by_rank(paths: list[str | Path]) -> tuple[dict[int, Trace], int | None]:
    """Traces by rank and the world size (one for all files, or None)."""
    per_rank: dict[int, Trace] = {}
    worlds: dict[int, Path] = {}
    for pos, p in enumerate(paths):
        tr = read_trace(p)
        r = pos if tr.rank is None else tr.rank
        if r in per_rank:
            raise ScenarioError(f"{p}: a second trace of rank {r} (the first: "
                                f"{per_rank[r].path}): give one file per rank")
        per_rank[r] = tr
        if tr.world_size is not None:
            worlds.setdefault(tr.world_size, tr.path)
    if len(worlds) > 1:
        (w1, p1), (w2, p2) = list(worlds.items())[:2]
        raise ScenarioError(f"the traces come from runs of different sizes: {p1} has "
                            f"world_size {w1}, {p2} has {w2}")
    return per_rank, next(iter(worlds), None)


def _check_recognised(ev: dict[int, RankEvents], traces: dict[int, Trace]) -> str:
    """The executor that wrote the traces; :class:`ScenarioError` saying what the traces
    hold when they have no compute range, or when one rank mixes executors."""
    computes = [rg for e in ev.values() for rg in e.ranges if rg.what == "compute"]
    if not computes:
        calls = sum(len(e.calls) for e in ev.values())
        files = ", ".join(str(traces[r].path) for r in sorted(traces))
        if calls:
            raise ScenarioError(f"{files}: {calls} P2P calls (c10d::send/c10d::recv_) but no "
                                f"compute ranges: {_NO_COMPUTE}")
        coll = collective_kernels(traces)
        if coll:
            raise ScenarioError(f"{files}: not a trace of a pipeline-parallel step: {coll}, "
                                f"and no pipeline ranges ({RECOGNISED}) or P2P calls "
                                f"(c10d::send/c10d::recv_)")
        names = sorted({n for e in ev.values() for n in e.other})
        held = (f"it holds {sum(len(e.other) for e in ev.values())} other events, e.g. "
                + ", ".join(repr(n) for n in names[:4]) if names else "it holds no events")
        raise ScenarioError(f"{files}: no recognised compute ranges ({RECOGNISED}) and no "
                            f"P2P calls: not a trace of a pipeline-parallel step ({held})")
    sources: set[str] = set()
    for r, e in ev.items():
        mine = {rg.source for rg in e.ranges if rg.what != "bookkeeping"}
        if len(mine) > 1:
            raise ScenarioError(f"{traces[r].path}: ranges of two executors on one rank "
                                f"({', '.join(sorted(mine))}): give the traces of one run")
        sources |= mine
    if len(sources) > 1:
        raise ScenarioError(f"the traces mix executors ({', '.join(sorted(sources))}): give "
                            f"the traces of one run")
    return sources.pop()


def collective_kernels(traces: dict[int, Trace]) -> str:
    """What the NCCL ``SendRecv`` kernels of traces without pipeline P2P calls came
    from: each kernel's launch (``cudaLaunchKernel`` with its ``correlation``) lies inside
    a collective's host range (``nccl:all_to_all``, ``nccl:all_reduce``...; NCCL runs an
    all-to-all as grouped sends and recvs, hence the kernel's name). Returns e.g. ``"its
    43 NCCL SendRecv kernels were launched by nccl:all_to_all (42)"``, or "" when the
    traces hold no such kernel."""
    from bisect import bisect_right

    from schedsim.interop.kineto_events import SENDRECV_KERNELS

    kernels, by = 0, {}
    for tr in traces.values():
        colls = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in tr.events
                       if e["name"].startswith("nccl:") and isinstance(e.get("ts"), (int, float))
                       and isinstance(e.get("dur", 0), (int, float)))
        launch = {(e.get("args") or {}).get("correlation"): e["ts"] for e in tr.events
                  if e.get("cat") in ("cuda_runtime", "cuda_driver")}
        starts = [c[0] for c in colls]
        for e in tr.events:
            if e.get("cat") != "kernel" or not e["name"].startswith(SENDRECV_KERNELS):
                continue
            kernels += 1
            t = launch.get((e.get("args") or {}).get("correlation"))
            i = bisect_right(starts, t) - 1 if isinstance(t, (int, float)) else -1
            what = colls[i][2] if i >= 0 and t <= colls[i][1] else "no collective range"
            by[what] = by.get(what, 0) + 1
    if not kernels:
        return ""
    return (f"its {kernels} NCCL SendRecv kernels were launched by "
            + ", ".join(f"{k} ({n})" for k, n in sorted(by.items(), key=lambda x: -x[1]))
            + " (collectives, not pipeline send/recv)")


def _survey(ev: dict[int, RankEvents], traces: dict[int, Trace], stepped: bool
            ) -> tuple[dict[tuple[int, int], int], list[tuple[int, int, int]], int, int]:
    """Where each traced op ran, each posted message's two stages, the highest stage and
    microbatch seen. Raises for an op twice on a rank or a message to no stage."""
    where: dict[tuple[int, int], int] = {}
    links: list[tuple[int, int, int]] = []
    top = mbs = 0
    for r, e in ev.items():
        done: set[Op] = set()
        for rg in e.ranges:
            if rg.what == "compute":
                for a in rg.op.atoms():
                    if a in done:
                        hint = (" or pick one with --step N" if stepped else "")
                        raise ScenarioError(
                            f"{traces[r].path}: {a} appears twice (the trace holds several "
                            f"steps?): profile one step per file{hint}")
                    done.add(a)
                    where[(a.stage, a.mb)] = r
                    top, mbs = max(top, a.stage), max(mbs, a.mb)
            elif rg.what == "launch":
                for c in launched(rg.instr):
                    key = c.message_key()
                    to = consumer_stage(key)
                    if min(key[1], to) < 0:
                        raise ScenarioError(f"{traces[r].path}: rank {r} posts {c}, a "
                                            f"message to stage {min(key[1], to)}, which "
                                            f"cannot exist")
                    links.append((key[1], to, key[2]))
                    top, mbs = max(top, key[1], to), max(mbs, key[2])
    return where, links, top, mbs


def _messages(runs: dict[int, RankRun], pl: Placement, ms: Any) -> list[Message]:
    """One Message per message posted by any traced side (module docstring)."""
    rank_of = pl.rank_fn()
    msgs: dict[tuple[str, int, int], Message] = {}
    for r, run in sorted(runs.items()):
        for c, (i, t) in run.posted.items():
            key = c.message_key()
            m = msgs.get(key)
            if m is None:
                m = msgs[key] = Message(key[0], *route(key, rank_of), key[2], key[1])
            if c in run.nbytes:
                m.bytes = run.nbytes[c]
            done = run.done.get(c)
            if c.is_send:
                m.send_posted, m.send_index, m.send_done = ms(t), i, ms(done)
            else:
                m.recv_posted, m.recv_index, m.recv_done = ms(t), i, ms(done)
    return sorted(msgs.values(), key=lambda m: (m.src, m.send_index, m.dst, m.recv_index))


def check_link_order(runs: dict[int, RankRun], pl: Placement) -> None:
    """On every directed link between two traced ranks, the k-th send and the k-th recv
    (posting order) name the same message. Raises :class:`ScenarioError` naming both."""
    rank_of = pl.rank_fn()
    sends: dict[tuple[int, int], list[tuple[Comm, int]]] = {}
    recvs: dict[tuple[int, int], list[tuple[Comm, int]]] = {}
    for r, run in runs.items():
        for c, (i, _) in run.posted.items():
            link = route(c.message_key(), rank_of)
            (sends if c.is_send else recvs).setdefault(link, []).append((c, i))
    for link, ss in sends.items():
        rs = recvs.get(link, [])
        if link[1] not in runs:
            continue
        for k, ((sc, si), (rc, ri)) in enumerate(zip(ss, rs)):
            if sc.message_key() != rc.message_key():
                raise ScenarioError(
                    f"the traces' P2P ops do not pair on link {link[0]}->{link[1]}: the "
                    f"{ordinal(k)} send is {sc} (rank {link[0]}, instr {si}) but the "
                    f"{ordinal(k)} recv is {rc} (rank {link[1]}, instr {ri}); gloo and NCCL "
                    f"match them in posting order per link")


def _notes(ev: dict[int, RankEvents], runs: dict[int, RankRun], missing: list[int],
           msgs: list[Message], source: str) -> tuple[list[str], dict[str, int]]:
    notes = []
    if missing:
        notes.append(f"no trace of rank(s) {', '.join(map(str, missing))}: a partial "
                     f"timeline (their rows are empty, the bubble figures count them as "
                     f"idle, and the program is not known)")
    calls = sum(len(e.calls) for e in ev.values())
    if not calls and msgs:
        notes.append("no P2P calls (c10d::send/c10d::recv_): when each message completed is "
                     "not known (record the step with torch.profiler's CPU activity)")
    elif calls and not any(c.done is not None for e in ev.values() for c in e.calls):
        notes.append("no gloo:/nccl: work ranges: completion times are the ends of the "
                     "waits that covered each message")
    works, kernels = (sum(e.unmatched[i] for e in ev.values()) for i in (0, 1))
    if works or kernels:
        what = " and ".join(x for x in (
            f"{works} gloo:/nccl: work range{'s' if works != 1 else ''}" if works else "",
            f"{kernels} NCCL P2P kernel{'s' if kernels != 1 else ''}" if kernels else "")
            if x)
        notes.append(f"{what} inside no c10d::send/recv_ call: left out (a collective's, "
                     f"or a call the trace did not record)")
    loose = sum(x.loose for x in runs.values())
    unbound = sum(x.unbound for x in runs.values())
    if loose or unbound:
        notes.append(f"{loose + unbound} P2P calls not explained by a pipeline range "
                     f"({loose} outside every range, {unbound} more than their range "
                     f"launches): left out")
    paired = sum(1 for m in msgs if m.send_posted is not None and m.recv_posted is not None)
    if paired < len(msgs):
        notes.append(f"{len(msgs) - paired} of {len(msgs)} messages have one side only "
                     f"(their other rank's trace is missing or cut short)")
    if source == "torch-single":
        notes.append("torch single-stage schedule ('Forward N'/'Backward N' ranges): each "
                     "range holds its recv, wait, compute and send; the spans are the "
                     "compute between them")
    return notes, {"messages": len(msgs), "paired": paired, "one_sided": len(msgs) - paired,
                   "calls": calls}


def import_traces(paths: list[str | Path], *, placement: str | None = None,
                  name: str = "imported", step: int | None = None) -> Timeline:
    """One measured Timeline from per-rank traces (module docstring for the rules); also
    Megatron timer dumps (:mod:`.megatron_timers`), nsys SQLite exports (:mod:`.nsys`)
    and a stage-internal piece trace (:mod:`.kineto_pieces`).

    ``placement`` (loop | v | dual) is inferred from where stages ran when None. ``step``
    keeps the events of one profiler step (``ProfilerStep#N``) of traces that hold
    several; without it, traces that hold several give their median step
    (:mod:`.kineto_steps`). A subset of the ranks gives a partial Timeline
    (``missing_ranks``, no ``program``). Raises :class:`ScenarioError` for malformed or unknown input (module
    docstring).
    """
    return _read(paths, placement, name, step, every=False)


def import_steps(paths: list[str | Path], *, placement: str | None = None,
                 name: str = "imported") -> dict[int, Timeline]:
    """Each ``ProfilerStep#N`` all per-rank Kineto traces hold, ``{N: Timeline}``, read
    once; fewer than 2 (or another format: Megatron timer dumps, an nsys export): ``{N or
    0: import_traces(paths)}``. Raises as import_traces."""
    return _read(paths, placement, name, None, every=True)


def _read(paths: list[str | Path], placement: str | None, name: str, step: int | None,
          every: bool) -> Any:
    """Import ``paths``: Megatron timer dumps or an nsys export as their importers do; of
    Kineto traces ``step``, else of several profiler steps each (``every``) or the median
    one (:mod:`.kineto_steps`), else all their events. ``every``: as ``{N: Timeline}``."""
    if not paths:
        raise ScenarioError("import-trace needs at least one trace file")
    given = [Path(p) for p in paths]
    from schedsim.interop.megatron_timers import import_timer_dumps, is_timer_dump
    from schedsim.interop.nsys import import_nsys, is_nsys_export

    other = (import_timer_dumps(given, name) if is_timer_dump(given) else
             import_nsys(given, name=name, placement=placement)
             if any(is_nsys_export(p) for p in given) else None)
    if other is not None:
        return {0: other} if every else other
    from schedsim.util.inputs import loading

    traces, world = _by_rank(paths)
    names = ", ".join(str(t.path) for t in traces.values())
    with loading(names if len(names) < 200 else names[:200] + "...", "set of traces"):
        numbers = profiler_steps(traces) if step is None else []
        if len(numbers) > 1:
            steps = {k: _import(traces, world, placement, name, k) for k in numbers}
            return steps if every else pick_median(steps)
        tl = _import(traces, world, placement, name, step)
        return {(numbers or [0])[0]: tl} if every else tl


def _import(traces: dict[int, Trace], world: int | None, placement: str | None, name: str,
            step: int | None) -> Timeline:
    """:func:`import_traces` of the read traces."""
    from schedsim.util.limits import check_program_size

    ev = {r: classify_rank(select_step(tr.events, step, tr.path), r, tr.path,
                           tr.base_ns / 1e3) for r, tr in traces.items()}
    if not any(rg.what == "compute" for e in ev.values() for rg in e.ranges) and \
            not any(e.calls for e in ev.values()):
        from schedsim.interop.kineto_pieces import has_pieces, pieces_from_trace, pieces_timeline

        with_pieces = [tr for tr in traces.values() if has_pieces(tr.events)]
        if len(with_pieces) == len(traces) == 1:
            return pieces_timeline(pieces_from_trace(with_pieces[0]), name)
        if with_pieces:
            raise ScenarioError(f"{with_pieces[0].path}: a stage-internal piece trace "
                                f"('BLOCK(F)' ranges, one op's pieces): import it alone")
    source = _check_recognised(ev, traces)
    stepped = any(e["name"].startswith("ProfilerStep#") for tr in traces.values()
                  for e in tr.events)
    where, links, top, mbs = _survey(ev, traces, stepped)
    ranks = max(max(traces) + 1, world or 0)
    check_program_size(", ".join(str(t.path) for t in traces.values())[:200], ranks=ranks,
                       stages=top + 1, microbatches=mbs + 1,
                       instructions=sum(len(t.events) for t in traces.values()))
    pl = infer_placement(placement, ranks, world is not None, where, links, top + 1, mbs + 1)
    runs = {r: build_rank(e, r, pl) for r, e in sorted(ev.items())}
    check_link_order(runs, pl)
    origin = min(x.t0 for e in ev.values() for x in (*e.ranges, *e.calls)
                 if getattr(x, "what", "") != "bookkeeping")

    def ms(t: float | None) -> float | None:
        return None if t is None else (t - origin) / 1e3

    msgs = _messages(runs, pl, ms)
    missing = [r for r in range(pl.ranks) if r not in runs]
    notes, p2p = _notes(ev, runs, missing, msgs, source)
    cols: tuple[list, ...] = ([], [], [], [], [])
    waits, posts = [], []
    for r, run in runs.items():
        for op, a, b, i in run.spans:
            for col, v in zip(cols, (r, op, ms(a), ms(b), i)):
                col.append(v)
        waits += [WaitRecord(r, i, k, ms(a), ms(b), [str(c) for c in cs])
                  for i, k, a, b, cs in run.waits]
        posts += [{"rank": r, "index": i, "last_index": i, "start": ms(a), "end": ms(b)}
                  for i, a, b in run.launches]
    extra: dict[str, Any] = {"trace_source": source, "p2p": p2p, "import_notes": notes,
                             "posts": posts}
    if missing:
        extra["missing_ranks"] = missing
    else:
        prog = Program(name=name, placement=pl, microbatches=mbs + 1,
                       ranks=[runs[r].instrs for r in range(pl.ranks)])
        extra["program"] = prog.model_dump(mode="json")
    backends = {tr.backend for tr in traces.values()} - {None}
    head = TimelineHeader(pl, name, mbs + 1, backends.pop() if len(backends) == 1 else "trace",
                          "ms", "measured")
    return timeline_from_columns(head, SpanColumns(*cols), msgs, waits, order="rank-start",
                                 **extra)

"""Per-rank Kineto / Chrome traces (``torch.profiler``'s ``export_chrome_trace``) to a
measured :class:`~schedsim.timeline.Timeline`. No torch.

Recognised complete events (``"ph": "X"``), by name:

- ``schedsim:<token>`` — ranges schedsim's replay records under ``--profile-dir``: one per
  compute token (``0F1``, ``3BW0``, ``(0F3;3BW1)``: spans), per post run
  (``POST[0SEND_F1+0RECV_B0]``: post times), per ``COMMIT`` / ``WAIT[...]`` / ``END``
  (waits, and the completion time of the ops they cover);
- ``PP:<action>`` — torch.distributed.pipelining's ``_PipelineScheduleRuntime`` ranges
  (``torch/distributed/pipelining/schedules.py``, ``_get_profiler_function_name``):
  ``{stage}F{mb}``, ``I`` (input backward, schedsim's ``B``), ``W``, ``B`` (full
  backward, schedsim's ``BW``), ``(a;b)OVERLAP_F_B`` pairs, and ``SEND_F``/``RECV_F``/
  ``SEND_B``/``RECV_B`` posts; ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` are skipped;
- ``Forward {mb}`` / ``Backward {mb}`` — torch's single-stage schedules (``ScheduleGPipe``,
  ``Schedule1F1B``): stage = rank, kinds F and BW (the ranges include their recv waits).

The rank of a file is its ``distributedInfo.rank`` (Kineto writes it when a process group
exists), else its position in the argument list.

**Partial input.** One rank's trace (or any subset of the ranks) is a valid, partial
timeline: the Timeline has every rank of the run (``distributedInfo.world_size``, else
the fewest ranks that explain the files), the ranks without a trace have no spans and
are listed in the Timeline's extra field ``missing_ranks``, and messages are placed from
the traced side alone. The stage count is the highest stage seen in an op or as either end
of a posted message, rounded up to what the placement needs (``loop``: a multiple of the
ranks; ``v``: 2 x ranks; ``dual``: the ranks). The placement is inferred from where
stages ran (``dual`` if a stage ran on two ranks, else the first of ``loop``, ``v`` that
puts every traced stage on its rank and the two ends of every message on two different
ranks, else a ``custom`` table when every stage was seen), or forced with ``placement``
and then checked against the traces. Anything else is a :class:`ScenarioError` naming the
file and what is wrong: not JSON / no ``traceEvents``, a bad ``distributedInfo`` or
``baseTimeNanoseconds``, a recognised range with a non-numeric or negative ``ts``/``dur``,
two files of one rank, files of runs of different sizes, an op twice in one file (several
profiled steps: profile one), a message to a stage that cannot exist, a placement that
cannot be told. Times: event ``ts``/``dur`` are µs
(offset by ``baseTimeNanoseconds`` when the file has it); the Timeline is in ms from the
earliest recognised event of all files — so the files must come from one host (or hosts
with synchronised clocks). ``index`` of a span is its position among the rank's
recognised instructions (for schedsim traces: the program's instruction index). Messages
get post times — the end of the post range, the definition of
:class:`~schedsim.timeline.Message` — and, for schedsim traces, completion = end of the
covering wait; ``start``/``arrival`` stay null.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from schedsim.errors import ScenarioError, SchedsimError
from schedsim.program.ir import Batch, Comm, Commit, Compute, Op, Placement, Post, Wait
from schedsim.program.ops import launched
from schedsim.program.routing import consumer_stage
from schedsim.program.tokens import parse_comm, parse_instr
from schedsim.timeline import Message, Part, Span, Timeline, WaitRecord
from schedsim.util.text import clip, excerpt

_TORCH_COMPUTE = re.compile(r"(\d+)(F|I|W|B)(\d+)")
_TORCH_COMM = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)")
_TORCH_FB = re.compile(r"\((.+);(.+)\)OVERLAP_F_B")
_TORCH_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}
_SINGLE = re.compile(r"(Forward|Backward) (\d+)")


class Trace(NamedTuple):
    """One trace file: its rank and world size (None when the file does not say), its
    complete (``"ph": "X"``) events with a string name and a ``ts``, and the base time in
    ns that their ``ts`` are relative to."""

    path: Path
    rank: int | None
    world_size: int | None
    events: list[dict[str, Any]]
    base_ns: int


def _count(value: Any, what: str, path: Path, low: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ScenarioError(f"{path}: {what} is {value!r}: expected an integer >= {low}")
    return value


def read_trace(path: str | Path) -> Trace:
    """The :class:`Trace` of one Chrome/Kineto trace file (.json or .json.gz).

    Raises :class:`ScenarioError` for an unreadable file, one without trace events, or a
    bad ``distributedInfo`` / ``baseTimeNanoseconds``.
    """
    from schedsim.util.inputs import decode_text, loading, read_input_bytes

    path = Path(path)
    if path.is_dir():
        raise ScenarioError(f"{path}: is a directory; give the trace files")
    with loading(path, "Chrome/Kineto trace"):
        raw = read_input_bytes(path, "trace file", gzip=True)     # bounded
        try:
            data = json.loads(decode_text(raw, path, "trace file"))
        except ValueError as e:
            raise ScenarioError(f"{path}: not a Chrome/Kineto trace JSON "
                                f"({str(e).splitlines()[0][:120]})") from None
        return _trace(path, data)


#: longest event name that can be one of ours: a schedsim token, a torch action
MAX_EVENT_NAME = 8192
MAX_PP_NAME = 256


def _trace(path: Path, data: Any) -> Trace:
    """The :class:`Trace` of a decoded trace file (see :func:`read_trace`)."""
    from schedsim.util.limits import check

    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ScenarioError(f"{path}: no 'traceEvents' list: not a Chrome/Kineto trace")
    rank = world = None
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
    return Trace(path, rank, world, xs, base)


def _times(e: dict[str, Any], path: Path) -> tuple[float, float]:
    """``(ts, dur)`` of an event in µs; :class:`ScenarioError` if not finite numbers."""
    out = []
    for key, default in (("ts", None), ("dur", 0.0)):
        v = e.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (key == "dur" and v < 0):
            raise ScenarioError(f"{path}: event {excerpt(e['name'])} has {key} "
                                f"{excerpt(v) if isinstance(v, str) else clip(repr(v))}: "
                                f"expected a finite number of µs"
                                f"{' >= 0' if key == 'dur' else ''}")
        out.append(float(v))
    return out[0], out[1]


def _torch_op(text: str) -> Op | None:
    m = _TORCH_COMPUTE.fullmatch(text)
    if m:
        return Op(_TORCH_KIND[m.group(2)], int(m.group(1)), int(m.group(3)))
    m = _TORCH_FB.fullmatch(text)
    if m:
        f, b = _torch_op(m.group(1)), _torch_op(m.group(2))
        if f is not None and b is not None and f.kind == "F" and b.kind in ("B", "BW"):
            return Op.fb(f, b)
    return None


def _classify(name: str, rank: int) -> tuple[str, Any] | None:
    """``("compute", Op) | ("posts", [Comm]) | ("wait", (kind, [Comm] | None))`` or None."""
    if name.startswith("schedsim:"):
        tok = name[len("schedsim:"):]
        if tok.startswith("POST[") and tok.endswith("]"):
            return "posts", [parse_comm(t) for t in tok[5:-1].split("+")]
        if tok == "END":
            return "wait", ("END", None)
        ins = parse_instr(tok)
        if isinstance(ins, Compute):
            return "compute", ins.op
        if isinstance(ins, Commit):
            return "wait", ("COMMIT", None)
        if isinstance(ins, Wait):
            return "wait", ("WAIT", list(ins.comms))
        if isinstance(ins, (Post, Batch)):
            return "posts", list(launched(ins))
        return None
    if name.startswith("PP:"):
        text = name[3:]
        m = _TORCH_COMM.fullmatch(text)
        if m:
            return "posts", [Comm(m.group(2), int(m.group(1)), int(m.group(3)))]
        op = _torch_op(text)
        return ("compute", op) if op is not None else None
    m = _SINGLE.fullmatch(name)
    if m:
        return "compute", Op("F" if m.group(1) == "Forward" else "BW", rank, int(m.group(2)))
    return None


def _ends(c: Comm) -> tuple[tuple[str, int, int], int]:
    """``(message key, consuming stage)`` of a post."""
    key = c.message_key()
    return key, consumer_stage(key)


def _fit_stages(kind: str, ranks: int, seen: int) -> int | None:
    """Stages of a ``kind`` placement on ``ranks`` holding stages ``0..seen-1`` (None:
    cannot)."""
    if kind == "loop":
        return -(-seen // ranks) * ranks
    need = 2 * ranks if kind == "v" else ranks
    return need if seen <= need else None


def _fits(pl: Placement, where: dict[tuple[int, int], int],
          links: list[tuple[int, int, int]]) -> str | None:
    """Why ``pl`` contradicts the traces (None: it fits): a traced op on another rank, or
    a message whose two ends it puts on one rank."""
    for (s, mb), r in where.items():
        if pl.rank_of(s, mb) != r:
            return f"stage {s} (microbatch {mb}) ran on rank {r}, not {pl.rank_of(s, mb)}"
    for a, b, mb in links:
        if pl.rank_of(a, mb) == pl.rank_of(b, mb):
            return (f"a message goes from stage {a} to stage {b} (microbatch {mb}), which "
                    f"it puts on one rank")
    return None


def _placement(kind: str | None, ranks: int, known_ranks: bool,
               where: dict[tuple[int, int], int], links: list[tuple[int, int, int]],
               seen: int, microbatches: int) -> Placement:
    """The placement (rules in the module docstring)."""
    def make(k: str, p: int) -> Placement | None:
        n = _fit_stages(k, p, seen)
        if n is None:
            return None
        return Placement(kind=k, ranks=p, stages=n,
                         microbatches=microbatches if k == "dual" else None)

    if kind is not None:
        pl = make(kind, ranks)
        if pl is None:
            raise ScenarioError(f"placement {kind!r} does not fit the traces: {seen} stages "
                                f"seen on {ranks} ranks")
        why = _fits(pl, where, links)
        if why:
            raise ScenarioError(f"placement {kind!r} does not fit the traces: {why}")
        return pl
    stage_ranks: dict[int, set[int]] = {}
    for (s, _), r in where.items():
        stage_ranks.setdefault(s, set()).add(r)
    if any(len(v) > 1 for v in stage_ranks.values()):
        kinds, sizes = ("dual",), [ranks]
    else:   # without a world size: the fewest ranks that explain the traces
        kinds, sizes = ("loop", "v"), ([ranks] if known_ranks else
                                       list(range(ranks, max(ranks, seen) + 1)))
    for p in sizes:
        for k in kinds:
            pl = make(k, p)
            if pl is not None and _fits(pl, where, links) is None:
                return pl
    if kinds == ("dual",):
        raise ScenarioError("the traces put a stage on two ranks but do not fit the dual "
                            "placement: give --placement")
    if all(s in stage_ranks for s in range(seen)):
        table = tuple(next(iter(stage_ranks[s])) for s in range(seen))
        pl = Placement(kind="custom", ranks=ranks, stages=seen, stage_ranks=table)
        if _fits(pl, where, links) is None:
            return pl
    missing = [s for s in range(seen) if s not in stage_ranks]
    raise ScenarioError(f"cannot tell which rank holds stage(s) {missing}: neither a loop "
                        f"nor a v placement fits the traces; give --placement or the "
                        f"traces of more ranks")


def import_traces(paths: list[str | Path], *, placement: str | None = None,
                  name: str = "imported") -> Timeline:
    """One measured Timeline from per-rank traces (module docstring for the rules).

    ``placement`` (loop | v | dual) is inferred from where stages ran when None. A subset
    of the ranks gives a partial Timeline (``missing_ranks``). Raises
    :class:`ScenarioError` for malformed input (module docstring).
    """
    if not paths:
        raise ScenarioError("import-trace needs at least one trace file")
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
    recs: dict[int, list[tuple[float, float, str, Any]]] = {}
    for r, tr in per_rank.items():
        out = []
        for e in tr.events:
            try:
                c = _classify(e["name"], r)
            except (SchedsimError, ValueError):    # not one of ours after all: skip it
                continue
            if c is None:
                continue
            ts, dur = _times(e, tr.path)
            t0 = tr.base_ns / 1e3 + ts
            out.append((t0, t0 + dur, c[0], c[1]))
        out.sort(key=lambda x: x[0])
        recs[r] = out
    everything = [x for v in recs.values() for x in v]
    if not any(x[2] == "compute" for x in everything):
        raise ScenarioError("no recognised compute ranges (schedsim:<token>, PP:<action>, "
                            "'Forward N'/'Backward N') in the traces")
    origin = min(x[0] for x in everything)

    def ms(t: float) -> float:
        return (t - origin) / 1e3

    # where every traced op ran; every message's two stages (seen from either side)
    where: dict[tuple[int, int], int] = {}
    links: list[tuple[int, int, int]] = []
    top = mbs = 0
    for r, v in recs.items():
        done: set[Op] = set()
        for x in v:
            if x[2] == "compute":
                for a in x[3].atoms():
                    if a in done:
                        raise ScenarioError(
                            f"{per_rank[r].path}: {a} appears twice (the trace holds several "
                            f"steps?): profile one step per file")
                    done.add(a)
                    where[(a.stage, a.mb)] = r
                    top, mbs = max(top, a.stage), max(mbs, a.mb)
            elif x[2] == "posts":
                for c in x[3]:
                    key, to = _ends(c)
                    if min(key[1], to) < 0:
                        raise ScenarioError(f"{per_rank[r].path}: rank {r} posts {c}, a "
                                            f"message to stage {min(key[1], to)}, which "
                                            f"cannot exist")
                    links.append((key[1], to, key[2]))
                    top, mbs = max(top, key[1], to), max(mbs, key[2])
    world = next(iter(worlds), None)
    ranks = max(max(per_rank) + 1, world or 0)
    from schedsim.util.limits import check_program_size

    check_program_size(", ".join(str(t.path) for t in per_rank.values())[:200], ranks=ranks,
                       stages=top + 1, microbatches=mbs + 1, instructions=len(everything))
    pl = _placement(placement, ranks, world is not None, where, links, top + 1, mbs + 1)
    chunk_of, rank_of = pl.chunk_of, pl.rank_fn()
    spans, waits = [], []
    msgs: dict[tuple[str, int, int], Message] = {}
    for r, v in sorted(recs.items()):
        index = 0
        since_commit: list[Comm] = []
        outstanding: list[Comm] = []
        for t0, t1, what, obj in v:
            if what == "compute":
                op: Op = obj
                parts = ([Part(p.kind, p.mb, chunk_of(p.stage, p.mb), p.stage)
                          for p in op.parts] if op.kind == "FB" else None)
                spans.append(Span(r, op.kind, op.mb, chunk_of(op.stage, op.mb), op.stage,
                                  ms(t0), ms(t1), index, parts))
                index += 1
            elif what == "posts":
                for c in obj:
                    key, to = _ends(c)
                    m = msgs.get(key)
                    if m is None:
                        m = msgs[key] = Message(key[0], rank_of(key[1], key[2]),
                                                rank_of(to, key[2]), key[2], key[1])
                    if c.is_send:
                        m.send_posted, m.send_index = ms(t1), index
                    else:
                        m.recv_posted, m.recv_index = ms(t1), index
                    index += 1
                since_commit += obj
                outstanding += obj
            else:
                kind, named = obj
                covered = (named if kind == "WAIT" else since_commit if kind == "COMMIT"
                           else list(outstanding))
                if kind == "COMMIT":
                    since_commit = []
                for c in covered:
                    m = msgs.get(c.message_key())
                    if m is not None:
                        if c.is_send and m.send_done is None:
                            m.send_done = ms(t1)
                        elif not c.is_send and m.recv_done is None:
                            m.recv_done = ms(t1)
                outstanding = [c for c in outstanding if c not in covered]
                waits.append(WaitRecord(r, index, kind, ms(t0), ms(t1),
                                        [str(c) for c in covered]))
                if kind != "END":
                    index += 1
    makespan, per_rank_summary = Timeline.summarize(pl.ranks, spans)
    missing = [r for r in range(pl.ranks) if r not in per_rank]
    extra = {"missing_ranks": missing} if missing else {}
    return Timeline(schedule=name, ranks=pl.ranks, stages=pl.stages,
                    microbatches=mbs + 1, semantics="trace", unit="ms", source="measured",
                    placement=pl.kind, makespan=makespan, per_rank=per_rank_summary,
                    spans=spans, messages=list(msgs.values()), waits=waits, **extra)

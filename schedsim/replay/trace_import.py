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
exists), else its position in the argument list. Times: event ``ts``/``dur`` are µs
(offset by ``baseTimeNanoseconds`` when the file has it); the Timeline is in ms from the
earliest recognised event of all files — so the files must come from one host (or hosts
with synchronised clocks). ``index`` of a span is its position among the rank's
recognised instructions (for schedsim traces: the program's instruction index). Messages
get post times (and, for schedsim traces, completion = end of the covering wait);
``start``/``arrival`` stay null.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from ..errors import ParseError, ScenarioError
from ..ir import Comm, Commit, Compute, Op, Placement, Post, Wait
from ..timeline import Message, Part, Span, Timeline, WaitRecord
from ..tokens import parse_comm, parse_instr

_TORCH_COMPUTE = re.compile(r"(\d+)(F|I|W|B)(\d+)")
_TORCH_COMM = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)")
_TORCH_FB = re.compile(r"\((.+);(.+)\)OVERLAP_F_B")
_TORCH_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}
_SINGLE = re.compile(r"(Forward|Backward) (\d+)")


def read_trace(path: str | Path) -> tuple[int | None, list[dict[str, Any]], int]:
    """``(rank or None, complete events, base ns)`` of one Chrome trace (.json/.json.gz).

    Raises :class:`ScenarioError` for an unreadable file or one without trace events.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such trace file") from None
    except (OSError, ValueError, EOFError) as e:
        raise ScenarioError(f"{path}: not a Chrome/Kineto trace JSON ({e})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ScenarioError(f"{path}: no 'traceEvents' list: not a Chrome/Kineto trace")
    rank = None
    if isinstance(data, dict):
        info = data.get("distributedInfo")
        if isinstance(info, dict) and isinstance(info.get("rank"), int):
            rank = info["rank"]
        base = int(data.get("baseTimeNanoseconds") or 0)
    else:
        base = 0
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
          and isinstance(e.get("name"), str) and "ts" in e]
    return rank, xs, base


def _torch_op(text: str) -> Op | None:
    m = _TORCH_COMPUTE.fullmatch(text)
    if m:
        return Op(_TORCH_KIND[m.group(2)], int(m.group(1)), int(m.group(3)))
    m = _TORCH_FB.fullmatch(text)
    if m:
        f, b = _torch_op(m.group(1)), _torch_op(m.group(2))
        if f is not None and b is not None:
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
        if isinstance(ins, Post):
            return "posts", [ins.comm]
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


def _placement(kind: str | None, ranks: int, stage_ranks: dict[int, set[int]],
               microbatches: int) -> Placement:
    stages = max(stage_ranks) + 1 if stage_ranks else ranks
    if kind is None:
        if any(len(v) > 1 for v in stage_ranks.values()):
            kind = "dual"
        else:
            table = tuple(next(iter(stage_ranks.get(s, {0}))) for s in range(stages))
            for k in ("loop", "v"):
                try:
                    pl = Placement(kind=k, ranks=ranks, stages=stages)
                except Exception:   # noqa: BLE001 - ScheduleError or pydantic's error
                    continue
                if all(pl.rank_of(s) == r for s, r in enumerate(table)):
                    return pl
            return Placement(kind="custom", ranks=ranks, stages=stages, stage_ranks=table)
    try:
        return Placement(kind=kind, ranks=ranks, stages=stages,
                         microbatches=microbatches if kind == "dual" else None)
    except Exception as e:   # noqa: BLE001 - report the placement rule
        raise ScenarioError(f"placement {kind!r} does not fit the trace ({ranks} ranks, "
                            f"{stages} stages): {str(e).splitlines()[0]}") from None


def import_traces(paths: list[str | Path], *, placement: str | None = None,
                  name: str = "imported") -> Timeline:
    """One measured Timeline from per-rank traces (module docstring for the rules).

    ``placement`` (loop | v | dual) is inferred from where stages ran when None. Raises
    :class:`ScenarioError` for unreadable files, two files of one rank, or no recognised
    ranges.
    """
    if not paths:
        raise ScenarioError("import-trace needs at least one trace file")
    per_rank: dict[int, tuple[list, int]] = {}
    for pos, p in enumerate(paths):
        rank, evs, base = read_trace(p)
        r = pos if rank is None else rank
        if r in per_rank:
            raise ScenarioError(f"{p}: a second trace of rank {r}: give one file per rank")
        per_rank[r] = (evs, base)
    ranks = max(per_rank) + 1
    recs: dict[int, list[tuple[float, float, str, Any]]] = {}
    for r, (evs, base) in per_rank.items():
        out = []
        for e in evs:
            try:
                c = _classify(e["name"], r)
            except ParseError:
                continue
            if c is None:
                continue
            t0 = base / 1e3 + float(e["ts"])
            out.append((t0, t0 + float(e.get("dur", 0.0)), c[0], c[1]))
        out.sort(key=lambda x: x[0])
        recs[r] = out
    everything = [x for v in recs.values() for x in v]
    if not any(x[2] == "compute" for x in everything):
        raise ScenarioError("no recognised compute ranges (schedsim:<token>, PP:<action>, "
                            "'Forward N'/'Backward N') in the traces")
    origin = min(x[0] for x in everything)

    def ms(t: float) -> float:
        return (t - origin) / 1e3

    ops = [(r, a) for r, v in recs.items() for x in v if x[2] == "compute"
           for a in x[3].atoms()]
    microbatches = max(a.mb for _, a in ops) + 1
    stage_ranks: dict[int, set[int]] = {}
    for r, a in ops:
        stage_ranks.setdefault(a.stage, set()).add(r)
    pl = _placement(placement, ranks, stage_ranks, microbatches)
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
                    key = c.message_key()
                    to = key[1] + 1 if key[0] == "F" else key[1] - 1
                    m = msgs.get(key)
                    if m is None:
                        m = msgs[key] = Message(key[0], rank_of(key[1], key[2]),
                                                rank_of(to, key[2]), key[2], key[1])
                    if c.is_send:
                        m.send_posted, m.send_index = ms(t0), index
                    else:
                        m.recv_posted, m.recv_index = ms(t0), index
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
    makespan, per_rank_summary = Timeline.summarize(ranks, spans)
    return Timeline(schedule=name, ranks=ranks, stages=pl.stages, microbatches=microbatches,
                    semantics="trace", unit="ms", source="measured", placement=pl.kind,
                    makespan=makespan, per_rank=per_rank_summary, spans=spans,
                    messages=list(msgs.values()), waits=waits)

"""Nsight Systems SQLite exports (``nsys export --type sqlite``) of a pipeline run into a
measured Timeline: NVTX ranges and the GPU kernels they launched. No torch.

Read as github.com/sail-sg/zero-bubble-pipeline-parallelism's ``tools/load_nsys_events.py``
reads them (its Megatron-LM fork pushes one NVTX range per op):

- tables ``NVTX_EVENTS(start, end, globalTid, text, eventType)`` with
  ``ENUM_NSYS_EVENT_TYPE(id, name)`` naming ``NvtxPushPopRange``,
  ``CUPTI_ACTIVITY_KIND_RUNTIME(correlationId, start, end, globalTid, nameId)`` and
  ``CUPTI_ACTIVITY_KIND_KERNEL(correlationId, start, end, deviceId, streamId,
  shortName, globalPid)``; times in ns;
- an op is a push/pop range named ``{F|B|W}{mb}.{chunk}.{seq}``; its kernels are those
  whose runtime launch (same ``correlationId``, same process: ``globalPid`` and
  ``globalTid`` agree in bits 24-47) ran on the range's thread inside the range; the op
  spans its first kernel's start to its last kernel's end, on the kernels' device;
- ranks: one per (file, device), files in the order given, devices in increasing id
  (load_nsys_events.py instead orders servers by their first forwards);
- stage: ``chunk x ranks + rank`` (``--placement loop``, the default) or the V placement
  (``--placement v``: chunk 1 on stage ``2 x ranks - 1 - rank``); kinds ``F``, ``B``
  (input gradient) and ``W``, or ``BW`` for ``B`` when the export has no ``W`` range.

The Timeline (``trace_source`` ``nsys``) has the spans and each rank's program (its ops in
time order, compute only: simulate it under ``data`` semantics). Noted in
``import_notes`` and not read: ``SEND_*``/``RECV_*`` ranges (messages are not paired),
``W_clear``/``Optimizer`` and other ranges, ranges without a kernel, kernels outside
every op range. Errors (:class:`ScenarioError`): not an SQLite file, a table or column
missing, no op range, an op twice on one rank.
"""
from __future__ import annotations

import re
import sqlite3
from bisect import bisect_right
from pathlib import Path
from typing import Any

from schedsim.errors import ScenarioError

OP_NAME = re.compile(r"^([FBW])(\d+)\.(\d+)\.(\d+)$")
_MAGIC = b"SQLite format 3\x00"
_PROC = 0x1000000


def is_nsys_export(path: Path) -> bool:
    """Whether ``path`` is an SQLite file (by its header)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == _MAGIC
    except OSError:
        return False


def _query(path: Path, cur: Any, sql: str) -> list[tuple]:
    try:
        return cur.execute(sql).fetchall()
    except sqlite3.Error as e:
        raise ScenarioError(f"{path}: not an nsys SQLite export with NVTX and CUDA kernel "
                            f"tables ({e}): export with 'nsys export --type sqlite' from a "
                            f"run profiled with NVTX and CUDA tracing") from None


def _read(path: Path) -> tuple[list[tuple], list[tuple]]:
    """``(NVTX push/pop ranges (start, end, tid, text), kernels (kernel start, end,
    device, launch start, launch end, tid))``."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        cur = con.cursor()
        kind = _query(path, cur, "SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = "
                                 "'NvtxPushPopRange'")
        if len(kind) != 1:
            raise ScenarioError(f"{path}: ENUM_NSYS_EVENT_TYPE names no NvtxPushPopRange")
        ranges = _query(path, cur, f"SELECT start, end, globalTid, text FROM NVTX_EVENTS "
                                   f"WHERE eventType = {int(kind[0][0])} AND end IS NOT NULL")
        kernels = _query(path, cur, f"""SELECT k.start, k.end, k.deviceId, r.start, r.end,
            r.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId
            WHERE k.globalPid / {_PROC} % {_PROC} = r.globalTid / {_PROC} % {_PROC}""")
    finally:
        con.close()
    return ranges, kernels


def _ops_of(path: Path, ranges: list[tuple], kernels: list[tuple]
            ) -> tuple[dict[int, list[tuple]], dict[str, int]]:
    """Per device: ``(kind, mb, chunk, start ns, end ns)`` of each op range, and counts
    of what was left out."""
    left: dict[str, int] = {}
    ops: dict[int, list[list]] = {}          # tid -> [start, end, kind, mb, chunk, ks]
    for a, b, tid, text in ranges:
        m = OP_NAME.match(text or "")
        if m is None:
            key = ("SEND_*/RECV_* ranges (P2P: messages not paired)"
                   if (text or "").startswith(("SEND_", "RECV_")) else
                   f"other NVTX ranges (e.g. {str(text)[:30]!r})")
            left[key] = left.get(key, 0) + 1
            continue
        ops.setdefault(tid, []).append([a, b, m[1], int(m[2]), int(m[3]), []])
    for v in ops.values():
        v.sort(key=lambda o: (o[0], -o[1]))
    starts = {t: [o[0] for o in v] for t, v in ops.items()}
    for ks, ke, dev, ra, rb, tid in kernels:
        v = ops.get(tid)
        i = bisect_right(starts[tid], ra) - 1 if v else -1
        while i >= 0 and v[i][1] < rb:        # the innermost enclosing range
            i -= 1
        if i < 0:
            left["kernels outside every op range"] = left.get(
                "kernels outside every op range", 0) + 1
            continue
        v[i][5].append((ks, ke, dev))
    out: dict[int, list[tuple]] = {}
    for v in ops.values():
        for a, b, kind, mb, chunk, ks in v:
            if not ks:
                left["op ranges without a kernel"] = left.get("op ranges without a kernel",
                                                              0) + 1
                continue
            out.setdefault(ks[0][2], []).append((kind, mb, chunk, min(k[0] for k in ks),
                                                 max(k[1] for k in ks)))
    if not out:
        raise ScenarioError(f"{path}: no op range with kernels (NVTX push/pop ranges named "
                            f"F{{mb}}.{{chunk}}.{{seq}}, B..., W..., as zero-bubble's Megatron "
                            f"fork pushes them)")
    return out, left


def import_nsys(paths: list[Path], *, name: str = "imported",
                placement: str | None = None) -> Any:
    """One measured Timeline from nsys SQLite exports (module docstring)."""
    from schedsim.program.ir import Placement
    from schedsim.program.tokens import parse_instr

    per_rank: list[list[tuple]] = []
    left: dict[str, int] = {}
    for p in paths:
        if not is_nsys_export(p):
            raise ScenarioError(f"{p}: not an SQLite file: give the nsys exports of one run "
                                f"(mixing them with other traces is not supported)")
        ranges, kernels = _read(p)
        devs, lo = _ops_of(p, ranges, kernels)
        for k, n in lo.items():
            left[k] = left.get(k, 0) + n
        per_rank += [devs[d] for d in sorted(devs)]
    P = len(per_rank)
    kind = placement or "loop"
    if kind not in ("loop", "v"):
        raise ScenarioError(f"nsys import: placement {kind!r}: expected loop or v")
    chunks = 1 + max(c for ops in per_rank for _, _, c, _, _ in ops)
    if kind == "v" and chunks != 2:
        raise ScenarioError(f"--placement v needs chunks 0 and 1 (the export has {chunks})")
    pl = Placement(kind=kind, ranks=P, stages=P * chunks)
    has_w = any(k == "W" for ops in per_rank for k, *_ in ops)
    t0 = min(a for ops in per_rank for *_, a, _ in ops)
    cols: tuple[list, ...] = ([], [], [], [], [])
    rows = []
    for r, ops in enumerate(per_rank):
        row, seen = [], set()
        for k, mb, chunk, a, b in sorted(ops, key=lambda o: o[3]):
            stage = chunk * P + r if kind == "loop" else (r if chunk == 0 else 2 * P - 1 - r)
            tok = f"{stage}{'BW' if k == 'B' and not has_w else k}{mb}"
            if tok in seen:
                raise ScenarioError(f"rank {r}: {tok} twice (the export holds several "
                                    f"iterations?): export one iteration")
            seen.add(tok)
            ins = parse_instr(tok)
            for col, v in zip(cols, (r, ins.op, (a - t0) / 1e6, (b - t0) / 1e6, len(row))):
                col.append(v)
            row.append(ins)
        rows.append(row)
    mbs = 1 + max(mb for ops in per_rank for _, mb, *_ in ops)
    notes = [f"ranks: one per (file, GPU) in the order given ({P}); ops span their kernels "
             f"(first start to last end)"] + [f"not read: {n} {k}" for k, n in left.items()]
    from schedsim.interop.ops_timeline import ops_only_timeline

    return ops_only_timeline(pl, name, mbs, rows, cols, "nsys", notes)

"""Megatron-LM per-op pipeline timer dumps into a measured Timeline. No torch.

The format is the one github.com/Victarry/PP-Schedule-Visualization's
``examples/megatron-lm/plot.py`` reads (its Megatron-LM patch writes them with
``ENABLE_PP_TIMER=1``): one JSON file per rank, named
``event_times_PP{pp}_VPP{vpp}_TPxCPxDP_rank_{r}_pp_rank_{p}_rank_{g}.json``, each a flat
object of times:

- ``vpp == 1``: ``"forward-{mb}-start"``, ``"forward-{mb}-end"``, ``"backward-{mb}-start"``,
  ``"backward-{mb}-end"``;
- ``vpp > 1``: ``"forward-{chunk}-{mb}-start"`` ... (stage ``pp * chunk + pp_rank``, the
  interleaved placement).

As plot.py does, only the files of TP x CP x DP rank 0 are read (one per pipeline rank;
the others are listed in the notes) and a forward is schedsim's ``F``, a backward its
full backward ``BW`` (Megatron runs no separate weight-gradient pass). Times are taken as
ms, the unit plot.py prints (the patch is not public: check your dump), from the
earliest start. The Timeline (``trace_source`` ``megatron-timers``) has the spans only:
the dump holds no P2P, so messages, waits and launches are unknown (said in the
notes); ``program`` lists each rank's ops in time order (compute only: simulate it
under ``data`` semantics).

Errors (:class:`ScenarioError`, one line): a file that is not such a dump, a key of
another form, an op without its start or end or ending before it starts, files of
different PP/VPP sizes, two files of one pipeline rank, a pipeline rank missing.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from schedsim.errors import ScenarioError

FILE_NAME = re.compile(r"^event_times_PP(\d+)_VPP(\d+)_TPxCPxDP_rank_(\d+)_pp_rank_(\d+)"
                       r"_rank_(\d+)\.json$")
_KEY = re.compile(r"^(forward|backward)-(\d+)(?:-(\d+))?-(start|end)$")


def is_timer_dump(paths: list[Path]) -> bool:
    """Whether ``paths`` name Megatron timer dumps (by file name), or one folder holding
    them."""
    if len(paths) == 1 and paths[0].is_dir():
        return any(FILE_NAME.match(p.name) for p in paths[0].iterdir())
    return bool(paths) and all(FILE_NAME.match(p.name) for p in paths)


def _files(paths: list[Path]) -> list[Path]:
    if len(paths) == 1 and paths[0].is_dir():
        return sorted(p for p in paths[0].iterdir() if FILE_NAME.match(p.name))
    return paths


def _ops(path: Path, data: Any, vpp: int) -> list[tuple[str, int, int, float, float]]:
    """``(kind, chunk, mb, start, end)`` of one dump."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: not a Megatron timer dump (expected an object of "
                            f"'forward-MB-start': time entries)")
    times: dict[tuple[str, int, int], dict[str, float]] = {}
    for k, v in data.items():
        m = _KEY.match(str(k))
        if not m or (m[3] is None) != (vpp == 1):
            form = "forward-MB-start" if vpp == 1 else "forward-CHUNK-MB-start"
            raise ScenarioError(f"{path}: key {str(k)[:60]!r} is not of the form {form} "
                                f"(VPP {vpp})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise ScenarioError(f"{path}: {k} is {v!r}: expected a number (ms)")
        chunk, mb = (int(m[2]), int(m[3])) if m[3] is not None else (0, int(m[2]))
        times.setdefault((m[1], chunk, mb), {})[m[4]] = float(v)
    out = []
    for (what, chunk, mb), t in sorted(times.items()):
        if set(t) != {"start", "end"} or t["end"] < t["start"]:
            raise ScenarioError(f"{path}: {what} of chunk {chunk} microbatch {mb} has "
                                f"{sorted(t)} (start {t.get('start')}, end {t.get('end')}): "
                                f"expected a start and an end after it")
        out.append(("F" if what == "forward" else "BW", chunk, mb, t["start"], t["end"]))
    return out


def import_timer_dumps(paths: list[str | Path], name: str = "imported") -> Any:
    """One measured Timeline from Megatron timer dumps (module docstring)."""
    from schedsim.program.ir import Placement
    from schedsim.program.tokens import parse_instr
    from schedsim.util.inputs import decode_text, read_input_bytes

    files = _files([Path(p) for p in paths])
    by_rank: dict[int, list[tuple[str, int, int, float, float]]] = {}
    sizes, skipped = set(), 0
    for f in files:
        m = FILE_NAME.match(f.name)
        if m is None:
            raise ScenarioError(f"{f}: not a Megatron timer dump name "
                                f"(event_times_PP*_VPP*_TPxCPxDP_rank_*_pp_rank_*_rank_*.json)")
        pp, vpp, other, p = int(m[1]), int(m[2]), int(m[3]), int(m[4])
        sizes.add((pp, vpp))
        if other != 0:
            skipped += 1
            continue
        if p in by_rank:
            raise ScenarioError(f"{f}: a second dump of pipeline rank {p}")
        try:
            data = json.loads(decode_text(read_input_bytes(f, "timer dump"), f, "timer dump"))
        except ValueError as e:
            raise ScenarioError(f"{f}: not JSON ({str(e)[:80]})") from None
        by_rank[p] = _ops(f, data, vpp)
    if len(sizes) != 1:
        raise ScenarioError(f"the dumps come from runs of different sizes (PP, VPP): "
                            f"{sorted(sizes)}")
    pp, vpp = sizes.pop()
    missing = [r for r in range(pp) if r not in by_rank]
    if missing:
        raise ScenarioError(f"no dump of pipeline rank(s) {missing} (TPxCPxDP rank 0) among "
                            f"the {len(files)} files: give one per pipeline rank")
    t0 = min(a for ops in by_rank.values() for *_, a, _ in ops)
    pl = Placement(kind="loop", ranks=pp, stages=pp * vpp)
    mbs = 1 + max(mb for ops in by_rank.values() for _, _, mb, _, _ in ops)
    cols: tuple[list, ...] = ([], [], [], [], [])
    rows = []
    for r in range(pp):
        ops = sorted(by_rank[r], key=lambda o: o[3])
        row = [parse_instr(f"{pp * chunk + r}{kind}{mb}") for kind, chunk, mb, _, _ in ops]
        rows.append(row)
        for i, (ins, (_, _, _, a, b)) in enumerate(zip(row, ops)):
            for col, v in zip(cols, (r, ins.op, a - t0, b - t0, i)):
                col.append(v)
    notes = ["a Megatron timer dump holds op times only: messages, waits and launches are "
             "not known (no P2P); simulate its program under data semantics",
             "times taken as ms (the unit PP-Schedule-Visualization's plot.py prints)"]
    if skipped:
        notes.append(f"{skipped} dumps of TPxCPxDP ranks other than 0 not read (as plot.py)")
    from schedsim.interop.ops_timeline import ops_only_timeline

    return ops_only_timeline(pl, name, mbs, rows, cols, "megatron-timers", notes)

"""Helpers shared by the replay tests."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_trace(path, rank, events, base=None):
    """Write a minimal Kineto/Chrome trace: X events ``(name, ts us, dur us)`` of ``rank``
    in a world of 2."""
    data = {"traceEvents": [{"ph": "X", "name": n, "ts": ts, "dur": d, "pid": 1, "tid": 1}
                            for n, ts, d in events] + [{"ph": "M", "name": "process_name"}],
            "distributedInfo": {"rank": rank, "world_size": 2}}
    if base is not None:
        data["baseTimeNanoseconds"] = base
    path.write_text(json.dumps(data))


def marked_pids(marker: str, live_only: bool = False) -> list[int]:
    """Processes other than this one whose environment carries ``marker`` (a test sets
    it in the environment of what it starts); ``live_only`` leaves zombies out."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (d / "environ").read_bytes():
                continue
            state = next(ln for ln in (d / "status").read_text().splitlines()
                         if ln.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if not (live_only and " Z" in state):
            out.append(int(d.name))
    return out


def marked_rank_pids(marker: str, live_only: bool = False) -> list[int]:
    """:func:`marked_pids` that are replay rank processes (``--spec`` on the command
    line)."""
    out = []
    for pid in marked_pids(marker, live_only):
        try:
            if b"--spec" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out

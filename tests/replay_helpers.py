"""Helpers shared by the replay tests."""
from __future__ import annotations

import json


def write_trace(path, rank, events, base=None):
    """Write a minimal Kineto/Chrome trace: X events ``(name, ts us, dur us)`` of ``rank``
    in a world of 2."""
    data = {"traceEvents": [{"ph": "X", "name": n, "ts": ts, "dur": d, "pid": 1, "tid": 1}
                            for n, ts, d in events] + [{"ph": "M", "name": "process_name"}],
            "distributedInfo": {"rank": rank, "world_size": 2}}
    if base is not None:
        data["baseTimeNanoseconds"] = base
    path.write_text(json.dumps(data))

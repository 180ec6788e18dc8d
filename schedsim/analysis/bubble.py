"""Where a measured rank's step went: compute, pure transfer, waiting, host, and the
bubble predicted beside the one measured (``check-trace``, ``replay --compare``).

Per rank, over the step ``[0, makespan]`` (the timeline's unit):

- ``wall``: the makespan;
- ``compute``: the summed durations of the rank's ops (its spans);
- ``transfer``: the time inside the rank's waits (its :class:`~schedsim.timeline.
  WaitRecord` intervals) during which a message the wait is for was moving (between its
  ``start``, both sides posted, and its ``arrival``; :class:`~schedsim.timeline.
  Message`): the wait could only end once the bytes were in;
- ``waiting``: the rest of the wait time: the peer had not posted yet, or the message
  was in and the wait had not yet let go;
- ``host``: ``wall - compute - transfer - waiting``: launches, the host's own work between
  instructions, and the time before the rank's first and after its last instruction;
- ``bubble``: ``wall - compute`` (everything but compute), and ``predicted_bubble`` the
  same of the prediction's rank (its makespan minus its busy time), when one is given.

Plain Python, no torch.
"""
from __future__ import annotations

from typing import Any

from schedsim.timeline import Timeline


def _covered(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    """Length of ``[a, b]`` covered by the union of ``spans``."""
    total, cur = 0.0, a
    for s, e in sorted(spans):
        s, e = max(s, cur), min(e, b)
        if e > s:
            total += e - s
            cur = e
    return total


def bubble_breakdown(measured: Timeline, predicted: Timeline | None = None
                     ) -> list[dict[str, Any]]:
    """One ``{rank, wall, compute, transfer, waiting, host, bubble,
    predicted_bubble}`` per rank (module docstring; ``predicted_bubble`` None without a
    prediction)."""
    from schedsim.program.tokens import parse_comm

    moving = {(m.kind, m.stage, m.mb): (m.start, m.arrival) for m in measured.messages
              if m.start is not None and m.arrival is not None}
    wall = measured.makespan
    rows = []
    for r in range(measured.ranks):
        compute = sum(s.duration for s in measured.spans if s.rank == r)
        transfer = waiting = 0.0
        for w in measured.waits:
            if w.rank != r or w.end <= w.start:
                continue
            spans = [moving[k] for k in (parse_comm(t).message_key() for t in w.comms)
                     if k in moving]
            t = _covered(w.start, w.end, spans)
            transfer += t
            waiting += (w.end - w.start) - t
        row = {"rank": r, "wall": wall, "compute": compute, "transfer": transfer,
               "waiting": waiting, "host": wall - compute - transfer - waiting,
               "bubble": wall - compute, "predicted_bubble": None}
        if predicted is not None and r < predicted.ranks:
            busy = sum(s.duration for s in predicted.spans if s.rank == r)
            row["predicted_bubble"] = predicted.makespan - busy
        rows.append(row)
    return rows


def breakdown_lines(rows: list[dict[str, Any]], unit: str) -> list[str]:
    """The breakdown as text lines, one per rank."""
    from schedsim.util.units import fmt_time as t

    out = [f"per rank ({unit}): wall = compute + transfer + waiting + host; bubble = wall - "
           f"compute, measured (predicted)"]
    for x in rows:
        pred = "" if x["predicted_bubble"] is None else f" ({t(x['predicted_bubble'])})"
        out.append(f"  rank {x['rank']}: wall {t(x['wall'])} = compute {t(x['compute'])} + "
                   f"transfer {t(x['transfer'])} + waiting {t(x['waiting'])} + host "
                   f"{t(x['host'])}; bubble {t(x['bubble'])}{pred}")
    return out

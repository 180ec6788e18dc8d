"""Schedule validation: every op present once, on the right rank, in a legal order.

Rules (checked in this order, the first violation is reported with rank, position and
token):

1. one op list per rank of the placement; stages and microbatches in range;
2. each op runs on the rank that holds its stage (``placement.rank_of(stage, mb)``);
3. every (stage, mb) has exactly one ``F`` and, unless the whole schedule is forward-only,
   exactly one backward: ``BW``, or ``B`` and ``W``;
4. on its rank, an op comes after the ops it needs that live on the same rank (``F`` before
   ``B``/``BW`` before ``W``, and same-rank stage hand-offs such as the V turn-around).
"""
from __future__ import annotations

from .dataflow import needs, produces
from .errors import ScheduleError
from .ir import Op, Schedule
from .tokens import format_op


def _where(r: int, i: int, op: Op) -> str:
    return f"rank {r}, op {i} ({format_op(op)})"


def validate_schedule(schedule: Schedule) -> None:
    """Check ``schedule`` against the rules above. Raises :class:`ScheduleError`."""
    pl = schedule.placement
    S, M = pl.stages, schedule.microbatches
    if len(schedule.ranks) != pl.ranks:
        raise ScheduleError(f"schedule has {len(schedule.ranks)} rank rows but the placement "
                            f"has {pl.ranks} ranks")
    if pl.kind == "dual" and pl.microbatches != M:
        raise ScheduleError(f"dual placement is for {pl.microbatches} microbatches, schedule "
                            f"has {M}")
    pos: dict[tuple[str, int, int], tuple[int, int]] = {}   # (kind, s, mb) -> (rank, index)
    has_backward = False
    for r, row in enumerate(schedule.ranks):
        for i, op in enumerate(row):
            if op.kind not in ("F", "B", "W", "BW", "FB"):
                raise ScheduleError(f"{_where(r, i, op)}: unknown kind {op.kind!r}")
            if op.kind == "FB" and (len(op.parts) != 2 or op.parts[0].kind != "F"
                                    or op.parts[1].kind not in ("B", "BW")):
                raise ScheduleError(f"{_where(r, i, op)}: FB needs a forward part and a "
                                    f"B or BW part")
            for a in op.atoms():
                if not (0 <= a.stage < S and 0 <= a.mb < M):
                    raise ScheduleError(
                        f"{_where(r, i, op)}: stage must be in [0, {S}) and microbatch in "
                        f"[0, {M})")
                want = pl.rank_of(a.stage, a.mb)
                if want != r:
                    raise ScheduleError(
                        f"{_where(r, i, op)}: stage {a.stage} (mb {a.mb}) runs on rank "
                        f"{want} under {pl.kind} placement, not on rank {r}")
                key = (a.kind, a.stage, a.mb)
                if key in pos:
                    raise ScheduleError(f"{_where(r, i, op)}: duplicate {a.kind} of stage "
                                        f"{a.stage} mb {a.mb}")
                pos[key] = (r, i)
                if a.kind != "F":
                    has_backward = True
    for s in range(S):
        for mb in range(M):
            home = pl.rank_of(s, mb)
            if ("F", s, mb) not in pos:
                raise ScheduleError(f"missing op: stage {s} mb {mb} has no F (expected on "
                                    f"rank {home})")
            if not has_backward:
                continue
            bw = ("BW", s, mb) in pos
            b, w = ("B", s, mb) in pos, ("W", s, mb) in pos
            if bw and (b or w):
                raise ScheduleError(f"stage {s} mb {mb} has both BW and a split B/W")
            if not bw and not (b and w):
                miss = "W" if b else ("B" if w else "BW (or B and W)")
                raise ScheduleError(f"missing op: stage {s} mb {mb} has no {miss} (expected "
                                    f"on rank {home})")
    # order: same-rank producers first
    made: dict[tuple[str, int, int], tuple[int, int]] = {}
    for (kind, s, mb), (r, i) in pos.items():
        k = produces(Op(kind, s, mb))
        if k is not None:
            made[k] = (r, i)
    for r, row in enumerate(schedule.ranks):
        for i, op in enumerate(row):
            for a in op.atoms():
                for need in needs(a, S):
                    src = made.get(need)
                    if src is None or src[0] != r:
                        continue
                    if src[1] >= i:
                        what = "forward" if need[0] == "F" else "input-gradient backward"
                        raise ScheduleError(
                            f"{_where(r, i, op)} comes before the {what} of stage {need[1]} "
                            f"mb {need[2]} it needs (op {src[1]} on the same rank)")

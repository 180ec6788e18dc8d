"""Diff two runs of schedules with the same ops: which ops moved, by how much.

Ops are matched by identity (kind, stage, microbatch; an ``FB`` pair by both parts), not
by position, so two orders of the same work compare op by op: for each op its position
in its rank's order and its start time in A and in B, and the makespan delta. An op
*moved* when its position in its rank's order differs; it *shifted* when only its start
time differs. Typical use: a paper figure's order against the code's order
(``schedsim diff schedules/1f1b.toml schedules/1f1b-megatron-figure.toml``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from schedsim.analysis._index import EPS, span_token
from schedsim.analysis.accuracy import require_same_ops
from schedsim.errors import ScheduleError
from schedsim.timeline import Timeline


@dataclass
class OpDelta:
    """One op in both runs: rank, token, position in its rank's order and start time."""

    rank: int
    op: str
    pos_a: int
    pos_b: int
    start_a: float
    start_b: float

    @property
    def delta(self) -> float:
        return self.start_b - self.start_a

    @property
    def moved(self) -> bool:
        return self.pos_a != self.pos_b

    def to_dict(self) -> dict:
        return {**asdict(self), "delta": self.delta, "moved": self.moved}


@dataclass
class Diff:
    """All op deltas of B against A, and the makespans."""

    makespan_a: float
    makespan_b: float
    ops: list[OpDelta] = field(default_factory=list)

    @property
    def makespan_delta(self) -> float:
        return self.makespan_b - self.makespan_a

    def moved(self) -> list[OpDelta]:
        """Ops whose position in their rank's order differs between A and B."""
        return [o for o in self.ops if o.moved]

    def shifted(self) -> list[OpDelta]:
        """Ops whose start time differs."""
        return [o for o in self.ops if abs(o.delta) > EPS]

    def to_dict(self) -> dict:
        return {"makespan_a": self.makespan_a, "makespan_b": self.makespan_b,
                "makespan_delta": self.makespan_delta,
                "moved": [o.to_dict() for o in self.moved()],
                "ops": [o.to_dict() for o in self.ops]}


def _ops(tl: Timeline) -> dict[tuple[int, str], tuple[int, float]]:
    out = {}
    for r in range(tl.ranks):
        for pos, s in enumerate(tl.spans_of(r)):
            out[(r, span_token(s))] = (pos, s.start)
    return out


def diff_timelines(a: Timeline, b: Timeline) -> Diff:
    """Compare ``b`` against ``a`` op by op.

    Raises :class:`ScheduleError` when the two runs do not have the same ops on the same
    ranks (naming up to five ops that differ).
    """
    if a.ranks != b.ranks:
        raise ScheduleError(f"cannot diff: A has {a.ranks} ranks, B has {b.ranks}")
    oa, ob = _ops(a), _ops(b)
    require_same_ops(oa.keys(), ob.keys(), lambda k: f"{k[1]} on rank {k[0]}", "diff",
                     ScheduleError)
    d = Diff(a.makespan, b.makespan)
    for (r, tok), (pa, sa) in oa.items():
        pb, sb = ob[(r, tok)]
        d.ops.append(OpDelta(r, tok, pa, pb, sa, sb))
    d.ops.sort(key=lambda o: (o.rank, o.pos_a))
    return d


def moved_line(d: Diff) -> str:
    """The line under ``diff``'s table: how many ops change position (and which forwards
    run earlier in B, the first 12) and how many start at another time."""
    def n(k: int, what: str) -> str:
        return f"{k} {what}{'' if k == 1 else 's'}"

    moved = d.moved()
    fwd = [o for o in moved if o.op.endswith(tuple("0123456789")) and "F" in o.op
           and "BW" not in o.op and o.pos_b < o.pos_a]
    shifted = len(d.shifted())
    starts = f"{n(shifted, 'op')} start{'s' if shifted == 1 else ''} at another time"
    if not moved:
        return f"no op changes position; {starts}"
    which = (f"{n(len(fwd), 'forward')} run{'s' if len(fwd) == 1 else ''} earlier in B: "
             + ", ".join(f"{o.op}@r{o.rank}" for o in fwd[:12])
             + (" ..." if len(fwd) > 12 else "")) if fwd else "no forward runs earlier in B"
    verb = "changes" if len(moved) == 1 else "change"
    return f"{n(len(moved), 'op')} {verb} position ({which}); {starts}"

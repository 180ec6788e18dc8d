"""Compute-order validation, the one home of these rules for schedules and programs:
every op present once, on the right rank, in a legal order.

Rules (checked in this order, the first violation is reported with rank, position and
token):

1. one op list per rank of the placement; stages and microbatches in range;
2. each op runs on the rank that holds its stage (``placement.rank_of(stage, mb)``), once;
3. (complete schedules) every (stage, mb) has exactly one ``F`` and, unless the whole
   schedule is forward-only, exactly one backward: ``BW``, or ``B`` and ``W``;
4. on its rank, an op comes after the ops it needs that live on the same rank (``F`` before
   ``B``/``BW`` before ``W``, and same-rank stage hand-offs such as the V turn-around); for a
   program (which may run a part of a schedule) such an input must be made by some op.

:func:`validate_schedule` checks a schedule (all four rules);
:func:`validate_program` a program's compute order (rules 1, 2 and 4, positions counted in
instructions). The comm instructions are checked by :mod:`schedsim.sim.compile`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedsim.errors import ProgramError, SchedsimError, ScheduleError
from schedsim.program.ir import ALL_RULES, PROGRAM_RULES, Compute, Op, Schedule
from schedsim.program.routing import needs, produces
from schedsim.program.tokens import format_instr, format_op


def _where(r: int, i: int, op: Op) -> str:
    return f"rank {r}, op {i} ({format_op(op)})"


def validate_program(program: Any) -> Any:
    """Check the compute order of a :class:`~schedsim.program.ir.Program` (rules 1, 2 and 4;
    a program may run a part of a schedule) and return it as a checked value (the same
    program, its check recorded; nothing checks it again). Raises :class:`ProgramError`
    naming the first offending instruction as ``rank r, instr i (token)``."""
    from schedsim.program.validate_flat import is_valid

    if program._checks >= PROGRAM_RULES:
        return program
    fl = program.flat()
    if is_valid(fl.schedule(), program.placement, program.microbatches, complete=False):
        return program._checked(PROGRAM_RULES)
    pos: list[list[int]] = []
    for row in program.ranks:
        pos.append([i for i, ins in enumerate(row) if type(ins) is Compute])

    def locate(r: int, k: int) -> str:
        i = pos[r][k]
        return f"rank {r}, instr {i} ({format_instr(program.ranks[r][i])})"

    validate_schedule(program.schedule(), locate, complete=False, error=ProgramError)
    return program._checked(PROGRAM_RULES)


def validate_all(value: Any) -> Any:
    """Check every rule on a :class:`~schedsim.program.ir.Schedule` or on a
    :class:`~schedsim.program.ir.Program`'s compute order, as on a complete schedule
    (:func:`validate_schedule`: every op of every stage and microbatch present), over the
    arrays first; return it as a validated value (as it is when it was one). Raises
    :class:`ScheduleError` naming the first offending op."""
    from schedsim.program.validate_flat import is_valid

    if value.validated:
        return value
    fs = value.flat() if isinstance(value, Schedule) else value.flat().schedule()
    if not is_valid(fs, value.placement, value.microbatches, complete=True):
        validate_schedule(value if isinstance(value, Schedule) else value.schedule())
    return value._checked(ALL_RULES)


def validate_schedule(schedule: Schedule,
                      locate: Callable[[int, int], str] | None = None, *,
                      complete: bool = True, error: type[SchedsimError] = ScheduleError
                      ) -> Schedule:
    """Check ``schedule`` against the rules above and return it as a validated value (the
    same schedule, its check recorded, when ``complete``). Raises ``error``
    (:class:`ScheduleError`) naming the first offending action (ranks in order, each
    rank's ops in order) as ``rank r, op i (token)``, or as ``locate(r, i)`` when given
    (file readers use it to name the cell). An op absent from every rank is named by its
    stage, microbatch and expected rank. ``complete=False`` skips rule 3 (a program may
    run part of a schedule) and instead requires every same-rank input to be made.
    """
    ScheduleError = error
    where = locate or (lambda r, i: _where(r, i, schedule.ranks[r][i]))
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
                raise ScheduleError(f"{where(r, i)}: unknown kind {op.kind!r}")
            if op.kind == "FB" and (len(op.parts) != 2 or op.parts[0].kind != "F"
                                    or op.parts[1].kind not in ("B", "BW")):
                raise ScheduleError(f"{where(r, i)}: FB needs a forward part and a "
                                    f"B or BW part")
            for a in op.atoms():
                if not (0 <= a.stage < S and 0 <= a.mb < M):
                    raise ScheduleError(
                        f"{where(r, i)}: stage must be in [0, {S}) and microbatch in "
                        f"[0, {M})")
                want = pl.rank_of(a.stage, a.mb)
                if want != r:
                    raise ScheduleError(
                        f"{where(r, i)}: stage {a.stage} (mb {a.mb}) runs on rank "
                        f"{want} under {pl.kind} placement, not on rank {r}")
                key = (a.kind, a.stage, a.mb)
                if key in pos:
                    fr, fi = pos[key]
                    raise ScheduleError(f"{where(r, i)}: duplicate {a.kind} of stage "
                                        f"{a.stage} mb {a.mb} (first at {where(fr, fi)}); "
                                        f"each op runs once, this one runs a second time")
                pos[key] = (r, i)
                if a.kind != "F":
                    has_backward = True
    if complete:
        _check_complete(schedule, pos, has_backward, where, ScheduleError)
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
                    if src is None and not complete and pl.rank_of(need[1], need[2]) == r:
                        what = "activation" if need[0] == "F" else "gradient"
                        raise ScheduleError(f"{where(r, i)} needs the {what} of stage "
                                            f"{need[1]} mb {need[2]}, which no op of the "
                                            f"program produces")
                    if src is None or src[0] != r:
                        continue
                    if src[1] >= i:
                        what = "forward" if need[0] == "F" else "input-gradient backward"
                        raise ScheduleError(
                            f"{where(r, i)} comes before the {what} of stage {need[1]} "
                            f"mb {need[2]} it needs ({where(*src)})")
    return schedule._checked(ALL_RULES) if complete else schedule


def _check_complete(schedule: Schedule, pos: dict, has_backward: bool,
                    where: Callable[[int, int], str], ScheduleError: type) -> None:  # noqa: N803
    """Rule 3: every (stage, mb) has one F and (unless forward-only) one backward; named at
    the first action of an incomplete (stage, mb), else by the missing F's stage."""
    pl = schedule.placement
    for r, row in enumerate(schedule.ranks):
        for i, op in enumerate(row):
            for a in op.atoms():
                k, s, mb = a.kind, a.stage, a.mb
                bw = ("BW", s, mb) in pos
                b, w = ("B", s, mb) in pos, ("W", s, mb) in pos
                if k != "F" and ("F", s, mb) not in pos:
                    raise ScheduleError(f"{where(r, i)}: missing op: stage {s} mb {mb} has "
                                        f"no F (expected on rank {r})")
                if k == "F" and has_backward and not (bw or b or w):
                    raise ScheduleError(f"{where(r, i)}: missing op: stage {s} mb {mb} has "
                                        f"no BW (or B and W), expected on rank {r}")
                if (k == "BW" and (b or w)) or (k in ("B", "W") and bw):
                    other = pos[("BW", s, mb)] if k != "BW" else \
                        pos[("B", s, mb) if b else ("W", s, mb)]
                    raise ScheduleError(f"{where(r, i)}: stage {s} mb {mb} has both BW and "
                                        f"a split B/W ({where(*other)})")
                if k == "B" and not w:
                    raise ScheduleError(f"{where(r, i)}: missing op: stage {s} mb {mb} has "
                                        f"no W for this B (expected on rank {r})")
                if k == "W" and not b:
                    raise ScheduleError(f"{where(r, i)}: missing op: stage {s} mb {mb} has "
                                        f"no B for this W (expected on rank {r})")
    for s in range(pl.stages):
        for mb in range(schedule.microbatches):
            if ("F", s, mb) not in pos:
                raise ScheduleError(f"missing op: stage {s} mb {mb} has no F (expected on "
                                    f"rank {pl.rank_of(s, mb)})")

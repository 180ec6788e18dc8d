"""Lowering: Schedule (compute order) -> Program (compute plus P2P instructions).

A comm *policy* decides where each rank posts its sends and recvs and where it waits:

- ``async`` (default): each send is posted right after the op that produced its data;
  the recvs an op needs are posted one op early (before the previous compute, so the
  transfer overlaps it) and waited right before the op. Sends are waited at the end of
  the program (the implicit ``END``).

Other policies register themselves in :data:`POLICIES` (see :func:`register_policy`).
"""
from __future__ import annotations

from typing import Callable

from .dataflow import consumer_stage, needs, produces, recv_comm, send_comm
from .errors import ScheduleError
from .ir import Comm, Compute, Instr, Op, Placement, Post, Program, Schedule, Wait

#: name -> function(schedule) -> Program
POLICIES: dict[str, Callable[[Schedule], Program]] = {}


def register_policy(name: str) -> Callable:
    """Decorator registering a lowering policy under ``name``."""
    def deco(fn: Callable[[Schedule], Program]) -> Callable[[Schedule], Program]:
        POLICIES[name] = fn
        return fn
    return deco


def op_recvs(op: Op, rank: int, pl: Placement) -> list[Comm]:
    """The RECVs rank ``rank`` must post for ``op``'s cross-rank inputs, in part order."""
    out = []
    for a in op.atoms():
        for need in needs(a, pl.stages):
            if pl.rank_of(need[1], need[2]) != rank:
                out.append(recv_comm(need))
    return out


def op_sends(op: Op, rank: int, pl: Placement, has_backward: bool = True) -> list[Comm]:
    """The SENDs rank ``rank`` posts after ``op`` for consumers on other ranks."""
    out = []
    S = pl.stages
    for a in op.atoms():
        k = produces(a)
        if k is None:
            continue
        kind, s, mb = k
        to = consumer_stage(k)
        if not 0 <= to < S or (kind == "B" and not has_backward):
            continue
        if pl.rank_of(to, mb) != rank:
            out.append(send_comm(k))
    return out


def has_backward(schedule: Schedule) -> bool:
    """Whether the schedule trains (has any backward op) or is forward-only."""
    return any(a.kind != "F" for row in schedule.ranks for op in row for a in op.atoms())


@register_policy("async")
def lower_async(schedule: Schedule) -> Program:
    """The ``async`` policy (module docstring)."""
    pl = schedule.placement
    bw = has_backward(schedule)
    rows: list[list[Instr]] = []
    for r, ops in enumerate(schedule.ranks):
        recvs = [op_recvs(op, r, pl) for op in ops]
        row: list[Instr] = [Post(c) for c in (recvs[0] if ops else [])]
        for k, op in enumerate(ops):
            if k + 1 < len(ops):
                row.extend(Post(c) for c in recvs[k + 1])
            if recvs[k]:
                row.append(Wait(tuple(recvs[k])))
            row.append(Compute(op))
            row.extend(Post(c) for c in op_sends(op, r, pl, bw))
        rows.append(row)
    return Program(name=schedule.name, placement=pl, microbatches=schedule.microbatches,
                   ranks=rows, params=dict(schedule.params))


def lower(schedule: Schedule, policy: str = "async") -> Program:
    """Lower ``schedule`` to a :class:`Program` with the named comm ``policy``.

    Raises :class:`ScheduleError` for an unknown policy.
    """
    fn = POLICIES.get(policy)
    if fn is None:
        raise ScheduleError(f"unknown comm policy {policy!r}: expected one of "
                            f"{', '.join(sorted(POLICIES))}")
    return fn(schedule)

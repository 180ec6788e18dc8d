"""Lowering helpers and the ``async`` and ``commit`` comm policies.

Lowering turns a Schedule (compute order) into a Program (compute plus P2P instructions).

A comm *policy* decides where each rank posts its sends and recvs and where it waits:

- ``async`` (default): each send is posted right after the op that produced its data;
  the recvs an op needs are posted one op early (before the previous compute, so the
  transfer overlaps it) and waited right before the op. Sends are waited at the end of
  the program (the implicit ``END``). Recvs are posted in each link's send order (see
  :func:`link_ordered_recvs`), so they match when a rank consumes a peer's messages out
  of order.

- ``commit`` (DualPipe style, deepseek-ai/DualPipe ``dualpipe/comm.py`` +
  ``_commit_and_wait_comm``): after each compute op the rank posts that op's sends and the
  recvs the next op needs (in link order); everything posted since the last compute is
  committed and waited (one ``batch_isend_irecv`` + ``wait()``) right before the next
  compute, and once more at the end. A commit waits its sends too, so under
  ``rendezvous`` semantics a schedule whose ranks commit sends to each other before
  posting the matching recvs deadlocks, as it would on NCCL.

``torch`` lives in :mod:`schedsim.program.torch_runtime`; :mod:`schedsim.program.lower`
holds the registry of policies and :func:`~schedsim.program.lower.lower`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from schedsim.program.ir import Comm, Instr, Op, Placement, Program, Schedule
from schedsim.program.ops import COMM_KINDS, recv_comm, send_comm
from schedsim.program.routing import consumer_stage, needs, produces


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


def link_ordered_recvs(schedule: Schedule) -> list[list[list[Comm]]]:
    """``out[r][k]``: the RECVs rank r posts for op k, in *link order*.

    P2P ops match in posting order per directed link, and a policy that posts each send
    right after its producer fixes the send order of every link. When rank r consumes
    messages from one peer in a different order than that peer sent them, it must post
    the earlier messages' recvs first: so for op k this lists, for each input it needs
    from another rank, every not yet posted recv on that link up to and including it,
    in the sender's order (a recv whose message no rank sends is kept as it is). Equal to
    :func:`op_recvs` when consumers follow the send order (1F1B, GPipe, DualPipe).
    Computed by :func:`schedsim.program.flat_lowering.link_order`.
    """
    from schedsim.program.flat_lowering import atom_comms, link_order

    _check_ranges(schedule)
    fs = schedule.flat()
    rp = link_order(atom_comms(fs, schedule.placement, schedule.microbatches),
                    schedule.placement.ranks)
    out: list[list[list[Comm]]] = [[[] for _ in range(int(fs.rptr[r + 1] - fs.rptr[r]))]
                                   for r in range(fs.ranks)]
    rank = np.repeat(np.arange(fs.ranks), np.diff(fs.rptr))
    for o, k, st, mb in zip(rp.op.tolist(), rp.kind.tolist(), rp.stage.tolist(),
                            rp.mb.tolist()):
        r = int(rank[o])
        out[r][o - int(fs.rptr[r])].append(Comm(COMM_KINDS[k], st, mb))
    return out


def _check_ranges(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` (the validator's message) for a schedule with a
    stage or microbatch out of range or a rank count that differs from the placement's,
    which the array lowering cannot index."""
    fs = schedule.flat()
    pl, M = schedule.placement, schedule.microbatches
    bad = (fs.ranks != pl.ranks or bool(np.any((fs.stage < 0) | (fs.stage >= pl.stages)))
           or bool(np.any((fs.mb < 0) | (fs.mb >= M)))
           or bool(np.any((fs.fb_stage < 0) | (fs.fb_stage >= pl.stages)))
           or bool(np.any((fs.fb_mb < 0) | (fs.fb_mb >= M))))
    if bad:
        from schedsim.program.validate import validate_schedule

        validate_schedule(schedule)


def lower_async(schedule: Schedule) -> Program:
    """The ``async`` policy (module docstring). Raises :class:`ScheduleError` for a
    stage or microbatch out of range."""
    from schedsim.program.flat_lowering import lower_async_flat

    _check_ranges(schedule)
    return program_of_flat(schedule, lower_async_flat(schedule.flat(), schedule.placement,
                                                      schedule.microbatches))


def program_of_flat(schedule: Schedule, flat: Any) -> Program:
    """A :class:`Program` held as the flat arrays ``flat``, named and placed as
    ``schedule`` (trusted when the schedule is)."""
    return Program.from_flat(flat, name=schedule.name, placement=schedule.placement,
                             microbatches=schedule.microbatches, params=schedule.params,
                             trusted=schedule.trusted)


def program_of(schedule: Schedule, rows: list[list[Instr]]) -> Program:
    return Program(name=schedule.name, placement=schedule.placement,
                   microbatches=schedule.microbatches, ranks=rows,
                   params=dict(schedule.params))


# -- commit ---------------------------------------------------------------------------
def lower_commit(schedule: Schedule) -> Program:
    """The ``commit`` policy (module docstring): the P2P ops of one step (the sends of the
    op just run and the recvs the next op needs, recvs in link order; see
    :func:`link_ordered_recvs`) are launched as one ``BATCH[...]`` and committed right
    before the next compute, as DualPipe's ``_commit_and_wait_comm`` does. Raises
    :class:`ScheduleError` for a stage or microbatch out of range."""
    from schedsim.program.flat_lowering import lower_commit_flat

    _check_ranges(schedule)
    return program_of_flat(schedule, lower_commit_flat(schedule.flat(), schedule.placement,
                                                       schedule.microbatches))

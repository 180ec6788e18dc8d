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

from schedsim.program.ir import (
    Batch,
    Comm,
    Commit,
    Compute,
    Instr,
    Op,
    Placement,
    Post,
    Program,
    Schedule,
    Wait,
)
from schedsim.program.ops import recv_comm, send_comm
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
    in the sender's order. Equal to :func:`op_recvs` when consumers follow the send
    order (1F1B, GPipe, DualPipe).
    """
    pl = schedule.placement
    bw = has_backward(schedule)
    rank_of = pl.rank_fn()
    seq: dict[tuple[int, int], list[tuple[str, int, int]]] = {}
    pos: dict[tuple[str, int, int], int] = {}
    for r, ops in enumerate(schedule.ranks):
        for op in ops:
            for c in op_sends(op, r, pl, bw):
                key = c.message_key()
                link = (r, rank_of(consumer_stage(key), key[2]))
                lst = seq.setdefault(link, [])
                pos[key] = len(lst)
                lst.append(key)
    out: list[list[list[Comm]]] = []
    for r, ops in enumerate(schedule.ranks):
        nxt: dict[tuple[int, int], int] = {}
        posted: set[tuple[str, int, int]] = set()
        row = []
        for op in ops:
            batch: list[Comm] = []
            for c in op_recvs(op, r, pl):
                key = c.message_key()
                if key in posted:
                    continue
                link = (rank_of(key[1], key[2]), r)
                i = pos.get(key)
                if i is None or seq[link][i] != key:     # no such send: keep the recv
                    batch.append(c)
                    posted.add(key)
                    continue
                while nxt.get(link, 0) <= i:
                    k2 = seq[link][nxt.get(link, 0)]
                    nxt[link] = nxt.get(link, 0) + 1
                    if k2 not in posted:
                        batch.append(recv_comm(k2))
                        posted.add(k2)
            row.append(batch)
        out.append(row)
    return out


def lower_async(schedule: Schedule) -> Program:
    """The ``async`` policy (module docstring)."""
    pl = schedule.placement
    bw = has_backward(schedule)
    posts = link_ordered_recvs(schedule)
    rows: list[list[Instr]] = []
    for r, ops in enumerate(schedule.ranks):
        recvs = posts[r]
        row: list[Instr] = [Post(c) for c in (recvs[0] if ops else [])]
        for k, op in enumerate(ops):
            if k + 1 < len(ops):
                row.extend(Post(c) for c in recvs[k + 1])
            need = op_recvs(op, r, pl)
            if need:
                row.append(Wait(tuple(need)))
            row.append(Compute(op))
            row.extend(Post(c) for c in op_sends(op, r, pl, bw))
        rows.append(row)
    return program_of(schedule, rows)


def program_of(schedule: Schedule, rows: list[list[Instr]]) -> Program:
    return Program(name=schedule.name, placement=schedule.placement,
                   microbatches=schedule.microbatches, ranks=rows,
                   params=dict(schedule.params))


# -- commit ---------------------------------------------------------------------------
def lower_commit(schedule: Schedule) -> Program:
    """The ``commit`` policy (module docstring): the P2P ops of one step (the sends of the
    op just run and the recvs the next op needs, recvs in link order; see
    :func:`link_ordered_recvs`) are launched as one ``BATCH[...]`` and committed right
    before the next compute, as DualPipe's ``_commit_and_wait_comm`` does."""
    pl = schedule.placement
    bw = has_backward(schedule)
    recvs = link_ordered_recvs(schedule)
    rows: list[list[Instr]] = []
    for r, ops in enumerate(schedule.ranks):
        row: list[Instr] = []
        pending = list(recvs[r][0]) if ops else []
        for k, op in enumerate(ops):
            if pending:
                row += [Batch(tuple(pending)), Commit()]
            row.append(Compute(op))
            pending = op_sends(op, r, pl, bw)
            if k + 1 < len(ops):
                pending = pending + recvs[r][k + 1]
        if pending:
            row += [Batch(tuple(pending)), Commit()]
        rows.append(row)
    return program_of(schedule, rows)

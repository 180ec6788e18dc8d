"""The ``commit`` comm policy, DualPipe style (deepseek-ai/DualPipe ``dualpipe/comm.py`` +
``_commit_and_wait_comm``): after each compute op the rank posts that op's sends and the
recvs the next op needs (in link order, :func:`schedsim.program.comm_plan.link_order`);
everything posted since the last compute is committed and waited (one
``batch_isend_irecv`` + ``wait()``) right before the next compute, and once more at the
end. A commit waits its sends too, so under ``rendezvous`` semantics a schedule whose
ranks commit sends to each other before posting the matching recvs deadlocks, as it
would on NCCL.

Over the flat form: the program's instructions are items sorted by (rank, slot) in array
operations, emitted as a :class:`~schedsim.program.flat.FlatProgram`.
"""
from __future__ import annotations

import numpy as np

from schedsim.program.comm_plan import (
    atom_comms,
    check_ranges,
    fb_sides,
    link_order,
    lowered,
    members,
)
from schedsim.program.flat import FlatProgram, FlatSchedule, Opcode
from schedsim.program.ir import Placement, Program, Schedule

I64 = np.int64
I32 = np.int32


def lower_commit(schedule: Schedule) -> Program:
    """The ``commit`` policy (module docstring): the P2P ops of one step (the sends of the
    op just run and the recvs the next op needs, recvs in link order) are launched as one
    ``BATCH[...]`` and committed right before the next compute, as DualPipe's
    ``_commit_and_wait_comm`` does. Raises :class:`ScheduleError` for a stage or
    microbatch out of range."""
    check_ranges(schedule)
    return lowered(schedule, commit_program(schedule.flat(), schedule.placement,
                                            schedule.microbatches))


def _assemble(fs: FlatSchedule, item_rank: np.ndarray, item_key: np.ndarray,
              item_code: np.ndarray, item_op: np.ndarray, item_mcount: np.ndarray,
              item_mstart: np.ndarray, mk: np.ndarray, ms: np.ndarray, mm: np.ndarray,
              ranks: int, mp: np.ndarray | None = None) -> FlatProgram:
    """Sort the items (instructions) by (rank, key), stable, and build the program.
    ``item_op``: the op of a COMPUTE item (else -1); members are rows of the member
    table (``mk``, ``ms``, ``mm``)."""
    order = np.lexsort((item_key, item_rank))
    code = item_code[order]
    op = item_op[order]
    n = len(order)
    is_c = code == Opcode.COMPUTE
    kind = np.full(n, -1, I32)
    stage = np.full(n, -1, I32)
    mb = np.full(n, -1, I32)
    kind[is_c] = fs.kind[op[is_c]]
    stage[is_c] = fs.stage[op[is_c]]
    mb[is_c] = fs.mb[op[is_c]]
    mptr, midx = members(n, item_mcount[order], item_mstart[order])
    rptr = np.zeros(ranks + 1, I64)
    np.cumsum(np.bincount(item_rank, minlength=ranks), out=rptr[1:])
    op_instr = np.empty(len(fs), I64)
    op_instr[op[is_c]] = np.flatnonzero(is_c)
    return FlatProgram(rptr, code.astype(I32), kind, stage, mb, mptr,
                       mk[midx].astype(I32), ms[midx].astype(I32), mm[midx].astype(I32),
                       *fb_sides(fs, op_instr),
                       cpeer=None if mp is None else mp[midx].astype(I32))  # skip edges


def _stable_keys(key: np.ndarray) -> np.ndarray:
    """``key`` refined by generation order, so that ties keep the order items were made
    (lexsort is stable, but the items of one key come from one block, in order)."""
    return key.astype(I64) * (len(key) + 1) + np.arange(len(key), dtype=I64)


def commit_program(fs: FlatSchedule, pl: Placement, microbatches: int) -> FlatProgram:
    """The ``commit`` policy: before op k, one ``BATCH`` of op k-1's sends and op k's
    recvs (link order) and a ``COMMIT``; after the last op, its sends the same way."""
    ac = atom_comms(fs, pl, microbatches)
    rp = link_order(ac, pl.ranks)
    n = len(fs)
    pos, rank = ac.op_pos, ac.op_rank
    row_len = np.diff(fs.rptr)
    # batch slot b of a rank holds the sends of op b-1 and the recvs of op b
    # (b = 0 .. len): identify slots by (rank, b); members: sends first, then recvs
    send_slot = pos[ac.send_op] + 1
    recv_slot = pos[rp.op]
    m_rank = np.concatenate((rank[ac.send_op], rank[rp.op]))
    m_slot = np.concatenate((send_slot, recv_slot))
    m_sub = np.concatenate((np.zeros(len(send_slot), I64), np.ones(len(recv_slot), I64)))
    m_order = np.lexsort((np.arange(len(m_slot)), m_sub, m_slot, m_rank))
    mk = np.concatenate((ac.send_kind, rp.kind))[m_order]
    ms = np.concatenate((ac.send_stage, rp.stage))[m_order]
    mm = np.concatenate((ac.send_mb, rp.mb))[m_order]
    mp = (np.concatenate((ac.send_peer, rp.peer))[m_order] if rp.peer is not None
          else None)
    sr, ss = m_rank[m_order], m_slot[m_order]
    # the non-empty slots, in (rank, slot) order, and their member ranges
    if len(sr):
        new = np.r_[True, (sr[1:] != sr[:-1]) | (ss[1:] != ss[:-1])]
        b_start = np.flatnonzero(new)
        b_count = np.diff(np.r_[b_start, len(sr)])
        b_rank, b_slot = sr[b_start], ss[b_start]
    else:
        b_start = b_count = b_rank = b_slot = np.zeros(0, I64)
    nb = len(b_start)
    del row_len
    item_rank = np.concatenate((b_rank, b_rank, rank))
    item_key = np.concatenate((3 * b_slot, 3 * b_slot + 1, 3 * pos + 2))
    item_code = np.concatenate((np.full(nb, int(Opcode.BATCH)), np.full(nb, int(Opcode.COMMIT)),
                                np.full(n, int(Opcode.COMPUTE))))
    item_op = np.concatenate((np.full(2 * nb, -1), np.arange(n)))
    item_mcount = np.concatenate((b_count, np.zeros(nb + n, I64)))
    item_mstart = np.concatenate((b_start, np.zeros(nb + n, I64)))
    return _assemble(fs, item_rank, _stable_keys(item_key), item_code, item_op.astype(I64),
                     item_mcount, item_mstart.astype(I64), mk, ms, mm, pl.ranks, mp)

"""The ``async`` comm policy (the default): each send is posted right after the op that
produced its data; the recvs an op needs are posted one op early (before the previous
compute, so the transfer overlaps it) and waited right before the op. Sends are waited
at the end of the program (the implicit ``END``). Recvs are posted in each link's send
order (:func:`schedsim.program.comm_plan.link_order`), so they match when a rank consumes
a peer's messages out of order.

Over the flat form: every instruction's position is computed in a few array operations
from the schedule's :class:`~schedsim.program.flat.FlatSchedule`, and the program's
:class:`~schedsim.program.flat.FlatProgram` is emitted directly.
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


def lower_async(schedule: Schedule) -> Program:
    """The ``async`` policy (module docstring). Raises :class:`ScheduleError` for a
    stage or microbatch out of range."""
    check_ranges(schedule)
    return lowered(schedule, async_program(schedule.flat(), schedule.placement,
                                           schedule.microbatches))


def async_program(fs: FlatSchedule, pl: Placement, microbatches: int) -> FlatProgram:
    """The ``async`` policy: per rank, the first op's recvs, then for each op k the next
    op's recvs (link order), a ``WAIT`` on op k's own recvs, op k, op k's sends.

    Every instruction's position is computed directly: op k's group
    ``[R(k+1)] [W(k)] C(k) [S(k)]`` starts after the rank's first recvs and the groups
    before it."""
    ac = atom_comms(fs, pl, microbatches)
    rp = link_order(ac, pl.ranks)
    n = len(fs)
    nn = np.bincount(ac.need_op, minlength=n)            # recvs op o waits for
    na = np.bincount(rp.op, minlength=n)                 # recvs posted for op o
    nsend = np.bincount(ac.send_op, minlength=n)
    first = np.zeros(n, bool)
    first[fs.rptr[:-1][np.diff(fs.rptr) > 0]] = True
    last = np.zeros(n, bool)
    last[fs.rptr[1:][np.diff(fs.rptr) > 0] - 1] = True
    a_next = np.where(last, 0, np.r_[na[1:], 0])        # recvs of the next op, same rank
    w = (nn > 0).astype(I64)
    pre = np.where(first, na, 0)                         # the rank's first recvs
    size = pre + a_next + w + 1 + nsend
    ends = np.cumsum(size)
    start = ends - size + pre                            # where op o's group starts
    pos_w = start + a_next
    pos_c = pos_w + w
    N = int(ends[-1]) if n else 0
    code = np.empty(N, I32)
    mcount = np.zeros(N, I64)
    mstart = np.zeros(N, I64)
    # recv posts: in the rank's prefix (first op) or at the previous op's group start
    k_in = np.arange(len(rp.op)) - (np.cumsum(na) - na)[rp.op]
    pos_r = np.where(first[rp.op], start[rp.op] - pre[rp.op], start[rp.op - 1]) + k_in
    np_ = len(rp.op)
    code[pos_r] = Opcode.POST
    mcount[pos_r] = 1
    mstart[pos_r] = np.arange(np_)
    wo = np.flatnonzero(w)
    code[pos_w[wo]] = Opcode.WAIT
    mcount[pos_w[wo]] = nn[wo]
    mstart[pos_w[wo]] = np_ + (np.cumsum(nn) - nn)[wo]
    code[pos_c] = Opcode.COMPUTE
    k_s = np.arange(len(ac.send_op)) - (np.cumsum(nsend) - nsend)[ac.send_op]
    pos_s = pos_c[ac.send_op] + 1 + k_s
    code[pos_s] = Opcode.POST
    mcount[pos_s] = 1
    mstart[pos_s] = np_ + len(ac.need_op) + np.arange(len(ac.send_op))
    # member table: recv posts, needs (waited), sends
    mk = np.concatenate((rp.kind, ac.need_kind, ac.send_kind))
    ms = np.concatenate((rp.stage, ac.need_stage, ac.send_stage))
    mm = np.concatenate((rp.mb, ac.need_mb, ac.send_mb))
    mp = (np.concatenate((rp.peer, ac.need_peer, ac.send_peer)) if rp.peer is not None
          else None)
    kind = np.full(N, -1, I32)
    stage = np.full(N, -1, I32)
    mb = np.full(N, -1, I32)
    kind[pos_c], stage[pos_c], mb[pos_c] = fs.kind, fs.stage, fs.mb
    mptr, midx = members(N, mcount, mstart)
    rptr = np.concatenate(([0], ends))[fs.rptr].astype(I64)
    return FlatProgram(rptr, code, kind, stage, mb, mptr, mk[midx].astype(I32),
                       ms[midx].astype(I32), mm[midx].astype(I32),
                       *fb_sides(fs, pos_c.astype(I64)),
                       cpeer=None if mp is None else mp[midx].astype(I32))

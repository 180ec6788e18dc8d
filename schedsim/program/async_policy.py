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
    before it; every member is written straight to its slot (no member table)."""
    ac = atom_comms(fs, pl, microbatches)
    rp = link_order(ac, pl.ranks)
    n = len(fs)
    nn = np.bincount(ac.need_op, minlength=n)            # recvs op o waits for
    na = np.bincount(rp.op, minlength=n)                 # recvs posted for op o
    nsend = np.bincount(ac.send_op, minlength=n)
    nonempty = np.diff(fs.rptr) > 0
    first = np.zeros(n, bool)
    first[fs.rptr[:-1][nonempty]] = True
    last = np.zeros(n, bool)
    last[fs.rptr[1:][nonempty] - 1] = True
    a_next = np.where(last, 0, np.r_[na[1:], 0])        # recvs of the next op, same rank
    del last
    w = (nn > 0).astype(I64)
    pre = np.where(first, na, 0)                         # the rank's first recvs
    size = a_next + w
    size += nsend
    size += 1
    size += pre
    ends = np.cumsum(size)
    start = ends - size                                  # where op o's group starts
    start += pre
    del size
    pos_w = start + a_next
    del a_next
    pos_c = pos_w + w
    N = int(ends[-1]) if n else 0
    code = np.empty(N, I32)
    mcount = np.zeros(N, I32)
    # recv posts: in the rank's prefix (first op) or at the previous op's group start
    k_in = np.arange(len(rp.op), dtype=I64) - (np.cumsum(na) - na)[rp.op]
    pos_r = np.where(first[rp.op], start[rp.op] - pre[rp.op], start[rp.op - 1]) + k_in
    del k_in, first, pre, start, na
    code[pos_r] = Opcode.POST
    mcount[pos_r] = 1
    wo = np.flatnonzero(w)
    del w
    code[pos_w[wo]] = Opcode.WAIT
    mcount[pos_w[wo]] = nn[wo]
    del wo
    code[pos_c] = Opcode.COMPUTE
    k_s = np.arange(len(ac.send_op), dtype=I64) - (np.cumsum(nsend) - nsend)[ac.send_op]
    pos_s = pos_c[ac.send_op] + 1 + k_s
    del k_s, nsend
    code[pos_s] = Opcode.POST
    mcount[pos_s] = 1
    mptr = np.zeros(N + 1, I64)
    np.cumsum(mcount, out=mptr[1:])
    del mcount
    # members: a post's one member, then a WAIT's needs in op order, at their slots
    slot_r, slot_s = mptr[pos_r], mptr[pos_s]
    del pos_r, pos_s
    slot_n = mptr[pos_w[ac.need_op]]
    slot_n += np.arange(len(ac.need_op), dtype=I64) - (np.cumsum(nn) - nn)[ac.need_op]
    del nn, pos_w
    nmem = int(mptr[-1])

    def column(r: np.ndarray, need: np.ndarray, send: np.ndarray) -> np.ndarray:
        out = np.empty(nmem, I32)
        out[slot_r], out[slot_n], out[slot_s] = r, need, send
        return out
    kind = np.full(N, -1, I32)
    stage = np.full(N, -1, I32)
    mb = np.full(N, -1, I32)
    kind[pos_c], stage[pos_c], mb[pos_c] = fs.kind, fs.stage, fs.mb
    rptr = np.concatenate(([0], ends))[fs.rptr].astype(I64)
    return FlatProgram(rptr, code, kind, stage, mb, mptr,
                       column(rp.kind, ac.need_kind, ac.send_kind),
                       column(rp.stage, ac.need_stage, ac.send_stage),
                       column(rp.mb, ac.need_mb, ac.send_mb), *fb_sides(fs, pos_c),
                       cpeer=None if rp.peer is None else
                       column(rp.peer, ac.need_peer, ac.send_peer))

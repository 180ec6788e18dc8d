"""The ``async`` comm policy (the default): each send is posted right after the op that
produced its data; the recvs an op needs are posted one op early (before the previous
compute, so the transfer overlaps it) and waited right before the op. Sends are waited
at the end of the program (the implicit ``END``). Recvs are posted in each link's send
order (:func:`schedsim.program.comm_plan.link_order`), so they match when a rank consumes
a peer's messages out of order.

Over the flat form: the schedule's :class:`~schedsim.program.flat.FlatSchedule` gives
each op's recvs and sends (array operations), and one pass
(:mod:`schedsim.program.lower_kernel`) writes the program's
:class:`~schedsim.program.flat.FlatProgram` directly.
"""
from __future__ import annotations

import numpy as np

from schedsim.program.comm_plan import (
    atom_comms,
    check_ranges,
    fb_sides,
    link_counted,
    lowered,
)
from schedsim.program.flat import FlatProgram, FlatSchedule
from schedsim.program.ir import Placement, Program, Schedule
from schedsim.program.lower_kernel import AsyncOut, OpRows, Posts, async_kernel
from schedsim.util.jit import executor

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

    One pass (:func:`schedsim.program.lower_kernel.async_kernel`) writes the program's
    arrays after the link order's counts (:func:`~schedsim.program.comm_plan.
    link_counted`): no temporaries of the program's size."""
    ac = atom_comms(fs, pl, microbatches)
    ln, sc, xs = link_counted(ac, pl.ranks)
    n, nn, ns = len(fs), len(ac.need_op), len(ac.send_op)
    nw = int(np.count_nonzero(ac.need_op[1:] != ac.need_op[:-1])) + 1 if nn else 0
    nr = int(sc.total[0])
    N, nmem = n + nr + ns + nw, nr + ns + nn
    peered = ln.peered
    out = AsyncOut(rptr=xs.empty(fs.ranks + 1, I64), code=xs.empty(N, I32),
                   kind=xs.empty(N, I32), stage=xs.empty(N, I32), mb=xs.empty(N, I32),
                   mptr=xs.empty(N + 1, I64),
                   mem=Posts(kind=xs.empty(nmem, I32), stage=xs.empty(nmem, I32),
                             mb=xs.empty(nmem, I32),
                             peer=xs.empty(nmem if peered else 0, I32)),
                   op_instr=xs.empty(n, I64))
    ops = OpRows(rptr=xs.ints(fs.rptr), kind=xs.ints(fs.kind), stage=xs.ints(fs.stage),
                 mb=xs.ints(fs.mb))
    del ac
    executor(async_kernel, n + nn + ns)[0](ln, sc, ops, out)
    del ln, sc, ops
    a = [np.asarray(v, dt) for v, dt in ((out.rptr, I64), (out.code, I32), (out.kind, I32),
                                         (out.stage, I32), (out.mb, I32), (out.mptr, I64),
                                         (out.mem.kind, I32), (out.mem.stage, I32),
                                         (out.mem.mb, I32))]
    return FlatProgram(*a, *fb_sides(fs, np.asarray(out.op_instr, I64)),
                       cpeer=np.asarray(out.mem.peer, I32) if peered else None)

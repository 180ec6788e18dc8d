"""Discrete-event simulator: compiled program -> raw run results -> Timeline.

Model (DESIGN.md, "Comm semantics"): each rank's host runs its program in order; a compute
op occupies the rank for its cost; posting a send/recv does not block (a launch costs
``CommModel.launch_cost`` of host time, 0 by default; under ``lazy_init`` a rank's first
bare post to a peer first waits for that peer to reach its own, see
:mod:`schedsim.sim.kernels`); ``WAIT``/``COMMIT`` block until the named ops complete; at the
end of its program a rank waits for everything it posted. Each directed link carries
messages FIFO in the order they start, occupying the link ``bytes/bandwidth`` and arriving
``latency`` later. Under ``eager`` a send completes once its bytes have left and a recv at
``max(arrival, post)``; under ``rendezvous`` the transfer starts once both sides are
active and both complete at arrival. With a comm stream, a rank's launches (bare posts and
batches) start one after another: a launch's ops become *active* only when the launch
reaches the head of its stream.

The event loop is :func:`schedsim.sim.kernels.run_kernel` (its docstring gives the event
order); :func:`run` executes it in CPython or, for large programs with numba installed,
compiled (:mod:`schedsim.sim.fast`): same source, same results. Everything terminates:
when no event is left and a rank has not finished, the program is deadlocked and
:mod:`schedsim.sim.deadlock` explains the wait-for cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from schedsim.sim.compiled import Compiled
from schedsim.sim.costs import CommModel
from schedsim.sim.kernel_records import Groups, RunOut, RunScratch
from schedsim.sim.kernels import run_kernel
from schedsim.sim.run_objects import RunSource, run_objects, run_span_kinds
from schedsim.timeline import Timeline
from schedsim.timeline_build import TimelineHeader, assemble_timeline


@dataclass(frozen=True, eq=False)
class RunState:
    """Raw results of one run (numpy arrays; -1 where a time is unknown: never ran,
    never posted, never completed). Indexed by span (``sstart``/``send``), handle
    (``hpost``: posted, ``hact``: active, i.e. at the head of its comm stream,
    ``hdone``: completed), message (``mstart``/``marr``: transfer start and arrival),
    rank (``pcs``: steps done, counted from the rank's first; ``times``; ``reach``: when
    the rank reached the step it is blocked on) and stream (``stream_busy``: the unit
    at its head, -1). ``waits``: ``(global step, reached, released)`` per recorded wait;
    ``pair_state``/``pair_rank``/``pair_t``: lazy communicator inits."""

    sstart: np.ndarray
    send: np.ndarray
    hpost: np.ndarray
    hact: np.ndarray
    hdone: np.ndarray
    mstart: np.ndarray
    marr: np.ndarray
    pcs: np.ndarray
    times: np.ndarray
    reach: np.ndarray
    waits: tuple[np.ndarray, np.ndarray, np.ndarray]
    stream_busy: np.ndarray
    pair_state: np.ndarray
    pair_rank: np.ndarray
    pair_t: np.ndarray

    def finished(self, cp: Compiled) -> bool:
        """True if every rank ran its whole program."""
        crptr = cp.code.crptr
        return bool(np.all(self.pcs + crptr[:-1] >= crptr[1:]))


def run(cp: Compiled) -> RunState:
    """Execute a compiled program (:func:`~schedsim.sim.kernels.run_kernel`, by CPython
    or numba: :func:`schedsim.sim.fast.executor`); returns the raw :class:`RunState`."""
    from schedsim.sim.fast import executor

    code, units, P = cp.code, cp.units, cp.ranks
    kernel, xs = executor(run_kernel, len(code.cop))
    nsp, nh, nm = len(cp.span_gi), 2 * cp.num_messages, cp.num_messages
    nu, nst, ns = len(units.unit_stream), cp.num_streams, len(code.cop)
    npair = P * P if cp.host.lazy_init else 1
    groups, gs, gmaxsize, matom = _groups(cp, xs)
    depth = 8 + max(int(np.diff(code.chptr).max(initial=0)), int(np.diff(
        units.unit_hptr).max(initial=0))) + 2 * gmaxsize   # the work stack: one step's or
    # unit's handles, what follows, and an atomic group's members moving or completing
    # together
    out = RunOut(sstart=xs.emptyf(nsp), send=xs.fullf(nsp, -1.0), hpost=xs.fullf(nh, -1.0),
                 hact=xs.fullf(nh, -1.0), hdone=xs.fullf(nh, -1.0),
                 mstart=xs.fullf(nm, -1.0), marr=xs.fullf(nm, -1.0),
                 pcs=xs.new_ints(code.crptr[:-1]), times=xs.fullf(P, 0.0),
                 reach=xs.fullf(P, -1.0), wrec=xs.empty(ns), wt0=xs.emptyf(ns),
                 wt1=xs.emptyf(ns), counts=xs.full(1, 0), sbusy=xs.full(nst, -1),
                 pair_state=xs.full(npair, 0), pair_rank=xs.full(npair, -1),
                 pair_t=xs.fullf(npair, 0.0))
    scratch = RunScratch(
        sfree=xs.fullf(nst, 0.0), qhead=xs.full(nst, -1), qtail=xs.empty(nst),
        unext=xs.empty(nu), uenq=xs.emptyf(nu), udone=xs.fullf(nu, 0.0),
        ucnt=xs.new_ints(np.diff(units.unit_hptr)), waiter=xs.full(nh, -1),
        wmax=xs.emptyf(P), wcnt=xs.empty(P), launched=xs.full(P, 0), delayed=xs.full(P, -1),
        link_free=xs.fullf(max(cp.links.num_links, 1), 0.0), wk_kind=xs.empty(depth),
        wk_x=xs.empty(depth), wk_t=xs.emptyf(depth), ready=xs.empty(nu + 1), **gs)
    if cp.data_mode:      # implicit recvs are always posted
        out.hact[1::2] = xs.fullf(nm, 0.0)
    links = cp.links
    if cp.host.atomic:    # an atomic group's message moves when its groups are armed
        links = links._replace(meager=np.where(matom > 0, 0, links.meager))
    kernel(code=xs.record(code, unread=("cipc", "cwk")), links=xs.record(links),
           units=xs.record(units), host=xs.record(cp.host), groups=groups, out=out,
           scratch=scratch)
    f, i = np.float64, np.int64
    nrec = int(out.counts[0])
    return RunState(
        sstart=np.asarray(out.sstart, f), send=np.asarray(out.send, f),
        hpost=np.asarray(out.hpost, f), hact=np.asarray(out.hact, f),
        hdone=np.asarray(out.hdone, f), mstart=np.asarray(out.mstart, f),
        marr=np.asarray(out.marr, f), pcs=np.asarray(out.pcs, i) - code.crptr[:-1],
        times=np.asarray(out.times, f), reach=np.asarray(out.reach, f),
        waits=(np.asarray(out.wrec[:nrec], i), np.asarray(out.wt0[:nrec], f),
               np.asarray(out.wt1[:nrec], f)),
        stream_busy=np.asarray(out.sbusy, i), pair_state=np.asarray(out.pair_state, i),
        pair_rank=np.asarray(out.pair_rank, i), pair_t=np.asarray(out.pair_t, f))


def _groups(cp: Compiled, xs) -> tuple[Groups, dict, int, np.ndarray | None]:
    """The kernel's atomic groups (:mod:`schedsim.sim.groups`), their scratch arrays (the
    group fields of :class:`~schedsim.sim.kernel_records.RunScratch`), the largest group's
    size and ``matom`` (numpy); one-entry dummies when the run is not atomic."""
    if not cp.host.atomic:
        one = xs.full(1, -1)
        return (Groups(atomic=False, hgroup=one, gptr=xs.full(2, 0), gh=one,
                       matom=xs.full(1, 0)),
                {"gpend": one, "gmax": xs.fullf(1, -1.0), "garm": xs.fullf(1, -1.0),
                 "gleft": one, "gfin": xs.fullf(1, -1.0)}, 0, None)
    from schedsim.sim.groups import atomic_groups

    hgroup, gptr, gh, matom = atomic_groups(cp)
    ng = len(gptr) - 1
    sizes = np.diff(gptr)
    return (Groups(atomic=True, hgroup=xs.ints(hgroup), gptr=xs.ints(gptr), gh=xs.ints(gh),
                   matom=xs.ints(matom)),
            {"gpend": xs.new_ints(sizes), "gmax": xs.fullf(max(ng, 1), -1.0),
             "garm": xs.fullf(max(ng, 1), -1.0), "gleft": xs.new_ints(sizes),
             "gfin": xs.fullf(max(ng, 1), -1.0)}, int(sizes.max(initial=0)), matom)


def build_timeline(cp: Compiled, st: RunState, comm: CommModel, unit: str) -> Timeline:
    """Turn raw run results into a :class:`Timeline`: the span columns of the ops that
    ran, for the summary, and a deferred builder of the span, message and wait objects,
    given to :func:`schedsim.timeline_build.assemble_timeline`. The builder keeps a
    :class:`~schedsim.sim.run_objects.RunSource` (what those objects need of ``cp`` and
    ``st``), not ``cp``: the Timeline does not keep the compiled program alive."""
    prog = cp.program
    src = RunSource.of(cp, st)
    head = TimelineHeader(prog.placement, prog.name, prog.microbatches, comm.semantics, unit,
                          "simulated", comm.comm_stream, prog.params)
    tl = assemble_timeline(head, src.span_rank, src.span_start, src.span_end,
                           build=partial(run_objects, src),
                           span_kinds=partial(run_span_kinds, src))
    if cp.host.atomic:
        tl.group_semantics = "atomic"
    return tl

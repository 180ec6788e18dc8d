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

from schedsim.program.flat import COMPUTE_KINDS
from schedsim.program.routing import MESSAGE_KINDS
from schedsim.sim.compile import Compiled
from schedsim.sim.costs import CommModel
from schedsim.sim.kernels import Step, WaitKind
from schedsim.timeline import Message, Part, Span, Timeline, WaitRecord
from schedsim.timeline_build import TimelineHeader, assemble_timeline


@dataclass
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
        return bool(np.all(self.pcs + cp.crptr[:-1] >= cp.crptr[1:]))


def run(cp: Compiled) -> RunState:
    """Execute a compiled program; returns the raw :class:`RunState`."""
    from schedsim.sim.fast import kernels_for

    P = cp.ranks
    K, xs = kernels_for(len(cp.cop), "run")
    nsp, nh, nm = len(cp.span_gi), 2 * cp.num_messages, cp.num_messages
    nu, nst, ns = len(cp.unit_stream), cp.num_streams, len(cp.cop)
    npair = P * P if cp.lazy_init else 1
    o = {"sstart": xs.emptyf(nsp), "send": xs.fullf(nsp, -1.0),
         "hpost": xs.fullf(nh, -1.0), "hact": xs.fullf(nh, -1.0),
         "hdone": xs.fullf(nh, -1.0), "mstart": xs.fullf(nm, -1.0),
         "marr": xs.fullf(nm, -1.0), "pcs": xs.new_ints(cp.crptr[:-1]),
         "times": xs.fullf(P, 0.0), "reach": xs.fullf(P, -1.0), "wrec": xs.empty(ns),
         "wt0": xs.emptyf(ns), "wt1": xs.emptyf(ns), "counts": xs.full(1, 0),
         "sbusy": xs.full(nst, -1), "sfree": xs.fullf(nst, 0.0), "qhead": xs.full(nst, -1),
         "qtail": xs.empty(nst), "unext": xs.empty(nu), "uenq": xs.emptyf(nu),
         "udone": xs.fullf(nu, 0.0), "ucnt": xs.new_ints(np.diff(cp.unit_hptr)),
         "waiter": xs.full(nh, -1), "wmax": xs.emptyf(P), "wcnt": xs.empty(P),
         "link_free": xs.fullf(max(cp.num_links, 1), 0.0), "launched": xs.full(P, 0),
         "pair_state": xs.full(npair, 0), "pair_rank": xs.full(npair, -1),
         "pair_t": xs.fullf(npair, 0.0), "delayed": xs.full(P, -1)}
    g = _groups(cp, xs)
    depth = 8 + max(int(np.diff(cp.chptr).max(initial=0)), int(np.diff(cp.unit_hptr).max(
        initial=0))) + 2 * g["gmaxsize"]   # the work stack: one step's or unit's handles,
    # what follows, and an atomic group's members moving or completing together
    o.update(wk_kind=xs.empty(depth), wk_x=xs.empty(depth), wk_t=xs.emptyf(depth),
             ready=xs.empty(nu + 1))
    if cp.data_mode:      # implicit recvs are always posted
        o["hact"][1::2] = xs.fullf(nm, 0.0)
    strict = bool(np.any(cp.mocc > 0))
    meager = cp.meager if not cp.atomic else np.where(g["matom_np"] > 0, 0, cp.meager)
    K.run_kernel(P, xs.ints(cp.crptr), xs.ints(cp.cop), xs.floats(cp.ccost),
                 xs.ints(cp.cspan), xs.ints(cp.chptr), xs.ints(cp.ch), xs.ints(cp.cuptr),
                 xs.ints(cp.cinit), xs.floats(cp.delay if cp.delay is not None else ()),
                 cp.delay is not None, xs.floats(cp.msend if cp.msend is not None else ()),
                 cp.msend is not None, xs.ints(cp.hunit), xs.ints(cp.unit_stream),
                 xs.ints(cp.unit_hptr), xs.ints(cp.unit_h), xs.floats(cp.mlat),
                 xs.floats(cp.mocc), xs.ints(cp.mlink), xs.ints(meager), cp.data_mode,
                 strict, float(cp.launch_cost), cp.lazy_init, float(cp.init_cost),
                 o["sstart"], o["send"], o["hpost"], o["hact"], o["hdone"], o["mstart"],
                 o["marr"], o["pcs"], o["times"], o["reach"], o["wrec"], o["wt0"], o["wt1"],
                 o["counts"], o["sbusy"], o["sfree"], o["qhead"], o["qtail"], o["unext"],
                 o["uenq"], o["udone"], o["ucnt"], o["waiter"], o["wmax"], o["wcnt"],
                 o["link_free"], o["launched"], o["pair_state"], o["pair_rank"],
                 o["pair_t"], o["delayed"], o["wk_kind"], o["wk_x"], o["wk_t"], o["ready"],
                 cp.atomic, g["hgroup"], g["gptr"], g["gh"], g["matom"], g["gpend"],
                 g["gmax"], g["garm"], g["gleft"], g["gfin"])
    f, i = np.float64, np.int64
    nrec = int(o["counts"][0])
    return RunState(
        sstart=np.asarray(o["sstart"], f), send=np.asarray(o["send"], f),
        hpost=np.asarray(o["hpost"], f), hact=np.asarray(o["hact"], f),
        hdone=np.asarray(o["hdone"], f), mstart=np.asarray(o["mstart"], f),
        marr=np.asarray(o["marr"], f), pcs=np.asarray(o["pcs"], i) - cp.crptr[:-1],
        times=np.asarray(o["times"], f), reach=np.asarray(o["reach"], f),
        waits=(np.asarray(o["wrec"][:nrec], i), np.asarray(o["wt0"][:nrec], f),
               np.asarray(o["wt1"][:nrec], f)),
        stream_busy=np.asarray(o["sbusy"], i), pair_state=np.asarray(o["pair_state"], i),
        pair_rank=np.asarray(o["pair_rank"], i), pair_t=np.asarray(o["pair_t"], f))


def _groups(cp: Compiled, xs) -> dict:
    """The kernel's atomic-group arrays (:mod:`schedsim.sim.groups`), one-entry dummies
    when the run is not atomic."""
    if not cp.atomic:
        one = xs.full(1, -1)
        return {"hgroup": one, "gptr": xs.full(2, 0), "gh": one, "matom": xs.full(1, 0),
                "gpend": one, "gmax": xs.fullf(1, -1.0), "garm": xs.fullf(1, -1.0),
                "gleft": one, "gfin": xs.fullf(1, -1.0), "gmaxsize": 0}
    from schedsim.sim.groups import atomic_groups

    hgroup, gptr, gh, matom = atomic_groups(cp)
    ng = len(gptr) - 1
    sizes = np.diff(gptr)
    return {"hgroup": xs.ints(hgroup), "gptr": xs.ints(gptr), "gh": xs.ints(gh),
            "matom": xs.ints(matom), "matom_np": matom, "gpend": xs.new_ints(sizes),
            "gmax": xs.fullf(max(ng, 1), -1.0), "garm": xs.fullf(max(ng, 1), -1.0),
            "gleft": xs.new_ints(sizes), "gfin": xs.fullf(max(ng, 1), -1.0),
            "gmaxsize": int(sizes.max(initial=0))}


def _opt(a: np.ndarray) -> list:
    """A float array as a list with None where it is -1 (unknown)."""
    lst = a.tolist()
    if (a < 0).any():
        return [None if x < 0 else x for x in lst]
    return lst


def handle_tokens(cp: Compiled, hs: np.ndarray) -> list[str]:
    """Program tokens of handles ``hs`` (``1RECV_F0``), built from the message arrays."""
    if not len(hs):
        return []
    recv = (hs & 1) == 1
    code = cp.mcode[hs >> 1]
    if cp.mrcode is not None:       # a swapped recv names another message (identity)
        code = np.where(recv, cp.mrcode[hs >> 1], code)
    mk, ps, cs, mb = cp.decode(code)
    stage = np.where(recv, cs, ps)
    names = [("SEND_" + k, "RECV_" + k) for k in MESSAGE_KINDS]
    toks = [f"{s}{names[k][r]}{m}" for s, k, r, m in
            zip(stage.tolist(), mk.tolist(), recv.tolist(), mb.tolist())]
    skip = cs != ps + 1 - 2 * (mk & 1)
    if skip.any():                  # a skip edge: the token names the other stage
        other = np.where(recv, ps, cs)
        for i in np.flatnonzero(skip).tolist():
            toks[i] += ("<" if recv[i] else ">") + str(int(other[i]))
    return toks


def _spans(cp: Compiled, st: RunState) -> list[Span]:
    """Spans of the ops that ran (a deadlock leaves some unreached)."""
    fl, pl = cp.flat, cp.program.placement
    ran = np.flatnonzero(st.send >= 0.0)
    gi = cp.span_gi[ran]
    kind = fl.kind[gi].astype(np.int64)
    stage = fl.stage[gi].astype(np.int64)
    mb = fl.mb[gi].astype(np.int64)
    chunk = _chunks(pl, stage, mb)
    rank = fl.rank_of_instr()[gi].tolist()
    index = fl.index_of_instr()[gi].tolist()
    names = [COMPUTE_KINDS[k] for k in kind.tolist()]
    parts: list = [None] * len(gi)
    if len(fl.fb_at):
        fb_pos = {g: k for k, g in enumerate(fl.fb_at.tolist())}
        for j in np.flatnonzero(kind == 4).tolist():
            k = fb_pos[int(gi[j])]
            bs, bm = int(fl.fb_stage[k]), int(fl.fb_mb[k])
            parts[j] = [Part("F", int(mb[j]), int(chunk[j]), int(stage[j])),
                        Part(COMPUTE_KINDS[int(fl.fb_kind[k])], bm,
                             int(_chunks(pl, np.array([bs]), np.array([bm]))[0]), bs)]
    return list(map(Span, rank, names, mb.tolist(), chunk.tolist(), stage.tolist(),
                    st.sstart[ran].tolist(), st.send[ran].tolist(), index, parts))


def _chunks(pl, stage: np.ndarray, mb: np.ndarray) -> np.ndarray:
    """Vectorized :meth:`Placement.chunk_of`."""
    if pl.kind == "dual":
        return (mb >= (pl.microbatches or 0) // 2).astype(np.int64)
    table = np.asarray([pl.chunk_of(s) for s in range(pl.stages)], dtype=np.int64)
    return table[stage]


def _messages(cp: Compiled, st: RunState) -> list[Message]:
    mk, ps, cs, mb = cp.decode(cp.mcode)
    kinds = MESSAGE_KINDS
    kind = [kinds[k] for k in mk.tolist()]
    skip = cs != ps + 1 - 2 * (mk & 1)
    to = np.where(skip, cs, -1).tolist() if skip.any() else None
    sact = _opt(st.hact[0::2])
    if cp.data_mode:
        sposts, rposts, ract = sact, [None] * cp.num_messages, [None] * cp.num_messages
    else:
        sposts, rposts, ract = _opt(st.hpost[0::2]), _opt(st.hpost[1::2]), \
            _opt(st.hact[1::2])
    out = list(map(Message, kind, cp.msrc.tolist(), cp.mdst.tolist(), mb.tolist(),
                   ps.tolist(), cp.mbytes.tolist(), sposts, rposts,
                   _opt(st.mstart), _opt(st.marr), _opt(st.hdone[0::2]),
                   _opt(st.hdone[1::2]), cp.hindex[0::2].tolist(), cp.hindex[1::2].tolist(),
                   sact, ract))
    if to is not None:              # skip edges: the consumer stage is not the chain's
        for msg, c in zip(out, to):
            if c >= 0:
                msg.to_stage = c
    return out


def _waits(cp: Compiled, st: RunState) -> list[WaitRecord]:
    g, t0, t1 = st.waits
    if not len(g):
        return []
    rank = np.searchsorted(cp.crptr, g, side="right") - 1
    is_init = cp.cop[g] == Step.LAUNCH
    kinds = [k.name for k in WaitKind]
    kind = np.where(is_init, int(WaitKind.INIT), cp.cwk[g])
    lo, cnt = cp.chptr[g], cp.chptr[g + 1] - cp.chptr[g]
    offs = np.concatenate(([0], np.cumsum(cnt)))
    # the handles of every record, concatenated: record k's are ch[lo[k]:lo[k]+cnt[k]]
    allh = cp.ch[np.repeat(lo - offs[:-1], cnt) + np.arange(int(offs[-1]))]
    toks = handle_tokens(cp, allh)
    o = offs.tolist()
    comms = [toks[o[k]:o[k + 1]] for k in range(len(g))]
    return list(map(WaitRecord, rank.tolist(), cp.cipc[g].tolist(),
                    [kinds[k] for k in kind.tolist()], t0.tolist(), t1.tolist(), comms))


def build_timeline(cp: Compiled, st: RunState, comm: CommModel, unit: str) -> Timeline:
    """Turn raw run results into a :class:`Timeline`: the span columns of the ops that
    ran, for the summary, and a deferred builder of the span, message and wait objects,
    given to :func:`schedsim.timeline_build.assemble_timeline`."""
    prog = cp.program
    ran = st.send >= 0.0
    rank = cp.flat.rank_of_instr()[cp.span_gi[ran]]     # spans are in rank order
    head = TimelineHeader(prog.placement, prog.name, prog.microbatches, comm.semantics, unit,
                          "simulated", comm.comm_stream, prog.params)
    tl = assemble_timeline(head, rank, st.sstart[ran], st.send[ran],
                           build=partial(_objects, cp, st),
                           span_kinds=partial(_span_kinds, cp, st))
    if cp.atomic:
        tl.group_semantics = "atomic"
    return tl


def _span_kinds(cp: Compiled, st: RunState) -> set[tuple[str, tuple[str, ...]]]:
    """:meth:`Timeline.span_kinds` from the arrays."""
    fl = cp.flat
    gi = cp.span_gi[st.send >= 0.0]
    kinds = np.unique(fl.kind[gi]).tolist()
    out = {(COMPUTE_KINDS[k], ()) for k in kinds if k != 4}
    if 4 in kinds:
        ran_fb = np.isin(fl.fb_at, gi)
        out |= {("FB", ("F", COMPUTE_KINDS[b])) for b in np.unique(fl.fb_kind[ran_fb]).tolist()}
    return out


def _objects(cp: Compiled, st: RunState) -> dict[str, list]:
    """The span, message and wait objects of a run (built when first needed)."""
    from schedsim.util.gc import no_gc

    with no_gc():
        return {"spans": _spans(cp, st), "messages": _messages(cp, st),
                "waits": _waits(cp, st)}

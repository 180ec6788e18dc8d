"""What every comm policy builds on: which cross-rank messages each op receives and sends,
the *link order* in which a rank posts its recvs, and the checks a compute order must
pass before a policy can index it.

P2P ops match in posting order per directed link. Every op is split into its *atoms*
(an ``FB`` op has two: its forward and its backward part). An atom whose input comes from
a stage on another rank needs a RECV; an atom whose output goes to a stage on another
rank posts a SEND (:func:`op_recvs`, :func:`op_sends` for one op; :func:`atom_comms` for a
whole schedule over its arrays). Recvs are posted in link order: for an op that needs
message x from rank q, rank r posts every not yet posted recv of link q -> r up to x, in
the order q sends them (:func:`link_order`). Message routing comes from
:mod:`schedsim.program.routing`. The policies are :mod:`schedsim.program.async_policy`,
:mod:`schedsim.program.commit_policy`, :mod:`schedsim.program.torch_runtime` and
:mod:`schedsim.program.megatron`; :mod:`schedsim.program.lower` registers them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from schedsim.program.flat import (
    FlatProgram,
    FlatSchedule,
    OpKind,
    index_dtype,
    placement_rank_table,
    ranks_of,
)
from schedsim.program.ir import Comm, Op, Program, Schedule
from schedsim.program.lower_kernel import (
    AtomOut,
    LinkIn,
    LinkScratch,
    OpsIn,
    Posts,
    atom_comms_kernel,
    atom_counts,
    link_counts,
    link_order_kernel,
)
from schedsim.program.ops import COMM_KINDS, recv_comm, send_comm
from schedsim.program.routing import (
    consumer_stage,
    consumer_stages,
    cross_stage_inputs,
    key_codes,
    needs,
    outputs,
    produces,
    skip_code,
)
from schedsim.util.jit import executor, use_numba

if TYPE_CHECKING:
    from schedsim.program.ir import Placement

I64 = np.int64
I32 = np.int32


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
    """Whether the schedule trains (has any backward op: any op not a forward ``F``; an
    ``FB`` has one) or is forward-only."""
    return bool(np.any(schedule.flat().kind != OpKind.F))


def link_ordered_recvs(schedule: Schedule) -> list[list[list[Comm]]]:
    """``out[r][k]``: the RECVs rank r posts for op k, in *link order*.

    P2P ops match in posting order per directed link, and a policy that posts each send
    right after its producer fixes the send order of every link. When rank r consumes
    messages from one peer in a different order than that peer sent them, it must post
    the earlier messages' recvs first: so for op k this lists, for each input it needs
    from another rank, every not yet posted recv on that link up to and including it,
    in the sender's order (a recv whose message no rank sends is kept as it is). Equal to
    :func:`op_recvs` when consumers follow the send order (1F1B, GPipe, DualPipe).
    Computed by :func:`link_order`.
    """
    check_ranges(schedule)
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


def check_ranges(schedule: Schedule) -> None:
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


@dataclass
class AtomComms:
    """The cross-rank recvs and sends of every op of a schedule, in schedule order
    (ranks, then ops, then atoms). ``*_op``: the op's global index; recv/send comm as
    the issuing rank writes it (kind code, stage, mb); ``*_code``: message key code;
    ``*_src``/``*_dst``: the two ranks. ``op_rank``/``op_pos``: each op's rank and
    position in its rank's row."""

    op_rank: np.ndarray
    op_pos: np.ndarray
    need_op: np.ndarray
    need_kind: np.ndarray
    need_stage: np.ndarray
    need_mb: np.ndarray
    need_code: np.ndarray
    need_src: np.ndarray
    send_op: np.ndarray
    send_kind: np.ndarray
    send_stage: np.ndarray
    send_mb: np.ndarray
    send_code: np.ndarray
    send_dst: np.ndarray
    #: the other stage of a skip edge (``Placement.skips``), -1 on the chain
    need_peer: np.ndarray | None = None
    send_peer: np.ndarray | None = None


def _atoms(fs: FlatSchedule, ix: type) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray]:
    """``fs.atoms()`` as ``ix`` arrays; without ``FB`` ops the atoms are the ops and the
    schedule's own int32 columns serve (no copy)."""
    if len(fs.fb_at) or ix is I64:
        return tuple(a.astype(ix, copy=False) for a in fs.atoms())
    return np.arange(len(fs), dtype=ix), fs.kind, fs.stage, fs.mb


def atom_comms(fs: FlatSchedule, pl: Placement, microbatches: int) -> AtomComms:
    """:class:`AtomComms` of schedule ``fs`` under placement ``pl`` (stages and
    microbatches in range). Indices, ranks, stages and microbatches are int32 below
    2**29 atoms (:func:`~schedsim.program.flat.index_dtype` of 4 x the entries: the
    values derived from them stay below that), message key codes int64."""
    S, M = pl.stages, microbatches
    n = len(fs)
    ix = index_dtype(4 * (2 * n + 2))    # derived values reach 4 x the entries
    if use_numba(2 * n) and not getattr(pl, "skips", ()):
        return _atom_comms_numba(fs, pl, M, ix)
    cnt = np.diff(fs.rptr)
    op_rank = np.repeat(np.arange(fs.ranks, dtype=ix), cnt)
    op_pos = np.arange(n, dtype=ix)
    op_pos -= np.repeat(fs.rptr[:-1].astype(ix), cnt)
    a_op, a_kind, a_stage, a_mb = _atoms(fs, ix)
    a_rank = op_rank[a_op] if len(a_op) != n else op_rank
    # recvs: the cross-stage input, when its producer is on another rank
    mk, ps = cross_stage_inputs(a_kind, a_stage, S)
    mk = mk.astype(ix, copy=False)
    has = ps >= 0
    src = np.full(len(a_op), -1, ix)
    src[has] = ranks_of(pl, ps[has], a_mb[has])
    need = has & (src != a_rank)
    del has
    # sends: the output, when its consumer is on another rank
    ok, os_ = outputs(a_kind, a_stage)
    ok = ok.astype(ix, copy=False)
    cs = consumer_stages(ok, os_)
    out = (os_ >= 0) & (cs >= 0) & (cs < S)
    dst = np.full(len(a_op), -1, ix)
    dst[out] = ranks_of(pl, cs[out], a_mb[out])
    del cs
    send = out & (dst != a_rank)
    del out
    ac = AtomComms(
        op_rank=op_rank, op_pos=op_pos,
        need_op=a_op[need], need_kind=(2 * mk + 1)[need], need_stage=a_stage[need],
        need_mb=a_mb[need], need_code=key_codes(mk[need], ps[need], a_mb[need], S, M),
        need_src=src[need],
        send_op=a_op[send], send_kind=(2 * ok)[send], send_stage=a_stage[send],
        send_mb=a_mb[send], send_code=key_codes(ok[send], os_[send], a_mb[send], S, M),
        send_dst=dst[send])
    if getattr(pl, "skips", ()):
        _add_skips(ac, pl, M, a_op, a_kind, a_stage, a_mb, a_rank)
    return ac


def _atom_comms_numba(fs: FlatSchedule, pl: Placement, M: int, ix: type) -> AtomComms:
    """:func:`atom_comms` of a schedule without skip edges by the numba kernels
    (:func:`~schedsim.program.lower_kernel.atom_counts`, :func:`~schedsim.program.
    lower_kernel.atom_comms_kernel`): the same arrays and types, written once each
    instead of through about 40 temporaries of the atoms' size."""
    counts, xs = executor(atom_counts, 2 * len(fs))
    table, half, last = placement_rank_table(pl)
    a = OpsIn(stages=pl.stages, microbatches=M, half=half, last=last, table=xs.ints(table),
              rptr=xs.ints(fs.rptr), kind=xs.ints(fs.kind), stage=xs.ints(fs.stage),
              mb=xs.ints(fs.mb), fb_at=xs.ints(fs.fb_at), fb_kind=xs.ints(fs.fb_kind),
              fb_stage=xs.ints(fs.fb_stage), fb_mb=xs.ints(fs.fb_mb))
    n = len(fs)
    # the numpy form's types: the schedule's own columns serve as the atoms' stage and mb
    # while every op is one atom and the index type is int32, else they are ``ix``
    own = not len(fs.fb_at) and ix is not I64
    sdt, mdt = (fs.stage.dtype, fs.mb.dtype) if own else (ix, ix)
    sizes = AtomOut(op_rank=xs.empty(n, ix), op_pos=xs.empty(n, ix), counts=xs.full(2, 0),
                    **{f: xs.empty(0, ix) for f in AtomOut._fields[3:]})
    counts(a, sizes)
    nn, ns = (int(x) for x in sizes.counts)
    out = sizes._replace(
        need_op=xs.empty(nn, ix), need_kind=xs.empty(nn, ix), need_stage=xs.empty(nn, sdt),
        need_mb=xs.empty(nn, mdt), need_code=xs.empty(nn, I64), need_src=xs.empty(nn, ix),
        send_op=xs.empty(ns, ix), send_kind=xs.empty(ns, ix), send_stage=xs.empty(ns, sdt),
        send_mb=xs.empty(ns, mdt), send_code=xs.empty(ns, I64), send_dst=xs.empty(ns, ix))
    executor(atom_comms_kernel, 2 * n)[0](a, out)
    return AtomComms(**{f: np.asarray(getattr(out, f)) for f in AtomOut._fields
                        if f != "counts"})


def _add_skips(ac: AtomComms, pl: Placement, M: int, a_op, a_kind, a_stage, a_mb,
               a_rank) -> None:
    """The cross-rank comms of the stage graph's skip edges (``Placement.skips``,
    :mod:`schedsim.program.routing`), merged into ``ac`` in op order: for edge (p, c) a
    forward of p sends ``("F", p, mb, c)`` to c's rank, a forward of c receives it; a
    backward of c sends ``("B", c, mb, p)`` to p's rank, a backward of p receives it."""
    S = pl.stages
    is_f = a_kind == 0
    is_b = (a_kind == 1) | (a_kind == 3)
    need = {k: [getattr(ac, "need_" + k)] for k in ("op", "kind", "stage", "mb", "code",
                                                    "src")}
    send = {k: [getattr(ac, "send_" + k)] for k in ("op", "kind", "stage", "mb", "code",
                                                    "dst")}
    need["peer"] = [np.full(len(ac.need_op), -1, I64)]
    send["peer"] = [np.full(len(ac.send_op), -1, I64)]
    for e, (p, c) in enumerate(pl.skips):
        for mkind, here, there, at_send in ((0, p, c, is_f & (a_stage == p)),
                                            (1, c, p, is_b & (a_stage == c))):
            t = np.flatnonzero(at_send)
            dst = ranks_of(pl, np.full(len(t), there, I64), a_mb[t]).astype(I64)
            t, dst = t[dst != a_rank[t]], dst[dst != a_rank[t]]
            code = skip_code(e, mkind, a_mb[t], S, M)
            for k, v in (("op", a_op[t]), ("kind", np.full(len(t), 2 * mkind)),
                         ("stage", np.full(len(t), here)), ("mb", a_mb[t]),
                         ("code", code), ("dst", dst), ("peer", np.full(len(t), there))):
                send[k].append(v)
            at_need = (is_f & (a_stage == c)) if mkind == 0 else (is_b & (a_stage == p))
            t = np.flatnonzero(at_need)
            src = ranks_of(pl, np.full(len(t), here, I64), a_mb[t]).astype(I64)
            t, src = t[src != a_rank[t]], src[src != a_rank[t]]
            for k, v in (("op", a_op[t]), ("kind", np.full(len(t), 2 * mkind + 1)),
                         ("stage", np.full(len(t), there)), ("mb", a_mb[t]),
                         ("code", skip_code(e, mkind, a_mb[t], S, M)), ("src", src),
                         ("peer", np.full(len(t), here))):
                need[k].append(v)
    for side, cols in (("need", need), ("send", send)):
        cat = {k: np.concatenate(v).astype(I64) for k, v in cols.items()}
        o = np.argsort(cat["op"], kind="stable")
        for k, v in cat.items():
            setattr(ac, f"{side}_{k}", v[o])


@dataclass
class RecvPosts:
    """Recvs in link order: post ``j`` (in order) is for op ``op[j]`` (the op before
    which it must be posted), comm (``kind``, ``stage``, ``mb``)."""

    op: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    peer: np.ndarray | None = None       # skip edges: the sending stage, -1 on the chain


def link_order(ac: AtomComms, ranks: int) -> RecvPosts:
    """The recvs each op needs posted before it, in link order (module docstring): for
    need x of rank r on link q -> r, every recv of that link up to x in q's send order
    that r has not posted yet; a recv whose message no rank sends is posted as it is
    (:func:`schedsim.program.lower_kernel.link_order_kernel`)."""
    ln, sc, xs = link_counted(ac, ranks)
    total = int(sc.total[0])
    dt = ac.need_kind.dtype
    op = xs.empty(total, ac.need_op.dtype)
    out = Posts(kind=xs.empty(total, dt), stage=xs.empty(total, ac.need_stage.dtype),
                mb=xs.empty(total, ac.need_mb.dtype),
                peer=xs.empty(total if ln.peered else 0, I64))
    executor(link_order_kernel, _work(ac))[0](ln, sc, op, out)
    return RecvPosts(op=np.asarray(op, ac.need_op.dtype), kind=np.asarray(out.kind, dt),
                     stage=np.asarray(out.stage, ac.need_stage.dtype),
                     mb=np.asarray(out.mb, ac.need_mb.dtype),
                     peer=np.asarray(out.peer, ac.need_peer.dtype) if ln.peered else None)


def _work(ac: AtomComms) -> int:
    """The size of a lowering, for the choice of executor: ops, needs and sends."""
    return len(ac.op_rank) + len(ac.need_op) + len(ac.send_op)


def link_counted(ac: AtomComms, ranks: int) -> tuple[LinkIn, LinkScratch, Any]:
    """The link order's input and state after :func:`~schedsim.program.lower_kernel.
    link_counts` (the sends grouped by link; ``na``: the recvs posted for each op,
    ``total[0]`` in all), and the executor's allocator (:mod:`schedsim.util.jit`)."""
    sid, found = _send_of_need(ac)
    counts, xs = executor(link_counts, _work(ac))
    none = np.zeros(0, I64)
    peered = ac.need_peer is not None
    ln = LinkIn(
        ranks=ranks, peered=peered, op_rank=xs.ints(ac.op_rank), need_op=xs.ints(ac.need_op),
        need_src=xs.ints(ac.need_src), need_kind=xs.ints(ac.need_kind),
        need_stage=xs.ints(ac.need_stage), need_mb=xs.ints(ac.need_mb),
        need_peer=xs.ints(ac.need_peer if peered else none), sid=xs.ints(sid),
        found=xs.ints(found.view(np.int8)), send_op=xs.ints(ac.send_op),
        send_dst=xs.ints(ac.send_dst), send_kind=xs.ints(ac.send_kind),
        send_stage=xs.ints(ac.send_stage), send_mb=xs.ints(ac.send_mb),
        send_peer=xs.ints(ac.send_peer if peered else none))
    del sid, found
    ns, ix = len(ac.send_op), ac.need_op.dtype
    sc = LinkScratch(lstart=xs.empty(ranks * ranks + 1, I64), lorder=xs.empty(ns, ix),
                     s_pos=xs.empty(ns, ix), slink=xs.empty(ns, I64),
                     posted=xs.empty(ranks * ranks, I64),
                     na=xs.empty(len(ac.op_rank), I64), total=xs.full(1, 0))
    counts(ln, sc)
    return ln, sc, xs


def _send_of_need(ac: AtomComms) -> tuple[np.ndarray, np.ndarray]:
    """``(send index, found)`` of every need's message (a need whose message no rank
    sends: index 0, not found): its key looked up among the sends' keys (a dense table
    when the key space is small, else a sorted search)."""
    space = int(max(ac.send_code.max(initial=-1), ac.need_code.max(initial=-1))) + 1
    if space <= 4 * (len(ac.send_code) + len(ac.need_code)) + 1024:
        table = np.full(space, -1, I64)
        table[ac.send_code] = np.arange(len(ac.send_code))
        sid = table[ac.need_code]
        del table
        found = sid >= 0
        return np.maximum(sid, 0, out=sid), found
    code_order = np.argsort(ac.send_code, kind="stable")
    sc = ac.send_code[code_order]
    at = np.searchsorted(sc, ac.need_code)
    atc = np.minimum(at, max(len(sc) - 1, 0))
    found = (at < len(sc)) & (sc[atc] == ac.need_code) if len(sc) else \
        np.zeros(len(ac.need_code), bool)
    sid = code_order[atc] if len(sc) else np.zeros(len(ac.need_code), I64)
    return sid, found


def members(n_instr: int, counts: np.ndarray, src_start: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """``(mptr, index)``: instruction i's members are rows ``src_start[i] ..
    src_start[i] + counts[i] - 1`` of a member table, concatenated in instruction
    order."""
    mptr = np.zeros(n_instr + 1, I64)
    np.cumsum(counts, out=mptr[1:])
    idx = np.repeat(src_start - mptr[:-1], counts) + np.arange(int(mptr[-1]), dtype=I64)
    return mptr, idx


def fb_sides(fs: FlatSchedule, op_instr: np.ndarray) -> tuple[np.ndarray, ...]:
    return (op_instr[fs.fb_at].astype(I64), fs.fb_kind, fs.fb_stage, fs.fb_mb)


def lowered(schedule: Schedule, flat: FlatProgram) -> Program:
    """The :class:`Program` whose arrays are ``flat``, named and placed as ``schedule``:
    what every policy returns. Validated when the schedule is (every policy runs the
    schedule's compute order, an ``FB`` at most split into its two parts in turn)."""
    return Program.from_flat(flat, name=schedule.name, placement=schedule.placement,
                             microbatches=schedule.microbatches, params=schedule.params,
                             validated=schedule.validated)

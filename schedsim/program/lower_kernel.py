"""The sequential parts of the lowering (:mod:`schedsim.program.comm_plan`,
:mod:`schedsim.program.async_policy`), written in the subset of Python that both CPython
and numba run (:mod:`schedsim.util.jit`; numba for large schedules): the *link order* of
the recvs (:func:`link_counts`, :func:`link_order_kernel`) and the ``async`` policy's
instructions (:func:`async_kernel`). One pass each, writing only its outputs: the array
form these replaced allocated and freed about 25 arrays of 2.5-10 M entries at 10 M
instructions (``benchmarks/NOTES.md``, "The 10 M path", second round).

The link order (:func:`schedsim.program.comm_plan.link_order` states the rule): sends are
grouped by directed link in send order (a counting sort: ``lstart``/``lorder``, each
send's position on its link ``s_pos``); needs are taken in order, and need ``j`` of rank
r on link q -> r posts every recv of that link from the first not yet posted
(``posted[link]``) up to its own message's position, or, when no send on that link
carries its message, its own recv alone.

Each op's cross-rank recv and send (:func:`atom_counts`, :func:`atom_comms_kernel`: the
routing rules of :func:`schedsim.program.comm_plan.atom_comms` in one pass over the atoms,
under numba only: the CPython executor keeps that function's numpy form, which the
tests compare with it).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from schedsim.program.flat import Opcode, OpKind

Arr = Any      # a numpy array (numba) or a list (CPython), allocated by the caller

_POST = int(Opcode.POST)
_WAIT = int(Opcode.WAIT)
_COMPUTE = int(Opcode.COMPUTE)
_FB = int(OpKind.FB)


class LinkIn(NamedTuple):
    """The needs and sends of a schedule (:class:`~schedsim.program.comm_plan.
    AtomComms`, in op order) for the link order: ``sid``/``found``: the send carrying
    each need's message (by key, any link), ``found`` 0 where none does; ``peered``:
    the schedule has skip edges (else ``*_peer`` are empty)."""

    ranks: int
    peered: bool
    op_rank: Arr
    need_op: Arr
    need_src: Arr
    need_kind: Arr
    need_stage: Arr
    need_mb: Arr
    need_peer: Arr
    sid: Arr
    found: Arr
    send_op: Arr
    send_dst: Arr
    send_kind: Arr
    send_stage: Arr
    send_mb: Arr
    send_peer: Arr


class LinkScratch(NamedTuple):
    """The link order's state: sends by link (``lstart``: ranks**2 + 1; ``lorder``,
    ``s_pos`` and ``slink``, each send's link: per send), ``posted`` per link, and the
    counts :func:`link_counts` writes: ``na[o]``, the recvs posted for op ``o``, and
    ``total[0]``, all of them."""

    lstart: Arr
    lorder: Arr
    s_pos: Arr
    slink: Arr
    posted: Arr
    na: Arr
    total: Arr


class OpsIn(NamedTuple):
    """A schedule's ops for :func:`atom_comms_kernel` (:class:`~schedsim.program.flat.
    FlatSchedule`'s arrays: ``rptr``, per op ``kind``/``stage``/``mb``, the FB side arrays)
    and its placement: ``stages``, ``microbatches``, and the rank of a stage
    (:func:`~schedsim.program.flat.placement_rank_table`: ``table[s]``, or ``last - s``
    for microbatches ``>= half`` when ``half >= 0``)."""

    stages: int
    microbatches: int
    half: int
    last: int
    table: Arr
    rptr: Arr
    kind: Arr
    stage: Arr
    mb: Arr
    fb_at: Arr
    fb_kind: Arr
    fb_stage: Arr
    fb_mb: Arr


class AtomOut(NamedTuple):
    """What :func:`atom_comms_kernel` writes (the fields of :class:`~schedsim.program.
    comm_plan.AtomComms` without skip edges, in op order): per op ``op_rank``/``op_pos``,
    per need ``need_*``, per send ``send_*``; ``counts``: needs and sends
    (:func:`atom_counts` fills it and ``op_rank``/``op_pos`` first)."""

    op_rank: Arr
    op_pos: Arr
    counts: Arr
    need_op: Arr
    need_kind: Arr
    need_stage: Arr
    need_mb: Arr
    need_code: Arr
    need_src: Arr
    send_op: Arr
    send_kind: Arr
    send_stage: Arr
    send_mb: Arr
    send_code: Arr
    send_dst: Arr


class Posts(NamedTuple):
    """Recv posts as comms (:class:`~schedsim.program.comm_plan.RecvPosts`), or a
    program's members: kind code, stage, mb, and the skip edge's other stage (empty
    without skip edges)."""

    kind: Arr
    stage: Arr
    mb: Arr
    peer: Arr


class OpRows(NamedTuple):
    """A schedule's ops (:class:`~schedsim.program.flat.FlatSchedule`): rank ``r``'s
    are ``rptr[r]`` to ``rptr[r + 1] - 1``; each op's kind, stage and mb."""

    rptr: Arr
    kind: Arr
    stage: Arr
    mb: Arr


class AsyncOut(NamedTuple):
    """What :func:`async_kernel` writes: a :class:`~schedsim.program.flat.FlatProgram`'s
    per-rank ``rptr``, per-instruction ``code``/``kind``/``stage``/``mb``, ``mptr`` and
    members ``mem``, and ``op_instr``, each op's compute instruction."""

    rptr: Arr
    code: Arr
    kind: Arr
    stage: Arr
    mb: Arr
    mptr: Arr
    mem: Posts
    op_instr: Arr


def _atom_stages(S, k, s):
    """``(producing stage of the input, consuming stage of the output)`` of an atom of
    kind ``k`` on stage ``s`` of ``S``, -1 where there is none: the routing rules of
    :func:`~schedsim.program.routing.cross_stage_inputs`, :func:`~schedsim.program.
    routing.outputs` and :func:`~schedsim.program.routing.consumer_stages`. Scalars only:
    an array passed to a helper costs reference-count traffic per call under numba, so
    the kernels look the ranks up themselves (``table[s] if m < hm else last - s``: the
    rank of stage s for microbatch m, :func:`~schedsim.program.flat.ranks_of`)."""
    ps = -1
    if k == 0 and s > 0:
        ps = s - 1
    elif (k == 1 or k == 3) and s < S - 1:
        ps = s + 1
    cs = -1
    if k != 2:
        cs = s + 1 if k == 0 else s - 1
        if cs >= S:
            cs = -1
    return ps, cs


def atom_counts(a, out):
    """Each op's rank and position in its row (``out.op_rank``, ``out.op_pos``) and the
    number of cross-rank needs and sends of the schedule's atoms (``out.counts``), for
    :func:`atom_comms_kernel`'s allocation (``a``: :class:`OpsIn`; an op has one atom,
    an ``FB`` op two: ``F`` of its stage and mb, then its ``fb_*`` part)."""
    S, half, last, table = a.stages, a.half, a.last, a.table
    rptr, kind, stage, mb = a.rptr, a.kind, a.stage, a.mb
    fb_at, fb_kind, fb_stage, fb_mb = a.fb_at, a.fb_kind, a.fb_stage, a.fb_mb
    op_rank, op_pos, counts = out.op_rank, out.op_pos, out.counts
    hm = half if half >= 0 else a.microbatches     # microbatches from hm on: ``last - s``
    nn = ns = f = 0
    nfb = len(fb_at)
    for r in range(len(rptr) - 1):
        for o in range(rptr[r], rptr[r + 1]):
            op_rank[o] = r
            op_pos[o] = o - rptr[r]
            k, s, m = kind[o], stage[o], mb[o]
            if k == _FB and nfb > 0:
                k = 0
            fb = f < nfb and fb_at[f] == o
            while True:             # the op's atom, then an FB op's backward part
                ps, cs = _atom_stages(S, k, s)
                if ps >= 0 and (table[ps] if m < hm else last - ps) != r:
                    nn += 1
                if cs >= 0 and (table[cs] if m < hm else last - cs) != r:
                    ns += 1
                if not fb:
                    break
                k, s, m = fb_kind[f], fb_stage[f], fb_mb[f]
                f += 1
                fb = False
    counts[0] = nn
    counts[1] = ns


def atom_comms_kernel(a, out):
    """The cross-rank needs and sends of every atom, in op order (after
    :func:`atom_counts`): a need is the recv of its input (kind code ``2 * message kind
    + 1``, the atom's stage and mb, the message's key code, the producer's rank), a send
    that of its output (``2 * message kind``, key code, the consumer's rank); key codes
    as :func:`~schedsim.program.routing.key_codes`."""
    S, M, kind, stage, mb = a.stages, a.microbatches, a.kind, a.stage, a.mb
    half, last, table = a.half, a.last, a.table
    fb_at, fb_kind, fb_stage, fb_mb = a.fb_at, a.fb_kind, a.fb_stage, a.fb_mb
    op_rank = out.op_rank
    need_op, need_kind, need_stage, need_mb = (out.need_op, out.need_kind, out.need_stage,
                                               out.need_mb)
    need_code, need_src = out.need_code, out.need_src
    send_op, send_kind, send_stage, send_mb = (out.send_op, out.send_kind, out.send_stage,
                                               out.send_mb)
    send_code, send_dst = out.send_code, out.send_dst
    hm = half if half >= 0 else M
    jn = js = f = 0
    nfb = len(fb_at)
    for o in range(len(kind)):
        r = op_rank[o]
        k, s, m = kind[o], stage[o], mb[o]
        if k == _FB and nfb > 0:
            k = 0
        fb = f < nfb and fb_at[f] == o
        while True:                 # the op's atom, then an FB op's backward part
            ps, cs = _atom_stages(S, k, s)
            mk = 0 if k == 0 else 1
            if ps >= 0:
                src = table[ps] if m < hm else last - ps
                if src != r:
                    need_op[jn] = o
                    need_kind[jn] = 2 * mk + 1
                    need_stage[jn] = s
                    need_mb[jn] = m
                    need_code[jn] = (mk * S + ps) * M + m
                    need_src[jn] = src
                    jn += 1
            if cs >= 0:
                dst = table[cs] if m < hm else last - cs
                if dst != r:
                    send_op[js] = o
                    send_kind[js] = 2 * mk
                    send_stage[js] = s
                    send_mb[js] = m
                    send_code[js] = (mk * S + s) * M + m
                    send_dst[js] = dst
                    js += 1
            if not fb:
                break
            k, s, m = fb_kind[f], fb_stage[f], fb_mb[f]
            f += 1
            fb = False


def _span(posted, s_pos, slink, lk, s, found):
    """``(first position, positions)`` a need on link ``lk`` whose message is send ``s``
    (``found`` 0: no send carries it) posts on its link (positions -1: its own recv
    alone), ``posted`` advanced past them."""
    if found == 0 or slink[s] != lk:
        return 0, -1
    first = posted[lk]
    end = s_pos[s] + 1
    if end <= first:
        return first, 0
    posted[lk] = end
    return first, end - first


def link_counts(ln, sc):
    """Group the sends by link (``lstart``, ``lorder``, ``s_pos``, ``slink``) and count
    the recvs posted for each op (``na``, ``total[0]``); ``posted`` is left zeroed for a
    following :func:`link_order_kernel` or :func:`async_kernel`. The records' fields are
    read into locals once, at the top (as in every kernel here: a field read in a loop
    costs reference-count traffic under numba)."""
    P, op_rank, need_op, need_src = ln.ranks, ln.op_rank, ln.need_op, ln.need_src
    sid, found, send_op, send_dst = ln.sid, ln.found, ln.send_op, ln.send_dst
    lstart, lorder, s_pos, slink = sc.lstart, sc.lorder, sc.s_pos, sc.slink
    posted, na = sc.posted, sc.na
    L = P * P
    ns = len(send_op)
    for k in range(L + 1):
        lstart[k] = 0
    for s in range(ns):
        lk = op_rank[send_op[s]] * P + send_dst[s]
        slink[s] = lk
        lstart[lk + 1] += 1
    for k in range(L):
        lstart[k + 1] += lstart[k]
        posted[k] = lstart[k]          # the next free slot of link k, for now
    for s in range(ns):
        lk = slink[s]
        p = posted[lk]
        lorder[p] = s
        s_pos[s] = p - lstart[lk]
        posted[lk] = p + 1
    for k in range(L):
        posted[k] = 0
    for o in range(len(na)):
        na[o] = 0
    total = 0
    for j in range(len(need_op)):
        c = -1
        if ns > 0:
            c = _span(posted, s_pos, slink, need_src[j] * P + op_rank[need_op[j]], sid[j],
                      found[j])[1]
        c = 1 if c < 0 else c
        na[need_op[j]] += c
        total += c
    for k in range(L):
        posted[k] = 0
    sc.total[0] = total


def _recv_of_send(s, send_kind, send_stage, send_peer, peered):
    """``(kind, stage, peer)`` of the recv matching send ``s``."""
    k = send_kind[s]
    stage = send_stage[s] + 1 if (k >> 1) == 0 else send_stage[s] - 1
    peer = -1
    if peered:
        sp = send_peer[s]
        if sp >= 0:                                           # a skip edge's recv
            peer = send_stage[s]
            stage = sp
    return k + 1, stage, peer


def link_order_kernel(ln, sc, op, out):
    """Every need's recv posts in order (after :func:`link_counts`): ``out`` their comms,
    ``op`` the op each is posted for."""
    P, op_rank, need_op, need_src = ln.ranks, ln.op_rank, ln.need_op, ln.need_src
    need_kind, need_stage, need_mb, need_peer = (ln.need_kind, ln.need_stage, ln.need_mb,
                                                 ln.need_peer)
    sid, found, send_kind, send_stage = ln.sid, ln.found, ln.send_kind, ln.send_stage
    send_mb, send_peer, peered = ln.send_mb, ln.send_peer, ln.peered
    lstart, lorder, s_pos, slink, posted = sc.lstart, sc.lorder, sc.s_pos, sc.slink, sc.posted
    o_kind, o_stage, o_mb, o_peer = out.kind, out.stage, out.mb, out.peer
    ns = len(ln.send_op)
    at = 0
    for j in range(len(need_op)):
        lk = need_src[j] * P + op_rank[need_op[j]]
        first, count = 0, -1
        if ns > 0:
            first, count = _span(posted, s_pos, slink, lk, sid[j], found[j])
        if count < 0:                      # no send carries it: its own recv
            o_kind[at], o_stage[at], o_mb[at] = need_kind[j], need_stage[j], need_mb[j]
            if peered:
                o_peer[at] = need_peer[j]
            op[at] = need_op[j]
            at += 1
        for p in range(first, first + count):
            s = lorder[lstart[lk] + p]
            o_kind[at], o_stage[at], pr = _recv_of_send(s, send_kind, send_stage,
                                                        send_peer, peered)
            o_mb[at] = send_mb[s]
            if peered:
                o_peer[at] = pr
            op[at] = need_op[j]
            at += 1


def async_kernel(ln, sc, ops, out):
    """The ``async`` policy's program (:func:`schedsim.program.async_policy.
    async_program`; after :func:`link_counts`): per rank, the first op's recv posts, then
    for each op k the next op's recv posts (link order), a ``WAIT`` on op k's needs,
    op k (``ops``: :class:`OpRows`), op k's sends. Recv posts are made as
    :func:`link_order_kernel` makes them."""
    P, op_rank, need_op, need_src = ln.ranks, ln.op_rank, ln.need_op, ln.need_src
    need_kind, need_stage, need_mb, need_peer = (ln.need_kind, ln.need_stage, ln.need_mb,
                                                 ln.need_peer)
    sid, found, send_op, send_kind = ln.sid, ln.found, ln.send_op, ln.send_kind
    send_stage, send_mb, send_peer, peered = (ln.send_stage, ln.send_mb, ln.send_peer,
                                              ln.peered)
    lstart, lorder, s_pos, slink, posted = sc.lstart, sc.lorder, sc.s_pos, sc.slink, sc.posted
    rptr, okind, ostage, omb = ops.rptr, ops.kind, ops.stage, ops.mb
    code, kind, stage, mb, mptr = out.code, out.kind, out.stage, out.mb, out.mptr
    m_kind, m_stage, m_mb, m_peer = out.mem.kind, out.mem.stage, out.mem.mb, out.mem.peer
    op_instr = out.op_instr
    i = m = jn = jw = js = 0
    nn, ns = len(need_op), len(send_op)
    R = len(rptr) - 1
    for r in range(R):
        o0, o1 = rptr[r], rptr[r + 1]
        out.rptr[r] = i
        for o in range(o0 - 1, o1):
            # the recv posts of op o + 1 (the rank's first op's before its first op)
            while o + 1 < o1 and jn < nn and need_op[jn] == o + 1:
                lk = need_src[jn] * P + op_rank[need_op[jn]]
                first, count = 0, -1
                if ns > 0:
                    first, count = _span(posted, s_pos, slink, lk, sid[jn], found[jn])
                if count < 0:
                    code[i], kind[i], stage[i], mb[i], mptr[i] = _POST, -1, -1, -1, m
                    m_kind[m], m_stage[m], m_mb[m] = need_kind[jn], need_stage[jn], need_mb[jn]
                    if peered:
                        m_peer[m] = need_peer[jn]
                    i += 1
                    m += 1
                for p in range(first, first + count):
                    s = lorder[lstart[lk] + p]
                    code[i], kind[i], stage[i], mb[i], mptr[i] = _POST, -1, -1, -1, m
                    m_kind[m], m_stage[m], pr = _recv_of_send(s, send_kind, send_stage,
                                                              send_peer, peered)
                    m_mb[m] = send_mb[s]
                    if peered:
                        m_peer[m] = pr
                    i += 1
                    m += 1
                jn += 1
            if o < o0:
                continue
            if jw < nn and need_op[jw] == o:
                code[i], kind[i], stage[i], mb[i], mptr[i] = _WAIT, -1, -1, -1, m
                while jw < nn and need_op[jw] == o:
                    m_kind[m], m_stage[m], m_mb[m] = need_kind[jw], need_stage[jw], need_mb[jw]
                    if peered:
                        m_peer[m] = need_peer[jw]
                    m += 1
                    jw += 1
                i += 1
            code[i], kind[i], stage[i], mb[i], mptr[i] = _COMPUTE, okind[o], ostage[o], omb[o], m
            op_instr[o] = i
            i += 1
            while js < ns and send_op[js] == o:
                code[i], kind[i], stage[i], mb[i], mptr[i] = _POST, -1, -1, -1, m
                m_kind[m], m_stage[m], m_mb[m] = send_kind[js], send_stage[js], send_mb[js]
                if peered:
                    m_peer[m] = send_peer[js]
                m += 1
                js += 1
                i += 1
    out.rptr[R] = i
    mptr[i] = m

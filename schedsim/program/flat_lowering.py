"""The ``async`` and ``commit`` comm policies over the flat form: array operations that
emit a :class:`~schedsim.program.flat.FlatProgram` straight from a
:class:`~schedsim.program.flat.FlatSchedule` (the rules are stated in
:mod:`schedsim.program.lowering`; message routing comes from
:mod:`schedsim.program.routing`'s array functions).

Every op is split into its *atoms* (an ``FB`` op has two: its forward and its backward
part). An atom whose input comes from a stage on another rank needs a RECV; an atom whose
output goes to a stage on another rank posts a SEND. Recvs are posted in *link order*:
for an op that needs message x from rank q, rank r posts every not yet posted recv of
link q -> r up to x, in the order q sends them (:func:`link_order`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from schedsim.program.flat import CommKind, FlatProgram, FlatSchedule, Opcode, ranks_of
from schedsim.program.routing import (
    consumer_stages,
    cross_stage_inputs,
    key_codes,
    outputs,
    skip_code,
)

if TYPE_CHECKING:
    from schedsim.program.ir import Placement

I64 = np.int64
I32 = np.int32


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


def atom_comms(fs: FlatSchedule, pl: Placement, microbatches: int) -> AtomComms:
    """:class:`AtomComms` of schedule ``fs`` under placement ``pl`` (stages and
    microbatches in range)."""
    S, M = pl.stages, microbatches
    n = len(fs)
    op_rank = np.repeat(np.arange(fs.ranks, dtype=I64), np.diff(fs.rptr))
    op_pos = np.arange(n, dtype=I64) - np.repeat(fs.rptr[:-1], np.diff(fs.rptr))
    a_op, a_kind, a_stage, a_mb = fs.atoms()
    a_rank = op_rank[a_op]
    # recvs: the cross-stage input, when its producer is on another rank
    mk, ps = cross_stage_inputs(a_kind, a_stage, S)
    has = ps >= 0
    src = np.full(len(a_op), -1, I64)
    src[has] = ranks_of(pl, ps[has], a_mb[has])
    need = has & (src != a_rank)
    # sends: the output, when its consumer is on another rank
    ok, os_ = outputs(a_kind, a_stage)
    cs = consumer_stages(ok, os_)
    out = (os_ >= 0) & (cs >= 0) & (cs < S)
    dst = np.full(len(a_op), -1, I64)
    dst[out] = ranks_of(pl, cs[out], a_mb[out])
    send = out & (dst != a_rank)
    ac = AtomComms(
        op_rank=op_rank, op_pos=op_pos,
        need_op=a_op[need], need_kind=(2 * mk + 1)[need], need_stage=a_stage[need],
        need_mb=a_mb[need], need_code=key_codes(mk, ps, a_mb, S, M)[need],
        need_src=src[need],
        send_op=a_op[send], send_kind=(2 * ok)[send], send_stage=a_stage[send],
        send_mb=a_mb[send], send_code=key_codes(ok, os_, a_mb, S, M)[send],
        send_dst=dst[send])
    if getattr(pl, "skips", ()):
        _add_skips(ac, pl, M, a_op, a_kind, a_stage, a_mb, a_rank)
    return ac


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
    that r has not posted yet; a recv whose message no rank sends is posted as it is."""
    P = ranks
    s_link = ac.op_rank[ac.send_op] * P + ac.send_dst
    order = np.argsort(s_link, kind="stable")            # sends grouped by link
    sl = s_link[order]
    starts = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1]]) if len(sl) else np.zeros(0, I64)
    grp = np.repeat(starts, np.diff(np.r_[starts, len(sl)]))
    s_pos = np.empty(len(sl), I64)
    s_pos[order] = np.arange(len(sl)) - grp               # position within its link
    # each need's position on its link (-1: no such send): look its key up among the
    # sends' keys (a dense table when the key space is small, else a sorted search)
    n_link = ac.need_src * P + ac.op_rank[ac.need_op]
    space = int(max(ac.send_code.max(initial=-1), ac.need_code.max(initial=-1))) + 1
    if space <= 4 * (len(ac.send_code) + len(ac.need_code)) + 1024:
        table = np.full(space, -1, I64)
        table[ac.send_code] = np.arange(len(ac.send_code))
        sid = table[ac.need_code]
        found = sid >= 0
        sid = np.maximum(sid, 0)
    else:
        code_order = np.argsort(ac.send_code, kind="stable")
        sc = ac.send_code[code_order]
        at = np.searchsorted(sc, ac.need_code)
        atc = np.minimum(at, max(len(sc) - 1, 0))
        found = (at < len(sc)) & (sc[atc] == ac.need_code) if len(sc) else \
            np.zeros(len(ac.need_code), bool)
        sid = code_order[atc] if len(sc) else np.zeros(len(ac.need_code), I64)
    if len(ac.send_code):
        found &= s_link[sid] == n_link
    pos = np.where(found, s_pos[sid] if len(ac.send_code) else 0, -1)
    # running maximum of positions per link, in need order
    BIG = int(pos.max(initial=0)) + 2
    n_order = np.argsort(n_link, kind="stable")
    key = n_link[n_order] * BIG + (pos[n_order] + 1)
    run = np.maximum.accumulate(key) if len(key) else key
    prev = np.r_[-1, run[:-1]] if len(run) else run
    same = np.r_[False, n_link[n_order][1:] == n_link[n_order][:-1]] if len(run) else \
        np.zeros(0, bool)
    prev_pos = np.where(same, prev - n_link[n_order] * BIG - 1, -1)
    prev_max = np.empty(len(pos), I64)
    prev_max[n_order] = prev_pos
    count = np.where(found, np.maximum(pos - prev_max, 0), 1)
    # expand: need j posts positions prev_max+1 .. pos on its link (or itself)
    total = int(count.sum())
    j = np.repeat(np.arange(len(count)), count)
    k = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    p_pos = prev_max[j] + 1 + k
    # the send at (link, position): sends sorted by link, then position
    kind = ac.need_kind[j].copy()
    stage = ac.need_stage[j].copy()
    mb = ac.need_mb[j].copy()
    peer = ac.need_peer[j].copy() if ac.need_peer is not None else None
    via = found[j]
    if via.any():
        base = np.searchsorted(sl, n_link)[j[via]]        # the link's first send
        s = order[base + p_pos[via]]
        kind[via] = ac.send_kind[s] + 1                    # the matching RECV
        mk = ac.send_kind[s] >> 1
        stage[via] = np.where(mk == 0, ac.send_stage[s] + 1, ac.send_stage[s] - 1)
        mb[via] = ac.send_mb[s]
        if peer is not None:                               # a skip edge's recv
            sp = ac.send_peer[s]
            stage[via] = np.where(sp >= 0, sp, stage[via])
            peer[via] = np.where(sp >= 0, ac.send_stage[s], -1)
    return RecvPosts(op=ac.need_op[j], kind=kind, stage=stage, mb=mb, peer=peer)


def _members(n_instr: int, counts: np.ndarray, src_start: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """``(mptr, index)``: instruction i's members are rows ``src_start[i] ..
    src_start[i] + counts[i] - 1`` of a member table, concatenated in instruction
    order."""
    mptr = np.zeros(n_instr + 1, I64)
    np.cumsum(counts, out=mptr[1:])
    idx = np.repeat(src_start - mptr[:-1], counts) + np.arange(int(mptr[-1]), dtype=I64)
    return mptr, idx


def _fb_sides(fs: FlatSchedule, op_instr: np.ndarray) -> tuple[np.ndarray, ...]:
    return (op_instr[fs.fb_at].astype(I64), fs.fb_kind, fs.fb_stage, fs.fb_mb)


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
    mptr, midx = _members(n, item_mcount[order], item_mstart[order])
    rptr = np.zeros(ranks + 1, I64)
    np.cumsum(np.bincount(item_rank, minlength=ranks), out=rptr[1:])
    op_instr = np.empty(len(fs), I64)
    op_instr[op[is_c]] = np.flatnonzero(is_c)
    fp = FlatProgram(rptr, code.astype(I32), kind, stage, mb, mptr,
                     mk[midx].astype(I32), ms[midx].astype(I32), mm[midx].astype(I32),
                     *_fb_sides(fs, op_instr))
    if mp is not None:          # skip edges (``Placement.skips``)
        fp.cpeer = mp[midx].astype(I32)
    return fp


def lower_async_flat(fs: FlatSchedule, pl: "Placement", microbatches: int) -> FlatProgram:
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
    mptr, midx = _members(N, mcount, mstart)
    rptr = np.concatenate(([0], ends))[fs.rptr].astype(I64)
    fp = FlatProgram(rptr, code, kind, stage, mb, mptr, mk[midx].astype(I32),
                     ms[midx].astype(I32), mm[midx].astype(I32),
                     *_fb_sides(fs, pos_c.astype(I64)))
    if mp is not None:
        fp.cpeer = mp[midx].astype(I32)
    return fp


def _stable_keys(key: np.ndarray) -> np.ndarray:
    """``key`` refined by generation order, so that ties keep the order items were made
    (lexsort is stable, but the items of one key come from one block, in order)."""
    return key.astype(I64) * (len(key) + 1) + np.arange(len(key), dtype=I64)


def lower_commit_flat(fs: FlatSchedule, pl: Placement, microbatches: int) -> FlatProgram:
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


__all__ = [
    "AtomComms",
    "CommKind",
    "RecvPosts",
    "atom_comms",
    "link_order",
    "lower_async_flat",
    "lower_commit_flat",
]

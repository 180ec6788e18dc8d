"""Array facts about a flat program under its placement, computed before the compile
pass (:mod:`schedsim.sim.compile`, :mod:`schedsim.sim.compile_data`): each comm op's
message key and ranks, each compute atom's cross-rank input and output, op costs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedsim.program.flat import (
    FlatProgram,
    Opcode,
    OpKind,
    index_dtype,
    placement_rank_table,
    ranks_of,
)
from schedsim.program.ir import Program
from schedsim.program.routing import (
    SKIP_BASE,
    comm_message_arrays,
    consumer_stages,
    cross_stage_inputs,
    key_codes,
    outputs,
    skip_code,
)
from schedsim.sim.costs import CostModel
from schedsim.sim.prep_kernel import (
    AtomFacts,
    MemberFacts,
    PrepIn,
    instr_sizes_kernel,
    prep_atoms,
    prep_members,
)
from schedsim.util.jit import executor, use_numba

I64 = np.int64


def where(cp_flat: FlatProgram, r: int, i: int) -> str:
    return f"rank {r}, instr {i} ({cp_flat.token(int(cp_flat.rptr[r]) + i)})"


@dataclass
class Prep:
    """Array facts about a flat program under a placement (vectorized, before the
    sequential pass)."""

    S: int
    M: int
    P: int
    # members
    mk: np.ndarray
    side: np.ndarray
    ps: np.ndarray
    cs: np.ndarray
    mvalid: np.ndarray
    mcode: np.ndarray
    msrc: np.ndarray
    mdst: np.ndarray
    # compute atoms (one per non-FB op, two per FB), instr-ordered
    aptr: np.ndarray
    a_instr: np.ndarray
    a_kind: np.ndarray
    a_stage: np.ndarray
    a_mb: np.ndarray
    a_rank: np.ndarray
    a_in: np.ndarray      # key code of the cross-rank input, -1
    a_in_rank: np.ndarray  # rank that produces that input, -1
    a_out: np.ndarray     # key code of the output, -1
    #: stage graphs (``Placement.skips``): an atom has one extra entry per skip-edge
    #: input or output, after its own, and ``a_skip`` is that edge's number (-1: the
    #: atom's own entry); ``ncodes``: the size of the key code space
    a_skip: np.ndarray | None = None
    ncodes: int = 0
    skips: tuple = ()


def prep(fl: FlatProgram, program: Program, pass_only: bool = False) -> Prep:
    """The :class:`Prep` of ``fl`` (``program``'s flat form). ``pass_only``: a numba
    computation may leave the fields the compile pass does not read empty (``ps``,
    ``cs``, ``a_instr``, ``a_kind``, ``a_stage``, ``a_mb``, ``a_rank``, ``a_in_rank``:
    130 MB less to write at 10 M instructions); for the pass only, which computes a
    whole one again to word an error."""
    pl = program.placement
    S, M, P = pl.stages, program.microbatches, pl.ranks
    if (not getattr(pl, "skips", ()) and fl.cpeer is None and use_numba(len(fl))
            and _kernel_types(fl)):
        return _prep_numba(fl, program, not pass_only)
    mk, side, ps = comm_message_arrays(fl.ckind, fl.cstage)
    cs = consumer_stages(mk, ps)
    cmb = fl.cmb
    valid = (ps >= 0) & (ps < S) & (cs >= 0) & (cs < S) & (cmb >= 0) & (cmb < M)
    skips = tuple(getattr(pl, "skips", ()))
    edge = None
    if fl.cpeer is not None:            # members naming the other stage of an edge
        ps, cs, valid, edge = _peered(fl, mk, side, ps, cs, valid, skips, S)
    ncodes = _code_space(int(mk.max()) if len(mk) else -1, S, M, skips)
    cdt = index_dtype(ncodes)           # key codes: int32 while the code space fits
    if valid.all() and edge is None:
        mcode = key_codes(mk, ps, cmb, S, M, cdt)
        msrc, mdst = ranks_of(pl, ps, cmb), ranks_of(pl, cs, cmb)
    else:
        mcode = np.where(valid, key_codes(mk, ps, cmb, S, M, cdt), -1)
        if edge is not None:
            mcode = np.where(valid & (edge >= 0), skip_code(np.maximum(edge, 0), mk, cmb, S, M),
                             mcode)
        psv, csv, mbv = np.where(valid, ps, 0), np.where(valid, cs, 0), np.where(valid, cmb, 0)
        msrc = np.where(valid, ranks_of(pl, psv, mbv), -1)
        mdst = np.where(valid, ranks_of(pl, csv, mbv), -1)
    # atoms: one per compute op, two for FB (forward part, then backward part)
    is_c = fl.code == Opcode.COMPUTE
    n = len(fl)
    cnt = is_c.view(np.int8)
    if len(fl.fb_at):
        cnt = cnt.copy()
        cnt[fl.fb_at] += 1
        a_instr = np.repeat(np.arange(n, dtype=I64), cnt)
    else:
        a_instr = np.flatnonzero(is_c)
    aptr = np.zeros(n + 1, _atom_index(len(a_instr)))
    np.cumsum(cnt, dtype=aptr.dtype, out=aptr[1:])
    na = len(a_instr)
    a_kind = fl.kind[a_instr]
    a_stage = fl.stage[a_instr]
    a_mb = fl.mb[a_instr]
    if len(fl.fb_at):
        second = aptr[fl.fb_at] + 1
        a_kind = np.where(a_kind == OpKind.FB, int(OpKind.F), a_kind)
        a_kind[second] = fl.fb_kind
        a_stage[second] = fl.fb_stage
        a_mb[second] = fl.fb_mb
    a_rank = fl.rank_of_instr()[a_instr]
    ok = (a_stage >= 0) & (a_stage < S) & (a_mb >= 0) & (a_mb < M) & (a_kind >= 0)
    ink, inps = cross_stage_inputs(a_kind, a_stage, S)
    has_in = ok & (inps >= 0)
    in_rank = np.full(na, -1, np.int32)
    if has_in.any():
        in_rank[has_in] = ranks_of(pl, inps[has_in], a_mb[has_in])
    a_in = np.where(has_in & (in_rank != a_rank), key_codes(ink, inps, a_mb, S, M, cdt), -1)
    ok_out, out_s = outputs(a_kind, a_stage)
    a_out = np.where(ok & (out_s >= 0), key_codes(ok_out, out_s, a_mb, S, M, cdt), -1)
    pr = Prep(S, M, P, mk, side, ps, cs, valid, mcode, msrc, mdst, aptr, a_instr,
              a_kind, a_stage, a_mb, a_rank, a_in, in_rank, a_out, ncodes=ncodes,
              skips=skips)
    if skips:
        _skip_atoms(pr, pl, skips, n)
    return pr


def _atom_index(na: int) -> type:
    """The type of ``Prep.aptr`` for ``na`` atoms: int32 unless that overflows."""
    return np.int32 if na < np.iinfo(np.int32).max else I64


def _code_space(mk_max: int, S: int, M: int, skips: tuple) -> int:
    """Size of the key code space: the chain's codes of F and B (and of the shape
    messages FS, BS when the program has any: ``mk_max``, the largest message kind of a
    member, -1 for none, is 2 or more), then the skip edges' (``skip_code``)."""
    if skips:
        return SKIP_BASE * S * M + 2 * len(skips) * M
    return (4 if mk_max >= 2 else 2) * S * M


def _kernel_types(fl: FlatProgram) -> bool:
    """Whether the program's columns have the types the flat form gives them (int32;
    ``fb_at`` int64) and its ``FB`` ops are compute instructions, as
    :func:`_prep_numba` assumes to give the numpy form's types."""
    cols = (fl.code, fl.kind, fl.stage, fl.mb, fl.ckind, fl.cstage, fl.cmb, fl.fb_kind,
            fl.fb_stage, fl.fb_mb)
    return (all(c.dtype == np.int32 for c in cols) and fl.fb_at.dtype == I64
            and bool(np.all(fl.code[fl.fb_at] == Opcode.COMPUTE)))


def _prep_numba(fl: FlatProgram, program: Program, full: bool = True) -> Prep:
    """:func:`prep` of a program without skip edges or peered members, by the numba
    passes of :mod:`schedsim.sim.prep_kernel`: the same arrays and types as the numpy
    form, each written once (no temporaries of the program's size); ``full`` False: the
    fields the compile pass does not read empty (:func:`prep`'s ``pass_only``)."""
    pl = program.placement
    S, M, P = pl.stages, program.microbatches, pl.ranks
    members, xs = executor(prep_members, len(fl))
    table, half, last = placement_rank_table(pl)
    pin = PrepIn(stages=S, microbatches=M, hm=half if half >= 0 else M, last=last,
                 table=table, full=full, rptr=fl.rptr, code=fl.code, kind=fl.kind, stage=fl.stage,
                 mb=fl.mb, ckind=fl.ckind, cstage=fl.cstage, cmb=fl.cmb, fb_at=fl.fb_at,
                 fb_kind=fl.fb_kind, fb_stage=fl.fb_stage, fb_mb=fl.fb_mb)
    nm = len(fl.ckind)
    ncodes = _code_space(int(fl.ckind.max()) >> 1 if nm else -1, S, M, ())
    cdt = index_dtype(ncodes)
    i32 = np.int32
    nx = nm if full else 0
    mo = MemberFacts(mk=xs.empty(nm, i32), side=xs.empty(nm, i32), ps=xs.empty(nx, i32),
                   cs=xs.empty(nx, i32), mvalid=xs.empty(nm, np.bool_),
                   mcode=xs.empty(nm, cdt), msrc=xs.empty(nm, i32), mdst=xs.empty(nm, i32))
    members(pin, mo)
    na = instr_sizes(fl)[0] + len(fl.fb_at)
    nx = na if full else 0
    ao = AtomFacts(aptr=xs.empty(len(fl) + 1, _atom_index(na)), a_instr=xs.empty(nx, I64),
                   a_kind=xs.empty(nx, i32), a_stage=xs.empty(nx, i32),
                   a_mb=xs.empty(nx, i32), a_rank=xs.empty(nx, i32), a_in=xs.empty(na, cdt),
                   a_in_rank=xs.empty(nx, i32), a_out=xs.empty(na, cdt))
    executor(prep_atoms, len(fl))[0](pin, ao)
    return Prep(S, M, P, *mo, *ao, ncodes=ncodes, skips=())


def _peered(fl: FlatProgram, mk, side, ps, cs, valid, skips, S: int):
    """Members that name the other stage (``fl.cpeer``): their producing and consuming
    stages, validity (a chain or skip edge of the graph) and skip edge number (-1: a
    chain edge or none)."""
    peer = fl.cpeer.astype(I64)
    has = peer >= 0
    stage = fl.cstage.astype(I64)
    prod = np.where(side == 0, stage, peer)
    cons = np.where(side == 0, peer, stage)
    ps = np.where(has, prod, ps)
    cs = np.where(has, cons, cs)
    down = (mk & 1) == 0                # F (and FS) flow to later stages
    chain = cons == np.where(down, prod + 1, prod - 1)
    lo, hi = np.where(down, prod, cons), np.where(down, cons, prod)
    index = {e: i for i, e in enumerate(skips)}
    edge = np.asarray([index.get((int(a), int(b)), -1) for a, b in zip(lo.tolist(), hi.tolist())],
                      dtype=I64) if has.any() else np.full(len(peer), -1, I64)
    edge = np.where(has & ~chain & (mk < 2), edge, -1)    # skip edges carry F and B
    ok = ~has | chain | (edge >= 0)
    valid = valid | (has & (edge >= 0) & (fl.cmb >= 0) & (ps >= 0) & (ps < S) & (cs >= 0)
                     & (cs < S))
    return ps, cs, valid & ok, edge


def _skip_atoms(pr: Prep, pl, skips, n: int) -> None:
    """Add the skip-edge entries of every atom (:class:`Prep`): for edge (p, c), a
    forward of c takes ``("F", p, mb, c)`` (an input entry when p runs on another rank)
    and a forward of p makes it; a backward of p takes ``("B", c, mb, p)`` and a
    backward of c makes it."""
    S, M = pr.S, pr.M
    k, st, mb, rank = pr.a_kind, pr.a_stage, pr.a_mb, pr.a_rank
    is_f = k == 0
    is_b = (k == 1) | (k == 3)
    ok = (st >= 0) & (st < S) & (mb >= 0) & (mb < M)
    base = np.arange(len(k), dtype=I64)
    rows = []        # (atom, edge, input code, input rank, output code)
    for e, (p, c) in enumerate(skips):
        for mkind, takes, makes, src in ((0, is_f & (st == c), is_f & (st == p), p),
                                         (1, is_b & (st == p), is_b & (st == c), c)):
            code = skip_code(e, mkind, np.maximum(mb, 0), S, M)
            t = np.flatnonzero(takes & ok)
            if len(t):
                src_rank = ranks_of(pl, np.full(len(t), src, I64), mb[t])
                cross = src_rank != rank[t]
                t, src_rank = t[cross], src_rank[cross]
                rows.append((t, np.full(len(t), e), code[t], src_rank, np.full(len(t), -1)))
            m = np.flatnonzero(makes & ok)
            rows.append((m, np.full(len(m), e), np.full(len(m), -1), np.full(len(m), -1),
                         code[m]))
    if not rows:
        return
    ex_atom = np.concatenate([r[0] for r in rows]).astype(I64)
    order = np.argsort(ex_atom, kind="stable")
    cat = [np.concatenate([r[i] for r in rows]).astype(I64)[order] for i in range(1, 5)]
    ex_atom = ex_atom[order]
    all_atom = np.concatenate((base, ex_atom))
    sub = np.concatenate((np.zeros(len(base), I64), np.arange(1, len(ex_atom) + 1)))
    o = np.lexsort((sub, all_atom))
    src_atom = all_atom[o]
    is_ex = sub[o] > 0
    exi = np.maximum(sub[o] - 1, 0)
    pr.a_instr = pr.a_instr[src_atom]
    pr.a_kind, pr.a_stage, pr.a_mb = k[src_atom], st[src_atom], mb[src_atom]
    pr.a_rank = rank[src_atom]
    pr.a_in = np.where(is_ex, cat[1][exi], pr.a_in[src_atom])
    pr.a_in_rank = np.where(is_ex, cat[2][exi], pr.a_in_rank[src_atom])
    pr.a_out = np.where(is_ex, cat[3][exi], pr.a_out[src_atom])
    pr.a_skip = np.where(is_ex, cat[0][exi], -1)
    cnt = np.bincount(pr.a_instr, minlength=n)
    pr.aptr = np.zeros(n + 1, _atom_index(len(pr.a_instr)))
    np.cumsum(cnt, dtype=pr.aptr.dtype, out=pr.aptr[1:])


def instr_sizes(fl: FlatProgram) -> tuple[int, int]:
    """``(compute instructions, members of launches)`` of ``fl`` (the sizes of the
    compile pass's arrays): under numba one pass (:func:`schedsim.sim.prep_kernel.
    instr_sizes_kernel`), else numpy."""
    if use_numba(len(fl)) and fl.code.dtype == np.int32 and fl.mptr.dtype == I64:
        kernel, xs = executor(instr_sizes_kernel, len(fl))
        counts = xs.full(2, 0)
        kernel(fl.code, fl.mptr, counts)
        return int(counts[0]), int(counts[1])
    is_l = (fl.code == Opcode.POST) | (fl.code == Opcode.BATCH)
    return (int(np.count_nonzero(fl.code == Opcode.COMPUTE)),
            int(np.diff(fl.mptr)[is_l].sum()))


def compute_costs(fl: FlatProgram, costs: CostModel, is_c: np.ndarray) -> np.ndarray:
    """Cost of every compute instruction, in order."""
    ci = np.flatnonzero(is_c)
    n = len(ci)
    bk = np.zeros(n, I64)
    bs = np.zeros(n, I64)
    bm = np.zeros(n, I64)
    if len(fl.fb_at):
        k = np.searchsorted(ci, fl.fb_at)
        bk[k], bs[k], bm[k] = fl.fb_kind, fl.fb_stage, fl.fb_mb
    return costs.op_costs(fl.kind[ci], fl.stage[ci], fl.mb[ci], bk, bs, bm)

"""The per-member and per-atom facts of :func:`schedsim.sim.prep.prep` as two passes
(:func:`prep_members`, :func:`prep_atoms`), for programs without skip edges, run by numba
(:mod:`schedsim.util.jit`): the numpy form allocated about 25 temporaries of the
program's size (770 MB of fresh memory at 10 M instructions, ``benchmarks/NOTES.md``);
these write each of :class:`~schedsim.sim.prep.Prep`'s arrays once. The CPython
executor keeps the numpy form (a loop over Python lists would be slower than it), and
the tests compare the two, array by array.

The rules are :mod:`schedsim.program.routing`'s array forms: a member of comm kind code
``ck`` (:class:`~schedsim.program.flat.CommKind`) issued on stage ``s`` is message kind
``ck >> 1``, side ``ck & 1``, produced on ``s`` (a send) or on the stage before it in the
message's direction (a recv); key code ``(kind * stages + stage) * microbatches + mb``
(:func:`~schedsim.program.routing.key_codes`). The rank of stage ``s`` for microbatch
``m`` is ``table[s] if m < hm else last - s`` (:func:`~schedsim.program.flat.ranks_of`,
``hm``: the ``dual`` placement's half, else ``microbatches``), looked up in the loops
themselves: an array passed to a helper costs reference-count traffic per call under
numba, so the helpers here take scalars only.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from schedsim.program.flat import Opcode, OpKind

Arr = Any      # a numpy array (numba), allocated by the caller

_COMPUTE = int(Opcode.COMPUTE)
_POST = int(Opcode.POST)
_BATCH = int(Opcode.BATCH)
_FB = int(OpKind.FB)


class PrepIn(NamedTuple):
    """A flat program's arrays (:class:`~schedsim.program.flat.FlatProgram`) and its
    placement for the passes: ``stages``, ``microbatches``, the ranks of the stages
    (``table``, ``hm``, ``last``: module docstring); ``full`` False: only the fields the
    compile pass reads are written (:func:`prep_members` and :func:`prep_atoms` say which;
    the others are given empty); ``rptr``, per instruction ``code``,
    ``kind``, ``stage``, ``mb``; per member ``ckind``, ``cstage``, ``cmb``; the FB side
    arrays."""

    stages: int
    microbatches: int
    hm: int
    last: int
    table: Arr
    full: bool
    rptr: Arr
    code: Arr
    kind: Arr
    stage: Arr
    mb: Arr
    ckind: Arr
    cstage: Arr
    cmb: Arr
    fb_at: Arr
    fb_kind: Arr
    fb_stage: Arr
    fb_mb: Arr


class MemberFacts(NamedTuple):
    """What :func:`prep_members` writes, per member (:class:`~schedsim.sim.prep.Prep`'s
    fields of the same names): message kind ``mk``, ``side``, producing and consuming
    stage ``ps``/``cs``, ``mvalid`` (both stages and the mb in range), key code ``mcode``
    and the two ranks ``msrc``/``mdst`` (-1 where not valid)."""

    mk: Arr
    side: Arr
    ps: Arr
    cs: Arr
    mvalid: Arr
    mcode: Arr
    msrc: Arr
    mdst: Arr


class AtomFacts(NamedTuple):
    """What :func:`prep_atoms` writes (:class:`~schedsim.sim.prep.Prep`'s fields): per
    instruction ``aptr`` (its atoms are ``aptr[i]:aptr[i+1]``), per atom ``a_instr``,
    ``a_kind``, ``a_stage``, ``a_mb``, ``a_rank``, ``a_in`` (key code of its cross-rank
    input, -1), ``a_in_rank`` (the rank that produces its input, -1), ``a_out`` (key code
    of its output, -1)."""

    aptr: Arr
    a_instr: Arr
    a_kind: Arr
    a_stage: Arr
    a_mb: Arr
    a_rank: Arr
    a_in: Arr
    a_in_rank: Arr
    a_out: Arr


def prep_members(p, out):
    """Every member's message facts (:class:`MemberFacts`; ``p``: :class:`PrepIn`;
    ``ps`` and ``cs`` only when ``p.full``)."""
    S, M, hm, last, table, full = p.stages, p.microbatches, p.hm, p.last, p.table, p.full
    ckind, cstage, cmb = p.ckind, p.cstage, p.cmb
    o_mk, o_side, o_ps, o_cs, mvalid = out.mk, out.side, out.ps, out.cs, out.mvalid
    mcode, msrc, mdst = out.mcode, out.msrc, out.mdst
    for j in range(len(ckind)):
        ck = ckind[j]
        mk = ck >> 1
        side = ck & 1
        ps = cstage[j] + side * (2 * (mk & 1) - 1)
        cs = ps + 1 - 2 * (mk & 1)
        m = cmb[j]
        o_mk[j], o_side[j] = mk, side
        if full:
            o_ps[j], o_cs[j] = ps, cs
        ok = ps >= 0 and ps < S and cs >= 0 and cs < S and m >= 0 and m < M
        mvalid[j] = ok
        if ok:
            mcode[j] = (mk * S + ps) * M + m
            msrc[j] = table[ps] if m < hm else last - ps
            mdst[j] = table[cs] if m < hm else last - cs
        else:
            mcode[j] = -1
            msrc[j] = -1
            mdst[j] = -1


def _atom_codes(S, M, k, s, m):
    """``(producing stage of the input, its key code, the output's key code)`` of an
    atom of kind ``k`` on stage ``s``, microbatch ``m`` (in range): the input of ``F`` is
    stage s-1's ``F``, of ``B``/``BW`` stage s+1's ``B`` (stage -1, code -1: none); every
    kind but ``W`` makes an output (:func:`~schedsim.program.routing.cross_stage_inputs`,
    :func:`~schedsim.program.routing.outputs`)."""
    ps = -1
    if k == 0 and s > 0:
        ps = s - 1
    elif (k == 1 or k == 3) and s < S - 1:
        ps = s + 1
    mk = 0 if k == 0 else 1
    cin = -1 if ps < 0 else (mk * S + ps) * M + m
    cout = -1 if k == 2 else (mk * S + s) * M + m
    return ps, cin, cout


def prep_atoms(p, out):
    """Every compute instruction's atoms (:class:`AtomFacts`; ``p``: :class:`PrepIn`), in
    instruction order: one per compute instruction, two for an ``FB`` (its ``F`` part,
    then its ``fb_*`` part); an atom out of range (stage, mb, a negative kind) has no
    input or output. Without ``p.full`` only ``aptr``, ``a_in`` and ``a_out``."""
    S, M, hm, last, table, full = p.stages, p.microbatches, p.hm, p.last, p.table, p.full
    rptr, code, kind, stage, mb = p.rptr, p.code, p.kind, p.stage, p.mb
    fb_at, fb_kind, fb_stage, fb_mb = p.fb_at, p.fb_kind, p.fb_stage, p.fb_mb
    aptr, a_instr, a_kind, a_stage, a_mb = (out.aptr, out.a_instr, out.a_kind, out.a_stage,
                                            out.a_mb)
    a_rank, a_in, a_in_rank, a_out = out.a_rank, out.a_in, out.a_in_rank, out.a_out
    a = f = 0
    nfb = len(fb_at)
    for r in range(len(rptr) - 1):
        for i in range(rptr[r], rptr[r + 1]):
            aptr[i] = a
            if code[i] != _COMPUTE:
                continue
            k, s, m = kind[i], stage[i], mb[i]
            if k == _FB and nfb > 0:
                k = 0
            fb = f < nfb and fb_at[f] == i
            while True:             # the instruction's atom, then an FB's backward part
                if full:
                    a_instr[a], a_kind[a], a_stage[a], a_mb[a], a_rank[a] = i, k, s, m, r
                    a_in_rank[a] = -1
                a_in[a], a_out[a] = -1, -1
                if s >= 0 and s < S and m >= 0 and m < M and k >= 0:
                    ps, cin, cout = _atom_codes(S, M, k, s, m)
                    if ps >= 0:
                        q = table[ps] if m < hm else last - ps
                        if full:
                            a_in_rank[a] = q
                        if q != r:
                            a_in[a] = cin
                    a_out[a] = cout
                a += 1
                if not fb:
                    break
                k, s, m = fb_kind[f], fb_stage[f], fb_mb[f]
                f += 1
                fb = False
    aptr[len(code)] = a


def instr_sizes_kernel(code, mptr, counts):
    """``counts[0]``: the compute instructions of a program (per instruction ``code``,
    members ``mptr[i]:mptr[i+1]``), ``counts[1]``: the members of its launches (bare
    posts and ``BATCH``es): the compile pass's sizes, without a temporary of the
    program's size."""
    nc = nl = 0
    for i in range(len(code)):
        c = code[i]
        if c == _COMPUTE:
            nc += 1
        elif c == _POST or c == _BATCH:
            nl += mptr[i + 1] - mptr[i]
    counts[0] = nc
    counts[1] = nl

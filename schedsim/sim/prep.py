"""Array facts about a flat program under its placement, computed before the compile
pass (:mod:`schedsim.sim.compile`, :mod:`schedsim.sim.compile_data`): each comm op's
message key and ranks, each compute atom's cross-rank input and output, op costs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedsim.program.flat import FlatProgram, Opcode, ranks_of
from schedsim.program.ir import Program
from schedsim.program.routing import (
    comm_message_arrays,
    consumer_stages,
    cross_stage_inputs,
    key_codes,
    outputs,
)
from schedsim.sim.costs import CostModel

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


def prep(fl: FlatProgram, program: Program) -> Prep:
    pl = program.placement
    S, M, P = pl.stages, program.microbatches, pl.ranks
    mk, side, ps = comm_message_arrays(fl.ckind, fl.cstage)
    cs = consumer_stages(mk, ps)
    cmb = fl.cmb
    valid = (ps >= 0) & (ps < S) & (cs >= 0) & (cs < S) & (cmb >= 0) & (cmb < M)
    if valid.all():
        mcode = key_codes(mk, ps, cmb, S, M)
        msrc, mdst = ranks_of(pl, ps, cmb), ranks_of(pl, cs, cmb)
    else:
        mcode = np.where(valid, key_codes(mk, ps, cmb, S, M), -1)
        psv, csv, mbv = np.where(valid, ps, 0), np.where(valid, cs, 0), np.where(valid, cmb, 0)
        msrc = np.where(valid, ranks_of(pl, psv, mbv), -1)
        mdst = np.where(valid, ranks_of(pl, csv, mbv), -1)
    # atoms: one per compute op, two for FB (forward part, then backward part)
    is_c = fl.code == Opcode.COMPUTE
    n = len(fl)
    cnt = is_c.astype(I64)
    if len(fl.fb_at):
        cnt[fl.fb_at] += 1
        a_instr = np.repeat(np.arange(n, dtype=I64), cnt)
    else:
        a_instr = np.flatnonzero(is_c)
    aptr = np.zeros(n + 1, I64)
    np.cumsum(cnt, out=aptr[1:])
    na = len(a_instr)
    a_kind = fl.kind[a_instr]
    a_stage = fl.stage[a_instr]
    a_mb = fl.mb[a_instr]
    if len(fl.fb_at):
        second = aptr[fl.fb_at] + 1
        a_kind = np.where(a_kind == 4, 0, a_kind)
        a_kind[second] = fl.fb_kind
        a_stage[second] = fl.fb_stage
        a_mb[second] = fl.fb_mb
    a_rank = fl.rank_of_instr()[a_instr]
    ok = (a_stage >= 0) & (a_stage < S) & (a_mb >= 0) & (a_mb < M) & (a_kind >= 0)
    ink, inps = cross_stage_inputs(a_kind, a_stage, S)
    has_in = ok & (inps >= 0)
    in_rank = np.full(na, -1, I64)
    if has_in.any():
        in_rank[has_in] = ranks_of(pl, inps[has_in], a_mb[has_in])
    a_in = np.where(has_in & (in_rank != a_rank), key_codes(ink, inps, a_mb, S, M), -1)
    ok_out, out_s = outputs(a_kind, a_stage)
    a_out = np.where(ok & (out_s >= 0), key_codes(ok_out, out_s, a_mb, S, M), -1)
    return Prep(S, M, P, mk, side, ps, cs, valid, mcode, msrc, mdst, aptr, a_instr,
                 a_kind, a_stage, a_mb, a_rank, a_in, in_rank, a_out)


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

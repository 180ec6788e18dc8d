"""Compile under ``data`` semantics: one implicit message per cross-rank producer ->
consumer edge (the comm instructions, checked by :mod:`schedsim.sim.compile`, are ignored).
"""
from __future__ import annotations

import numpy as np

from schedsim.errors import ProgramError
from schedsim.program.flat import FlatProgram, Opcode
from schedsim.program.routing import cross_stage_inputs
from schedsim.program.flat import index_dtype
from schedsim.sim.compiled import OPCODE, Code, Messages, Part, Units
from schedsim.sim.costs import CostModel
from schedsim.sim.opcodes import Step, WaitKind
from schedsim.sim.prep import I64, Prep, compute_costs, where


def compile_data(fl: FlatProgram, pr: Prep, costs: CostModel) -> Part:
    """``data`` semantics: one message per cross-rank producer -> consumer edge (ids in
    order of first consumption, ranks then instructions); a consumer waits for its inputs
    (a ``DATA`` wait step) and a producer's end activates its sends."""
    P, n = pr.P, len(fl)
    is_c = fl.code == Opcode.COMPUTE
    gi_c = np.flatnonzero(is_c).astype(I64)
    nc = len(gi_c)
    cpos = np.full(n, -1, I64)            # instr -> position among compute instrs
    cpos[gi_c] = np.arange(nc)
    has_out = pr.a_out >= 0
    prod_code, prod_instr = pr.a_out[has_out], pr.a_instr[has_out]
    po = np.argsort(prod_code, kind="stable")
    prod_code, prod_instr = prod_code[po], prod_instr[po]
    has_in = pr.a_in >= 0
    need_code, need_instr, need_atom = pr.a_in[has_in], pr.a_instr[has_in], \
        np.flatnonzero(has_in)
    at = _producers_or_raise(fl, pr, prod_code, need_code, need_atom)
    producer = prod_instr[at] if len(at) else np.zeros(0, I64)
    uniq, first, inv = np.unique(need_code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    mid_of = np.empty(len(uniq), I64)
    mid_of[order] = np.arange(len(uniq))
    need_m = mid_of[inv]
    nm = len(uniq)
    mcode = uniq[order]
    m_cons = need_instr[first[order]]
    m_prod = producer[first[order]]
    rank_of = fl.rank_of_instr().astype(I64)
    idx_of = fl.index_of_instr().astype(I64)
    hindex = np.empty(2 * nm, I64)
    hindex[0::2] = idx_of[m_prod]
    hindex[1::2] = idx_of[m_cons]
    # steps: per compute instr an optional DATA wait, then the compute
    w = np.zeros(n, I64)
    np.add.at(w, need_instr, 1)
    has_w = (w[gi_c] > 0).astype(I64)
    per = 1 + has_w
    cstep = np.cumsum(per) - 1                  # position of each compute step
    ns = int(per.sum())
    cop = np.full(ns, int(Step.COMPUTE), I64)
    cwk = np.full(ns, -1, I64)
    wstep = cstep[has_w == 1] - 1
    cop[wstep] = int(Step.WAIT)
    cwk[wstep] = int(WaitKind.DATA)
    cipc = np.empty(ns, I64)
    cipc[cstep] = idx_of[gi_c]
    cipc[wstep] = idx_of[gi_c[has_w == 1]]
    ccost = np.zeros(ns)
    if nc:
        ccost[cstep] = compute_costs(fl, costs, is_c)
    cspan = np.full(ns, -1, I64)
    cspan[cstep] = np.arange(nc)
    # handles: a wait's recvs (scan order), a compute's sends (message order)
    item_step = np.concatenate((cstep[cpos[need_instr]] - 1, cstep[cpos[m_prod]]))
    item_key = np.concatenate((np.arange(len(need_m)), np.arange(nm)))
    item_h = np.concatenate((2 * need_m + 1, 2 * np.arange(nm, dtype=I64)))
    o = np.lexsort((item_key, item_step))
    ch = item_h[o]
    chptr = np.zeros(ns + 1, I64)
    np.cumsum(np.bincount(item_step, minlength=ns), out=chptr[1:])
    crptr = np.zeros(P + 1, I64)
    np.cumsum(np.bincount(rank_of[gi_c], weights=per, minlength=P).astype(I64),
              out=crptr[1:])
    dt = index_dtype(max(ns, len(ch), 2 * nm, n, P * P) + 1)

    def ix(a: np.ndarray) -> np.ndarray:
        return a.astype(dt, copy=False)
    return Part(code=Code(crptr=ix(crptr), cop=cop.astype(OPCODE), cipc=ix(cipc),
                          cwk=cwk.astype(OPCODE),
                          ccost=ccost, cspan=ix(cspan), chptr=ix(chptr), ch=ix(ch),
                          cuptr=np.zeros(0, dt), cinit=np.zeros(0, dt)),
                span_gi=ix(gi_c),
                messages=Messages(mcode=mcode, msrc=ix(rank_of[m_prod]),
                                  mdst=ix(rank_of[m_cons]), mbytes=np.zeros(0),
                                  hindex=ix(hindex), hseq=np.full(2 * nm, -1, dt)),
                units=Units(unit_stream=np.zeros(0, dt), unit_hptr=np.zeros(1, dt),
                            unit_h=np.zeros(0, dt), hunit=np.full(2 * nm, -1, dt)))


def _producers_or_raise(fl: FlatProgram, pr: Prep, prod_code: np.ndarray,
                        need_code: np.ndarray, need_atom: np.ndarray) -> np.ndarray:
    """Positions in ``prod_code`` (sorted) of each cross-rank input's producer; raises
    :class:`ProgramError` at the first input that no op produces."""
    at = np.searchsorted(prod_code, need_code)
    found = (at < len(prod_code)) & (prod_code[np.minimum(at, max(len(prod_code) - 1, 0))]
                                     == need_code) if len(prod_code) else \
        np.zeros(len(need_code), bool)
    if not found.all():
        j = int(need_atom[np.flatnonzero(~found)[0]])
        gi = int(pr.a_instr[j])
        r = int(pr.a_rank[j])
        kind, ps = cross_stage_inputs(pr.a_kind[j:j + 1], pr.a_stage[j:j + 1], pr.S)
        what = "activation" if int(kind[0]) == 0 else "gradient"
        raise ProgramError(f"{where(fl, r, gi - int(fl.rptr[r]))} needs the {what} of stage "
                           f"{int(ps[0])} mb {int(pr.a_mb[j])}, which no op of the program "
                           f"produces")
    return at

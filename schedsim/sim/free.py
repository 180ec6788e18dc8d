"""Counterfactual runs: make given compute ops and messages free in a compiled program.

- a free op costs 0;
- a free message (comm semantics): its handles are dropped from every launch, comm-stream
  unit and wait, so each side completes the moment it is posted, nobody waits for it and
  it occupies no link or stream; a launch left with nothing to post is dropped with its
  launch cost (kept, empty, when it creates a communicator under lazy init);
- a free message (``data`` semantics): no link latency or occupancy (its consumer still
  waits for its producer).

Public entry point: the ``free_ops`` / ``free_messages`` arguments of
:func:`schedsim.sim.simulate.simulate`.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from schedsim.errors import ScenarioError
from schedsim.sim.compiled import Code, Compiled, Units, links_of
from schedsim.sim.opcodes import Step

I64 = np.int64


def make_free(cp: Compiled, ops: list[tuple[int, int]],
              messages: list[tuple[str, int, int]]) -> Compiled:
    """A new :class:`Compiled`: ``cp`` with ``ops`` ((rank, instruction index) of compute
    ops) and ``messages`` ((kind, producing stage, mb) keys) free (module docstring);
    ``cp`` is left as it is. Raises :class:`ScenarioError` naming an op or message the
    program does not have."""
    code = cp.code
    if ops:
        is_c = code.cop == Step.COMPUTE
        where = {(r, i): g for g, r, i in zip(np.flatnonzero(is_c).tolist(),
                                               cp.step_rank()[is_c].tolist(),
                                               code.cipc[is_c].tolist())}
        ccost = code.ccost.copy()
        for r, i in ops:
            g = where.get((int(r), int(i)))
            if g is None:
                raise ScenarioError(f"free op: rank {r} has no compute op at instruction {i}")
            ccost[g] = 0.0
        code = code._replace(ccost=ccost)
    if not messages:
        return replace(cp, code=code)
    index = {k: m for m, k in enumerate(cp.mkey)}
    free = []
    for key in messages:
        m = index.get(tuple(key))
        if m is None:
            raise ScenarioError(f"free message: the program moves no {key[0]} of stage "
                                f"{key[1]} mb {key[2]} between ranks")
        free.append(m)
    fm = np.asarray(free, dtype=I64)
    if cp.data_mode:
        lk = cp.links
        mocc, mlat = lk.mocc.copy(), lk.mlat.copy()
        mocc[fm] = 0.0
        mlat[fm] = 0.0
        return replace(cp, code=code, links=links_of(mlat, mocc, lk.mlink, lk.meager,
                                                     msend=lk.msend,
                                                     num_links=lk.num_links))
    code, units = _drop_handles(cp, code, np.concatenate((2 * fm, 2 * fm + 1)))
    return replace(cp, code=code, units=units)


def _drop_handles(cp: Compiled, code: Code, gone: np.ndarray) -> tuple[Code, Units]:
    """``code`` and ``cp.units`` without handles ``gone`` in any step or unit; emptied
    launches and units dropped."""
    nh = 2 * cp.num_messages
    dt = code.chptr.dtype        # the compiled program's index type (program.flat.index_dtype)
    dead = np.zeros(nh, bool)
    dead[gone] = True
    # units: keep the handles that stay, drop emptied units, renumber
    un = cp.units
    ucnt_old = np.diff(un.unit_hptr)
    uid = np.repeat(np.arange(len(un.unit_stream), dtype=I64), ucnt_old)
    keep_uh = ~dead[un.unit_h]
    ucnt = np.bincount(uid[keep_uh], minlength=len(un.unit_stream))
    ukeep = ucnt > 0
    unew = np.cumsum(ukeep) - 1
    hunit = un.hunit
    if len(unew):
        hunit = np.where(hunit >= 0, unew[np.maximum(hunit, 0)], -1)
    hunit = np.where(dead, -1, hunit).astype(dt)
    units = Units(unit_stream=un.unit_stream[ukeep], unit_hptr=np.concatenate(
        ([0], np.cumsum(ucnt[ukeep]))).astype(dt), unit_h=un.unit_h[keep_uh], hunit=hunit)
    # steps: drop the dead handles; drop launches left empty (unless they create a
    # communicator under lazy init)
    ns = len(code.cop)
    cnt = np.diff(code.chptr)
    sid = np.repeat(np.arange(ns, dtype=I64), cnt)
    keep_h = ~dead[code.ch]
    hcnt = np.bincount(sid[keep_h], minlength=ns)
    is_l = code.cop == Step.LAUNCH
    keep_step = ~is_l | (hcnt > 0)
    if cp.host.lazy_init:
        keep_step |= code.cinit >= 0
    # units of each step: the first and last unit ids of the step, renumbered
    cuptr = code.cuptr          # empty without comm streams
    if len(cuptr):
        kept_before = np.concatenate(([0], np.cumsum(ukeep))).astype(dt)
        new_lo, new_hi = kept_before[cuptr[:-1]], kept_before[cuptr[1:]]
        cuptr = np.concatenate((new_lo[keep_step], new_hi[keep_step][-1:] if
                                keep_step.any() else [0])).astype(dt)
    step_rank = cp.step_rank()
    # the handles of dropped steps are none (they were all dead), so ch stays in order
    return Code(
        crptr=np.concatenate(([0], np.cumsum(np.bincount(step_rank[keep_step],
                                                         minlength=cp.ranks)))).astype(dt),
        cop=code.cop[keep_step], cipc=code.cipc[keep_step], cwk=code.cwk[keep_step],
        ccost=code.ccost[keep_step], cspan=code.cspan[keep_step],
        chptr=np.concatenate(([0], np.cumsum(hcnt[keep_step]))).astype(dt),
        ch=code.ch[keep_h],
        cuptr=cuptr,
        cinit=code.cinit[keep_step] if len(code.cinit) else code.cinit), units

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

import numpy as np

from schedsim.errors import ScenarioError
from schedsim.sim.compile import Compiled
from schedsim.sim.kernels import Step

I64 = np.int64


def make_free(cp: Compiled, ops: list[tuple[int, int]],
              messages: list[tuple[str, int, int]]) -> None:
    """Make ``ops`` ((rank, instruction index) of compute ops) and ``messages``
    ((kind, producing stage, mb) keys) free in ``cp`` (module docstring). Raises
    :class:`ScenarioError` naming an op or message the program does not have."""
    if ops:
        step_rank = np.repeat(np.arange(cp.ranks, dtype=I64), np.diff(cp.crptr))
        is_c = cp.cop == Step.COMPUTE
        where = {(r, i): g for g, r, i in zip(np.flatnonzero(is_c).tolist(),
                                               step_rank[is_c].tolist(),
                                               cp.cipc[is_c].tolist())}
        for r, i in ops:
            g = where.get((int(r), int(i)))
            if g is None:
                raise ScenarioError(f"free op: rank {r} has no compute op at instruction {i}")
            cp.ccost[g] = 0.0
    if not messages:
        return
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
        cp.mocc = cp.mocc.copy()
        cp.mlat = cp.mlat.copy()
        cp.mocc[fm] = 0.0
        cp.mlat[fm] = 0.0
        return
    _drop_handles(cp, np.concatenate((2 * fm, 2 * fm + 1)))


def _drop_handles(cp: Compiled, gone: np.ndarray) -> None:
    """Remove handles ``gone`` from every step and unit; drop emptied launches and units."""
    nh = 2 * cp.num_messages
    dead = np.zeros(nh, bool)
    dead[gone] = True
    # units: keep the handles that stay, drop emptied units, renumber
    ucnt_old = np.diff(cp.unit_hptr)
    uid = np.repeat(np.arange(len(cp.unit_stream), dtype=I64), ucnt_old)
    keep_uh = ~dead[cp.unit_h]
    ucnt = np.bincount(uid[keep_uh], minlength=len(cp.unit_stream))
    ukeep = ucnt > 0
    unew = np.cumsum(ukeep) - 1
    cp.unit_h = cp.unit_h[keep_uh]
    cp.unit_stream = cp.unit_stream[ukeep]
    cp.unit_hptr = np.concatenate(([0], np.cumsum(ucnt[ukeep]))).astype(I64)
    if len(unew):
        cp.hunit = np.where(cp.hunit >= 0, unew[np.maximum(cp.hunit, 0)], -1)
    cp.hunit[dead] = -1
    # steps: drop the dead handles; drop launches left empty (unless they create a
    # communicator under lazy init)
    ns = len(cp.cop)
    cnt = np.diff(cp.chptr)
    sid = np.repeat(np.arange(ns, dtype=I64), cnt)
    keep_h = ~dead[cp.ch]
    hcnt = np.bincount(sid[keep_h], minlength=ns)
    is_l = cp.cop == Step.LAUNCH
    keep_step = ~is_l | (hcnt > 0) | (cp.lazy_init & (cp.cinit >= 0))
    # units of each step: the first and last unit ids of the step, renumbered
    ulo, uhi = cp.cuptr[:-1], cp.cuptr[1:]
    kept_before = np.concatenate(([0], np.cumsum(ukeep))).astype(I64)
    new_lo, new_hi = kept_before[ulo], kept_before[uhi]
    step_rank = np.repeat(np.arange(cp.ranks, dtype=I64), np.diff(cp.crptr))
    cp.ch = cp.ch[keep_h]
    cp.chptr = np.concatenate(([0], np.cumsum(hcnt[keep_step]))).astype(I64)
    # the handles of dropped steps are none (they were all dead), so ch stays in order
    cp.cuptr = np.concatenate((new_lo[keep_step], new_hi[keep_step][-1:] if keep_step.any()
                               else [0])).astype(I64)
    for name in ("cop", "cipc", "cwk", "ccost", "cspan", "cinit"):
        setattr(cp, name, getattr(cp, name)[keep_step])
    cp.crptr = np.concatenate(([0], np.cumsum(np.bincount(step_rank[keep_step],
                                                          minlength=cp.ranks)))).astype(I64)

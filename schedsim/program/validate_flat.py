"""The rules of :mod:`schedsim.program.validate` checked over the flat form in a few array
operations: :func:`is_valid` answers "does any rule fail?" for a whole schedule at once.
Only when one does is the per-op validator run, to find and word the first violation; so
a valid million-op schedule is checked in milliseconds and an invalid one is reported
exactly as before. (The tests check that both agree on random schedules.)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from schedsim.program.flat import FlatSchedule, ranks_of

I64 = np.int64
_F, _B, _W, _BW, _FB = 0, 1, 2, 3, 4


def is_valid(fs: FlatSchedule, placement: Any, microbatches: int, complete: bool) -> bool:
    """True if schedule ``fs`` (under ``placement``, ``microbatches``) breaks none of the
    rules of :func:`schedsim.program.validate.validate_schedule` (``complete``: rule 3 as
    well; else every same-rank input must be made, as for a program)."""
    pl, M = placement, microbatches
    S = pl.stages
    if fs.ranks != pl.ranks or (pl.kind == "dual" and pl.microbatches != M):
        return False
    if len(fs.fb_at) and not (np.all(fs.kind[fs.fb_at] == _FB)
                              and np.all((fs.fb_kind == _B) | (fs.fb_kind == _BW))):
        return False
    if np.count_nonzero(fs.kind == _FB) != len(fs.fb_at):
        return False
    op, kind, stage, mb = fs.atoms()
    if not (np.all((kind >= 0) & (kind <= _BW)) and np.all((stage >= 0) & (stage < S))
            and np.all((mb >= 0) & (mb < M))):
        return False
    rank = np.repeat(np.arange(fs.ranks, dtype=I64), np.diff(fs.rptr))[op]
    if np.any(ranks_of(pl, stage, mb) != rank):
        return False
    code = (kind * S + stage) * M + mb
    present = np.zeros(4 * S * M, bool)
    present[code] = True
    if np.count_nonzero(present) != len(code):           # a duplicate atom
        return False
    has = present.reshape(4, S, M)
    has_bw = kind != _F
    if complete:
        if not has[_F].all():
            return False
        if has_bw.any():
            bw, b, w = has[_BW], has[_B], has[_W]
            if np.any(bw & (b | w)) or np.any(~bw & ~(b & w)) or np.any(b != w):
                return False
        elif has[_B].any() or has[_W].any():
            return False
    # order: a same-rank input is made by an earlier op (programs: made at all)
    where = np.full(2 * S * M, -1, I64)                  # output key -> op index
    out_k = np.where(kind == _F, 0, 1)
    makes = kind != _W
    out_code = (out_k * S + stage) * M + mb
    where[out_code[makes]] = op[makes]
    return _inputs_in_order(op, kind, stage, mb, rank, where, pl, S, M, complete)


def _inputs_in_order(op: np.ndarray, kind: np.ndarray, stage: np.ndarray, mb: np.ndarray,
                     rank: np.ndarray, where: np.ndarray, pl: Any, S: int, M: int,
                     complete: bool) -> bool:
    """Every need of every atom (:func:`schedsim.program.routing.needs`) that lives on the
    same rank is made by an earlier op (and, unless ``complete``, made at all)."""
    is_f = kind == _F
    is_b = (kind == _B) | (kind == _BW)
    last = stage == S - 1
    needs = [  # (which atoms, need kind 0 F / 1 B, need stage)
        (is_f & (stage > 0), 0, stage - 1),
        (is_b & ~last, 1, stage + 1),
        (is_b, 0, stage),
        (kind == _W, 1, stage),
    ]
    for mask, nk, ns in needs:
        if not mask.any():
            continue
        a = np.flatnonzero(mask)
        src_rank = ranks_of(pl, ns[a], mb[a])
        same = src_rank == rank[a]
        a, nsa = a[same], ns[a][same]
        src = where[(nk * S + nsa) * M + mb[a]]
        if np.any((src >= 0) & (src >= op[a])):
            return False
        if not complete and np.any(src < 0):
            return False
    return True

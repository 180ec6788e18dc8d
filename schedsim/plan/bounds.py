"""A cheap bound of a candidate, before any simulation: a lower bound on the makespan
(pure compute plus the warm-up and cool-down chains every schedule must wait through),
from the program and the costs alone.

**Makespan lower bound** (:func:`makespan_lower_bound`). For rank ``r`` of a program:

- ``work_r``: the summed cost of its compute ops (ops of one rank never overlap, and an
  op lasts at least its cost under every semantics);
- ``start_r``: its first op is a forward of one of its stages ``s`` (every op of
  ``(s, mb)`` needs ``F(s, mb)`` first), which needs the forwards of stages ``0..s-1``
  of that microbatch: ``start_r >= min over s on r of sum_{s' < s} f_min[s']``;
- its last backward (``B``, ``BW`` or an ``FB``) ends after all its forwards and
  backwards (each forward precedes the backward of the same ``(stage, mb)``, on the same
  rank), and is followed by the backward chain of the stages below it:
  ``tail_r = min over s on r of sum_{s' < s} b_min[s']``.

So ``makespan >= max_r max(start_r + work_r, start_r + (work_r - w_r) + tail_r)``, with
``w_r`` the cost of the rank's ``W`` ops. ``f_min[s]`` (``b_min[s]``) is the cheapest op
that holds a forward (backward) of stage ``s``: an ``FB`` op's parts are available at its
end. Link costs only add, so the bound holds under ``data``, ``eager`` and
``rendezvous``; for 1F1B it equals the closed form ``(p - 1)(F + BW) + m (F + BW)``
(Narayanan et al., SC'21, Sec. 2.2), for zero-bubble orders ``(p - 1) F + m (F + B + W)``
or the ``B`` chain, whichever is larger (Qi et al., ICLR 2024, Sec. 3).
"""
from __future__ import annotations

import numpy as np

from schedsim.program.flat import Opcode, OpKind
from schedsim.program.ir import Program
from schedsim.sim.costs import CostModel


def _compute_ops(program: Program) -> tuple[np.ndarray, ...]:
    """``(rank, kind, stage, mb, bkind, bstage, bmb)`` of every compute instruction, in
    program order (``bkind`` etc.: an FB's backward part, -1 elsewhere)."""
    fl = program.flat()
    comp = _compute_instructions(program)
    rank = fl.rank_of_instr()[comp].astype(np.int64)
    kind = fl.kind[comp].astype(np.int64)
    stage = fl.stage[comp].astype(np.int64)
    mb = fl.mb[comp].astype(np.int64)
    bkind = np.full(len(comp), -1, np.int64)
    bstage, bmb = bkind.copy(), bkind.copy()
    if len(fl.fb_at):
        at = np.searchsorted(comp, fl.fb_at)
        bkind[at], bstage[at], bmb[at] = fl.fb_kind, fl.fb_stage, fl.fb_mb
    return rank, kind, stage, mb, bkind, bstage, bmb


def _compute_instructions(program: Program) -> np.ndarray:
    """Global instruction indices of the compute instructions, in program order."""
    fl = program.flat()
    return np.flatnonzero(fl.code == Opcode.COMPUTE)


class ProgramShape:
    """What the bounds need of a program, costs aside: its compute ops grouped by
    ``(rank, kind, stage, backward part's kind and stage)`` with their counts (the
    microbatch only matters to per-microbatch cost overrides, for which the ops are
    kept). Build once per program, bound it under many cost models; after :meth:`lower_bound`, ``shortest`` is the cheapest op's cost."""

    def __init__(self, program: Program) -> None:
        self.ranks = program.placement.ranks
        self.stages = program.placement.stages
        self.ops = _compute_ops(program)
        rank, kind, stage, _, bkind, bstage, _ = self.ops
        rows = np.stack([rank, kind, stage, bkind, bstage], axis=1) if len(kind) else \
            np.zeros((0, 5), np.int64)
        self.groups, self.count = np.unique(rows, axis=0, return_counts=True)
        self.placement = program.placement

    def lower_bound(self, costs: CostModel) -> float:
        """:func:`makespan_lower_bound` of the program with ``costs``."""
        if costs.overrides:             # per-microbatch costs: every op
            rank, kind, stage, mb, bkind, bstage, bmb = self.ops
            count = np.ones(len(kind))
        else:
            rank, kind, stage, bkind, bstage = self.groups.T if len(self.groups) else \
                [np.zeros(0, np.int64)] * 5
            mb = bmb = np.zeros(len(kind), np.int64)
            count = self.count.astype(np.float64)
        if not len(kind):
            self.shortest = 0.0
            return 0.0
        c = np.asarray(costs.op_costs(kind, stage, mb, np.maximum(bkind, 0),
                                      np.maximum(bstage, 0), np.maximum(bmb, 0)), np.float64)
        self.shortest = float(c.min())
        return _bound(self.ranks, self.stages, rank, kind, stage, bkind, bstage, c, count)


def _bound(ranks: int, stages: int, rank: np.ndarray, kind: np.ndarray, stage: np.ndarray,
           bkind: np.ndarray, bstage: np.ndarray, c: np.ndarray, count: np.ndarray
           ) -> float:
    """The bound of the module docstring over ops (or groups of ``count`` equal ops) of
    cost ``c``."""
    work = np.bincount(rank, weights=c * count, minlength=ranks)
    w_work = np.bincount(rank, weights=np.where(kind == OpKind.W, c * count, 0.0),
                         minlength=ranks)
    fb = kind == OpKind.FB
    f_min = np.full(stages, np.inf)          # cheapest op holding a forward of a stage
    b_min = np.full(stages, np.inf)          # ... a backward
    has_f = (kind == OpKind.F) | fb
    np.minimum.at(f_min, stage[has_f], c[has_f])
    back = (kind == OpKind.B) | (kind == OpKind.BW)
    np.minimum.at(b_min, stage[back], c[back])
    fb_back = fb & ((bkind == OpKind.B) | (bkind == OpKind.BW))
    np.minimum.at(b_min, bstage[fb_back], c[fb_back])
    f_pre = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(f_min), f_min, 0.0))])
    b_pre = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(b_min), b_min, 0.0))])
    best = 0.0
    for r in range(ranks):
        here = rank == r
        mine = np.unique(np.concatenate([stage[here], bstage[here & fb]]))
        if not len(mine):
            continue
        start = float(f_pre[mine].min())
        tail = float(b_pre[mine].min()) if bool((here & (back | fb_back)).any()) else 0.0
        best = max(best, start + float(work[r]), start + float(work[r] - w_work[r]) + tail)
    return best


def makespan_lower_bound(program: Program, costs: CostModel) -> float:
    """A lower bound on the makespan of ``program`` with ``costs`` under any comm
    semantics, link and comm policy (module docstring), in ``costs.unit``."""
    return ProgramShape(program).lower_bound(costs)

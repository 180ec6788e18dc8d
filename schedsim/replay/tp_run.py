"""The replay's tensor-parallel plumbing (``--set tp=N``), called by
:mod:`schedsim.replay.worker`: process layout and TP groups, the collective records, and
the per-pipeline-rank view rank 0 builds the measured timeline and the gradient check
from.

Layout (Megatron's order, TP innermost): process ``g`` is TP rank ``g % tp`` of pipeline
rank ``g // tp``; the TP group of pipeline rank ``p`` is processes ``p*tp .. p*tp+tp-1``.
Each TP rank runs its pipeline rank's whole program (the TP ranks of a stage replicate the
pipeline's P2P traffic between matching TP ranks, as Megatron without sequence
parallelism does).
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from schedsim.replay.config import ReplayConfig
from schedsim.replay.tensor_parallel import TPContext, unshard


def layout(rank: int, tp: int) -> tuple[int, int]:
    """``(pipeline rank, TP rank)`` of process ``rank``."""
    return divmod(rank, tp)


def make_context(cfg: ReplayConfig, rank: int, pp_ranks: int, stamp: Any) -> TPContext:
    """Create every pipeline rank's TP group (collective: every process calls it, in the
    same order) and return this process's :class:`TPContext`."""
    tp = cfg.tp
    groups = [dist.new_group(list(range(p * tp, (p + 1) * tp))) for p in range(pp_ranks)]
    pp, t = layout(rank, tp)
    return TPContext(groups[pp], tp, t, cfg.tp_comm, stamp)


def resolve_collectives(raw: list[tuple], resolve: Any, offset_ns: int) -> list[tuple]:
    """Collective records with their stamps as int ns on rank 0's clock."""
    return [(*r[:8], resolve(r[8]) + offset_ns, resolve(r[9]) + offset_ns, r[10])
            for r in raw]


def param_names(cfg: ReplayConfig) -> list[str]:
    """A stage's parameter names in ``named_parameters`` order (the same for every
    stage, and for its TP shards)."""
    from schedsim.replay.stage_modules import StageModule

    return [n for n, _ in StageModule(cfg).named_parameters()]


def pp_view(got: list[Any], cfg: ReplayConfig) -> list[Any]:
    """The gathered ``(records, grads, losses, offset)`` of every process reduced to one
    entry per pipeline rank: TP rank 0's records, losses and offset, and the full
    gradients reassembled from every TP rank's shards."""
    tp, names = cfg.tp, param_names(cfg)
    out = []
    for p in range(len(got) // tp):
        recs, grads, losses, offset = got[p * tp]
        full = None
        if grads is not None:
            full = {k: [unshard(n, [got[p * tp + t][1][k][i] for t in range(tp)], cfg)
                        for i, n in enumerate(names)] for k in grads}
        out.append((recs, full, losses, offset))
    return out


def replica_error(got: list[Any], cfg: ReplayConfig) -> float:
    """Largest relative difference between the TP ranks' copies of a replicated
    parameter's gradient (they must agree)."""
    from schedsim.replay.tensor_parallel import REPLICATED

    tp, worst, names = cfg.tp, 0.0, param_names(cfg)
    for p in range(len(got) // tp):
        grads0 = got[p * tp][1] or {}
        for k in grads0:
            for i, n in enumerate(names):
                if not n.endswith(REPLICATED):
                    continue
                ref = grads0[k][i].double()
                scale = max(float(ref.abs().max()), 1e-30)
                for t in range(1, tp):
                    g = got[p * tp + t][1][k][i].double()
                    worst = max(worst, float((g - ref).abs().max()) / scale)
    return worst


def measured_pieces(got_step: list[dict[str, Any]], tp: int, origin: int
                    ) -> list[dict[str, Any]]:
    """``Timeline.pieces`` (:mod:`schedsim.sim.pieces`) of one measured step from every
    process's resolved records (process order); times in ms from ``origin`` (ns)."""
    out = []
    for g, rec in enumerate(got_step):
        pp, t = layout(g, tp)
        for (i, kind, stage, mb, name, coll, layer, half, t0, t1,
             nbytes) in rec.get("collectives", ()):
            out.append({"rank": pp, "index": i, "stream": "collective", "name": name,
                        "kind": kind, "mb": mb, "stage": stage, "layer": layer,
                        "half": half, "collective": coll, "group": "tp",
                        "bytes": float(nbytes), "start": (t0 - origin) / 1e6,
                        "end": (t1 - origin) / 1e6, "tp_rank": t})
    out.sort(key=lambda p: (p["rank"], p["tp_rank"], p["start"]))
    return out

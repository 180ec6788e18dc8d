"""An FB pair's pieces in Megatron-LM's combined-1F1B launch order (``overlap = "megatron"``).

Megatron-LM's EP overlap (``overlap_moe_expert_parallel_comm``) runs the forward of one
microbatch and the backward of another layer by layer, forward layer ``i`` with backward
layer ``L-1-i`` (``megatron/core/models/common/model_chunk_schedule_plan.py``,
``TransformerModelChunkSchedulePlan.run``), and inside each layer pair launches its
nodes in this order (``TransformerLayerSchedulePlan.run``; all-to-alls on the comm
stream, the rest on the compute stream)::

    B combine (a2a) | F attention | B mlp (+ W unless delayed) | F dispatch (a2a)
    | B mlp W (delay_wgrad_compute) | B dispatch (a2a) | F mlp | F combine (a2a)
    | B attention (+ W unless delayed) | B attention W (delayed; the last backward
    layer's after everything, to overlap the P2P)

so that each all-to-all of one part runs under a compute node of the other: "comm:
combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd; comp: pre_dispatch_fwd |
mlp_bwd->mlp_bwd_dw->mlp_fwd | pre_dispatch_bwd". Layers one part has more of run
after the pairs (backward first, then forward), in the same node order. A dense layer has
no dispatch or combine; its TP collectives belong to their block.

Plain Python (no torch).
"""
from __future__ import annotations

from dataclasses import replace

from schedsim.sim.overlap import Piece

#: the blocks a piece belongs to (stage_model's builders label them)
BLOCKS = ("attention", "dispatch", "mlp", "combine", "mlp-w", "attention-w")


def _slots(delay_wgrad: bool, last_b: bool) -> list[tuple[int, str]]:
    """One layer pair's node order: (part, block), part 0 = forward, 1 = backward."""
    order = [(1, "combine"), (0, "attention"), (1, "mlp")]
    order += [(0, "dispatch"), (1, "mlp-w")] if delay_wgrad else [(1, "mlp-w"), (0, "dispatch")]
    order += [(1, "dispatch"), (0, "mlp"), (0, "combine"), (1, "attention")]
    if not (delay_wgrad and last_b):
        order.append((1, "attention-w"))
    return order


def combined_order(f: list[Piece], f_blocks: list[str], b: list[Piece],
                   b_blocks: list[str], delay_wgrad: bool = False) -> list[Piece]:
    """The pieces of forward ``f`` and backward ``b`` (each with its own dependencies
    and each piece's block, :data:`BLOCKS`) as one op, in the launch order of the module
    docstring; ``which`` is 0 for the forward's pieces, 1 for the backward's. Every
    dependency still points to an earlier piece (each part keeps its own order)."""
    groups: dict[tuple[int, int, str], list[int]] = {}
    for part, pieces, blocks in ((0, f, f_blocks), (1, b, b_blocks)):
        for i, (p, blk) in enumerate(zip(pieces, blocks)):
            groups.setdefault((part, p.layer, blk), []).append(i)
    f_layers = sorted({p.layer for p in f})
    b_layers = sorted({p.layer for p in b}, reverse=True)
    n = min(len(f_layers), len(b_layers))
    steps = [(f_layers[i], b_layers[i]) for i in range(n)]
    steps += [(None, ly) for ly in b_layers[n:]] + [(ly, None) for ly in f_layers[n:]]
    order: list[tuple[int, int]] = []          # (part, index in that part)
    for lf, lb in steps:
        for part, blk in _slots(delay_wgrad, lb == b_layers[-1] if b_layers else False):
            layer = lf if part == 0 else lb
            if layer is not None:
                order += [(part, i) for i in groups.get((part, layer, blk), ())]
    if delay_wgrad and b_layers:               # the first layer's attention W, last
        order += [(1, i) for i in groups.get((1, b_layers[-1], "attention-w"), ())]
    pos = {key: k for k, key in enumerate(order)}
    src = (f, b)
    return [replace(src[part][i], which=part,
                    deps=tuple(pos[(part, d)] for d in src[part][i].deps))
            for part, i in order]

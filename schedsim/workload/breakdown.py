"""The derived costs of a workload as data: per stage and per rank, in ms and bytes (what
``schedsim costs`` prints and writes)."""
from __future__ import annotations

from typing import Any

from schedsim.program.ir import Op, Placement
from schedsim.workload.derive import DerivedWorkload


def costs_breakdown(d: DerivedWorkload, placement: Placement) -> dict[str, Any]:
    """What ``schedsim costs`` prints (and writes with ``--json``) of a workload derived
    on ``placement``: per stage its layers, embedding/head, FLOPs per microbatch on one
    rank, ms per op kind and per piece (per layer), activation bytes; per rank the static
    bytes (params, grads, optimizer states, FSDP's unsharded copy, receive buffers) and
    the step boundary in ms."""
    stages = []
    for s, p in enumerate(d.pieces):
        st, sb = p.layout, d.stage_bytes[s]
        pieces = {"attention": p.attention.model_dump(), "mlp" if not d.workload.model.experts
                  else "experts": p.mlp.model_dump()}
        if p.dense_mlp is not None:
            pieces["mlp"] = p.dense_mlp.model_dump()
        for name, b in (("embedding", p.embedding), ("head", p.head)):
            if b is not None:
                pieces[name] = b.model_dump()
        stages.append({
            "stage": s, "rank": placement.rank_of(s), "layers": st.layers,
            "first_layer": st.first, "embedding": st.embedding, "head": st.head,
            "flops": p.flops,
            "ms": {k: d.costs.cost(Op(k, s, 0)) for k in ("F", "B", "W", "BW")},
            "piece_ms_per_layer": pieces,
            "activation_bytes": {"stored": sb.stored, "stash_w": sb.stash_w,
                                 "working": sb.working, "rows": list(sb.rows)}})
    ranks = [{"rank": r, "params": x.params, "grads": x.grads, "optimizer": x.optimizer,
              "fsdp_unsharded": x.unsharded, "recv_buffers": d.recv_bytes[r],
              "step_boundary_ms": d.step_boundary[r]} for r, x in enumerate(d.static)]
    return {"unit": "ms", "model": d.workload.model.name, "gpu": d.workload.gpu.name,
            "message_bytes": d.costs.message_bytes,
            "model_flops_per_step": d.model_flops_per_step,
            "tokens_per_step": d.tokens_per_step, "stages": stages, "ranks": ranks}

"""Gradient check: the replay's loss and parameter gradients against the single-process
reference (:func:`schedsim.replay.stage_modules.reference_step`).

Per stage the replay's gradient is the sum over every copy of the stage's parameters
(DualPipe's ``dual`` placement holds stage s twice, on rank s for direction 0 and on rank
P-1-s for direction 1; as in deepseek-ai/DualPipe ``examples/example_dualpipe.py``, the
two copies' gradients are summed). Error of one parameter tensor:
``max|g - g_ref| / max|g_ref|`` (relative to the tensor's largest reference entry, so
near-zero entries do not blow it up); a stage's error is the max over its tensors. The
loss (mean over microbatches) is compared the same way.

Tolerances (:data:`TOLERANCE`): ``1e-9`` in float64 and ``1e-4`` in float32. The replay
runs the same kernels on the same microbatches as the reference; only the order in which
microbatch gradients are accumulated (and the copy sums) differ, which costs a few ulps
per add — about 1e-15 relative in float64 and 1e-6 in float32 for the test models, two to
five orders of magnitude inside the tolerance.
"""
from __future__ import annotations

from typing import Any

import torch

from schedsim.replay.config import ReplayConfig
from schedsim.replay.stage_modules import reference_step

#: max relative error allowed, per dtype
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}

_TINY = 1e-30


def _rel(g: torch.Tensor, ref: torch.Tensor) -> float:
    g, ref = g.double().cpu(), ref.double().cpu()
    scale = max(float(ref.abs().max()), _TINY) if ref.numel() else 1.0
    return float((g - ref).abs().max()) / scale if ref.numel() else 0.0


def grad_check(cfg: ReplayConfig, stages: int, microbatches: int,
               grads: list[dict[tuple[int, int], list[torch.Tensor]]],
               losses: list[dict[int, float]], device: Any = "cpu") -> dict[str, Any]:
    """Compare the replay (``grads``/``losses`` of every rank, in rank order) with the
    reference. Returns ``{passed, max_rel_error, tolerance, per_stage: [{stage,
    max_rel_error, copies}], loss, ref_loss, loss_rel_error, dtype}``.

    A stage no rank computed, or a microbatch without a loss, fails the check (its error
    is reported as infinity).
    """
    tol = TOLERANCE[cfg.dtype]
    summed: dict[int, list[torch.Tensor]] = {}
    copies: dict[int, int] = {}
    for per_rank in grads:
        for (s, _direction), gs in per_rank.items():
            gs = [g.double().cpu() for g in gs]
            if s in summed:
                summed[s] = [a + b for a, b in zip(summed[s], gs)]
            else:
                summed[s] = gs
            copies[s] = copies.get(s, 0) + 1
    ref_loss, _ref_losses, ref_grads = reference_step(cfg, stages, microbatches, device)
    per_stage = []
    for s in range(stages):
        if s not in summed:
            err = float("inf")
        else:
            err = max((_rel(g, r) for g, r in zip(summed[s], ref_grads[s])), default=0.0)
        per_stage.append({"stage": s, "max_rel_error": err, "copies": copies.get(s, 0)})
    got: dict[int, float] = {}
    for per_rank in losses:
        got.update(per_rank)
    if len(got) == microbatches:
        loss = sum(got[mb] for mb in range(microbatches)) / microbatches
        loss_err = abs(loss - ref_loss) / max(abs(ref_loss), _TINY)
    else:
        loss, loss_err = float("nan"), float("inf")
    worst = max([p["max_rel_error"] for p in per_stage] + [loss_err])
    return {"passed": bool(worst <= tol), "max_rel_error": worst, "tolerance": tol,
            "per_stage": per_stage, "loss": loss, "ref_loss": ref_loss,
            "loss_rel_error": loss_err, "dtype": cfg.dtype}

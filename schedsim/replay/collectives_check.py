"""``schedsim check-collectives``: what each way of writing the tensor-parallel
all-reduce does to the gradients, measured on ``tp`` gloo processes in float64.

The layer: ``y = g(gelu(f(x) W1_r^T + b1_r) W2_r^T)``, ``loss = 0.5 |y - t|^2 / batch``
— a column-parallel linear (rank r holds rows ``W1_r``, ``b1_r``) and a row-parallel one
(columns ``W2_r``; no bias: a bias added after the reduction is a replicated parameter,
which no collective touches) with Megatron's f before and g after (Megatron-LM
``megatron/core/tensor_parallel/mappings.py``). Every rank holds the same ``x``, ``t``
and full weights (seeded) and its shards, so ``loss`` is *replicated*: each rank computes
the same number. Variants (:data:`VARIANTS`) write f and g differently; each rank's
gradients of ``W1_r``, ``b1_r``, ``W2_r`` (gathered into full tensors) and of ``x`` are
fitted against the single-process gradients of (a) the replicated loss and (b) the loss
summed over ranks (``tp x loss``: what an ``x.grad = 4`` on 4 ranks measures): the
least-squares scale ``s = <g, r> / <r, r>`` per tensor; a variant has a scale when every
tensor has the same one and ``|g - s r| <= 1e-9 |r|`` (else null: not a multiple).

Finding (:func:`_hazard`): a raw in-place ``dist.all_reduce`` on a tensor autograd saved
for backward (``tanh`` saves its output) changes it without bumping its version counter,
so backward silently uses the reduced values; the same change through a tracked in-place
op raises autograd's "modified by an inplace operation" error. The measured relative
error of the silent gradient is reported.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from schedsim.replay.config import JobSpec
from schedsim.replay.launch import init_group
from schedsim.replay.tensor_parallel import (
    CopyToTP,
    DominoCopy,
    DominoWait,
    ReduceFromTP,
    TPContext,
    _Box,
)
from schedsim.util.files import atomic_write_text

#: (name, note) of every variant, in table order
VARIANTS: list[tuple[str, str]] = [
    ("megatron-fg", "Megatron's f (identity fwd, all-reduce bwd) and g (all-reduce fwd, "
                    "identity bwd)"),
    ("raw-forward-allreduce", "Domino: g is a raw in-place dist.all_reduce outside autograd "
                              "(autograd sees the identity, which is g's backward); f "
                              "all-reduces the input grad async with a deferred wait"),
    ("allreduce-both-ways", "an autograd Function all-reducing in forward and backward (a "
                            "common hand-written AllReduce): every rank's gradient is the "
                            "sum of tp identical ones"),
    ("torch-nn-functional", "torch.distributed.nn.functional.all_reduce: its backward "
                            "all-reduces the gradient too"),
    ("no-f", "g right but f forgotten: weights fine, the input gradient is one rank's "
             "partial sum"),
]
#: batch, input and output sizes; the hidden size is 3 per rank
SIZES = {"batch": 3, "in": 5, "hidden_per_rank": 3, "out": 4}
TOL = 1e-9


class _AllReduceBothWays(torch.autograd.Function):
    """All-reduce in forward and in backward (a common hand-written AllReduce)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, group: Any):  # type: ignore[override]
        ctx.group = group
        z = z.clone()
        dist.all_reduce(z, group=group)
        return z

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def _data(n: int) -> dict[str, torch.Tensor]:
    """The seeded full tensors (float64), identical on every rank."""
    g = torch.Generator().manual_seed(1234)
    s = SIZES
    h = s["hidden_per_rank"] * n
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return {"x": r(s["batch"], s["in"]), "t": r(s["batch"], s["out"]),
            "W1": r(h, s["in"]) / s["in"] ** 0.5, "b1": r(h) * 0.1,
            "W2": r(s["out"], h) / h ** 0.5}


def _loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((y - t) ** 2).sum() / y.shape[0]


def reference(d: dict[str, torch.Tensor], factor: float = 1.0) -> dict[str, torch.Tensor]:
    """Single-process gradients of ``factor x loss`` w.r.t. ``W1, b1, W2, x``."""
    p = {k: d[k].clone().requires_grad_(True) for k in ("W1", "b1", "W2", "x")}
    y = F.gelu(p["x"] @ p["W1"].T + p["b1"]) @ p["W2"].T
    (factor * _loss(y, d["t"])).backward()
    return {k: v.grad for k, v in p.items()}


def _shards(d: dict[str, torch.Tensor], r: int, n: int) -> dict[str, torch.Tensor]:
    k = d["W1"].shape[0] // n
    return {"W1": d["W1"][r * k:(r + 1) * k].clone(), "b1": d["b1"][r * k:(r + 1) * k].clone(),
            "W2": d["W2"][:, r * k:(r + 1) * k].clone(), "x": d["x"].clone()}


def _run_variant(name: str, d: dict[str, torch.Tensor], tp: TPContext
                 ) -> dict[str, torch.Tensor]:
    """This rank's gradients (shards, and x) under variant ``name``."""
    p = {k: v.requires_grad_(True) for k, v in _shards(d, tp.rank, tp.size).items()}
    x = p["x"]
    box = _Box()
    if name == "no-f":
        u = x
    elif name == "raw-forward-allreduce":
        u = DominoCopy.apply(DominoWait.apply(x, box), tp, box, "f")
    else:
        u = CopyToTP.apply(x, tp, "f")
    z = F.gelu(u @ p["W1"].T + p["b1"]) @ p["W2"].T          # partial sums
    if name in ("megatron-fg", "no-f"):
        y = ReduceFromTP.apply(z, tp, "g")
    elif name == "raw-forward-allreduce":
        dist.all_reduce(z, group=tp.group)                   # in place, outside autograd
        y = z
    elif name == "allreduce-both-ways":
        y = _AllReduceBothWays.apply(z, tp.group)
    elif name == "torch-nn-functional":
        import torch.distributed.nn.functional as dnnf

        y = dnnf.all_reduce(z, group=tp.group or dist.group.WORLD)
    else:
        raise ValueError(f"unknown variant {name!r}")
    _loss(y, d["t"]).backward()
    return {k: v.grad.detach().clone() for k, v in p.items()}


def _hazard(d: dict[str, torch.Tensor], tp: TPContext) -> dict[str, Any]:
    """The saved-tensor hazard on this rank: ``s = tanh(h)`` (tanh saves ``s``), then
    ``s`` is summed over the ranks (a) through Megatron's g — correct — (b) by a raw
    in-place ``dist.all_reduce(s)`` — backward then uses the reduced ``s`` — and (c) by a
    tracked in-place copy of the reduced values. Returns this rank's gradients of (a) and
    (b), whether (b) raised, and (c)'s error message."""
    out: dict[str, Any] = {}
    for how in ("g", "raw"):
        p = {k: v.requires_grad_(True) for k, v in _shards(d, tp.rank, tp.size).items()
             if k in ("W1", "b1")}
        s = torch.tanh(d["x"] @ p["W1"].T + p["b1"])
        if how == "g":
            y = ReduceFromTP.apply(s, tp, "g")
        else:
            dist.all_reduce(s, group=tp.group)      # raw, in place, on a saved tensor
            y = s
        try:
            (0.5 * (y ** 2).sum()).backward()
            out[how] = {k: v.grad.detach().clone() for k, v in p.items()}
            out[how + "_raised"] = None
        except RuntimeError as e:                   # pragma: no cover - not on torch 2.x
            out[how], out[how + "_raised"] = None, str(e).splitlines()[0]
    p = {k: v.requires_grad_(True) for k, v in _shards(d, tp.rank, tp.size).items()
         if k in ("W1", "b1")}
    s = torch.tanh(d["x"] @ p["W1"].T + p["b1"])
    red = s.detach().clone()
    dist.all_reduce(red, group=tp.group)
    s.copy_(red)                                     # tracked: bumps the version counter
    try:
        (0.5 * (s ** 2).sum()).backward()
        out["tracked_error"] = None
    except RuntimeError as e:
        out["tracked_error"] = str(e).splitlines()[0].split(": [")[0]
    return out


def fit(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Least-squares ``(scale, relative residual)`` of ``got ~ scale x ref``."""
    g, r = got.double().flatten(), ref.double().flatten()
    rr = float(r @ r)
    if rr == 0.0:
        return (1.0, float(g.norm())) if float(g.norm()) == 0.0 else (float("nan"), 1.0)
    s = float(g @ r) / rr
    return s, float((g - s * r).norm()) / rr ** 0.5


def common_scale(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
                 ) -> float | None:
    """The scale every tensor of ``grads`` shares against ``ref`` (module docstring), or
    None when they are not all one multiple of the reference."""
    fits = [fit(grads[k], ref[k]) for k in ref]
    scales = [s for s, _ in fits]
    if any(res > TOL or s != s for s, res in fits):
        return None
    if max(scales) - min(scales) > TOL * max(1.0, max(abs(s) for s in scales)):
        return None
    return sum(scales) / len(scales)


def _gather_full(per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full tensors from every rank's shards; ``x`` from rank 0 (every rank has one)."""
    return {"W1": torch.cat([g["W1"] for g in per_rank], 0),
            "b1": torch.cat([g["b1"] for g in per_rank], 0),
            "W2": torch.cat([g["W2"] for g in per_rank], 1), "x": per_rank[0]["x"]}


def _correct_for(rep: float | None, summed: float | None) -> str:
    if rep is not None and abs(rep - 1.0) <= TOL:
        return "replicated"
    if summed is not None and abs(summed - 1.0) <= TOL:
        return "summed"
    return "neither"


def summarize(n: int, gathered: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Rank 0: the result dict from every rank's ``(variant grads, hazard)``."""
    d = _data(n)
    ref_rep, ref_sum = reference(d), reference(d, float(n))
    variants = []
    for j, (name, note) in enumerate(VARIANTS):
        full = _gather_full([g[0][j] for g in gathered])
        rep, summed = common_scale(full, ref_rep), common_scale(full, ref_sum)
        extra = ""
        if rep is None:
            bad = [k for k in ref_rep if fit(full[k], ref_rep[k])[1] > TOL]
            extra = f" (not a multiple of the reference: {', '.join(bad)})"
        variants.append({"name": name, "scale_replicated_loss": rep,
                         "scale_summed_loss": summed,
                         "correct_for": _correct_for(rep, summed), "note": note + extra})
    hz = [g[1] for g in gathered]
    good = {k: torch.cat([h["g"][k] for h in hz], 0) for k in ("W1", "b1")}
    bad = {k: torch.cat([h["raw"][k] for h in hz], 0) for k in ("W1", "b1")}
    err = max(float((bad[k] - good[k]).abs().max()) / max(float(good[k].abs().max()), 1e-30)
              for k in good)
    raised = hz[0]["raw_raised"]
    finding = {"name": "saved-tensor-inplace-allreduce", "silent": raised is None,
               "max_rel_error": err, "tracked_inplace_error": hz[0]["tracked_error"],
               "note": (f"s = tanh(h) is saved by tanh for backward; dist.all_reduce(s) in "
                        f"place does not bump s's version counter, so backward "
                        f"{'ran without an error' if raised is None else 'raised'} and the "
                        f"W1/b1 gradients are off by {err:.3g} (max relative error) against "
                        f"the same forward written with Megatron's g; the same change "
                        f"through s.copy_() "
                        + ("raises: " + hz[0]["tracked_error"]
                           if hz[0]["tracked_error"] else "did not raise"))}
    return {"tp": n, "variants": variants, "findings": [finding]}


def check_rank(spec: JobSpec, measure: Any = None, fold: Any = None
               ) -> dict[str, Any] | None:
    """One process of the check (``spec.config.tp`` of them, gloo, float64): run every
    variant and the hazard (or ``measure(data, tp)``), gather on rank 0, which folds
    them (:func:`summarize`, or ``fold(world, gathered)``), writes ``result.json`` to
    ``spec.out_dir`` and returns the result (None on other ranks)."""
    cfg = spec.config
    torch.set_num_threads(cfg.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    deadline = spec.deadline or time.time() + cfg.timeout
    init_group("gloo", rank, world, max(deadline - time.time(), 1.0))
    try:
        tp = TPContext(None, world, rank, "megatron-fg", time.perf_counter_ns)
        d = _data(world)
        if measure is None:
            mine: Any = ([_run_variant(name, d, tp) for name, _ in VARIANTS], _hazard(d, tp))
        else:
            mine = measure(d, tp)
        got: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(mine, got if rank == 0 else None, dst=0)
        res = (summarize if fold is None else fold)(world, got) if rank == 0 else None
        if res is not None and spec.out_dir:
            import json

            atomic_write_text(Path(spec.out_dir) / "result.json", json.dumps(res))
        dist.barrier()          # nobody tears the group down while a peer still uses it
        return res
    finally:
        dist.destroy_process_group()


def run_check(tp: int, timeout: float = 120.0,
              functions: dict[str, str] | None = None) -> dict[str, Any]:
    """Launch the check on ``tp`` local gloo processes (:func:`schedsim.replay.launch`)
    and return rank 0's result: ``{"tp", "variants": [{"name", "scale_replicated_loss",
    "scale_summed_loss", "correct_for", "note"}], "findings": [...]}``. Raises
    :class:`~schedsim.replay.config.ReplayError` when a process fails or times out.
    ``functions``: check the user's operators instead of the built-in variants
    (:mod:`schedsim.replay.user_collective`; the result is its ``summarize``)."""
    from schedsim.replay.config import ReplayConfig
    from schedsim.replay.launch import launch

    spec = JobSpec(program={}, task="check-collectives", functions=functions,
                   config=ReplayConfig(tp=tp, hidden=tp, ffn_mult=1, heads=1,
                                       dtype="float64", timeout=timeout))
    return launch(spec, tp, timeout)

"""``check-collectives --function``: the user's own tensor-parallel reduction, measured
(*torch*; runs in each of the ``tp`` gloo processes, float64).

The user's operator ``g`` (and optionally ``f``) is loaded from ``MODULE:NAME`` or
``FILE.py:NAME`` (:func:`load`) and called with one tensor (an autograd Function through
``.apply``); the tensor-parallel group is the default process group (the check's world
is the ``tp`` ranks). Three measurements per rank:

1. **the operator alone** (:func:`_behaviour`): rank ``r`` feeds ``z_r = (r + 1) u`` and
   back-propagates ``(r + 1) v``; the forward output and the input gradient are each
   classified as ``identity`` (this rank's own), ``all-reduce`` (the sum over ranks), or
   ``other``, and whether the operator changed its input in place without autograd
   seeing it (values changed, version counter not bumped);
2. **the column->row block** of :mod:`schedsim.replay.collectives_check` with ``f``
   (default: Megatron's f, identity forward and all-reduce backward) before the
   column-parallel linear and ``g`` after the row-parallel one: every rank's gradients of
   ``W1, b1, W2`` (gathered) and ``x``, fitted against the single-process gradients of
   the replicated and of the summed loss;
3. **the saved-tensor probe**: ``g`` applied to ``tanh``'s output (which ``tanh`` saves
   for its backward) against the same with Megatron's g: an in-place change that
   autograd does not see corrupts that gradient silently.

The verdict is made from these facts by :func:`schedsim.replay.collective_api.verdict`.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from schedsim.replay.collectives_check import _data, _loss, _shards, fit
from schedsim.replay.tensor_parallel import CopyToTP, ReduceFromTP, TPContext

TOL = 1e-9


def load(spec: str) -> Any:
    """The object ``NAME`` of ``MODULE:NAME`` (importable module) or ``FILE.py:NAME`` (a
    file, loaded as a module of its own). Raises ``ValueError`` naming what is wrong."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"--function {spec!r}: give MODULE:NAME or FILE.py:NAME")
    if where.endswith(".py"):
        path = Path(where)
        mod_name = f"_schedsim_user_{abs(hash(str(path.resolve())))}"
        if mod_name in sys.modules:
            mod = sys.modules[mod_name]
        else:
            s = importlib.util.spec_from_file_location(mod_name, path)
            if s is None or s.loader is None:
                raise ValueError(f"--function {spec!r}: cannot load {path}")
            mod = importlib.util.module_from_spec(s)
            sys.modules[mod_name] = mod
            s.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    obj: Any = mod
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--function {spec!r}: {where} has no {name}")
        obj = getattr(obj, part)
    return obj


def as_op(obj: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``obj`` as a one-tensor operator: an autograd Function's ``apply``, or the
    callable itself."""
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        return obj.apply
    if callable(obj):
        return obj
    raise ValueError(f"{obj!r} is neither an autograd Function nor a callable")


def _kind(got: torch.Tensor, own: torch.Tensor, total: torch.Tensor) -> str:
    """``identity`` (``got`` is ``own``), ``all-reduce`` (``total``), or ``other``."""
    for name, ref in (("identity", own), ("all-reduce", total)):
        if float((got - ref).norm()) <= TOL * max(float(ref.norm()), 1.0):
            return name
    return "other"


def _behaviour(op: Callable, rank: int, n: int) -> dict[str, Any]:
    """How ``op`` acts on this rank (module docstring, 1)."""
    g = torch.Generator().manual_seed(99)
    u = torch.randn(3, 4, generator=g, dtype=torch.float64)
    v = torch.randn(3, 4, generator=g, dtype=torch.float64)
    total = sum(range(1, n + 1))
    leaf = (u * (rank + 1)).requires_grad_(True)
    z = leaf * 1.0                        # a non-leaf, as a layer's output is
    before, version = z.detach().clone(), z._version
    y = op(z)
    inplace = bool((z.detach() - before).abs().max() > 0) and z._version == version
    fwd = _kind(y.detach(), u * (rank + 1), u * total)
    y.backward(v * (rank + 1))
    bwd = _kind(leaf.grad, v * (rank + 1), v * total)
    return {"forward": fwd, "backward": bwd, "inplace_untracked": inplace}


def _block(d: dict[str, torch.Tensor], f_op: Callable, g_op: Callable, rank: int,
           n: int) -> dict[str, torch.Tensor]:
    """This rank's gradients in the column->row block (module docstring, 2)."""
    p = {k: v.requires_grad_(True) for k, v in _shards(d, rank, n).items()}
    z = F.gelu(f_op(p["x"]) @ p["W1"].T + p["b1"]) @ p["W2"].T      # partial sums
    _loss(g_op(z), d["t"]).backward()
    return {k: v.grad.detach().clone() for k, v in p.items()}


def _saved_probe(d: dict[str, torch.Tensor], g_op: Callable, tp: TPContext
                 ) -> dict[str, torch.Tensor]:
    """This rank's ``W1, b1`` gradients with ``g`` on tanh's saved output, and with
    Megatron's g (module docstring, 3)."""
    out = {}
    for how, op in (("user", g_op), ("megatron", lambda s: ReduceFromTP.apply(s, tp, "g"))):
        p = {k: v.requires_grad_(True) for k, v in _shards(d, tp.rank, tp.size).items()
             if k in ("W1", "b1")}
        s = torch.tanh(d["x"] @ p["W1"].T + p["b1"])
        (0.5 * (op(s) ** 2).sum()).backward()
        out.update({f"{how}_{k}": v.grad.detach().clone() for k, v in p.items()})
    return out


def run_rank(functions: dict[str, str], d: dict[str, torch.Tensor], tp: TPContext
             ) -> dict[str, Any]:
    """Everything this rank measures for the user's ``functions`` (``{"g": spec}`` and
    optionally ``"f"``)."""
    g_op = as_op(load(functions["g"]))
    f_op = as_op(load(functions["f"])) if functions.get("f") else \
        (lambda x: CopyToTP.apply(x, tp, "f"))
    out: dict[str, Any] = {"g": _behaviour(g_op, tp.rank, tp.size)}
    if functions.get("f"):
        out["f"] = _behaviour(f_op, tp.rank, tp.size)
    dist.barrier()
    out["grads"] = _block(d, f_op, g_op, tp.rank, tp.size)
    dist.barrier()
    out["probe"] = _saved_probe(d, g_op, tp)
    return out


def summarize(n: int, per_rank: list[dict[str, Any]], functions: dict[str, str]
              ) -> dict[str, Any]:
    """Rank 0: the facts of every rank, fitted (scales per tensor), for
    :func:`~schedsim.replay.collective_api.verdict`."""
    from schedsim.replay.collectives_check import reference

    d = _data(n)
    refs = {"replicated": reference(d), "summed": reference(d, float(n))}
    full = {"W1": torch.cat([g["grads"]["W1"] for g in per_rank], 0),
            "b1": torch.cat([g["grads"]["b1"] for g in per_rank], 0),
            "W2": torch.cat([g["grads"]["W2"] for g in per_rank], 1)}
    tensors: dict[str, dict[str, Any]] = {}
    for k in ("W1", "b1", "W2", "x"):
        row: dict[str, Any] = {}
        for loss, ref in refs.items():
            if k == "x":        # replicated input: every rank must hold the same grad
                fits = [fit(g["grads"]["x"], ref["x"]) for g in per_rank]
                ok = all(res <= TOL for _, res in fits) and \
                    max(s for s, _ in fits) - min(s for s, _ in fits) <= TOL * n
                row[loss] = fits[0][0] if ok else None
            else:
                s, res = fit(full[k], ref[k])
                row[loss] = s if res <= TOL else None
        tensors[k] = row
    xs = [g["grads"]["x"] for g in per_rank]
    x_sum = fit(sum(xs), refs["replicated"]["x"])
    tensors["x"]["ranks_sum_to"] = x_sum[0] if x_sum[1] <= TOL else None
    good = torch.cat([torch.cat([g["probe"]["megatron_W1"].flatten(),
                                 g["probe"]["megatron_b1"]]) for g in per_rank])
    got = torch.cat([torch.cat([g["probe"]["user_W1"].flatten(), g["probe"]["user_b1"]])
                     for g in per_rank])
    probe_err = float((got - good).abs().max()) / max(float(good.abs().max()), 1e-30)
    ops = {k: {"forward": sorted({g[k]["forward"] for g in per_rank}),
               "backward": sorted({g[k]["backward"] for g in per_rank}),
               "inplace_untracked": any(g[k]["inplace_untracked"] for g in per_rank)}
           for k in ("g", "f") if k in per_rank[0]}
    for o in ops.values():
        for side in ("forward", "backward"):
            o[side] = o[side][0] if len(o[side]) == 1 else "other"
    return {"tp": n, "functions": functions, "tensors": tensors, "ops": ops,
            "saved_probe_rel_error": probe_err}

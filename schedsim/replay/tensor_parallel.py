"""Tensor-parallel stages for the replay (``--set tp=N``): Megatron column/row-parallel
linears with the f/g operators, or DeepSpeed Domino's way of writing them.

Sources: Megatron-LM ``megatron/core/tensor_parallel/mappings.py`` (f =
``_CopyToModelParallelRegion``: identity forward, all-reduce backward; g =
``_ReduceFromModelParallelRegion``: all-reduce forward, identity backward) and
``layers.py`` (``ColumnParallelLinear`` applies f to its input, ``RowParallelLinear``
applies g to its output and adds the unsharded bias after it); DeepSpeed
``deepspeed/runtime/domino/transformer.py`` (the microbatch split in two halves; the row
output all-reduced by a raw ``dist.all_reduce(..., async_op=True)`` outside autograd,
waited before use; f as ``_CopyToModelParallelRegionA``, whose backward launches the
input-gradient all-reduce asynchronously, and ``NoOper``, whose backward waits for it).

A TP stage holds exactly the shards of the single-process stage's parameters
(:func:`schedsim.replay.stage_modules.build_stage`), with the same names and order, so the
gradient check reassembles them (:func:`unshard`) and compares with the unchanged
reference. Sharding (``n`` = tp, rank ``r``): ``fc1`` and ``qkv`` column-parallel (rows;
``qkv`` by attention heads), ``fc2`` and ``proj`` row-parallel (columns) with their bias
replicated (:data:`REPLICATED`). Every weight and bias gradient goes through the replay's
B/W split (:data:`~schedsim.replay.stage_modules.WEIGHT_GRADS`): W has no collective.

Each collective is logged (:class:`CollectiveLog`) with its instruction, op part, layer,
Domino half and its start and end on the executor's clock (an async one: launch to the
end of its wait), for the measured timeline's ``pieces``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from schedsim.replay.config import ReplayConfig
from schedsim.replay.stage_modules import WEIGHT_GRADS, _accumulate, _SplitLinearFn, build_stage

#: parameter-name suffixes whose tensors are replicated on every TP rank
REPLICATED = ("fc2.bias", "proj.bias")


@dataclass
class CollectiveLog:
    """Collectives run by this process: ``(index, kind, stage, mb, name, collective,
    layer, half, t0, t1, bytes)`` with clock stamps; ``at`` says which op runs."""

    stamp: Any = None
    records: list[tuple] = field(default_factory=list)
    where: tuple[int, str, int, int] = (-1, "", -1, -1)
    layer: int = 0
    half: int | None = None

    def at(self, index: int, kind: str, stage: int, mb: int) -> None:
        self.where = (index, kind, stage, mb)

    def add(self, name: str, coll: str, t0: Any, t1: Any, nbytes: int) -> None:
        i, k, s, mb = self.where
        self.records.append((i, k, s, mb, name, coll, self.layer, self.half, t0, t1, nbytes))

    def drain(self) -> list[tuple]:
        out, self.records = self.records, []
        return out


class TPContext:
    """This process's tensor-parallel group: ``size``, ``rank``, ``group``, the way the
    collectives are written (``comm``: ``megatron-fg`` or ``domino``) and the log."""

    def __init__(self, group: Any, size: int, rank: int, comm: str, stamp: Any) -> None:
        self.group, self.size, self.rank, self.comm = group, size, rank, comm
        self.log = CollectiveLog(stamp)

    def all_reduce(self, t: torch.Tensor, name: str) -> None:
        """Blocking in-place sum over the group, logged."""
        t0 = self.log.stamp()
        dist.all_reduce(t, group=self.group)
        self.log.add(name, "all-reduce", t0, self.log.stamp(), t.numel() * t.element_size())

    def all_reduce_async(self, t: torch.Tensor, name: str) -> "_Pending":
        """Launch an in-place sum; the returned handle's ``wait()`` logs it."""
        t0 = self.log.stamp()
        work = dist.all_reduce(t, group=self.group, async_op=True)
        return _Pending(self, work, name, t0, t.numel() * t.element_size(),
                        self.log.layer, self.log.half)


class _Pending:
    def __init__(self, tp: TPContext, work: Any, name: str, t0: Any, nbytes: int,
                 layer: int, half: int | None) -> None:
        self.tp, self.work, self.name, self.t0, self.nbytes = tp, work, name, t0, nbytes
        self.layer, self.half = layer, half

    def wait(self) -> None:
        self.work.wait()
        log = self.tp.log
        prev = (log.layer, log.half)
        log.layer, log.half = self.layer, self.half
        log.add(self.name, "all-reduce", self.t0, log.stamp(), self.nbytes)
        log.layer, log.half = prev


# -- the f and g operators ---------------------------------------------------------------
class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPContext, name: str):  # type: ignore[override]
        ctx.tp, ctx.name, ctx.where = tp, name, (tp.log.layer, tp.log.half)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        g = g.contiguous().clone()
        ctx.tp.log.layer, ctx.tp.log.half = ctx.where
        ctx.tp.all_reduce(g, ctx.name)
        return g, None, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, tp: TPContext, name: str):  # type: ignore[override]
        z = z.contiguous().clone()
        tp.all_reduce(z, name)
        return z

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return g, None, None


class _Box:
    """Where Domino's async input-gradient all-reduce hands its handle to the wait."""

    pending: _Pending | None = None


class DominoCopy(torch.autograd.Function):
    """Domino's f (``_CopyToModelParallelRegionA``): identity forward; backward launches
    the input-gradient all-reduce asynchronously and returns at once."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPContext, box: _Box,  # type: ignore[override]
                name: str):
        ctx.tp, ctx.box, ctx.name = tp, box, name
        ctx.where = (tp.log.layer, tp.log.half)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        g = g.contiguous().clone()
        ctx.tp.log.layer, ctx.tp.log.half = ctx.where
        ctx.box.pending = ctx.tp.all_reduce_async(g, ctx.name)
        return g, None, None, None


class DominoWait(torch.autograd.Function):
    """Domino's ``NoOper``: identity forward; backward waits for the all-reduce that
    :class:`DominoCopy` launched (it comes later in backward: the deferred wait)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, box: _Box):  # type: ignore[override]
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        if ctx.box.pending is not None:
            ctx.box.pending.wait()
            ctx.box.pending = None
        return g, None


class _BiasFn(torch.autograd.Function):
    """``z + bias`` whose bias gradient is deferred to W like
    :class:`~schedsim.replay.stage_modules.SplitLinear`'s."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, bias: torch.Tensor):  # type: ignore[override]
        ctx.bias = bias
        return z + bias

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        bias = ctx.bias

        def weight_grad() -> None:
            with torch.no_grad():
                _accumulate(bias, g.reshape(-1, g.shape[-1]).sum(0))

        if WEIGHT_GRADS.active is not None:
            WEIGHT_GRADS.active.append(weight_grad)
        else:
            weight_grad()
        return g, None


# -- layers --------------------------------------------------------------------------------
class ColumnParallelLinear(nn.Module):
    """This rank's rows of ``in -> out``: ``weight (out/n, in)``, ``bias (out/n)``."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(w)
        self.bias = nn.Parameter(b)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return _SplitLinearFn.apply(u, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's columns of ``in -> out``: ``weight (out, in/n)``; ``bias (out)``
    replicated, added after the reduction (:meth:`add_bias`)."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(w)
        self.bias = nn.Parameter(b)

    def partial(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the output (before the reduction)."""
        return _SplitLinearFn.apply(h, self.weight, None)

    def add_bias(self, z: torch.Tensor) -> torch.Tensor:
        return _BiasFn.apply(z, self.bias)


def _rows(t: torch.Tensor, r: int, n: int) -> torch.Tensor:
    k = t.shape[0] // n
    return t[r * k:(r + 1) * k].clone()


def _qkv(t: torch.Tensor, heads: int, r: int, n: int) -> torch.Tensor:
    """Rows of a fused ``qkv`` weight/bias (``3 x heads x d`` rows) for heads of rank r."""
    rest = t.shape[1:]
    v = t.reshape(3, heads, -1, *rest)
    k = heads // n
    return v[:, r * k:(r + 1) * k].reshape(-1, *rest).clone()


def shard(name: str, t: torch.Tensor, cfg: ReplayConfig, r: int) -> torch.Tensor:
    """Rank ``r``'s shard of the full parameter ``name`` (module docstring)."""
    n = cfg.tp
    if name.endswith(REPLICATED):
        return t.clone()
    if ".qkv." in name:
        return _qkv(t, cfg.heads, r, n)
    if name.endswith(("fc2.weight", "proj.weight")):
        k = t.shape[1] // n
        return t[:, r * k:(r + 1) * k].clone()
    return _rows(t, r, n)


def unshard(name: str, shards: list[torch.Tensor], cfg: ReplayConfig) -> torch.Tensor:
    """The full tensor of parameter ``name`` from every TP rank's shard (rank order)."""
    if name.endswith(REPLICATED):
        return shards[0]
    if ".qkv." in name:
        rest = shards[0].shape[1:]
        parts = [s.reshape(3, cfg.heads // cfg.tp, -1, *rest) for s in shards]
        return torch.cat(parts, dim=1).reshape(-1, *rest)
    if name.endswith(("fc2.weight", "proj.weight")):
        return torch.cat(shards, dim=1)
    return torch.cat(shards, dim=0)


class _SubBlock:
    """One residual half of a block: ``x + bias(g(row(local(f(pre(x))))))``."""

    def __init__(self, block: nn.Module, kind: str) -> None:
        self.block, self.kind = block, kind

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],)) if self.block.norm else x

    def inner(self, u: torch.Tensor) -> torch.Tensor:
        blk = self.block
        if self.kind == "mlp":
            return blk.fc2.partial(F.gelu(blk.fc1(u)))
        b, s, _ = u.shape
        nh, d = blk.local_heads, blk.head_dim
        qkv = blk.qkv(u).view(b, s, 3, nh, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        mask = torch.ones(s, s, dtype=torch.bool, device=u.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return blk.proj.partial((att @ v).transpose(1, 2).reshape(b, s, nh * d))

    @property
    def row(self) -> RowParallelLinear:
        return self.block.fc2 if self.kind == "mlp" else self.block.proj

    @property
    def names(self) -> tuple[str, str]:
        """(f name, g name) of the collectives, as the stage model calls them."""
        if self.kind == "mlp":
            return "fc1 dgrad all-reduce", "fc2 all-reduce"
        return "qkv dgrad all-reduce", "proj all-reduce"


class TPBlock(nn.Module):
    """A block's shards: ``fc1``/``fc2`` (and ``qkv``/``proj`` for the transformer)."""

    def __init__(self, full: nn.Module, prefix: str, cfg: ReplayConfig, r: int) -> None:
        super().__init__()
        named = dict(full.named_parameters())

        def sh(lin: str) -> tuple[torch.Tensor, torch.Tensor]:
            return tuple(shard(f"{prefix}{lin}.{p}", named[f"{lin}.{p}"].detach(), cfg, r)
                         for p in ("weight", "bias"))  # type: ignore[return-value]

        self.norm = cfg.workload == "transformer"
        if self.norm:
            self.local_heads, self.head_dim = cfg.heads // cfg.tp, cfg.hidden // cfg.heads
            self.qkv = ColumnParallelLinear(*sh("qkv"))
            self.proj = RowParallelLinear(*sh("proj"))
        self.fc1 = ColumnParallelLinear(*sh("fc1"))
        self.fc2 = RowParallelLinear(*sh("fc2"))
        self.subs = ([_SubBlock(self, "attn")] if self.norm else []) + [_SubBlock(self, "mlp")]


class TPStage(nn.Module):
    """One stage's TP shards; ``forward`` runs Megatron's f/g or Domino's halves."""

    def __init__(self, cfg: ReplayConfig, stage: int, tp: TPContext,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        full = build_stage(cfg, stage, "cpu")
        self.tp = tp
        self.blocks = nn.ModuleList(TPBlock(b, f"blocks.{i}.", cfg, tp.rank)
                                    for i, b in enumerate(full.blocks))
        self.to(device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.comm == "domino":
            return self._domino(x)
        tp, log = self.tp, self.tp.log
        log.half = None
        for i, blk in enumerate(self.blocks):
            log.layer = i
            for sb in blk.subs:
                fname, gname = sb.names
                z = sb.inner(CopyToTP.apply(sb.pre(x), tp, fname))
                x = x + sb.row.add_bias(ReduceFromTP.apply(z, tp, gname))
        return x

    def _domino(self, x: torch.Tensor) -> torch.Tensor:
        """Two halves along the batch; a half's raw in-place all-reduce runs while the
        other half computes (DeepSpeed Domino's ``DominoTransformerLayer.forward``)."""
        tp, log = self.tp, self.tp.log
        xs = list(x.chunk(2, dim=0))
        pending: list[tuple | None] = [None, None]

        def finish(h: int) -> None:
            sb, xin, z, work = pending[h]       # type: ignore[misc]
            work.wait()
            xs[h] = xin + sb.row.add_bias(z)

        for i, blk in enumerate(self.blocks):
            for sb in blk.subs:
                fname, gname = sb.names
                for h in (0, 1):
                    log.layer, log.half = i, h
                    if pending[h] is not None:
                        finish(h)
                    box = _Box()
                    u = DominoCopy.apply(DominoWait.apply(sb.pre(xs[h]), box), tp, box,
                                         fname)
                    z = sb.inner(u)
                    # raw in-place all-reduce, outside autograd (its backward: identity)
                    pending[h] = (sb, xs[h], z, tp.all_reduce_async(z, gname))
        for h in (0, 1):
            finish(h)
        log.half = None
        return torch.cat(xs, dim=0)


def build_tp_stage(cfg: ReplayConfig, stage: int, tp: TPContext,
                   device: torch.device | str = "cpu") -> TPStage:
    """Stage ``stage``'s shards for TP rank ``tp.rank`` (dtype ``cfg.dtype``)."""
    from schedsim.replay.stage_modules import DTYPES

    return TPStage(cfg, stage, tp, device).to(dtype=DTYPES[cfg.dtype])

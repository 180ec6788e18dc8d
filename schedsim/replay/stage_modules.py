"""Replay workloads: real ``nn.Module`` model chunks whose backward splits into B and W.

A stage is a :class:`StageModule`: ``layers_per_stage`` blocks, either :class:`MLPBlock`
(``x + fc2(gelu(fc1(x)))``) or :class:`TransformerBlock` (pre-norm causal self-attention
and MLP, both residual; the norms have no parameters). Every parameter lives in a
:class:`SplitLinear`, whose autograd backward returns the input gradient at once and
hands the weight/bias gradient to :data:`WEIGHT_GRADS` as a closure. So:

- ``B`` (input gradient) runs autograd from the stage output with the sink *capturing*:
  the input gradient is computed, the weight-gradient closures (which hold the saved
  input activations and output gradients — exactly what W needs) are kept;
- ``W`` runs the kept closures (accumulating into ``param.grad``);
- ``BW`` runs autograd with the sink off: weight gradients are computed inline.

This is DualPipe's ``WeightGradStore`` pattern (deepseek-ai/DualPipe,
``dualpipe/utils.py`` and ``examples/example_dualpipe.py``), keyed by (model chunk,
microbatch) instead of a FIFO so any program order of W ops works.

Loss: the last stage computes ``loss_mb = mse(output_mb, target_mb)`` (mean over
elements) and backpropagates ``loss_mb / M``, so the parameter gradients are those of
``loss = mean over microbatches of loss_mb`` (the reported loss). The single-process
reference (:func:`reference_step`) uses exactly this normalisation.

Initialisation and data are seeded per stage and per microbatch with their own
``torch.Generator`` (drawn in float64 on the CPU, then cast), so every process, and the
reference, builds bit-identical parameters and microbatches.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from schedsim.replay.config import ReplayConfig

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class WeightGradSink:
    """Where :class:`SplitLinear` puts its weight-gradient closures during backward.

    ``active`` is None (compute weight gradients inline) or a list collecting closures.
    A plain attribute, not thread-local: CUDA autograd runs backward on a device thread.
    """

    def __init__(self) -> None:
        self.active: list[Callable[[], None]] | None = None

    @contextmanager
    def capture(self) -> Iterator[list[Callable[[], None]]]:
        """Collect the closures of every backward run inside the block into a list."""
        prev, self.active = self.active, []
        try:
            yield self.active
        finally:
            self.active = prev


#: the process-wide sink (one replay executor per process)
WEIGHT_GRADS = WeightGradSink()


def _accumulate(p: torch.Tensor, g: torch.Tensor) -> None:
    if p.grad is None:
        p.grad = g
    else:
        p.grad.add_(g)


class _SplitLinearFn(torch.autograd.Function):
    """``y = x W^T + b`` whose backward defers the weight gradient (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.params = (weight, bias)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        weight, bias = ctx.params
        gi = g @ weight if ctx.needs_input_grad[0] else None

        def weight_grad() -> None:   # may run later, outside backward: no graph
            with torch.no_grad():
                g2 = g.reshape(-1, g.shape[-1])
                _accumulate(weight, g2.t() @ x.reshape(-1, x.shape[-1]))
                if bias is not None:
                    _accumulate(bias, g2.sum(0))

        if WEIGHT_GRADS.active is not None:
            WEIGHT_GRADS.active.append(weight_grad)
        else:
            weight_grad()
        return gi, None, None


class SplitLinear(nn.Module):
    """A linear layer (``in_features -> out_features``) with B/W-split backward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SplitLinearFn.apply(x, self.weight, self.bias)


class MLPBlock(nn.Module):
    """``x + fc2(gelu(fc1(x)))``; input and output ``(batch, seq, hidden)``."""

    def __init__(self, hidden: int, ffn_mult: int) -> None:
        super().__init__()
        self.fc1 = SplitLinear(hidden, ffn_mult * hidden)
        self.fc2 = SplitLinear(ffn_mult * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + proj(causal_attention(norm(x)))``, then ``x + mlp(norm(x))``.

    Norms are parameter-free layer norms; attention is written out (softmax of
    ``q k^T / sqrt(d)`` with a causal mask) so float64 runs everywhere.
    """

    def __init__(self, hidden: int, heads: int, ffn_mult: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = SplitLinear(hidden, 3 * hidden)
        self.proj = SplitLinear(hidden, hidden)
        self.fc1 = SplitLinear(hidden, ffn_mult * hidden)
        self.fc2 = SplitLinear(ffn_mult * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        nh, d = self.heads, h // self.heads
        qkv = self.qkv(F.layer_norm(x, (h,))).view(b, s, 3, nh, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(o)
        return x + self.fc2(F.gelu(self.fc1(F.layer_norm(x, (h,)))))


class StageModule(nn.Module):
    """One stage (model chunk): ``layers_per_stage`` blocks applied in order."""

    def __init__(self, cfg: ReplayConfig) -> None:
        super().__init__()
        if cfg.workload == "mlp":
            blocks = [MLPBlock(cfg.hidden, cfg.ffn_mult) for _ in range(cfg.layers_per_stage)]
        else:
            blocks = [TransformerBlock(cfg.hidden, cfg.heads, cfg.ffn_mult)
                      for _ in range(cfg.layers_per_stage)]
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


_DATA_OFFSET = 1 << 40


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + salt) % (1 << 62))


def build_stage(cfg: ReplayConfig, stage: int, device: torch.device | str = "cpu"
                ) -> StageModule:
    """Stage ``stage``'s module, initialised from ``(seed, stage)`` only.

    Weights ``~ N(0, 1/fan_in)``, biases ``~ N(0, 0.02^2)``; drawn in float64 on the CPU
    and cast to ``cfg.dtype`` on ``device``, so each process builds identical copies.
    """
    mod = StageModule(cfg)
    g = _generator(cfg.seed, stage)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            if name.endswith("bias"):
                val = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.02
            else:
                val = torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(
                    p.shape[1])
            p.data = val
    return mod.to(device=device, dtype=DTYPES[cfg.dtype])


def microbatch_input(cfg: ReplayConfig, mb: int, device: torch.device | str = "cpu"
                     ) -> torch.Tensor:
    """Input of microbatch ``mb``: ``(microbatch_size, seq, hidden)``, ``N(0, 1)``."""
    g = _generator(cfg.seed, _DATA_OFFSET + 2 * mb)
    x = torch.randn(cfg.activation_shape, generator=g, dtype=torch.float64)
    return x.to(device=device, dtype=DTYPES[cfg.dtype])


def microbatch_target(cfg: ReplayConfig, mb: int, device: torch.device | str = "cpu"
                      ) -> torch.Tensor:
    """Regression target of microbatch ``mb`` (same shape as the input)."""
    g = _generator(cfg.seed, _DATA_OFFSET + 2 * mb + 1)
    y = torch.randn(cfg.activation_shape, generator=g, dtype=torch.float64)
    return y.to(device=device, dtype=DTYPES[cfg.dtype])


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-microbatch loss: mean squared error over all elements (a scalar)."""
    return F.mse_loss(output, target)


def reference_step(cfg: ReplayConfig, stages: int, microbatches: int,
                   device: torch.device | str = "cpu"
                   ) -> tuple[float, list[float], list[list[torch.Tensor]]]:
    """Single-process reference: the whole model on every microbatch, in order.

    Returns ``(loss, per-microbatch losses, grads)`` where ``grads[s]`` lists stage s's
    parameter gradients in ``named_parameters`` order, those of
    ``mean_mb mse(model(x_mb), y_mb)``.
    """
    mods = [build_stage(cfg, s, device) for s in range(stages)]
    scale = torch.tensor(1.0 / microbatches, dtype=DTYPES[cfg.dtype], device=device)
    losses = []
    assert WEIGHT_GRADS.active is None
    for mb in range(microbatches):
        x = microbatch_input(cfg, mb, device)
        for m in mods:
            x = m(x)
        loss = loss_fn(x, microbatch_target(cfg, mb, device))
        torch.autograd.backward(loss, scale)
        losses.append(float(loss.detach()))
    grads = [[p.grad if p.grad is not None else torch.zeros_like(p)
              for p in m.parameters()] for m in mods]
    return sum(losses) / microbatches, losses, grads

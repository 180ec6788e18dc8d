"""Alpha-beta cost of the collectives inside a stage (TP all-reduce, all-gather,
reduce-scatter; EP all-to-all), in the nccl-tests conventions.

Source: NVIDIA/nccl-tests ``doc/PERFORMANCE.md`` ("Bus bandwidth"). For ``n`` ranks and a
buffer of ``S`` bytes (``S`` = the *whole* array: for all-gather and reduce-scatter the
gathered / pre-scatter size, ``count x n x sizeof``), the bus bandwidth ``busbw`` is the
algorithm bandwidth ``S/t`` times a factor that makes it independent of ``n``:

==============  ==================  ==============================================
collective      busbw factor        time with ``alpha`` per step (this module)
==============  ==================  ==============================================
all-reduce      ``2(n-1)/n``        ``2(n-1)*alpha + 2(n-1)/n * S/busbw``
all-gather      ``(n-1)/n``         ``(n-1)*alpha + (n-1)/n * S/busbw``
reduce-scatter  ``(n-1)/n``         ``(n-1)*alpha + (n-1)/n * S/busbw``
all-to-all      ``(n-1)/n``         ``(n-1)*alpha + (n-1)/n * S/busbw``
==============  ==================  ==============================================

The bandwidth term is the page's "perfect" time ``t = S/busbw * factor``; the latency
term charges ``alpha`` per sequential step of a ring (``2(n-1)`` for an all-reduce:
reduce-scatter then all-gather; ``n-1`` for the others), the usual alpha-beta model.
A group of one rank costs 0 (Megatron bypasses the call: ``mappings._reduce``).

Which link a group uses (:class:`ModelLinks`): ranks are numbered as Megatron's default
order (``tp-cp-ep-dp-pp``: TP innermost, EP next), so a TP group spans ``tp`` consecutive
GPUs and an EP group ``tp x ep``; a group that fits in ``gpus_per_node`` runs on the
intra-node link, else the inter-node link is its bottleneck. Bandwidths are bus
bandwidths in bytes per time unit (the unit of ``[costs]``), latencies in that unit.

Plain Python (no torch).
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CollectiveKind = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]

#: (latency steps per (n - 1), busbw factor numerator per (n - 1)/n) of each collective
_SHAPE: dict[str, tuple[int, int]] = {
    "all-reduce": (2, 2),
    "all-gather": (1, 1),
    "reduce-scatter": (1, 1),
    "all-to-all": (1, 1),
}
#: short names used in tables and figures
SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A"}


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor ``busbw / algbw`` of ``kind`` on ``n`` ranks
    (``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for the others). Raises ValueError for an
    unknown kind or ``n < 1``."""
    if kind not in _SHAPE:
        raise ValueError(f"unknown collective {kind!r}: expected one of {', '.join(_SHAPE)}")
    if n < 1:
        raise ValueError(f"a collective needs n >= 1 ranks (got {n})")
    return _SHAPE[kind][1] * (n - 1) / n


def collective_time(kind: str, n: int, nbytes: float, bandwidth: float,
                    latency: float = 0.0) -> float:
    """Time of one collective: ``steps * alpha + bus_factor * S / busbw`` (module table).

    ``n``: ranks in the group; ``nbytes``: ``S``, the whole buffer in bytes;
    ``bandwidth``: bus bandwidth in bytes per time unit (``inf``: free); ``latency``:
    ``alpha`` per step, in the time unit. 0 for ``n == 1``. Raises ValueError for an
    unknown kind, ``n < 1`` or negative sizes.
    """
    if nbytes < 0 or latency < 0 or not bandwidth > 0:
        raise ValueError("collective sizes and latencies must be >= 0 and bandwidth > 0")
    f = bus_factor(kind, n)
    if n == 1:
        return 0.0
    steps = _SHAPE[kind][0] * (n - 1)
    beta = 0.0 if math.isinf(bandwidth) or nbytes == 0 else f * nbytes / bandwidth
    return steps * latency + beta


class LinkSpec(BaseModel):
    """One class of link: bus ``bandwidth`` (bytes per time unit; default infinite) and
    ``latency`` (alpha, time per ring step; default 0)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    bandwidth: float = Field(default=math.inf, gt=0)
    latency: float = Field(default=0.0, ge=0, allow_inf_nan=False)


class ModelLinks(BaseModel):
    """``[model.links]``: the intra-node and inter-node links of the collectives and how
    many GPUs a node holds (module docstring)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    gpus_per_node: int = Field(default=8, ge=1)
    intra: LinkSpec = Field(default_factory=LinkSpec)
    inter: LinkSpec = Field(default_factory=LinkSpec)

    def for_span(self, gpus: int) -> LinkSpec:
        """The link of a group whose ranks span ``gpus`` consecutive GPU ids."""
        return self.intra if gpus <= self.gpus_per_node else self.inter

    def time(self, kind: str, n: int, nbytes: float, span: int) -> float:
        """:func:`collective_time` of a group of ``n`` ranks spanning ``span`` GPUs."""
        link = self.for_span(span)
        return collective_time(kind, n, nbytes, link.bandwidth, link.latency)

"""Calibration results, the link fit and the cost file ``simulate`` reads. No torch.

The measurements come from :mod:`schedsim.replay.measure` (run on the real ranks by
``schedsim calibrate`` or ``schedsim replay --compare``). The cost file is a TOML
fragment with ``[costs]`` (unit ``ms``, global F/B/W/BW = mean over stages, a
``[costs.stage.N]`` table per stage, ``message_bytes`` = one activation) and ``[link]``
(``latency`` in ms, ``bandwidth`` in bytes per ms). Read it with
``schedsim simulate SCENARIO --costs-file FILE`` (its tables replace the scenario's) or
paste it into a scenario.

FB is written per stage only when every FB op of the program pairs a forward with a full
backward (``(F;BW)``, what was measured); otherwise it is left unset, so an FB costs its
forward part plus its backward part, which is what the sequential CPU replay runs.
"""
from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..costs import CostModel, LinkModel

_KINDS = ("F", "B", "W", "BW", "FB")


def fit_link(samples: list[list[float]]) -> tuple[float, float]:
    """Least-squares fit of ``one_way_ms = latency + bytes / bandwidth``.

    ``samples`` are ``[bytes, one-way ms]`` pairs. Returns ``(latency ms, bandwidth
    bytes/ms)``; latency is clipped at 0; bandwidth is ``inf`` when the fitted slope is
    not positive (time does not grow with size) or with fewer than two sizes.
    """
    if not samples:
        return 0.0, math.inf
    xs = [float(s[0]) for s in samples]
    ys = [float(s[1]) for s in samples]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        return max(my, 0.0), math.inf
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        return max(my, 0.0), math.inf
    return max(my - slope * mx, 0.0), 1.0 / slope


class Calibration(BaseModel):
    """Measured per-stage op costs (ms) and link samples of one workload and backend."""

    model_config = ConfigDict(extra="forbid")

    unit: str = "ms"
    stages: dict[int, dict[str, float]]
    link_samples: list[list[float]] = Field(default_factory=list)
    message_bytes: float = 0.0
    backend: str = "gloo"
    world_size: int = 1
    fb_backward_kinds: list[str] = Field(default_factory=list)
    workload: dict[str, Any] = Field(default_factory=dict)

    @property
    def write_fb(self) -> bool:
        """Whether the measured FB (forward then full backward) fits the program's FB ops."""
        return self.fb_backward_kinds == ["BW"]

    def mean(self, kind: str) -> float:
        vals = [c[kind] for c in self.stages.values()]
        return sum(vals) / len(vals) if vals else 0.0

    def link(self) -> tuple[float, float]:
        """``(latency ms, bandwidth bytes/ms)`` fitted to the samples."""
        return fit_link(self.link_samples)

    def cost_model(self) -> CostModel:
        """The :class:`CostModel` the cost file describes."""
        kinds = _KINDS if self.write_fb else _KINDS[:4]
        stage = {s: {k: c[k] for k in kinds} for s, c in self.stages.items()}
        top = {k: self.mean(k) for k in ("F", "B", "W", "BW")}
        return CostModel(unit=self.unit, message_bytes=self.message_bytes, stage=stage, **top)

    def link_model(self) -> LinkModel:
        lat, bw = self.link()
        return LinkModel(latency=lat, bandwidth=bw)

    def to_toml(self, title: str = "") -> str:
        """The cost file text (module docstring)."""
        w = self.workload
        lines = [f"# schedsim calibrate{': ' + title if title else ''}",
                 f"# measured on {self.backend}, {self.world_size} ranks; workload "
                 f"{w.get('workload', '?')} hidden {w.get('hidden', '?')} x "
                 f"{w.get('layers_per_stage', '?')} layers/stage, seq {w.get('seq', '?')}, "
                 f"microbatch {w.get('microbatch_size', '?')}, {w.get('dtype', '?')}",
                 "# op costs: median per stage (ms); link: least-squares fit of the one-way "
                 "ping-pong time", "", "[costs]", f'unit = "{self.unit}"']
        for k in ("F", "B", "W", "BW"):
            lines.append(f"{k} = {self.mean(k):.6g}")
        lines.append(f"message_bytes = {self.message_bytes:.0f}")
        if not self.write_fb and self.fb_backward_kinds:
            lines.append("# FB left unset: the program's FB pairs are not all (F;BW), so "
                         "FB = its forward + its backward part")
        for s in sorted(self.stages):
            c = self.stages[s]
            lines += ["", f"[costs.stage.{s}]"]
            for k in _KINDS:
                if k == "FB" and not self.write_fb:
                    lines.append(f"# FB = {c[k]:.6g}   (measured: F then BW)")
                else:
                    lines.append(f"{k} = {c[k]:.6g}")
        lat, bw = self.link()
        lines += ["", "[link]", f"latency = {lat:.6g}   # ms"]
        if math.isinf(bw):
            lines.append("# bandwidth: not measurable (one rank, or time did not grow with "
                         "size): infinite")
        else:
            lines.append(f"bandwidth = {bw:.6g}   # bytes per ms ({bw * 1e3 / 1e9:.3g} GB/s)")
        if self.link_samples:
            lines.append("# samples (bytes: one-way ms): " + ", ".join(
                f"{b:.0f}: {t:.4g}" for b, t in self.link_samples))
        return "\n".join(lines) + "\n"

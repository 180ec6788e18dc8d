"""Calibration results, the link fit and the cost file ``simulate`` reads. No torch.

The measurements come from :mod:`schedsim.replay.measure` (run on the real ranks by
``schedsim calibrate`` or ``schedsim replay --compare``). The cost file is a TOML
fragment with ``[costs]`` (unit ``ms``, global F/B/W/BW = mean over stages, a
``[costs.stage.N]`` table per stage, ``message_bytes`` = one activation), ``[link]``
(``latency`` in ms, ``bandwidth`` in bytes per ms) and ``[comm]`` (``launch_cost`` in ms:
host time to launch one batch of sends/recvs, :attr:`CommModel.launch_cost
<schedsim.sim.costs.CommModel>`). Read it with ``schedsim simulate SCENARIO --costs-file
FILE`` (its ``[costs]`` and ``[link]`` replace the scenario's, its ``launch_cost`` the
scenario's; the comm semantics stay the scenario's) or paste it into a scenario.

Launch cost: every launch of the program (a bare post or a ``BATCH``) has some number of
sends and recvs (its *composition*). The ranks measure, at the workload's
message size, the host time of launching a batch of each composition the program uses
(plus a single ``isend``, a single ``irecv`` and a send+recv pair); ``launch_cost`` is
the mean of each composition's samples, averaged over the program's launches (so a
program of many single posts and a few 4-op batches gets the cost of its own mix).

Why the mean: the simulator charges one constant per batch, so what it has to get right
is a rank's summed launch time, i.e. the replay's *mean* post run (field ``posts``), and
post runs have a heavy tail (on shared cores a launch sometimes loses the CPU for
milliseconds, to the rank's own comm threads or the other ranks). Checked against 14
replays of ``schedules/replay-1f1b.toml`` and ``replay-dualpipev.toml`` on 2 shared
vCPUs (ratio calibrated / replay, geometric mean and range): the calibration's mean was
0.81 (0.36-1.29) of the replay's mean post run, its upper quartile 0.58 (0.30-1.32) and
its median 0.45 (0.23-0.70). The median and upper quartile describe the *typical* post
run instead (0.78 and 1.02 of the replay's median) and leave the tail out.

FB is written per stage only when every FB op of the program pairs a forward with a full
backward (``(F;BW)``, what was measured); otherwise it is left unset, so an FB costs its
forward part plus its backward part, which is what the sequential CPU replay runs.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schedsim.program.ir import Program
from schedsim.program.ops import launched
from schedsim.sim.costs import CommModel, CostModel, LinkModel, Semantics

_KINDS = ("F", "B", "W", "BW", "FB")


def toml_number(x: float) -> str:
    """``x`` as a TOML number that reads back as exactly ``x`` (``repr`` of the float;
    ``inf`` and ``nan`` are TOML too)."""
    return repr(float(x))


def composition_key(sends: int, recvs: int) -> str:
    """``"S+R"``: the key of a batch of ``sends`` isends and ``recvs`` irecvs."""
    return f"{sends}+{recvs}"


def post_runs(program: Program) -> dict[str, int]:
    """How many launches ``program`` has, by composition: ``{"S+R": count}`` (``S`` sends
    and ``R`` recvs in one bare post or ``BATCH[...]``), over all ranks."""
    out: dict[str, int] = {}
    for row in program.ranks:
        for ins in row:
            comms = launched(ins)
            if comms:
                sends = sum(c.is_send for c in comms)
                k = composition_key(sends, len(comms) - sends)
                out[k] = out.get(k, 0) + 1
    return out


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

    model_config = ConfigDict(extra="forbid", defer_build=True)

    unit: str = "ms"
    stages: dict[int, dict[str, float]]
    link_samples: list[list[float]] = Field(default_factory=list)
    message_bytes: float = 0.0
    backend: str = "gloo"
    world_size: int = 1
    fb_backward_kinds: list[str] = Field(default_factory=list)
    workload: dict[str, Any] = Field(default_factory=dict)
    #: host time (ms) of launching one batch, by composition ``"S+R"`` (all samples)
    launch_samples: dict[str, list[float]] = Field(default_factory=dict)
    #: the program's post runs by composition ``"S+R"`` -> count (:func:`post_runs`)
    post_runs: dict[str, int] = Field(default_factory=dict)

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

    def launch_means(self) -> dict[str, float]:
        """Mean launch time (ms) of each measured composition ``"S+R"``."""
        return {k: statistics.fmean(v) for k, v in self.launch_samples.items() if v}

    def launch_cost(self) -> float:
        """Host time (ms) to launch one batch: each composition's mean launch time,
        averaged over the program's post runs (module docstring). A composition that was
        not measured counts with the mean of all samples; 0 when nothing was measured
        (one rank) or the program posts nothing."""
        means = self.launch_means()
        if not means or not self.post_runs:
            return 0.0
        pooled = statistics.fmean([x for v in self.launch_samples.values() for x in v])
        total = sum(self.post_runs.values())
        return sum(c * means.get(k, pooled) for k, c in self.post_runs.items()) / total

    def comm_model(self, semantics: Semantics = "eager", **fields: Any) -> CommModel:
        """A :class:`CommModel` with the measured :meth:`launch_cost` (other fields:
        ``semantics`` and ``fields``)."""
        return CommModel(semantics=semantics, launch_cost=self.launch_cost(), **fields)

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
        """The cost file text (module docstring). Every number is written exactly
        (``repr``: the shortest text that reads back as the same float), so simulating
        with the file gives the same timeline as with :meth:`cost_model`,
        :meth:`link_model` and :meth:`comm_model`."""
        w = self.workload
        lines = [f"# schedsim calibrate{': ' + title if title else ''}",
                 f"# measured on {self.backend}, {self.world_size} ranks; workload "
                 f"{w.get('workload', '?')} hidden {w.get('hidden', '?')} x "
                 f"{w.get('layers_per_stage', '?')} layers/stage, seq {w.get('seq', '?')}, "
                 f"microbatch {w.get('microbatch_size', '?')}, {w.get('dtype', '?')}",
                 "# op costs: median per stage (ms); link: least-squares fit of the one-way "
                 "ping-pong time; launch cost: mean host time of launching a batch of "
                 "sends/recvs, averaged over the program's batches",
                 "", "[costs]", f'unit = "{self.unit}"']
        for k in ("F", "B", "W", "BW"):
            lines.append(f"{k} = {toml_number(self.mean(k))}")
        lines.append(f"message_bytes = {toml_number(self.message_bytes)}")
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
                    lines.append(f"{k} = {toml_number(c[k])}")
        lat, bw = self.link()
        lines += ["", "[link]", f"latency = {toml_number(lat)}   # ms"]
        if math.isinf(bw):
            lines.append("# bandwidth: not measurable (one rank, or time did not grow with "
                         "size): infinite")
        else:
            lines.append(f"bandwidth = {toml_number(bw)}   # bytes per ms "
                         f"({bw * 1e3 / 1e9:.3g} GB/s)")
        if self.link_samples:
            lines.append("# samples (bytes: one-way ms): " + ", ".join(
                f"{b:.0f}: {t:.4g}" for b, t in self.link_samples))
        lines += ["", "[comm]", f"launch_cost = {toml_number(self.launch_cost())}   # ms per "
                  "launch (a bare post or a BATCH)"]
        means = self.launch_means()
        if means:
            med = {k: statistics.median(v) for k, v in self.launch_samples.items() if v}
            lines.append("# launch time per batch (sends+recvs: mean ms, median ms, samples): "
                         + ", ".join(f"{k}: {means[k]:.4g}, {med[k]:.4g}, "
                                     f"{len(self.launch_samples[k])}" for k in sorted(means)))
        else:
            lines.append("# launch cost not measured (one rank): 0")
        if self.post_runs:
            lines.append("# the program's batches (sends+recvs: count): " + ", ".join(
                f"{k}: {c}" for k, c in sorted(self.post_runs.items())))
        return "\n".join(lines) + "\n"

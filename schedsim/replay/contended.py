"""Contended calibration: costs fitted to steps of the program itself. No torch.

The benchmark calibration (:mod:`schedsim.replay.measure`) times ops, a ping-pong and
launches apart; on shared cores a message then moves in 0.07 ms where, inside the run,
with both hosts computing, it takes 1-3 ms (and compute slows while messages move). The
contended calibration (``calibrate --contended``, the default on CPU gloo, and
``replay --compare``'s default there) runs one untimed step and then ``repeats`` steps
of the program on the real ranks (:func:`schedsim.replay.worker._calibration_steps`;
``calibrate`` spreads them over :data:`SPREAD_S` seconds by default, a pause before each
step after the first, because the machine's speed moves by up to 2x within a second and
consecutive steps share one moment's; under ``replay --compare`` taking turns with the
measured steps, so that both see the same load: on a shared machine it drifts by 2x
within a minute), so every number is
measured under the contention of the run; each step is fitted like a measured timeline
(:func:`schedsim.replay.fit.fit_timeline`: op medians, wait-matched link, launches, host
time per instruction) and the steps are merged (:func:`merge_fits`):

- op cost of each stage and kind: the **median over the steps of each step's mean**
  of its durations (the mean within a step gets each rank's summed compute right on
  shared cores, where an op's durations have a heavy tail; one step's fit takes the
  median, :mod:`schedsim.replay.fit`); launch cost and host cost likewise: the median
  over the steps of each step's mean. The median over steps because a whole step can
  be hit by one long pause (at real-time priority the kernel's real-time throttling
  stops the ranks for about 50 ms once a second: 2 of 5 Interleaved1F1B steps of 17 ms
  took 65 and 67 ms), which the mean of every step's durations spread over the costs:
  the program simulated with them took more than the steps' median makespan even
  without link latency, and predicted another run's median step +76% (the median
  over the steps: +10.6%);
- link: every step's samples together (wait matching per size, as in one step);

Then the **link latency is fitted to the steps' makespans** (:func:`fit_latency`): the
latency for which the program simulated with the merged costs takes the calibration
steps' median makespan (bisection; the simulated makespan grows with the latency). Each
mean is right on its own, but a run whose durations scatter loses more at every
cross-rank wait than one where each takes its mean (a receiver waits for the later of
two random times: ``E[max] >= max(E)``); the deterministic simulator can only charge
that where ranks synchronize, on the messages. On this project's 2-core machine (9 runs
per schedule, each run's steps in turns predicting the others, median) the means alone
predicted 1F1B 16% and DualPipeV 7% short; with the fitted latency +0.6% and -2.5%. The
spread line gives the wait-matched latency beside the fitted one.

The calibration's own spread (:meth:`StepsFit.spread_lines`): the calibration steps'
measured makespans, the makespan each step's own fit predicts, and each kind's cost,
as min .. max over the steps. Nothing here is the measured step that ``replay
--compare`` then checks: those run after the calibration steps.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from schedsim.program.ir import Program
from schedsim.replay.fit import TimelineFit, fit_timeline
from schedsim.sim.costs import LinkModel, Semantics
from schedsim.timeline import Timeline
from schedsim.util.units import fmt_time, with_unit


#: ``calibrate --contended``'s default: its steps spread over this many seconds
#: (``--spread``), so that they sample the machine's speed over time (module docstring)
SPREAD_S = 5.0
#: ``calibrate --contended``'s default step count (``--repeats``) with the spread
SPREAD_REPEATS = 21


def pause_for(spread: float, repeats: int) -> float:
    """The pause (s) before each calibration step after the first that spreads
    ``repeats`` steps over about ``spread`` s (0 for one step or no spread)."""
    return spread / (repeats - 1) if repeats > 1 and spread > 0 else 0.0


def merge_fits(fits: list[TimelineFit]) -> TimelineFit:
    """One :class:`TimelineFit` of several steps' fits (module docstring): each cost the
    median over the steps of the step's own mean; every duration, message sample and
    launch kept."""
    per: dict[tuple[int, str], list[float]] = {}
    for f in fits:
        for key, v in f.durations.items():
            per.setdefault(key, []).extend(v)
    stages: dict[int, dict[str, float]] = {}
    for (s, k) in sorted(per):
        stages.setdefault(s, {})[k] = statistics.median(
            statistics.fmean(f.durations[(s, k)]) for f in fits if f.durations.get((s, k)))
    launched = [f.launch_cost() for f in fits if f.launches]
    return replace(fits[0], stages=stages, durations=per,
                   samples=[x for f in fits for x in f.samples],
                   launches=[x for f in fits for x in f.launches],
                   launch=statistics.median(launched) if launched else None,
                   host_cost=statistics.median(f.host_cost for f in fits),
                   source=f"{fits[0].source}; {len(fits)} contended calibration steps")


def fit_latency(program: Program, fit: TimelineFit, target: float,
                semantics: Semantics = "rendezvous", rel_tol: float = 1e-6) -> float | None:
    """The link latency (ms, >= 0) for which ``program`` simulated with ``fit``'s costs,
    bandwidth, launch and host costs under ``semantics`` takes ``target`` ms (module
    docstring), by bisection on ``[0, target]`` to ``rel_tol * target`` (at most 60
    simulations). 0 when the simulation at latency 0 already takes ``target`` or more;
    None when not even latency ``target`` reaches it (the makespan does not depend on
    the link: no message on the critical path) or ``target`` is not positive."""
    from schedsim.sim.simulate import simulate

    if not target > 0:
        return None
    cost, comm = fit.cost_model(), fit.comm_model(semantics)
    bw = fit.link()[1]

    def makespan(lat: float) -> float:
        return simulate(program, cost, LinkModel(latency=lat, bandwidth=bw), comm).makespan

    if makespan(0.0) >= target:
        return 0.0
    lo, hi = 0.0, target
    if makespan(hi) < target:
        return None
    for _ in range(58):
        if hi - lo <= rel_tol * target:
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if makespan(mid) < target else (lo, mid)
    return hi


@dataclass
class StepsFit:
    """The merged fit of the calibration steps and what it is made of (ms)."""

    fit: TimelineFit
    steps: list[TimelineFit]
    measured: list[float]       # each calibration step's measured makespan
    predicted: list[float]      # each step's makespan predicted with its own fit
    waits_latency: float = 0.0  # the merged samples' wait-matched latency
    fitted: bool = False        # the latency fitted to the median makespan
    span_s: float | None = None  # seconds from the first step's start to the last's

    def spread_lines(self) -> list[str]:
        """The calibration's spread over its steps (module docstring), one line each."""
        def span(xs: list[float]) -> str:
            return (f"{fmt_time(min(xs))} .. {fmt_time(max(xs))} (median "
                    f"{fmt_time(statistics.median(xs))})"
                    if xs else "-")
        def kind(f: TimelineFit, k: str) -> list[float]:
            vals = [c[k] for c in f.stages.values() if k in c]
            return [statistics.fmean(vals)] if vals else []

        kinds = sorted({k for f in self.steps for c in f.stages.values() for k in c})
        parts = [f"{k} {span([x for f in self.steps for x in kind(f, k)])}" for k in kinds]
        parts += [f"link latency (wait matching) {span([f.link()[0] for f in self.steps])}",
                  f"launch {span([f.launch_cost() for f in self.steps])}",
                  f"host {span([f.host_cost for f in self.steps])}"]
        lat = self.fit.link()[0]
        how = (f"fitted to the steps' median makespan "
               f"{with_unit(statistics.median(self.measured), 'ms')}: {with_unit(lat, 'ms')} "
               f"(wait matching alone: {with_unit(self.waits_latency, 'ms')})"
               if self.fitted else f"wait matching: {with_unit(lat, 'ms')} (the makespan does not "
               f"depend on it: not fitted)")
        over = "" if self.span_s is None else f" over {with_unit(self.span_s, 's')}"
        return [f"calibration: {len(self.steps)} contended steps of the program{over}; "
                f"measured makespan {span(self.measured)} ms; each step's own fit predicts "
                f"{span(self.predicted)} ms",
                "calibration spread over the steps (ms, mean over stages): "
                + "; ".join(parts),
                f"link latency {how}"]

    def to_toml(self, title: str = "") -> str:
        """The merged cost file (:meth:`TimelineFit.to_toml`) with the spread as
        comments."""
        text = self.fit.to_toml(title)
        head, _, rest = text.partition("\n")
        head = head.replace("calibrate --from-timeline", "calibrate --contended")
        return "\n".join([head, *(f"# {x}" for x in self.spread_lines()), rest])


def fit_steps(steps: list[dict[str, Any]], program: Program,
              semantics: Semantics = "rendezvous", span_s: float | None = None
              ) -> StepsFit:
    """Fit the contended calibration's step timelines (Timeline JSON dicts) of
    ``program``: each step (:func:`fit_timeline`), merged (:func:`merge_fits`), the
    latency fitted to the steps' median makespan under ``semantics``
    (:func:`fit_latency`; module docstring). Raises
    :class:`~schedsim.errors.ScenarioError` as :func:`fit_timeline`."""
    from schedsim.sim.simulate import simulate

    tls = [Timeline.model_validate(s) for s in steps]
    fits = [fit_timeline(t, program) for t in tls]
    pred = [simulate(program, f.cost_model(), f.link_model(),
                     f.comm_model("rendezvous")).makespan for f in fits]
    merged = merge_fits(fits)
    waits = merged.link()[0]
    lat = fit_latency(program, merged, statistics.median(t.makespan for t in tls),
                      semantics)
    if lat is not None:
        merged = replace(merged, latency=lat)
    return StepsFit(merged, fits, [t.makespan for t in tls], pred, waits, lat is not None,
                    span_s)


def calibrated_model(calibration: dict[str, Any], program: Program, semantics: Any,
                     title: str = "") -> tuple[Any, Any, Any, str, list[str]]:
    """``(costs, link, comm, cost file text, spread lines)`` of a calibration result:
    the contended steps (:func:`fit_steps`) or the benchmark measurements
    (:class:`~schedsim.replay.calibrate.Calibration`)."""
    if calibration.get("contended"):
        sf = fit_steps(calibration["steps"], program, semantics,
                       calibration.get("span_s"))
        f = sf.fit
        return (f.cost_model(), f.link_model(), f.comm_model(semantics),
                sf.to_toml(title), sf.spread_lines())
    from schedsim.replay.calibrate import Calibration

    cal = Calibration.model_validate(calibration)
    return (cal.cost_model(), cal.link_model(), cal.comm_model(semantics),
            cal.to_toml(title), [])

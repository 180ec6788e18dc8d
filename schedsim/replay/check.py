"""The engine checked against a measured run: two errors, reported apart. No torch.

- **semantics error**: the program simulated with the run's own measured durations
  (:func:`~schedsim.replay.fit.fit_timeline` with ``exact``: every op's duration, every
  message's transfer and sender completion, every instruction's host time) against the
  measurement. What is left is what the engine's comm semantics and the program get
  wrong: which wait releases when, which transfer may start when;
- **cost-model error**: the program simulated with a cost model (fitted medians, link
  fit and launch cost, or a given cost file / calibration) against the measurement.

Both as fractions of the measured makespan (:func:`fractions`): ``makespan`` is signed
``(predicted - measured) / measured``; ``mean_start`` and ``max_start`` are the mean and
largest ``|predicted - measured|`` op start (:mod:`schedsim.analysis.accuracy`).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from schedsim.analysis.accuracy import PredictionError, prediction_error
from schedsim.program.ir import Program
from schedsim.replay.fit import fit_timeline
from schedsim.sim.costs import CommModel, CostModel, LinkModel, Semantics
from schedsim.sim.simulate import simulate
from schedsim.timeline import Timeline
from schedsim.util.units import fmt_time, with_unit


def fractions(pe: PredictionError) -> dict[str, float]:
    """``{makespan, mean_start, max_start}`` of a prediction error as fractions of the
    measured makespan (module docstring)."""
    mk = pe.makespan_measured
    return {"makespan": pe.makespan_error / mk, "mean_start": pe.mean_start_error / mk,
            "max_start": abs(pe.max_start_error) / mk}


@dataclass
class TwoErrors:
    """Both errors of one measured run, with the two predictions they come from."""

    semantics: PredictionError
    cost_model: PredictionError
    exact_prediction: Timeline
    cost_prediction: Timeline
    comm_semantics: str
    #: every measured step's makespan (a replay's ``step_makespans``), or None
    step_makespans: list[float] | None = None
    #: the measurement (for the per-rank bubble breakdown), or None
    measured: Timeline | None = None
    #: a multi-step trace (:func:`steps_errors`): per profiler step ``(N, measured
    #: makespan, semantics makespan error, cost-model makespan error)``, or None
    per_step: list[tuple[int, float, float, float]] | None = None
    #: the profiler step these errors are of (the median one), or None
    step: int | None = None

    def bubble(self) -> list[dict[str, Any]]:
        """Per rank: wall, compute, transfer, waiting, host, the measured bubble and the
        cost-model prediction's (:func:`schedsim.analysis.bubble.bubble_breakdown`)."""
        from schedsim.analysis.bubble import bubble_breakdown

        return [] if self.measured is None else bubble_breakdown(self.measured,
                                                                 self.cost_prediction)

    def step_errors(self) -> list[float]:
        """The cost-model makespan error against each measured step (fractions): of a
        multi-step trace, each step's own (:attr:`per_step`); of a replay, the one
        prediction against each step's makespan."""
        if self.per_step:
            return [x[3] for x in self.per_step]
        p = self.cost_prediction.makespan
        return [(p - m) / m for m in self.step_makespans or () if m > 0]

    def to_dict(self) -> dict[str, Any]:
        """``{"semantics_error": {makespan, mean_start, max_start}, "cost_model_error":
        {...}}`` plus ``semantics`` (the prediction's), ``makespan_measured``, ``unit``
        and ``ops``; ``bubble``, one ``{rank, wall, compute, transfer, waiting, host,
        bubble, predicted_bubble}`` per rank (:meth:`bubble`); with several measured
        steps also ``cost_model_error_steps``: ``{median, min, max, per_step}`` of the
        makespan error against each step."""
        out = {"semantics_error": fractions(self.semantics),
               "cost_model_error": fractions(self.cost_model),
               "semantics": self.comm_semantics,
               "makespan_measured": self.semantics.makespan_measured,
               "unit": self.exact_prediction.unit, "ops": self.semantics.ops}
        if self.measured is not None:
            out["bubble"] = self.bubble()
        errs = self.step_errors()
        if len(errs) > 1:
            out["cost_model_error_steps"] = _summary(errs)
        if self.per_step:
            out["semantics_error_steps"] = _summary([x[2] for x in self.per_step])
            out["profiler_steps"] = {"median_step": self.step,
                                     "steps": [x[0] for x in self.per_step],
                                     "makespans": [x[1] for x in self.per_step]}
        return out

    def lines(self) -> list[str]:
        """Two lines for a terminal, one per error."""
        out = []
        for what, pe in (("semantics error", self.semantics),
                         ("cost-model error", self.cost_model)):
            f = fractions(pe)
            out.append(f"{what:16s}: makespan {100 * f['makespan']:+.1f}%, op start mean "
                       f"{100 * f['mean_start']:.1f}% / max {100 * f['max_start']:.1f}% of "
                       f"the measured makespan ({pe.worst_op}; {pe.ops} ops)")
        if self.measured is not None:
            from schedsim.analysis.bubble import breakdown_lines

            out += breakdown_lines(self.bubble(), self.measured.unit)
        errs = self.step_errors()
        if self.per_step:
            ms = [x[1] for x in self.per_step]
            sem = [x[2] for x in self.per_step]
            out.append(f"over the {len(ms)} profiler steps (makespans {fmt_time(min(ms))} .. "
                       f"{with_unit(max(ms), self.exact_prediction.unit)}, median step "
                       f"{self.step}): cost-model error (makespan) {_pct(errs)}; semantics "
                       f"error {_pct(sem)}")
            out.append("per step (N: measured makespan, cost-model error): " + ", ".join(
                f"{k}: {fmt_time(m)} {100 * c:+.1f}%" for k, m, _, c in self.per_step))
        elif len(errs) > 1:
            out.append(f"cost-model error over the {len(errs)} measured steps (makespan): "
                       f"{_pct(errs)}")
        return out


def _summary(xs: list[float]) -> dict[str, Any]:
    """``{median, min, max, per_step}`` of per-step errors (fractions)."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "per_step": xs}


def _pct(xs: list[float]) -> str:
    """``median +x.x% [min, max]`` of fractions."""
    return (f"median {100 * statistics.median(xs):+.1f}% [{100 * min(xs):+.1f}, "
            f"{100 * max(xs):+.1f}]")


def two_errors(measured: Timeline, program: Program, *, semantics: Semantics = "rendezvous",
               model: tuple[CostModel, LinkModel, CommModel] | None = None) -> TwoErrors:
    """Both errors of ``measured``, a run of ``program`` (module docstring). ``model``:
    the cost model of the cost-model error (default: fitted from ``measured`` itself).
    Raises :class:`~schedsim.errors.ScenarioError` /
    :class:`~schedsim.errors.SchedsimError` when the program and the run differ or the
    program cannot run."""
    exact = fit_timeline(measured, program, exact=True)
    ex = simulate(program, exact.cost_model(), exact.link_model(),
                  exact.comm_model(semantics))
    if model is None:
        fit = fit_timeline(measured)
        model = (fit.cost_model(), fit.link_model(), fit.comm_model(semantics))
    cm = simulate(program, *model)
    return TwoErrors(prediction_error(ex, measured), prediction_error(cm, measured), ex, cm,
                     semantics, measured=measured)


def steps_errors(steps: dict[int, Timeline], program: Program, *,
                 semantics: Semantics = "rendezvous",
                 model: tuple[CostModel, LinkModel, CommModel] | None = None) -> TwoErrors:
    """Both errors of every profiler step of a multi-step trace (``{N: Timeline}``,
    :func:`schedsim.interop.kineto_steps.import_steps`), each as :func:`two_errors`
    (``model`` None: each step's costs fitted from that step itself). Returns the median
    step's :class:`TwoErrors` (:func:`~schedsim.interop.kineto_steps.median_step`) with
    ``per_step`` and ``step`` set. Raises as :func:`two_errors`."""
    from schedsim.interop.kineto_steps import median_step

    per = {k: two_errors(tl, program, semantics=semantics, model=model)
           for k, tl in steps.items()}
    keep = median_step(steps)
    head = per[keep]
    head.step = keep
    head.per_step = [(k, steps[k].makespan, fractions(e.semantics)["makespan"],
                      fractions(e.cost_model)["makespan"]) for k, e in per.items()]
    return head


def send_waits_before_recv(tl: Timeline) -> tuple[int, int]:
    """How a measured backend's sends complete: among the messages whose sender began
    waiting for the send before the receiver posted the matching recv, ``(completed only
    after that recv post, all of them)``. Rendezvous semantics predicts all of them (a send
    completes only once the receiver posted), eager none (a send completes once its bytes
    have left)."""
    from schedsim.program.tokens import parse_comm

    since: dict[tuple[str, int, int], float] = {}
    for w in tl.waits:
        for tok in w.comms:
            c = parse_comm(tok)
            if c.is_send:
                since.setdefault(c.message_key(), w.start)
    late = total = 0
    for m in tl.messages:
        t = since.get(m.key)
        if t is None or m.recv_posted is None or m.send_done is None:
            continue
        if t < m.recv_posted:
            total += 1
            late += m.send_done >= m.recv_posted
    return late, total

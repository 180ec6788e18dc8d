"""Prediction vs measurement: error metrics and the overlay figure. No torch.

The errors are those of :mod:`schedsim.analysis.accuracy` (one definition for the console
line, the overlay figure and the README):

- makespan error ``= (predicted - measured) / measured`` in %;
- per-op start error: ops matched by ``(rank, kind, stage, microbatch)`` (an FB pair is
  two ops) — both timelines come from the same program —, ``mean |start_pred -
  start_meas| / measured makespan`` in %, with the largest one named.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..analysis.accuracy import prediction_error
from ..timeline import Timeline


def compare_metrics(predicted: Timeline, measured: Timeline) -> dict[str, Any]:
    """Makespan error and per-op start error of ``predicted`` against ``measured``
    (:func:`schedsim.analysis.accuracy.prediction_error` as a dict).

    Returns ``{makespan_predicted, makespan_measured, makespan_error,
    makespan_error_pct, mean_start_error, mean_start_error_pct, max_start_error,
    max_start_error_pct, worst_op, ops, moved}`` (times in the timelines' unit, ``*_pct``
    in %). Raises :class:`~schedsim.errors.ScenarioError` if the timelines do not hold
    the same ops or the measured makespan is 0.
    """
    return prediction_error(predicted, measured).to_dict()


def summary_line(m: dict[str, Any], unit: str = "ms") -> str:
    """``makespan: predicted X, measured Y (error Z%); per-op start error ...``, where
    error = (predicted - measured) / measured and start errors are % of the measured
    makespan."""
    return (f"makespan: predicted {m['makespan_predicted']:.4g} {unit}, measured "
            f"{m['makespan_measured']:.4g} {unit} (error {m['makespan_error_pct']:+.1f}%); "
            f"per-op start error: mean {m['mean_start_error_pct']:.1f}% of makespan, max "
            f"{m['max_start_error_pct']:.1f}% ({m['worst_op']}) over {m['ops']} ops")


def write_overlay(predicted: Timeline, measured: Timeline, path: str | Path,
                  title: str | None = None, width: float = 12.0, tol_frac: float = 0.05
                  ) -> None:
    """Overlay figure (upper half-row: predicted, lower: measured), via
    :func:`schedsim.plot.overlay`; measured ops starting more than ``tol_frac`` of the
    measured makespan away from their prediction are outlined. ``width`` in inches."""
    from ..plot import overlay, save_figure

    fig = overlay(predicted, measured, names=("predicted", "measured"),
                  title=title, width=width, tol=tol_frac * measured.makespan)
    save_figure(fig, path)

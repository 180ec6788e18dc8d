"""Prediction vs measurement: error metrics and the overlay figure. No torch.

- makespan error ``= (predicted - measured) / measured`` in %;
- per-op start error: ops are matched by (rank, instruction index) — both timelines come
  from the same program — and ``mean |start_pred - start_meas| / measured makespan`` is
  given in %, with the largest one named.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ScenarioError
from ..timeline import Timeline


def compare_metrics(predicted: Timeline, measured: Timeline) -> dict[str, Any]:
    """Makespan error and per-op start error of ``predicted`` against ``measured``.

    Returns ``{makespan_predicted, makespan_measured, makespan_error_pct,
    mean_start_error_pct, max_start_error_pct, worst_op, ops}``. Raises
    :class:`ScenarioError` if the timelines do not hold the same ops.
    """
    a = {(s.rank, s.index): s for s in predicted.spans}
    b = {(s.rank, s.index): s for s in measured.spans}
    if a.keys() != b.keys() or not a:
        raise ScenarioError(f"cannot compare: the timelines hold different ops "
                            f"({len(a)} predicted, {len(b)} measured spans)")
    mk = measured.makespan
    if mk <= 0:
        raise ScenarioError("cannot compare: the measured makespan is 0")
    errs = {k: abs(a[k].start - b[k].start) for k in a}
    worst = max(errs, key=errs.__getitem__)
    ws = b[worst]
    return {"makespan_predicted": predicted.makespan, "makespan_measured": mk,
            "makespan_error_pct": 100.0 * (predicted.makespan - mk) / mk,
            "mean_start_error_pct": 100.0 * sum(errs.values()) / len(errs) / mk,
            "max_start_error_pct": 100.0 * errs[worst] / mk,
            "worst_op": f"{ws.stage}{ws.kind}{ws.mb} on rank {ws.rank}", "ops": len(errs)}


def summary_line(m: dict[str, Any], unit: str = "ms") -> str:
    """``makespan: predicted X, measured Y (error Z%); per-op start error ...``."""
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

    fig = overlay(predicted, measured, names=("predicted", f"measured ({measured.semantics})"),
                  title=title, width=width, tol=tol_frac * measured.makespan)
    save_figure(fig, path)

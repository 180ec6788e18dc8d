"""How far one timeline is from another of the same ops: the prediction error.

One definition, used by ``schedsim replay --compare``'s console line, the overlay figure
(:func:`schedsim.plot.overlay`, ``schedsim render A --overlay B``) and the README. The
first timeline is the *prediction*, the second the *reference* (the measurement):

- makespan error ``= (predicted - measured) / measured``, in % (negative: the prediction
  is too short);
- per-op start error: ops matched by ``(rank, kind, stage, microbatch)`` (an ``FB`` span
  counts as its two ops, both starting at its start); the error of an op is
  ``start_predicted - start_measured``; the mean of ``|error|`` over all ops and the
  largest ``|error|`` are given as % of the measured makespan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from schedsim.errors import ScenarioError
from schedsim.timeline import Span, Timeline


@dataclass(frozen=True)
class OpError:
    """Start time of one op in both timelines: ``start_a`` (predicted), ``start_b``
    (measured). ``error = start_a - start_b``; ``delta = start_b - start_a``."""

    rank: int
    kind: str
    stage: int
    mb: int
    start_a: float
    start_b: float

    @property
    def delta(self) -> float:
        return self.start_b - self.start_a

    @property
    def error(self) -> float:
        """Predicted minus measured start (negative: predicted too early)."""
        return self.start_a - self.start_b

    def label(self) -> str:
        return f"{self.stage}{self.kind}{self.mb} on rank {self.rank}"


def _keyed(tl: Timeline) -> dict[tuple[int, str, int, int], Span]:
    out: dict[tuple[int, str, int, int], Span] = {}
    for s in tl.spans:
        for p in (s.parts or [s]):
            out[(s.rank, p.kind, p.stage, p.mb)] = s
    return out


def op_start_errors(a: Timeline, b: Timeline) -> list[OpError]:
    """Per op (an FB span counts as its two parts), its start in ``a`` and in ``b``,
    sorted by ``(rank, kind, stage, microbatch)``.

    Ops are matched by ``(rank, kind, stage, microbatch)``. Raises
    :class:`ScenarioError` when the timelines have different ranks or different ops
    (naming a few of the ops found in only one of them).
    """
    if a.ranks != b.ranks:
        raise ScenarioError(f"cannot overlay timelines with {a.ranks} and {b.ranks} ranks: "
                            "overlay needs two timelines of the same program")
    ka, kb = _keyed(a), _keyed(b)
    require_same_ops(ka.keys(), kb.keys(), lambda k: f"{k[2]}{k[1]}{k[3]}@rank{k[0]}",
                     "overlay", ScenarioError)
    return [OpError(k[0], k[1], k[2], k[3], ka[k].start, kb[k].start) for k in sorted(ka)]


def require_same_ops(keys_a, keys_b, show, action: str, error: type) -> None:
    """Raise ``error`` naming (up to 3 of) the ops found in only one of two timelines, if
    their op keys differ; ``show(key)`` formats one key and ``action`` says what needed
    them equal ("overlay", "diff"). Shared by overlays, prediction errors and diffs."""
    if keys_a == keys_b:
        return
    only_a = sorted(set(keys_a) - set(keys_b))
    only_b = sorted(set(keys_b) - set(keys_a))

    def listing(keys: list) -> str:
        txt = ", ".join(show(k) for k in keys[:3])
        return txt + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")
    msg = []
    if only_a:
        msg.append(f"{len(only_a)} ops only in the first ({listing(only_a)})")
    if only_b:
        msg.append(f"{len(only_b)} ops only in the second ({listing(only_b)})")
    raise error(f"cannot {action} timelines of different ops: " + "; ".join(msg)
                + f" — {action} needs two runs of the same ops")


@dataclass(frozen=True)
class PredictionError:
    """The prediction error of a timeline against a reference (module docstring).

    Times in the timelines' unit; ``*_pct`` in %. ``worst_op`` is the op with the largest
    ``|start error|`` (``"1F7 on rank 1"``), ``max_start_error`` its signed error
    (predicted - measured). ``moved``: ops whose starts differ by more than the ``tol``
    given to :func:`prediction_error`.
    """

    makespan_predicted: float
    makespan_measured: float
    makespan_error: float
    makespan_error_pct: float
    mean_start_error: float
    mean_start_error_pct: float
    max_start_error: float
    max_start_error_pct: float
    worst_op: str
    ops: int
    moved: int

    def to_dict(self) -> dict:
        return asdict(self)


def prediction_error(predicted: Timeline, measured: Timeline, tol: float = 1e-9,
                     errors: list[OpError] | None = None) -> PredictionError:
    """:class:`PredictionError` of ``predicted`` against ``measured`` (module docstring).

    ``errors``: the :func:`op_start_errors` of the pair, if already computed. Raises
    :class:`ScenarioError` if the timelines hold different ops, or the measured makespan
    is not positive (no relative error).
    """
    errs = op_start_errors(predicted, measured) if errors is None else errors
    mk = measured.makespan
    if not errs:
        raise ScenarioError("cannot compare: the timelines hold no ops")
    if mk <= 0:
        raise ScenarioError("cannot compare: the measured makespan is 0")
    worst = max(errs, key=lambda e: abs(e.error))
    mean = sum(abs(e.error) for e in errs) / len(errs)
    dm = predicted.makespan - mk
    return PredictionError(
        makespan_predicted=predicted.makespan, makespan_measured=mk, makespan_error=dm,
        makespan_error_pct=100.0 * dm / mk, mean_start_error=mean,
        mean_start_error_pct=100.0 * mean / mk, max_start_error=worst.error,
        max_start_error_pct=100.0 * abs(worst.error) / mk, worst_op=worst.label(),
        ops=len(errs), moved=sum(abs(e.error) > tol for e in errs))


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
    from schedsim.util.units import with_unit

    return (f"makespan: predicted {with_unit(m['makespan_predicted'], unit)}, measured "
            f"{with_unit(m['makespan_measured'], unit)} (error {m['makespan_error_pct']:+.1f}%); "
            f"per-op start error: mean {m['mean_start_error_pct']:.1f}% of makespan, max "
            f"{m['max_start_error_pct']:.1f}% ({m['worst_op']}) over {m['ops']} ops")

"""Traces that hold several profiler steps (``ProfilerStep#N`` ranges): the one rule for
which step stands for them (the files are read by
:func:`schedsim.interop.kineto.import_steps` and ``import_traces``).

One step of a run samples the machine's speed at one moment; on a shared or virtual
machine that speed moves by up to 2x within a second (docs/traces.md, "From a separate
run"), so a run is described by its **median step**: the step whose makespan is the
median (the lower median of an even count, :func:`median_index`), as ``schedsim replay``
keeps among its measured steps. ``import-trace`` of a multi-step trace without
``--step`` imports the median step; ``check-trace`` reports every step and heads with
the median one (:mod:`schedsim.cli.check`).
"""
from __future__ import annotations

from typing import Any

from schedsim.util.units import fmt_time

_PREFIX = "ProfilerStep#"


def median_index(values: list[float]) -> int:
    """The index of the median of ``values`` (the lower median of an even count; the
    first such index on ties). Raises ValueError when ``values`` is empty."""
    if not values:
        raise ValueError("median_index of no values")
    order = sorted(range(len(values)), key=lambda k: values[k])
    return order[(len(values) - 1) // 2]


def profiler_steps(traces: dict[int, Any]) -> list[int]:
    """The ``ProfilerStep#N`` numbers every rank's trace holds (sorted); [] when a file
    has none."""
    common: set[int] | None = None
    for tr in traces.values():
        mine = set()
        for e in tr.events:
            n = e.get("name", "")
            if isinstance(n, str) and n.startswith(_PREFIX) and n[len(_PREFIX):].isdigit():
                mine.add(int(n[len(_PREFIX):]))
        common = mine if common is None else common & mine
    return sorted(common or ())


def median_step(steps: dict[int, Any]) -> int:
    """The profiler step number of the median makespan among ``steps`` (:func:`import_steps`;
    :func:`median_index`)."""
    keys = list(steps)
    return keys[median_index([steps[k].makespan for k in keys])]


def note_median(tl: Any, steps: dict[int, Any], keep: int) -> None:
    """Record on the imported median step ``tl`` which step it is and every step's
    makespan (``step``, ``step_makespans``, an import note)."""
    ms = [steps[k].makespan for k in steps]
    tl.step = keep
    tl.step_makespans = ms
    tl.import_notes = [*getattr(tl, "import_notes", []),
                       f"{len(ms)} profiler steps (makespans {fmt_time(min(ms))} .. "
                       f"{fmt_time(max(ms))} "
                       f"{tl.unit}): imported step {keep}, the median makespan; --step N "
                       f"for another"]


def pick_median(steps: dict[int, Any]) -> Any:
    """The median step's Timeline of ``{N: Timeline}``, noted (:func:`note_median`)."""
    keep = median_step(steps)
    note_median(steps[keep], steps, keep)
    return steps[keep]

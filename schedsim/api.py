"""The command line's questions as Python functions for notebooks and scripts: each takes
a :class:`~schedsim.scenario.Scenario` (from :func:`scenario` or
:func:`~schedsim.scenario.load_scenario`) and returns objects, never printed tables.

=====================  =================================================================
function               returns
=====================  =================================================================
:func:`scenario`       a Scenario from a TOML file and/or the values the CLI flags set
:func:`run`            the simulated :class:`~schedsim.timeline.Timeline`
:func:`stalls`         every idle interval with its cause (``Stall``)
:func:`align`          per message: data ready, posts, transfer, consumer (``AlignRow``)
:func:`critical_path`  the chain that sets the makespan and every op's slack
:func:`query`          does a cause delay an effect, per semantics (``Answer``)
:func:`lint`           the program's findings (``Finding``)
:func:`compare`        several schedules side by side (``Comparison``)
:func:`compare_overlaps` the same once per stage-model overlap mode (``OverlapComparison``)
:func:`diff`           per-op start deltas of B against A (``TimelineDiff``)
:func:`replay`         the measured Timeline of a torch.distributed run
:func:`check_collective` the user's TP reduction checked (``CollectiveCheck``)
=====================  =================================================================

Importing this module also imports :mod:`schedsim.plot`, so a Timeline shows as its
Gantt chart in a notebook (``Timeline._repr_png_``). Errors are
:class:`~schedsim.errors.SchedsimError` subclasses, as on the command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import schedsim.plot  # noqa: F401  (registers the Timeline's PNG view)
from schedsim.errors import ScenarioError
from schedsim.replay.collective_api import CollectiveCheck, check_collective
from schedsim.scenario import Scenario
from schedsim.sweep import Comparison, OverlapComparison
from schedsim.timeline import Timeline

__all__ = ["scenario", "run", "stalls", "align", "critical_path", "query", "lint",
           "compare", "compare_overlaps", "diff", "replay", "check_collective", "CollectiveCheck",
           "CriticalPath", "Comparison", "OverlapComparison"]

def scenario(path: str | Path | None = None, **values: Any) -> Scenario:
    """A :class:`Scenario` from the TOML file ``path`` (optional) with ``values`` on top,
    exactly as the command line's flags of the same names (``schedule``, ``ranks``,
    ``microbatches``, ``chunks``, ``variant``, ``param`` (KEY=VALUE items or a dict),
    ``cost`` (``"F=1,BW=2"``), ``semantics``, ``comm_stream``, ``comm_policy``,
    ``latency``, ``bandwidth``, ...: :func:`schedsim.scenario_flags.build_scenario`).
    Raises :class:`~schedsim.errors.ScenarioError` for a bad value."""
    from schedsim.scenario_flags import build_scenario

    return build_scenario(Path(path) if path is not None else None, **values)


def run(sc: Scenario) -> Timeline:
    """The simulated Timeline of ``sc`` (a deadlocked run is returned with its
    ``deadlock`` set, not raised)."""
    from schedsim.sim.simulate import simulate

    return simulate(sc.build_program(), sc.costs, sc.link, sc.comm, raise_on_deadlock=False)


def stalls(sc: Scenario) -> list[Any]:
    """Every idle interval of every rank with its cause
    (:func:`schedsim.analysis.stalls.attribute_stalls`)."""
    from schedsim.analysis.stalls import attribute_stalls

    prog = sc.build_program()
    from schedsim.sim.simulate import simulate

    return attribute_stalls(simulate(prog, sc.costs, sc.link, sc.comm,
                                     raise_on_deadlock=False), prog)


def align(sc: Scenario, late_threshold: float = 0.0) -> list[Any]:
    """One :class:`~schedsim.analysis.align.AlignRow` per message, in data-ready order."""
    from schedsim.analysis.align import alignment

    return alignment(run(sc), late_threshold)


@dataclass
class CriticalPath:
    """What ``schedsim critical-path`` prints: ``path`` (steps: op, post, message,
    wait, in time order), ``slack`` (per op: how far it can slip before the makespan
    moves), ``makespan`` and the headline ``summary``."""

    makespan: float
    path: list[Any]
    slack: list[Any]
    summary: str
    route: str

    def to_dict(self) -> dict[str, Any]:
        return {"makespan": self.makespan, "path": [s.to_dict() for s in self.path],
                "slack": [o.to_dict() for o in self.slack]}

    def __repr__(self) -> str:
        return f"<CriticalPath: {self.summary}>"


def critical_path(sc: Scenario) -> CriticalPath:
    """The critical path of ``sc``'s run (:mod:`schedsim.analysis.critical`). Raises
    :class:`~schedsim.errors.DeadlockError` when the run deadlocks."""
    from schedsim.analysis._simulated import simulate_compiled
    from schedsim.analysis.critical import critical_path as path_of, op_slack, \
        path_headline, slack_values
    from schedsim.analysis.graph import build_graph
    from schedsim.errors import DeadlockError

    prog = sc.build_program()
    tl, gi = simulate_compiled(prog, sc.costs, sc.link, sc.comm)
    if tl.deadlock is not None:
        raise DeadlockError(tl.deadlock.message, tl)
    G = build_graph(tl, prog, sc.link, sc.comm, compiled=gi)
    path = path_of(G)
    sl = slack_values(G)
    head, route = path_headline(path, tl.makespan, int((sl == 0).sum()), len(sl),
                                unit=tl.unit)
    return CriticalPath(tl.makespan, path, op_slack(G), head, route)


def query(sc: Scenario, effect: str, causes: str | Sequence[str],
          semantics: str | None = None) -> list[Any]:
    """Does ``causes`` (selectors, freed together) delay ``effect``? One
    :class:`~schedsim.analysis.query.Answer` per semantics: ``sc``'s, or data, eager
    and rendezvous for ``semantics="all"`` (selector grammar: ``schedsim query
    --help``)."""
    from schedsim.analysis.query import SEMANTICS, answer
    from schedsim.analysis.select import select

    prog = sc.build_program()
    eff = select(prog, effect, "effect")
    cs = [select(prog, c, "cause") for c in ([causes] if isinstance(causes, str)
                                               else causes)]
    sems = list(SEMANTICS) if semantics == "all" else [semantics or sc.comm.semantics]
    return [answer(prog, eff, cs, sc.costs, sc.link,
                   sc.comm.model_copy(update={"semantics": s})) for s in sems]


def lint(sc: Scenario, late_threshold: float = 0.0) -> list[Any]:
    """The program's :class:`~schedsim.analysis.lint.Finding` s (the timed rules run
    under ``sc``'s semantics, eager when it says data)."""
    from schedsim.analysis.lint import lint as run_lint
    from schedsim.sim.simulate import simulate

    prog = sc.build_program()
    comm = sc.comm if sc.comm.semantics != "data" else \
        sc.comm.model_copy(update={"semantics": "eager"})
    tl = simulate(prog, sc.costs, sc.link, comm, raise_on_deadlock=False)
    return run_lint(prog, tl, late_threshold, lazy_init=sc.comm.lazy_init)


def compare(sc: Scenario, schedules: str | Sequence[str] | None = None, *,
            per_rank_costs: bool = True, keep_timelines: bool = False,
            jobs: int = 1) -> Comparison:
    """Every schedule (or ``schedules``, ``"interleaved-1f1b:chunks=4,zbv"`` or a list)
    at ``sc``'s ranks and microbatches with its costs, link, comm and memory model
    (:func:`schedsim.sweep.compare_schedules`)."""
    from schedsim.analysis.memory import MemoryModel
    from schedsim.sweep import compare_schedules

    s = sc.schedule
    if s.ranks is None or s.microbatches is None:
        raise ScenarioError("compare needs the scenario's ranks and microbatches")
    names = [schedules] if isinstance(schedules, str) else schedules
    return compare_schedules(s.ranks, s.microbatches, sc.costs, sc.link, sc.comm, names,
                             MemoryModel.from_spec(sc.memory or None),
                             per_rank_costs=per_rank_costs, keep_timelines=keep_timelines,
                             jobs=jobs)


def compare_overlaps(sc: Scenario, modes: str | Sequence[str],
                     schedules: str | Sequence[str] | None = None) -> OverlapComparison:
    """:func:`compare` once per stage-model overlap mode (``"none,fb"`` or a list, two or
    more) of a scenario with a ``[model]`` table, with each schedule's makespan gain over
    the first mode (``compare --model-overlap``; :func:`schedsim.sweep.compare_overlap_modes`).
    Raises :class:`ScenarioError` without a ``[model]``, ranks or microbatches."""
    from schedsim.analysis.memory import MemoryModel
    from schedsim.sweep import compare_overlap_modes

    s = sc.schedule
    if s.ranks is None or s.microbatches is None:
        raise ScenarioError("compare needs the scenario's ranks and microbatches")
    names = [schedules] if isinstance(schedules, str) else schedules
    data = sc.model_dump(exclude={"base_dir", "schedule"}, exclude_none=True,
                         exclude_unset=True)
    return compare_overlap_modes(data, modes, s.ranks, s.microbatches,
                                 None if names is None else list(names),
                                 MemoryModel.from_spec(sc.memory or None))


def diff(a: Scenario, b: Scenario) -> Any:
    """Per-op start deltas and the makespan delta of ``b`` against ``a`` (same ops,
    matched by identity), both run with ``a``'s costs, link and comm
    (:func:`schedsim.analysis.diff.diff_timelines`)."""
    from schedsim.analysis.diff import diff_timelines
    from schedsim.sim.simulate import simulate

    return diff_timelines(simulate(a.build_program(), a.costs, a.link, a.comm),
                          simulate(b.build_program(), a.costs, a.link, a.comm))


def replay(sc: Scenario, *, check_grads: bool = False, timeout: float | None = None
           ) -> Timeline:
    """Run ``sc``'s program on local torch.distributed processes (gloo on CPU) and return
    the measured Timeline (``grad_check`` set with ``check_grads``). Raises
    :class:`~schedsim.replay.config.ReplayError` when a rank fails or times out."""
    from schedsim.replay.config import require_torch, spec_from_scenario
    from schedsim.replay.launch import launch

    require_torch()
    spec = spec_from_scenario(sc, check_grads=check_grads, timeout=timeout)
    n = spec.program["placement"]["ranks"] * spec.config.tp   # one process per rank, TP rank
    return Timeline.model_validate(launch(spec, n)["timeline"])

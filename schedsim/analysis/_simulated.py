"""Simulate and keep what the run's dependency graph needs of the compiled program, so
that an analysis of the run does not compile the program a second time."""
from __future__ import annotations

from schedsim.analysis._graph_edges import GraphInput
from schedsim.analysis._graph_input import graph_input
from schedsim.program.ir import Program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate_run
from schedsim.timeline import Timeline
from schedsim.util.gc import no_gc


def simulate_compiled(program: Program, costs: CostModel, link: LinkModel,
                      comm: CommModel) -> tuple[Timeline, GraphInput | None]:
    """``(timeline, graph input)`` of ``program``: what
    :func:`schedsim.sim.simulate.simulate` returns (``raise_on_deadlock=False``), and
    :func:`~schedsim.analysis._graph_input.graph_input` of the compiled form it ran (for
    :func:`~schedsim.analysis.graph.build_graph`; the compiled form itself is freed).
    A run that deadlocks comes back with ``None`` (its timeline carries the diagnosis).

    Raises what ``simulate`` raises.
    """
    with no_gc():
        tl, cp, st = simulate_run(program, costs, link, comm, raise_on_deadlock=False)
        del st
        gi = None if tl.deadlock is not None else graph_input(cp)
        del cp
    return tl, gi

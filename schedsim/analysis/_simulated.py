"""Simulate and keep what the run's dependency graph needs of the compiled program, so
that an analysis of the run does not compile the program a second time."""
from __future__ import annotations

import math

from schedsim.analysis._graph_edges import GraphInput, graph_input
from schedsim.program.ir import Program
from schedsim.sim.compile import compile_program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.engine import build_timeline, run
from schedsim.sim.simulate import simulate
from schedsim.timeline import Timeline
from schedsim.util.gc import no_gc


def simulate_compiled(program: Program, costs: CostModel, link: LinkModel,
                      comm: CommModel) -> tuple[Timeline, GraphInput | None]:
    """``(timeline, graph input)`` of ``program``: what
    :func:`schedsim.sim.simulate.simulate` returns (``raise_on_deadlock=False``), and
    :func:`~schedsim.analysis._graph_edges.graph_input` of the compiled form it ran (for
    :func:`~schedsim.analysis.graph.build_graph`; the compiled form itself is freed). A
    run that deadlocks or overflows is handed to ``simulate`` (the one home of those
    diagnoses) and comes back with ``None``.

    Raises what ``simulate`` raises.
    """
    with no_gc():
        cp = compile_program(program, costs, link, comm)
        st = run(cp)
        clean = all(st.pcs[r] >= len(code) for r, code in enumerate(cp.code))
        tl = build_timeline(cp, st, comm, costs.unit) if clean else None
        del st
        if tl is None or not math.isfinite(tl.makespan):
            del cp
            return simulate(program, costs, link, comm, raise_on_deadlock=False), None
        gi = graph_input(cp)
    return tl, gi

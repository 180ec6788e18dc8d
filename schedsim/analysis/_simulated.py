"""Simulate and keep the compiled program, so that an analysis of the run (its
dependency graph) does not compile the program a second time."""
from __future__ import annotations

import math

from schedsim.program.ir import Program
from schedsim.sim.compile import Compiled, compile_program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.engine import build_timeline, run
from schedsim.sim.simulate import simulate
from schedsim.timeline import Timeline
from schedsim.util.gc import no_gc


def simulate_compiled(program: Program, costs: CostModel, link: LinkModel,
                      comm: CommModel) -> tuple[Timeline, Compiled | None]:
    """``(timeline, compiled program)`` of ``program``: what
    :func:`schedsim.sim.simulate.simulate` returns (``raise_on_deadlock=False``), and the
    compiled form it ran. A run that deadlocks or overflows is handed to ``simulate``
    (the one home of those diagnoses) and comes back with ``None``.

    Raises what ``simulate`` raises.
    """
    with no_gc():
        cp = compile_program(program, costs, link, comm)
        st = run(cp)
        clean = all(st.pcs[r] >= len(code) for r, code in enumerate(cp.code))
        tl = build_timeline(cp, st, comm, costs.unit) if clean else None
    if tl is None or not math.isfinite(tl.makespan):
        return simulate(program, costs, link, comm, raise_on_deadlock=False), None
    return tl, cp

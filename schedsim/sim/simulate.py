"""``simulate``: compile a program, run the engine, build the Timeline and, when the
program cannot finish, explain the deadlock."""
from __future__ import annotations

import math

from schedsim.errors import DeadlockError, ScenarioError
from schedsim.program.ir import Program
from schedsim.sim.compile import compile_program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.deadlock import diagnose
from schedsim.sim.engine import build_timeline, run
from schedsim.timeline import Timeline
from schedsim.util.gc import no_gc


def simulate(program: Program, costs: CostModel | None = None, link: LinkModel | None = None,
             comm: CommModel | None = None, *, raise_on_deadlock: bool = True) -> Timeline:
    """Simulate ``program`` and return its :class:`Timeline` (times in ``costs.unit``).

    Raises :class:`~schedsim.errors.ProgramError` for an ill-formed program and
    :class:`~schedsim.errors.DeadlockError` (carrying the partial timeline with its
    ``deadlock`` field filled) if it can never finish, unless ``raise_on_deadlock`` is
    False, in which case the partial timeline is returned.
    """
    costs = costs or CostModel()
    link = link or LinkModel()
    comm = comm or CommModel()
    with no_gc():
        cp = compile_program(program, costs, link, comm)
        st = run(cp)
        tl = build_timeline(cp, st, comm, costs.unit)
    if not math.isfinite(tl.makespan):
        raise ScenarioError(f"times overflow to {tl.makespan}: the costs, latencies or "
                            f"message sizes are too large for floating point")
    if any(st.pcs[r] < len(cp.code[r]) for r in range(len(cp.code))):
        tl.deadlock = diagnose(cp, st)
        if raise_on_deadlock:
            raise DeadlockError(tl.deadlock.message, tl)
    return tl

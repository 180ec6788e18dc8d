"""``simulate``: validate and compile a program, run the engine, build the Timeline and,
when the program cannot finish, explain the deadlock."""
from __future__ import annotations

import math
from collections.abc import Iterable

from schedsim.errors import DeadlockError, ProgramError, ScenarioError
from schedsim.program.ir import Program
from schedsim.sim.compile import compile_program
from schedsim.sim.compiled import Compiled
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.deadlock import diagnose, unmatched_consequence
from schedsim.sim.engine import RunState, build_timeline, run
from schedsim.sim.free import make_free
from schedsim.timeline import Timeline
from schedsim.util.gc import no_gc


def simulate(program: Program, costs: CostModel | None = None, link: LinkModel | None = None,
             comm: CommModel | None = None, *, raise_on_deadlock: bool = True,
             free_ops: Iterable[tuple[int, int]] = (),
             free_messages: Iterable[tuple[str, int, int]] = ()) -> Timeline:
    """Simulate ``program`` and return its :class:`Timeline` (times in ``costs.unit``).

    ``free_ops``: ``(rank, instruction index)`` of compute ops that cost 0 in this run;
    ``free_messages``: message keys ``(kind, producing stage, mb)`` (``"F"``/``"B"``) made
    free: under ``eager``/``rendezvous`` each side completes the moment it is posted (no
    rank waits for it, it occupies no link or comm stream), under ``data`` it costs
    nothing on the link (its consumer still waits for its producer). Counterfactual
    queries (:mod:`schedsim.analysis.query`) use them; see ``docs/comm-semantics.md``.

    Raises :class:`~schedsim.errors.ProgramError` for an ill-formed program (its compute
    order is checked by :func:`~schedsim.program.validate.validate_program` unless the
    value is a checked one: built by a registered generator or policy, or returned by a
    validator), :class:`~schedsim.errors.ScenarioError` for a free op or message the
    program does not have, and
    :class:`~schedsim.errors.DeadlockError` (carrying the partial timeline with its
    ``deadlock`` field filled) if it can never finish, unless ``raise_on_deadlock`` is
    False, in which case the partial timeline is returned.
    """
    return simulate_run(program, costs, link, comm, raise_on_deadlock=raise_on_deadlock,
                        free_ops=free_ops, free_messages=free_messages)[0]


def simulate_run(program: Program, costs: CostModel | None = None,
                 link: LinkModel | None = None, comm: CommModel | None = None, *,
                 raise_on_deadlock: bool = True,
                 free_ops: Iterable[tuple[int, int]] = (),
                 free_messages: Iterable[tuple[str, int, int]] = ()
                 ) -> tuple[Timeline, Compiled, RunState]:
    """:func:`simulate` (same arguments, same errors), returning ``(timeline, compiled
    program, raw run state)``: for an analysis of the run that reads the compiled arrays
    (:mod:`schedsim.analysis.graph`) instead of compiling the program a second time."""
    costs = costs or CostModel()
    link = link or LinkModel()
    comm = comm or CommModel()
    with no_gc():
        from schedsim.program.validate import validate_program

        program = validate_program(program)      # returns a checked value as it is
        cp = compile_program(program, costs, link, comm, flat=program.flat(),
                             allow_unmatched=True)
        free_ops, free_messages = list(free_ops), list(free_messages)
        if free_ops or free_messages:
            cp = make_free(cp, free_ops, free_messages)
        st = run(cp)
        if cp.unmatched is not None:
            raise ProgramError(f"{cp.unmatched}; {unmatched_consequence(cp, st)}")
        tl = build_timeline(cp, st, comm, costs.unit)
        tl.findings = list(cp.swaps)
    if not math.isfinite(tl.makespan):
        raise ScenarioError(f"times overflow to {tl.makespan}: the costs, latencies or "
                            f"message sizes are too large for floating point")
    if not st.finished(cp):
        tl.deadlock = diagnose(cp, st)
        if raise_on_deadlock:
            raise DeadlockError(tl.deadlock.message, tl)
    return tl, cp, st


def warm_up() -> bool:
    """Load the numba-compiled kernels now (compiling them into numba's on-disk cache the
    first time), so that every later simulation in this process uses them whatever its
    size (:mod:`schedsim.sim.fast`). Returns False, doing nothing, when numba is not
    installed or ``SCHEDSIM_ENGINE=python``."""
    from schedsim.program.ir import Placement
    from schedsim.sim.fast import choice, jitted, numba_available

    if choice() == "python" or not numba_available():
        return False
    jitted()
    prog = Program(placement=Placement(kind="loop", ranks=2, stages=2), microbatches=1,
                   ranks=[["0F0", "0SEND_F0"], ["1RECV_F0", "WAIT[1RECV_F0]", "1F0"]])
    simulate(prog, comm=CommModel(semantics="eager"))      # loads both kernels
    return True

"""schedsim: pipeline-parallel schedule simulator and visualizer.

One program per rank, two executors (the discrete-event simulator here and the torch
replay in :mod:`schedsim.replay`), one :class:`Timeline` model. Quick start::

    from schedsim import build_program, simulate, CostModel, CommModel
    prog = build_program("dualpipe", ranks=8, microbatches=20)
    tl = simulate(prog, CostModel(F=1, B=1, W=1, BW=2, FB=3), comm=CommModel(semantics="data"))
    tl.makespan  # 66.0
"""
from schedsim.errors import (
                     DeadlockError,
                     ParseError,
                     ProgramError,
                     ScenarioError,
                     SchedsimError,
                     ScheduleError,
)
from schedsim.generators import build_program, generate
from schedsim.program.ir import (
                     Comm,
                     Commit,
                     Compute,
                     Op,
                     Placement,
                     Post,
                     Program,
                     Schedule,
                     Wait,
)
from schedsim.program.lower import lower
from schedsim.program.validate import validate_schedule
from schedsim.scenario import Scenario, load_scenario
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate
from schedsim.timeline import Message, Span, Timeline

__all__ = [
    "CommModel", "CostModel", "LinkModel", "simulate", "DeadlockError", "ParseError",
    "ProgramError", "ScenarioError", "ScheduleError", "SchedsimError", "build_program",
    "generate", "Comm", "Commit", "Compute", "Op", "Placement", "Post", "Program",
    "Schedule", "Wait", "lower", "Scenario", "load_scenario", "Message", "Span", "Timeline",
    "validate_schedule",
]
from schedsim.util.version import __version__  # noqa: E402

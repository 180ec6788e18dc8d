"""schedsim: pipeline-parallel schedule simulator and visualizer.

One program per rank, two executors (the discrete-event simulator here and the torch
replay in :mod:`schedsim.replay`), one :class:`Timeline` model. Quick start::

    from schedsim import build_program, simulate, CostModel, CommModel
    prog = build_program("dualpipe", ranks=8, microbatches=20)
    tl = simulate(prog, CostModel(F=1, B=1, W=1, BW=2, FB=3), comm=CommModel(semantics="data"))
    tl.makespan  # 66.0

The names below are imported on first use (PEP 562), so ``import schedsim`` and the
command line's start-up load only what they need.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(("DeadlockError", "ParseError", "ProgramError", "ScenarioError",
                     "SchedsimError", "ScheduleError"), "schedsim.errors"),
    **dict.fromkeys(("build_program", "generate"), "schedsim.generators"),
    **dict.fromkeys(("Comm", "Commit", "Compute", "Op", "Placement", "Post", "Program",
                     "Schedule", "Wait"), "schedsim.program.ir"),
    "lower": "schedsim.program.lower",
    "validate_schedule": "schedsim.program.validate",
    **dict.fromkeys(("Scenario", "load_scenario"), "schedsim.scenario"),
    **dict.fromkeys(("CommModel", "CostModel", "LinkModel"), "schedsim.sim.costs"),
    "simulate": "schedsim.sim.simulate",
    **dict.fromkeys(("Message", "Span", "Timeline"), "schedsim.timeline"),
}

#: subpackages exported as themselves: ``schedsim.plan(...)`` is the callable package
#: :mod:`schedsim.plan` (its :func:`~schedsim.plan.plan`)
_PACKAGES = ("plan",)

__all__ = sorted([*_EXPORTS, *_PACKAGES])
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _PACKAGES:
        return importlib.import_module(f"{__name__}.{name}")   # sets the attribute
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'schedsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_PACKAGES))


if TYPE_CHECKING:   # for type checkers and readers: the same names, imported eagerly
    from schedsim.errors import (  # noqa: F401
        DeadlockError,
        ParseError,
        ProgramError,
        ScenarioError,
        SchedsimError,
        ScheduleError,
    )
    from schedsim.generators import build_program, generate  # noqa: F401
    from schedsim.program.ir import (  # noqa: F401
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
    from schedsim.program.lower import lower  # noqa: F401
    from schedsim.program.validate import validate_schedule  # noqa: F401
    from schedsim.scenario import Scenario, load_scenario  # noqa: F401
    from schedsim.sim.costs import CommModel, CostModel, LinkModel  # noqa: F401
    from schedsim.sim.simulate import simulate  # noqa: F401
    from schedsim.timeline import Message, Span, Timeline  # noqa: F401

"""What an analysis command runs on: a scenario (simulated here) or a Timeline JSON (a
simulated, measured or imported run, analysed as it is). The one place that tells them
apart (:func:`timeline_input`) and gives both the same face (:func:`run_input`).

A Timeline JSON is accepted where a scenario is (``schedsim stalls T.json``, ``align``,
``critical-path``, ``memory``): the positional argument is read as a Timeline when it ends
in ``.json`` or is ``-`` (stdin). Its program is the one the timeline carries (field
``program``: replay and ``import-trace`` write it) or the one given with ``--program
FILE`` (its text; the timeline's placement, stages and microbatches are used); without
either, the analyses that need a program say so. The scenario flags that would change the run (costs,
semantics, schedule, ...) are refused: a timeline is a run already.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from schedsim.errors import ScenarioError

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.sim.costs import CommModel, LinkModel
    from schedsim.program.ir import Placement, Program
    from schedsim.program.vocab import SEMANTICS
    from schedsim.timeline import Timeline


#: the positional input of a command that takes a scenario or a timeline
InputArg = Annotated[Optional[Path], typer.Argument(
    help="Scenario TOML file (flags below override its values), or a Timeline JSON "
    "(simulated, measured by 'schedsim replay', or from 'schedsim import-trace') to "
    "analyse as it is.", show_default=False)]
#: scenario flags that still mean something for a timeline input
TIMELINE_FLAGS = ("scenario", "program", "placement", "stages")


def _costs():
    """:mod:`schedsim.sim.costs`, imported when a timeline input is made."""
    from schedsim.sim import costs

    return costs


@dataclass
class TimelineInput:
    """A Timeline given to a command in place of a scenario. Offers what the analysis
    commands use of a :class:`~schedsim.scenario.Scenario`: :meth:`build_program`,
    ``link``, ``comm``, ``memory``."""

    path: Path
    timeline: Timeline
    program: Program | None
    link: LinkModel = field(default_factory=lambda: _costs().LinkModel())
    comm: CommModel = field(default_factory=lambda: _costs().CommModel())
    memory: Any = None

    def build_program(self) -> Program:
        if self.program is None:
            why = ("simulate --json does not store it): give the scenario instead, or"
                   if self.timeline.source == "simulated" else "a partial trace, or written "
                   "before timelines carried one): give")
            raise ScenarioError(f"{self.path}: the timeline carries no program ({why} the "
                                f"program it ran with --program FILE")
        return self.program


def is_timeline_path(path: Path | None) -> bool:
    """Whether a command's positional input names a Timeline JSON: a ``.json`` file, or
    ``-`` (stdin, read by :func:`schedsim.util.inputs.read_input_bytes`: what
    ``schedsim simulate --json -`` writes)."""
    return path is not None and (path.suffix.lower() == ".json" or str(path) == "-")


def placement_of(tl: Timeline) -> Placement:
    """The timeline's placement (its ``program``'s when it carries one)."""

    from schedsim.program.ir import Placement, Program

    data = getattr(tl, "program", None)
    if data:
        return Program.model_validate(data).placement
    if tl.placement == "custom":
        raise ScenarioError("the timeline's placement is custom and it carries no program: "
                            "give --program FILE")
    return Placement(kind=tl.placement, ranks=tl.ranks, stages=tl.stages,
                     microbatches=tl.microbatches if tl.placement == "dual" else None)


def timeline_input(path: Path, flags: dict[str, Any]) -> TimelineInput:
    """Load a Timeline JSON and its program (module docstring). ``flags`` are the shared
    scenario flags the user gave (None = not given). Raises :class:`ScenarioError` for a
    flag that cannot apply to a timeline, an unreadable timeline or program."""

    from schedsim.program.ir import Program
    from schedsim.program.vocab import SEMANTICS
    from schedsim.sim.costs import CommModel
    from schedsim.timeline import Timeline

    bad = sorted(k for k, v in flags.items() if v is not None and k not in TIMELINE_FLAGS)
    if bad:
        names = ", ".join("--" + k.replace("_", "-") for k in bad)
        raise ScenarioError(f"{names} cannot apply to {path}: a timeline is a run already "
                            f"(analyse a scenario to change how it runs)")
    tl = Timeline.read_json(path)
    prog = None
    if flags.get("program") is not None:
        from schedsim.scenario import load_program_file

        pl = flags.get("placement") or (tl.placement if tl.placement != "custom" else None)
        prog = load_program_file(flags["program"], pl, ranks=tl.ranks,
                                 stages=flags.get("stages") or tl.stages,
                                 microbatches=tl.microbatches)
    elif getattr(tl, "program", None):
        prog = Program.model_validate(tl.program)
    elif flags.get("placement") or flags.get("stages"):
        raise ScenarioError("--placement and --stages go with --program FILE for a timeline")
    measured = tl.source == "measured"
    sem = "rendezvous" if measured or tl.semantics not in SEMANTICS else tl.semantics
    comm = CommModel(semantics=sem, comm_stream="none" if measured else tl.comm_stream)
    return TimelineInput(path, tl, prog, comm=comm)


def pick_timeline(shared: dict[str, Any], own: dict[str, Any]) -> TimelineInput | None:
    """The timeline a command was given, if any: the positional input when it is a
    ``.json`` file, or a ``from_timeline`` option (not both). ``shared``: the scenario
    flags; ``own``: the command's own parameters. Raises :class:`ScenarioError`."""
    opt = own.get("from_timeline")
    if opt is not None:
        if shared.get("scenario") is not None:
            raise ScenarioError(f"give a scenario or --from-timeline, not both (got "
                                f"{shared['scenario']} and {opt})")
        return timeline_input(Path(opt), shared)
    if is_timeline_path(shared.get("scenario")):
        return timeline_input(shared["scenario"], shared)
    return None


def run_input(sc: Any, comm: CommModel | None = None) -> tuple[Program | None, Timeline]:
    """``(program, timeline)`` of a command's input: a :class:`TimelineInput` as it is
    (program None when unknown), a scenario simulated (deadlocks are returned, not
    raised) under ``comm`` (default: the scenario's)."""
    if isinstance(sc, TimelineInput):
        return sc.program, sc.timeline
    prog = sc.build_program()
    return prog, simulate_scenario(prog, sc, comm)[0]


def simulate_scenario(prog: Program, sc: Any, comm: CommModel | None = None
                      ) -> tuple[Timeline, Any]:
    """:func:`schedsim.scenario.simulate_scenario` (the one home of a scenario's run:
    ``simulate`` and ``compare`` of a ``[workload]`` both run through it)."""
    from schedsim.scenario import simulate_scenario as run

    return run(prog, sc, comm)

"""``schedsim render``: draw a saved Timeline JSON (Gantt), or overlay two of them."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from schedsim.cli import app
from schedsim.cli.common import handle_errors
from schedsim.errors import ScenarioError
from schedsim.timeline import Timeline

ArrowsOpt = Annotated[bool, typer.Option(
    "--arrows", help="Gantt: draw an arrow per message (red: the receiver waited).")]
MemoryOpt = Annotated[bool, typer.Option(
    "--memory", help="Gantt: add an activation-memory panel per rank.")]
StallsOpt = Annotated[bool, typer.Option(
    "--stalls", help="Gantt: hatch the stalls found by the analysis, by cause.")]


def check_figure_path(path: Path) -> None:
    """Raise :class:`ScenarioError` unless ``path`` ends in .png, .svg or .pdf."""
    from schedsim.plot import FORMATS

    if path.suffix.lower() not in FORMATS:
        raise ScenarioError(f"{path}: unsupported figure format {path.suffix!r} (use .png, "
                            ".svg or .pdf)")


def gantt_options(arrows: bool, memory: bool | object, stalls: bool) -> dict:
    """Keyword arguments of :func:`schedsim.plot.gantt` for the CLI flags."""
    return {"arrows": arrows, "memory": memory or None, "stalls": True if stalls else None}


@app.command()
@handle_errors
def render(
    timeline: Annotated[Path, typer.Argument(
        help="Timeline JSON (from 'schedsim simulate --json' or a replay).")],
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="Figure file (.png, .svg or .pdf).")],
    overlay: Annotated[Optional[Path], typer.Option(
        "--overlay", help="Second timeline JSON of the same ops: draw both, one half-row "
        "each, with per-op start error and makespan error in the title.")] = None,
    names: Annotated[Optional[str], typer.Option(
        "--names", help="With --overlay: names of the two timelines, 'A,B' (default: "
        "their semantics or source).")] = None,
    arrows: ArrowsOpt = False,
    memory: MemoryOpt = False,
    memory_model: Annotated[str, typer.Option(
        "--memory-model", help="With --memory: zb or inflight (see schedsim.analysis.memory).")] = "zb",
    stalls: StallsOpt = False,
    detail: Annotated[bool, typer.Option(
        "--detail", help="Gantt: draw each op's compute and collective pieces (a timeline "
        "with pieces: 'simulate --json' with a \\[model], a TP replay).")] = False,
    title: Annotated[Optional[str], typer.Option("--title", help="Figure title.")] = None,
) -> None:
    """Draw a Timeline JSON as a Gantt chart, or overlay two timelines of the same ops.

    Examples:
      schedsim render dualpipe.json --out dualpipe.png --arrows --memory
      schedsim render data.json --overlay rendezvous.json --out overlay.png
    """
    from schedsim.plot import gantt, overlay as draw_overlay, save_figure

    check_figure_path(out)
    tl = Timeline.read_json(timeline)
    if overlay is not None:
        if arrows or memory or stalls or detail:
            raise ScenarioError("--arrows, --memory, --stalls and --detail draw a single "
                                "timeline; drop them or --overlay")
        other = Timeline.read_json(overlay)
        pair = None
        if names is not None:
            pair = [x.strip() for x in names.split(",")]
            if len(pair) != 2 or not all(pair):
                raise ScenarioError(f"bad --names {names!r}: expected two names 'A,B'")
        fig = draw_overlay(tl, other, names=pair, title=title)
    else:
        if names is not None:
            raise ScenarioError("--names needs --overlay")
        from schedsim.plot import resolve_model

        model = resolve_model(memory_model) if memory else None
        opts = gantt_options(arrows, model, stalls)
        if detail:
            if not getattr(tl, "pieces", None):
                raise ScenarioError(f"{timeline}: no pieces to --detail (simulate a "
                                    f"scenario with a [model], or replay with --set tp=N)")
            opts["detail"] = True
        fig = gantt(tl, title=title, **opts)
    save_figure(fig, out)

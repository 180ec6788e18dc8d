"""``schedsim render``: draw a saved Timeline JSON (Gantt), or overlay two of them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from schedsim.cli import app
from schedsim.cli.common import Phases, handle_errors
from schedsim.cli.options import (
    ArrowsOpt,
    DetailOpt,
    HighlightOpt,
    MemoryOpt,
    ShowRanksOpt,
    StallsOpt,
    WindowOpt,
    check_figure_path,
    gantt_options,
)
from schedsim.cli.records import options_record
from schedsim.errors import ScenarioError

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.timeline import Timeline


TimelineArg = Annotated[Path, typer.Argument(
    help="Timeline JSON (from 'schedsim simulate --json' or a replay); - reads it from "
    "stdin.")]
RenderOutOpt = Annotated[Path, typer.Option(
    "--out", "-o", "--gantt", help="Figure file (.png, .svg or .pdf); --gantt as in "
    "simulate.")]
OverlayOpt = Annotated[Optional[Path], typer.Option(
    "--overlay", help="Second timeline JSON of the same ops: draw both, one half-row "
    "each, with per-op start error and makespan error in the title.")]
NamesOpt = Annotated[Optional[str], typer.Option(
    "--names", help="With --overlay: names of the two timelines, 'A,B' (default: "
    "their semantics or source).")]
RenderMemModelOpt = Annotated[str, typer.Option(
    "--memory-model", help="With --memory: zb or inflight (see "
    "schedsim.analysis.memory).")]
MoveThresholdOpt = Annotated[Optional[str], typer.Option(
    "--threshold", help="With --overlay: outline ops whose start moved by more than "
    "this, in the time unit or as a percentage of the second timeline's makespan "
    "('5%'); default: any move, or 5% when a timeline is measured.")]
TitleOpt = Annotated[Optional[str], typer.Option("--title", help="Figure title.")]
RenderQuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress.")]


@dataclass(frozen=True)
class RenderOptions:
    """The options of ``schedsim render`` (each one its flag, in --help order)."""

    timeline: TimelineArg
    out: RenderOutOpt
    overlay: OverlayOpt = None
    names: NamesOpt = None
    arrows: ArrowsOpt = False
    memory: MemoryOpt = False
    memory_model: RenderMemModelOpt = "zb"
    stalls: StallsOpt = False
    threshold: MoveThresholdOpt = None
    detail: DetailOpt = False
    title: TitleOpt = None
    highlight: HighlightOpt = None
    window: WindowOpt = None
    show_ranks: ShowRanksOpt = None
    quiet: RenderQuietOpt = False


@app.command()
@handle_errors
@options_record(RenderOptions)
def render(o: RenderOptions) -> None:
    """Draw a Timeline JSON as a Gantt chart, or overlay two timelines of the same ops.

    Examples:
      schedsim render dualpipe.json --out dualpipe.png --arrows --memory
      schedsim render data.json --overlay rendezvous.json --out overlay.png
      schedsim render pred.json --overlay meas.json --threshold 5% --out o.png
      schedsim render dualpipe.json --out part.png --window 10:30 --show-ranks 0-3
      schedsim simulate -s 1f1b -p 4 -m 8 --json - | schedsim render - -o g.png
    """
    from schedsim.timeline import Timeline
    from schedsim.plot import gantt, overlay as draw_overlay, save_figure

    check_figure_path(o.out)
    if str(o.timeline) == "-" and o.overlay is not None and str(o.overlay) == "-":
        raise ScenarioError("the timeline and --overlay are both '-': stdin holds one "
                            "timeline; give the other as a file")
    if o.threshold is not None and o.overlay is None:
        raise ScenarioError("--threshold needs --overlay")
    with Phases(o.quiet) as ph:
        ph.step(f"reading {o.timeline}")
        tl = Timeline.read_json(o.timeline)
        if o.overlay is not None:
            if (o.arrows or o.memory or o.stalls or o.detail or o.highlight or o.window
                    or o.show_ranks):
                raise ScenarioError("--arrows, --memory, --stalls, --detail, --highlight, "
                                    "--window and --show-ranks draw a single timeline; "
                                    "drop them or --overlay")
            other = Timeline.read_json(o.overlay)
            pair = None
            if o.names is not None:
                pair = [x.strip() for x in o.names.split(",")]
                if len(pair) != 2 or not all(pair):
                    raise ScenarioError(f"bad --names {o.names!r}: expected two names 'A,B'")
            ph.step("drawing the overlay")
            fig = draw_overlay(tl, other, names=pair, title=o.title,
                               threshold=parse_threshold(o.threshold, other.makespan))
        else:
            if o.names is not None:
                raise ScenarioError("--names needs --overlay")
            from schedsim.plot import resolve_model

            model = resolve_model(o.memory_model) if o.memory else None
            opts = gantt_options(o.arrows, model, o.stalls, o.highlight, o.window,
                                 o.show_ranks)
            if o.detail:
                if not getattr(tl, "pieces", None):
                    raise ScenarioError(f"{o.timeline}: no pieces to --detail (simulate a "
                                        f"scenario with a [model], or replay with --set tp=N)")
                opts["detail"] = True
            ph.step("drawing the Gantt chart")
            fig = gantt(tl, title=o.title, **opts)
        ph.step(f"writing {o.out}")
        save_figure(fig, o.out)


def parse_threshold(text: str | None, makespan: float) -> float | None:
    """``--threshold``: a time (``0.5``) or a percentage of ``makespan`` (``5%``); None
    stays None. Raises :class:`ScenarioError` for anything else."""
    if text is None:
        return None
    t = text.strip()
    try:
        val = float(t[:-1]) * makespan / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ScenarioError(f"bad --threshold {text!r}: expected a time (0.5) or a "
                            f"percentage of the makespan (5%)") from None
    if not val >= 0:
        raise ScenarioError(f"bad --threshold {text!r}: must be >= 0")
    return val

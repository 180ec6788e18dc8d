"""Options that several command modules declare alike (one home each): the Gantt chart
flags of ``simulate``, ``render`` and ``compare`` (and what they mean: :func:`gantt_options`,
:func:`check_figure_path`), and ``--connections``. The other scenario flags live in
:mod:`schedsim.cli.common`; an option one module alone uses is declared in that module."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from schedsim.errors import ScenarioError

GanttOpt = Annotated[Optional[Path], typer.Option(
    "--gantt", help="Write a Gantt chart (.png, .svg or .pdf).")]

ArrowsOpt = Annotated[bool, typer.Option(
    "--arrows", help="Gantt: draw an arrow per message (red: the receiver waited).")]
MemoryOpt = Annotated[bool, typer.Option(
    "--memory", help="Gantt: add an activation-memory panel per rank (memory model: the "
    "scenario's \\[memory] or --memory-model; default zb).")]
StallsOpt = Annotated[bool, typer.Option(
    "--stalls", help="Gantt: hatch the stalls found by the analysis, by cause.")]
DetailOpt = Annotated[bool, typer.Option(
    "--detail", help="Gantt: draw each op's compute and collective pieces (a scenario "
    "with a \\[model], or a timeline with pieces: 'simulate --json' with a \\[model], a "
    "TP replay).")]
ConnectionsOpt = Annotated[Optional[int], typer.Option(
    "--connections", help="CUDA_DEVICE_MAX_CONNECTIONS of every rank (1..32, default 8): 1 "
    "= one hardware queue, the kernels of all its streams start in launch order.")]
HighlightOpt = Annotated[Optional[list[str]], typer.Option(
    "--highlight", metavar="KIND:SRC:DST:MB", help="Gantt: draw this message bold and "
    "annotated, e.g. B:5:4:0 (the input gradient of mb 0 from rank 5 to 4; repeatable).")]
WindowOpt = Annotated[Optional[str], typer.Option(
    "--window", metavar="START:END", help="Gantt: only this time range (in the cost "
    "unit), e.g. 10:30.")]
ShowRanksOpt = Annotated[Optional[str], typer.Option(
    "--show-ranks", metavar="LIST", help="Gantt: only these ranks, e.g. 0-3,60-63 (no "
    "arrows).")]

for _a in (ArrowsOpt, MemoryOpt, StallsOpt, DetailOpt, HighlightOpt, WindowOpt, ShowRanksOpt):
    _a.__metadata__[0].rich_help_panel = "Gantt chart"
GanttOpt.__metadata__[0].rich_help_panel = "Outputs"


def check_figure_path(path: Path) -> None:
    """Raise :class:`ScenarioError` unless ``path`` names a figure file: not ``-`` (a
    figure cannot go to stdout), not a folder, ending in .png, .svg or .pdf."""
    from schedsim.plot import FORMATS

    if str(path) == "-":
        raise ScenarioError("a figure cannot go to stdout: give a file name (.png, .svg, "
                            ".pdf)")
    if path.is_dir():
        raise ScenarioError(f"{path} is a directory: give a file name such as "
                            f"{path / 'gantt.png'}")
    if path.suffix.lower() not in FORMATS:
        raise ScenarioError(f"{path}: unsupported figure format {path.suffix!r} (use .png, "
                            ".svg or .pdf)")


def gantt_options(arrows: bool, memory: bool | object, stalls: bool,
                  highlight: list[str] | None = None, window: str | None = None,
                  show_ranks: str | None = None) -> dict:
    """Keyword arguments of :func:`schedsim.plot.gantt` for the CLI flags (``--highlight
    KIND:SRC:DST:MB``, ``--window START:END``, ``--show-ranks 0-3,60-63``). Raises
    :class:`ScenarioError` for a malformed value."""
    opts: dict = {"arrows": arrows, "memory": memory or None,
                  "stalls": True if stalls else None}
    hl = []
    for h in highlight or []:
        parts = h.split(":")
        if len(parts) != 4 or not all(p.strip().isdigit() for p in parts[1:]):
            raise ScenarioError(f"bad --highlight {h!r}: expected KIND:SRC:DST:MB, e.g. "
                                f"B:5:4:0")
        hl.append((parts[0].strip().upper(), *(int(p) for p in parts[1:])))
    if hl:
        opts["highlight"] = hl
    if window is not None:
        try:
            a, b = (float(x) for x in window.split(":"))
        except ValueError:
            raise ScenarioError(f"bad --window {window!r}: expected START:END, e.g. "
                                f"10:30") from None
        opts["window"] = (a, b)
    if show_ranks is not None:
        opts["ranks"] = parse_ranks(show_ranks)
    return opts


def parse_ranks(text: str) -> list[int]:
    """``0-3,60-63`` as ``[0, 1, 2, 3, 60, 61, 62, 63]``. Raises :class:`ScenarioError`
    for a malformed list and for a reversed range (``3-1``: it would be empty)."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ScenarioError(f"bad --show-ranks {text!r}: expected ranks and ranges, "
                                f"e.g. 0-3,60-63")
        a, b = int(lo), int(hi if sep else lo)
        if b < a:
            raise ScenarioError(f"bad --show-ranks {text!r}: the range {part} is reversed "
                                f"(a range goes from low to high): write {b}-{a}")
        out += list(range(a, b + 1))
    return out

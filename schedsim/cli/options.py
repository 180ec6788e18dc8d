"""Options that several command modules declare alike (one home each): the Gantt chart
flags of ``simulate``, ``render`` and ``compare``, and ``--connections``. The other
scenario flags live in :mod:`schedsim.cli.common`; an option one module alone uses is
declared in that module."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

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

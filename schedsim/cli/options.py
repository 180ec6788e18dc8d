"""Options that several command modules declare alike (one home each): the Gantt chart
flags of ``simulate`` and ``render``, and ``--connections``. The other scenario flags live
in :mod:`schedsim.cli.common`; an option one module alone uses is declared in that
module."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

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

"""A measured Timeline of compute ops only (no P2P recorded): what the Megatron timer and
nsys importers build from per-rank op times. One home for that Timeline's fields."""
from __future__ import annotations

from typing import Any


def ops_only_timeline(pl: Any, name: str, microbatches: int, rows: list, cols: list,
                      trace_source: str, notes: list[str]) -> Any:
    """The measured :class:`~schedsim.timeline.Timeline` of program ``rows`` (per rank,
    its compute instructions) on placement ``pl`` with span columns ``cols`` (rank, op,
    start, end, index; ms), its program, ``import_notes`` and no messages."""
    from schedsim.program.ir import Program
    from schedsim.timeline_build import SpanColumns, TimelineHeader, timeline_from_columns

    prog = Program(name=name, placement=pl, microbatches=microbatches, ranks=rows)
    return timeline_from_columns(TimelineHeader(pl, name, microbatches, "trace", "ms",
                                                "measured"), SpanColumns(*cols),
                                 order="rank-start", trace_source=trace_source,
                          import_notes=notes, program=prog.model_dump(mode="json"),
                          p2p={"messages": 0, "paired": 0, "one_sided": 0, "calls": 0})

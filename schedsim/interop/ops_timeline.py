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
    from schedsim.timeline import build_timeline

    prog = Program(name=name, placement=pl, microbatches=microbatches, ranks=rows)
    return build_timeline(pl, name=name, microbatches=microbatches, span_rank=cols[0],
                          span_op=cols[1], span_start=cols[2], span_end=cols[3],
                          span_index=cols[4], order="rank-start", semantics="trace",
                          unit="ms", source="measured", trace_source=trace_source,
                          import_notes=notes, program=prog.model_dump(mode="json"),
                          p2p={"messages": 0, "paired": 0, "one_sided": 0, "calls": 0})

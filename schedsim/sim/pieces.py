"""An op's internal pieces on a Timeline: the ``pieces`` field (JSON, optional).

``Timeline.pieces`` (an extra field, absent when nothing inside the ops is known) lists
what ran inside the compute ops, one record per piece::

    {"rank", "index", "stream": "compute"|"collective", "name", "kind", "mb", "stage",
     "layer", "half", "collective", "group", "bytes", "start", "end", "tp_rank"}

``index`` is the instruction of the op the piece belongs to; ``kind``/``mb``/``stage`` are
those of the op's part (an ``FB``'s forward or backward part); ``collective``
(``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``), ``group`` (``tp`` or
``ep``) and ``bytes`` are null for compute pieces; ``half`` is the Domino half or null;
``tp_rank`` the tensor-parallel rank that recorded it (measured timelines; 0 when
simulated). Under one hardware queue (``[comm] connections = 1``) a piece that could have
started earlier but waited behind the head of the queue has ``queued``: the time its
inputs and its stream were ready (absent otherwise). Times are in the timeline's unit.

Simulated timelines get them from the stage model (:func:`simulated_pieces`), measured
ones from the TP replay's collective records.
"""
from __future__ import annotations

from typing import Any

from schedsim.program.ir import Op
from schedsim.sim.overlap import COLLECTIVE, OpCost
from schedsim.timeline import Span, Timeline


def _derived(span: Span, stage_costs: Any) -> OpCost | None:
    if span.kind == "FB":
        f, b = span.parts or ()
        if b.kind not in ("B", "BW"):
            return None
        return stage_costs.fb(f.stage, b.stage, b.kind)
    return stage_costs.op(span.kind, span.stage)


def simulated_pieces(tl: Timeline, stage_costs: Any, rel_tol: float = 1e-9
                     ) -> list[dict[str, Any]]:
    """The pieces of every span of ``tl`` whose duration is the stage model's derived
    cost (``stage_costs``: a :class:`~schedsim.sim.stage_costs.StageCosts`); a span whose
    cost was typed explicitly (another duration) has no known inside and gets none."""
    out: list[dict[str, Any]] = []
    for s in tl.spans:
        oc = _derived(s, stage_costs)
        if oc is None or abs(s.duration - oc.cost) > rel_tol * max(1.0, oc.cost):
            continue
        parts = s.parts or [s]
        for pl in oc.pieces:
            p = pl.piece
            part = parts[p.which] if p.which < len(parts) else parts[0]
            out.append({"rank": s.rank, "index": s.index, "stream": p.stream,
                        "name": p.name, "kind": p.part, "mb": part.mb, "stage": part.stage,
                        "layer": p.layer, "half": p.half, "collective": p.collective,
                        "group": p.group, "bytes": p.nbytes if p.collective else None,
                        "start": s.start + pl.start, "end": s.start + pl.end,
                        "tp_rank": 0})
            if pl.queued is not None:          # held by the one hardware queue
                out[-1]["queued"] = s.start + pl.queued
    return out


def attach_pieces(tl: Timeline, stage_costs: Any) -> Timeline:
    """Set ``tl.pieces`` from the stage model (:func:`simulated_pieces`); returns ``tl``."""
    tl.pieces = simulated_pieces(tl, stage_costs)  # type: ignore[attr-defined]
    return tl


def pieces_of(tl: Timeline) -> list[dict[str, Any]]:
    """``tl``'s piece records (empty when it has none)."""
    return list(getattr(tl, "pieces", None) or [])


def exposed_by_kind(tl: Timeline, stage_costs: Any) -> dict[str, dict[str, float]]:
    """Per op kind over the whole run: ``{kind: {"ops", "collective", "exposed",
    "hidden"}}`` summed over the spans whose cost is the derived one (module
    :func:`simulated_pieces`)."""
    out: dict[str, dict[str, float]] = {}
    for s in tl.spans:
        oc = _derived(s, stage_costs)
        if oc is None or abs(s.duration - oc.cost) > 1e-9 * max(1.0, oc.cost):
            continue
        row = out.setdefault(s.kind, {"ops": 0, "collective": 0.0, "exposed": 0.0,
                                      "hidden": 0.0})
        row["ops"] += 1
        row["collective"] += oc.collective
        row["exposed"] += oc.exposed
        row["hidden"] += oc.hidden
    return out


def fb_op(stage_f: int, stage_b: int, back: str = "BW") -> Op:
    """An FB op of microbatch 0 (for cost look-ups)."""
    return Op.fb(Op("F", stage_f, 0), Op(back, stage_b, 0))


def is_collective(rec: dict[str, Any]) -> bool:
    return rec.get("stream") == COLLECTIVE

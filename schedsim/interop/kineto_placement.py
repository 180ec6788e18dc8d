"""Which rank holds which stage, told from where a trace's ops ran. No torch.

Rules (:func:`infer_placement`): ``dual`` if a stage ran on two ranks; else the first of
``loop``, ``v`` that puts every traced stage on its rank and the two ends of every posted
message on two different ranks (without a world size: on the fewest ranks that explain
the traces); else a ``custom`` table when every stage was seen. A forced placement is
checked against the traces. The stage count is the highest stage seen rounded up to what
the placement needs (``loop``: a multiple of the ranks; ``v``: 2 x ranks; ``dual``: the
ranks). Anything else is a :class:`~schedsim.errors.ScenarioError`.
"""
from __future__ import annotations

from schedsim.errors import ScenarioError
from schedsim.program.ir import Placement


def _fit_stages(kind: str, ranks: int, seen: int) -> int | None:
    """Stages of a ``kind`` placement on ``ranks`` holding stages ``0..seen-1`` (None:
    cannot)."""
    if kind == "loop":
        return -(-seen // ranks) * ranks
    need = 2 * ranks if kind == "v" else ranks
    return need if seen <= need else None


def _fits(pl: Placement, where: dict[tuple[int, int], int],
          links: list[tuple[int, int, int]]) -> str | None:
    """Why ``pl`` contradicts the traces (None: it fits): a traced op on another rank, or
    a message whose two ends it puts on one rank."""
    for (s, mb), r in where.items():
        if pl.rank_of(s, mb) != r:
            return f"stage {s} (microbatch {mb}) ran on rank {r}, not {pl.rank_of(s, mb)}"
    for a, b, mb in links:
        if pl.rank_of(a, mb) == pl.rank_of(b, mb):
            return (f"a message goes from stage {a} to stage {b} (microbatch {mb}), which "
                    f"it puts on one rank")
    return None


def infer_placement(kind: str | None, ranks: int, known_ranks: bool,
               where: dict[tuple[int, int], int], links: list[tuple[int, int, int]],
               seen: int, microbatches: int) -> Placement:
    """The placement (module docstring). ``where``: ``(stage, mb) -> rank`` of every traced
    op; ``links``: ``(producing stage, consuming stage, mb)`` of every posted message;
    ``seen``: stages 0..seen-1 appear; ``known_ranks``: ``ranks`` is the world size (else
    the least rank count). Raises :class:`ScenarioError` when none fits."""
    def make(k: str, p: int) -> Placement | None:
        n = _fit_stages(k, p, seen)
        if n is None:
            return None
        return Placement(kind=k, ranks=p, stages=n,
                         microbatches=microbatches if k == "dual" else None)

    if kind is not None:
        pl = make(kind, ranks)
        if pl is None:
            raise ScenarioError(f"placement {kind!r} does not fit the traces: {seen} stages "
                                f"seen on {ranks} ranks")
        why = _fits(pl, where, links)
        if why:
            raise ScenarioError(f"placement {kind!r} does not fit the traces: {why}")
        return pl
    stage_ranks: dict[int, set[int]] = {}
    for (s, _), r in where.items():
        stage_ranks.setdefault(s, set()).add(r)
    if any(len(v) > 1 for v in stage_ranks.values()):
        kinds, sizes = ("dual",), [ranks]
    else:   # without a world size: the fewest ranks that explain the traces
        kinds, sizes = ("loop", "v"), ([ranks] if known_ranks else
                                       list(range(ranks, max(ranks, seen) + 1)))
    for p in sizes:
        for k in kinds:
            pl = make(k, p)
            if pl is not None and _fits(pl, where, links) is None:
                return pl
    if kinds == ("dual",):
        raise ScenarioError("the traces put a stage on two ranks but do not fit the dual "
                            "placement: give --placement")
    if all(s in stage_ranks for s in range(seen)):
        table = tuple(next(iter(stage_ranks[s])) for s in range(seen))
        pl = Placement(kind="custom", ranks=ranks, stages=seen, stage_ranks=table)
        if _fits(pl, where, links) is None:
            return pl
    missing = [s for s in range(seen) if s not in stage_ranks]
    raise ScenarioError(f"cannot tell which rank holds stage(s) {missing}: neither a loop "
                        f"nor a v placement fits the traces; give --placement or the "
                        f"traces of more ranks")

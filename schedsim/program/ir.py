"""The program model: ops, comm, instructions, placement, schedules and programs.

Vocabulary (see DESIGN.md): a *rank* runs one or more *stages*; each stage processes every
*microbatch* ``mb`` with a forward ``F``, a backward for inputs ``B``, a backward for
weights ``W`` (or the fused full backward ``BW``); ``FB`` is an overlapped pair (the forward
of one microbatch with the backward of another, as in DualPipe).

Atoms (:class:`Op`, :class:`Comm` and the instructions) are frozen, slotted dataclasses:
they are created by the hundred thousand and must be cheap. Containers
(:class:`Placement`, :class:`Schedule`, :class:`Program`) are pydantic models; in JSON
their per-rank lists are written as the text tokens of :mod:`schedsim.program.tokens`
(``"0F1"``, ``"2SEND_B3"``, ``"COMMIT"``, ...), which are also accepted on input.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    model_validator,
)

from schedsim.errors import ScheduleError
from schedsim.program.ops import (
    COMM_KINDS,
    COMPUTE_KINDS,
    LAUNCHES,
    Batch,
    Comm,
    Commit,
    Compute,
    Instr,
    Op,
    Post,
    Wait,
    format_instr,
)
from schedsim.program.tokens import parse_instr, parse_op
from schedsim.util.lazy import LazyFields

#: the atoms are defined in :mod:`schedsim.program.ops` and importable from here too
__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "Batch",
    "Comm",
    "Commit",
    "Compute",
    "Instr",
    "Op",
    "Placement",
    "Post",
    "Program",
    "Schedule",
    "Wait",
]


#: how stages are placed on ranks (see :class:`Placement`); the one home of these names
PlacementKind = Literal["loop", "v", "dual", "custom"]
PLACEMENTS: tuple[str, ...] = get_args(PlacementKind)

class Placement(BaseModel):
    """Which rank holds which stage.

    - ``loop``: stage s on rank ``s % ranks`` (chunk ``s // ranks``); interleaved schedules.
    - ``v``: ``2*ranks`` stages, rank r holds stages r (chunk 0) and ``2*ranks-1-r`` (chunk 1).
    - ``dual``: DualPipe. ``stages == ranks``; microbatches ``< microbatches/2`` flow in
      direction 0 (stage s on rank s), the rest in direction 1 (stage s on rank
      ``ranks-1-s``); the chunk is the direction.
    - ``custom``: ``stage_ranks[s]`` is the rank of stage s; chunks number a rank's stages
      in increasing stage order.

    Raises :class:`ScheduleError` on inconsistent sizes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: PlacementKind = "loop"
    ranks: int = Field(ge=1)
    stages: int = Field(ge=1)
    microbatches: int | None = None
    stage_ranks: tuple[int, ...] | None = None

    @model_validator(mode="after")
    def _check(self) -> Placement:
        p, s = self.ranks, self.stages
        if self.kind == "loop" and s % p:
            raise ScheduleError(
                f"loop placement needs stages to be a multiple of ranks (got {s} stages "
                f"on {p} ranks)")
        if self.kind == "v" and s != 2 * p:
            raise ScheduleError(f"v placement needs stages = 2 x ranks (got {s} stages on "
                                f"{p} ranks)")
        if self.kind == "dual":
            if s != p:
                raise ScheduleError(f"dual placement needs stages = ranks (got {s}, {p})")
            if self.microbatches is None:
                raise ScheduleError("dual placement needs the number of microbatches")
        if self.kind == "custom":
            sr = self.stage_ranks
            if sr is None or len(sr) != s or any(not 0 <= r < p for r in sr):
                raise ScheduleError("custom placement needs stage_ranks: one rank in "
                                    f"[0, {p}) per stage ({s} stages)")
        return self

    @cached_property
    def _tables(self) -> tuple[list[int], list[int]]:
        p, s = self.ranks, self.stages
        if self.kind == "loop":
            return [i % p for i in range(s)], [i // p for i in range(s)]
        if self.kind == "v":
            return ([i if i < p else 2 * p - 1 - i for i in range(s)],
                    [0 if i < p else 1 for i in range(s)])
        if self.kind == "dual":
            return list(range(s)), [0] * s
        table = list(self.stage_ranks or ())
        seen: dict[int, int] = {}
        chunk = []
        for r in table:
            chunk.append(seen.get(r, 0))
            seen[r] = seen.get(r, 0) + 1
        return table, chunk

    def rank_fn(self) -> Callable[[int, int], int]:
        """A fast ``(stage, mb) -> rank`` function, for hot loops."""
        table = self._tables[0]
        if self.kind == "dual":
            half, last = (self.microbatches or 0) // 2, self.ranks - 1
            return lambda s, mb: last - s if mb >= half else s
        return lambda s, mb: table[s]

    def chunk_fn(self) -> Callable[[int, int], int]:
        """A fast ``(stage, mb) -> chunk`` function, for hot loops."""
        chunk = self._tables[1]
        if self.kind == "dual":
            half = (self.microbatches or 0) // 2
            return lambda s, mb: 1 if mb >= half else 0
        return lambda s, mb: chunk[s]

    def direction(self, mb: int) -> int:
        """DualPipe direction of a microbatch (0 for every other placement)."""
        if self.kind != "dual":
            return 0
        return 0 if mb < (self.microbatches or 0) // 2 else 1

    def rank_of(self, stage: int, mb: int = 0) -> int:
        """Rank that runs ``stage`` for microbatch ``mb``."""
        if self.kind == "dual" and mb >= (self.microbatches or 0) // 2:
            return self.ranks - 1 - stage
        return self._tables[0][stage]

    def chunk_of(self, stage: int, mb: int = 0) -> int:
        """Rank-local model chunk index of ``stage`` (DualPipe: the direction)."""
        if self.kind == "dual":
            return self.direction(mb)
        return self._tables[1][stage]

    def stages_of(self, rank: int) -> list[int]:
        """Stages held by ``rank`` (for ``dual``: its direction-0 and direction-1 stage)."""
        if self.kind == "dual":
            return sorted({rank, self.ranks - 1 - rank})
        return [s for s, r in enumerate(self._tables[0]) if r == rank]


def _ops_in(v: Any) -> Any:
    if isinstance(v, list):
        return [[parse_op(x) if isinstance(x, str) else x for x in row] for row in v]
    return v


def _instrs_in(v: Any) -> Any:
    if isinstance(v, list):
        return [[parse_instr(x) if isinstance(x, str) else x for x in row] for row in v]
    return v


def _tokens_out(v: list[list[Any]]) -> list[list[str]]:
    return [[format_instr(x) for x in row] for row in v]


OpRows = Annotated[list[list[Op]], BeforeValidator(_ops_in), PlainSerializer(_tokens_out)]
InstrRows = Annotated[list[list[Instr]], BeforeValidator(_instrs_in),
                      PlainSerializer(_tokens_out)]


class _PerRank(LazyFields):
    """Fields shared by :class:`Schedule` and :class:`Program` (rows are per rank).

    ``ranks`` (the object rows) may be held in the flat array form
    (:mod:`schedsim.program.flat`) instead: a schedule or program made by
    :meth:`from_flat` builds its object rows only when ``ranks`` is first read. From then
    on the rows are the program (they may be edited) and the arrays are dropped.
    """

    model_config = ConfigDict(extra="forbid")
    _lazy_fields: ClassVar[tuple[str, ...]] = ("ranks",)

    name: str = "custom"
    placement: Placement
    microbatches: int = Field(ge=1)
    params: dict[str, Any] = Field(default_factory=dict)

    _trusted: bool = PrivateAttr(default=False)

    @classmethod
    def from_flat(cls, flat: Any, *, name: str, placement: Placement, microbatches: int,
                  params: dict[str, Any] | None = None, trusted: bool = False) -> Any:
        """A schedule or program held as flat arrays (``FlatSchedule`` for a
        :class:`Schedule`, ``FlatProgram`` for a :class:`Program`), not validated.

        ``trusted``: the arrays come from a registered generator or lowering policy whose
        tests prove them valid, so :func:`~schedsim.sim.simulate.simulate` and
        :meth:`schedsim.scenario.Scenario.build_program` skip the compute-order checks.
        """
        obj = cls.model_construct(name=name, placement=placement, microbatches=microbatches,
                                  params=dict(params or {}))
        obj._defer(flat)
        obj._trusted = trusted
        return obj

    def _build_lazy(self, flat: Any) -> dict[str, Any]:
        return {"ranks": flat.rows()}

    def _after_build(self) -> None:
        self._trusted = False     # the rows may be edited from now on

    @property
    def _flat(self) -> Any:
        return self._lazy

    @property
    def is_flat(self) -> bool:
        """True while the rows are held as arrays only (not yet built as objects)."""
        return self.is_deferred

    @property
    def trusted(self) -> bool:
        """True for an unedited schedule or program from a registered generator."""
        return bool(self._trusted) and self.is_flat

    def mark_trusted(self) -> None:
        """Mark a flat schedule or program as built by a registered generator (its
        compute order is not re-validated); no effect once its rows were built."""
        if self.is_flat:
            self._trusted = True


class Schedule(_PerRank):
    """Compute order per rank plus placement: what a schedule generator produces.

    ``ranks[r]`` is rank r's ops in execution order. In JSON the ops are tokens
    (``"0F1"``, ``"3BW0"``, ``"(0F3;3BW1)"``). Validate with
    :func:`schedsim.program.validate.validate_schedule`; lower to a :class:`Program` with
    :func:`schedsim.program.lower.lower`.
    """

    ranks: OpRows

    def num_ops(self) -> int:
        if self.is_flat:
            return len(self._flat)
        return sum(len(r) for r in self.ranks)

    def flat(self) -> Any:
        """The compute order as a :class:`~schedsim.program.flat.FlatSchedule` (the held
        arrays, or converted from the object rows)."""
        if self.is_flat:
            return self._flat
        from schedsim.program.flat import FlatSchedule

        return FlatSchedule.from_rows(self.ranks)


class Program(_PerRank):
    """Per-rank instruction lists: compute, post send/recv, wait and commit.

    This is what both executors run (the simulator in :mod:`schedsim.sim.engine`, the torch
    replay in :mod:`schedsim.replay`). ``params`` carries the generator's parameters.
    """

    ranks: InstrRows

    def num_instructions(self) -> int:
        if self.is_flat:
            return len(self._flat)
        return sum(len(r) for r in self.ranks)

    def row_length(self, rank: int) -> int:
        """Number of instructions of ``rank``'s program."""
        if self.is_flat:
            return self._flat.row_length(rank)
        return len(self.ranks[rank])

    def has_comm(self) -> bool:
        """True if any rank posts a send or recv."""
        if self.is_flat:
            return self._flat.has_comm()
        return any(isinstance(i, LAUNCHES) for row in self.ranks for i in row)

    def flat(self) -> Any:
        """The program as a :class:`~schedsim.program.flat.FlatProgram` (the held arrays,
        or converted from the object rows: call once per use, the rows may change).
        Raises TypeError for a row entry that is not an instruction."""
        if self.is_flat:
            return self._flat
        from schedsim.program.flat import FlatProgram

        return FlatProgram.from_rows(self.ranks)

    def schedule(self) -> Schedule:
        """The compute order of this program (its comm instructions dropped)."""
        if self.is_flat:
            return Schedule.from_flat(self._flat.schedule(), name=self.name,
                                      placement=self.placement,
                                      microbatches=self.microbatches, params=self.params,
                                      trusted=self.trusted)
        rows = [[i.op for i in row if isinstance(i, Compute)] for row in self.ranks]
        return Schedule(name=self.name, placement=self.placement,
                        microbatches=self.microbatches, ranks=rows, params=self.params)

    def tokens(self) -> list[list[str]]:
        """Program text tokens per rank."""
        if self.is_flat:
            return self._flat.tokens()
        return [[format_instr(i) for i in row] for row in self.ranks]

    def to_text(self) -> str:
        """The program text form: one ``rank N: tok tok ...`` line per rank."""
        return "\n".join(f"rank {r}: " + " ".join(row)
                         for r, row in enumerate(self.tokens())) + "\n"

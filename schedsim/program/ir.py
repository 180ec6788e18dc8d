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
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    model_serializer,
    model_validator,
)

from schedsim.errors import ScheduleError
from schedsim.program.ops import (
    COMM_KINDS,
    COMPUTE_KINDS,
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

    ``skips``: the stage graph's edges beyond the chain, ``(producer, consumer)`` with
    ``consumer > producer + 1`` (skip connections; :mod:`schedsim.program.routing`);
    empty for a chain.

    Raises :class:`ScheduleError` on inconsistent sizes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: PlacementKind = "loop"
    ranks: int = Field(ge=1)
    stages: int = Field(ge=1)
    microbatches: int | None = None
    stage_ranks: tuple[int, ...] | None = None
    skips: Annotated[tuple[tuple[int, int], ...], Field(exclude_if=lambda v: not v)] = ()

    @model_validator(mode="after")
    def _check(self) -> Placement:
        p, s = self.ranks, self.stages
        if self.skips:
            from schedsim.program.routing import check_skips

            try:
                ok = check_skips([list(e) for e in self.skips]
                                 + [[i, i + 1] for i in range(s - 1)], s)
            except ValueError as e:
                raise ScheduleError(f"stage graph: {e}") from None
            if ok != tuple(self.skips):
                raise ScheduleError(f"stage graph: skips must be sorted skip edges "
                                    f"(c > p + 1), got {list(self.skips)}")
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


class RowsView(list):
    """A read-only list: the object rows of a :class:`Schedule` or :class:`Program`, a
    view of its flat arrays (built on first read, then kept). It compares, iterates,
    indexes and concatenates as a list; editing it raises TypeError (build a new
    schedule or program from edited copies, ``[list(row) for row in p.ranks]``)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the rows of a schedule or program are a read-only view of its "
                        "arrays: build a new Schedule/Program from edited copies "
                        "([list(row) for row in p.ranks])")

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> Any:
        return type(self), (list(self),)


def _view(rows: list[list[Any]]) -> RowsView:
    return RowsView(RowsView(r) for r in rows)


#: what a value's ``_checks`` records: nothing checked, the program rules (1, 2 and 4 of
#: :mod:`schedsim.program.validate`), or every rule of a complete schedule
UNCHECKED, PROGRAM_RULES, ALL_RULES = 0, 1, 2


def _rows_in(rows: Any, parse: Callable[[str], Any], what: str) -> list[list[Any]]:
    """Per-rank rows with text tokens parsed (:mod:`schedsim.program.tokens`; a bad token
    raises :class:`~schedsim.errors.ParseError`). Raises ValueError naming the first
    entry that is not a list of ``what``."""
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"ranks: expected a list of per-rank lists of {what}, got "
                         f"{type(rows).__name__}")
    out = []
    for r, row in enumerate(rows):
        if not isinstance(row, (list, tuple)):
            raise ValueError(f"ranks[{r}]: expected a list of {what}, got "
                             f"{type(row).__name__}")
        out.append([parse(x) if isinstance(x, str) else x for x in row])
    return out


class _PerRank(BaseModel):
    """Fields shared by :class:`Schedule` and :class:`Program` (rows are per rank).

    The flat arrays (:mod:`schedsim.program.flat`) are the value: a schedule or program is
    built from them (:meth:`from_flat`) or from object rows or text tokens (``ranks=``,
    converted once, here). ``ranks`` is a read-only view of the arrays, built on first
    read; reading it changes nothing. A value is immutable (its fields and its arrays'
    fields frozen; no reader writes into the arrays), and what was checked about it is
    recorded when it is built (:attr:`validated`), never reset.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = "custom"
    placement: Placement
    microbatches: int = Field(ge=1)
    params: dict[str, Any] = Field(default_factory=dict)

    _flat: Any = PrivateAttr(default=None)
    _checks: int = PrivateAttr(default=UNCHECKED)
    _rows: Any = PrivateAttr(default=None)

    @classmethod
    def _flat_of_rows(cls, rows: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @model_validator(mode="wrap")
    @classmethod
    def _convert_rows(cls, data: Any, handler: Any) -> Any:
        """``ranks=`` (object rows or tokens) converted to the arrays, once."""
        if isinstance(data, dict) and "ranks" in data:
            flat = cls._flat_of_rows(data["ranks"])
            obj = handler({k: v for k, v in data.items() if k != "ranks"})
            obj._flat = flat
            return obj
        obj = handler(data)
        if obj._flat is None:
            raise ValueError("ranks: field required (the per-rank rows)")
        return obj

    @model_serializer(mode="wrap")
    def _rows_out(self, handler: Any) -> Any:
        out = handler(self)
        out["ranks"] = self.tokens()
        return out

    @classmethod
    def from_flat(cls, flat: Any, *, name: str, placement: Placement, microbatches: int,
                  params: dict[str, Any] | None = None, validated: bool = False) -> Any:
        """A schedule or program whose arrays are ``flat`` (``FlatSchedule`` for a
        :class:`Schedule`, ``FlatProgram`` for a :class:`Program`; not to be written
        after).

        ``validated``: the arrays come from a registered generator or lowering policy
        whose tests prove every rule of :mod:`schedsim.program.validate`, so
        :func:`~schedsim.sim.simulate.simulate` and
        :meth:`schedsim.scenario.Scenario.build_program` do not check them again.
        """
        obj = cls.model_construct(name=name, placement=placement, microbatches=microbatches,
                                  params=dict(params or {}))
        obj._flat = flat
        obj._checks = ALL_RULES if validated else UNCHECKED
        return obj

    def _checked(self, level: int) -> Any:
        """This value with ``level`` recorded as checked (a new value sharing the arrays;
        for :mod:`schedsim.program.validate`, which has just checked it)."""
        if self._checks >= level:
            return self
        out = type(self).from_flat(self._flat, name=self.name, placement=self.placement,
                                   microbatches=self.microbatches, params=self.params)
        out._checks = level
        out._rows = self._rows
        return out

    @property
    def validated(self) -> bool:
        """True when every rule was checked (a registered generator, a policy lowering a
        validated schedule, or a validator's result): nothing checks it again."""
        return self._checks >= ALL_RULES

    def flat(self) -> Any:
        """The arrays: the value itself (:mod:`schedsim.program.flat`; read them, never
        write into them)."""
        return self._flat

    @property
    def ranks(self) -> RowsView:
        """The object rows, per rank: a read-only view of the arrays (:class:`RowsView`),
        built on first read and kept."""
        if self._rows is None:
            self._rows = _view(self._flat.rows())
        return self._rows

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        from schedsim.program.flat import same_arrays

        return ((self.name, self.placement, self.microbatches, self.params)
                == (other.name, other.placement, other.microbatches, other.params)
                and same_arrays(self._flat, other._flat))

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()        # the view is rebuilt on demand, not pickled
        priv = state.get("__pydantic_private__")
        if priv and priv.get("_rows") is not None:
            state["__pydantic_private__"] = {**priv, "_rows": None}
        return state

    def __repr_args__(self) -> Any:
        yield from super().__repr_args__()
        yield "ranks", self.ranks

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Any:
        """A copy; with ``update`` a new, unchecked value (its fields changed)."""
        if update:
            fields = {**{k: getattr(self, k) for k in type(self).model_fields}, **update}
            if "ranks" not in fields:
                return type(self).from_flat(self._flat, **fields)
            return type(self)(**fields)
        return super().model_copy(deep=deep)


class Schedule(_PerRank):
    """Compute order per rank plus placement: what a schedule generator produces.

    ``ranks[r]`` is rank r's ops in execution order (a view of the
    :class:`~schedsim.program.flat.FlatSchedule` arrays). In JSON the ops are tokens
    (``"0F1"``, ``"3BW0"``, ``"(0F3;3BW1)"``). Validate with
    :func:`schedsim.program.validate.validate_schedule`; lower to a :class:`Program` with
    :func:`schedsim.program.lower.lower`.
    """

    @classmethod
    def _flat_of_rows(cls, rows: Any) -> Any:
        from schedsim.program.flat import FlatSchedule

        rows = _rows_in(rows, parse_op, "ops")
        for r, row in enumerate(rows):
            for i, op in enumerate(row):
                if not isinstance(op, Op):
                    raise ValueError(f"ranks[{r}][{i}]: not an op: {op!r}")
        return FlatSchedule.from_rows(rows)

    def num_ops(self) -> int:
        return len(self._flat)

    def tokens(self) -> list[list[str]]:
        """Op tokens per rank (``0F1``, ``(0F3;3BW1)``)."""
        return [[format_instr(op) for op in row] for row in self.ranks]


class Program(_PerRank):
    """Per-rank instruction lists: compute, post send/recv, wait and commit.

    This is what both executors run (the simulator in :mod:`schedsim.sim.engine`, the torch
    replay in :mod:`schedsim.replay`). ``params`` carries the generator's parameters; the
    :class:`~schedsim.program.flat.FlatProgram` arrays are the program, ``ranks`` their
    object view.
    """

    @classmethod
    def _flat_of_rows(cls, rows: Any) -> Any:
        from schedsim.program.flat_build import flat_program

        rows = _rows_in(rows, parse_instr, "instructions")
        try:
            return flat_program(rows)
        except TypeError as e:
            raise ValueError(f"ranks: {e}") from None

    def num_instructions(self) -> int:
        return len(self._flat)

    def row_length(self, rank: int) -> int:
        """Number of instructions of ``rank``'s program."""
        return self._flat.row_length(rank)

    def has_comm(self) -> bool:
        """True if any rank posts a send or recv."""
        return self._flat.has_comm()

    def schedule(self) -> Schedule:
        """The compute order of this program (its comm instructions dropped); validated
        when the program was checked against every rule."""
        return Schedule.from_flat(self._flat.schedule(), name=self.name,
                                  placement=self.placement, microbatches=self.microbatches,
                                  params=self.params, validated=self.validated)

    def tokens(self) -> list[list[str]]:
        """Program text tokens per rank, straight from the arrays."""
        return self._flat.tokens()

    def to_text(self) -> str:
        """The program text form: one ``rank N: tok tok ...`` line per rank."""
        return "\n".join(f"rank {r}: " + " ".join(row)
                         for r, row in enumerate(self.tokens())) + "\n"

"""Building the flat program form (:mod:`schedsim.program.flat`) rank by rank: what the
generators and comm policies that trace a runtime instruction by instruction
(DualPipe, DualPipeV, the ``torch`` and ``megatron`` policies) and the object-row
converter (program text, the Python API's rows) write into.

A :class:`FlatBuilder` takes each instruction either as integer fields
(:meth:`FlatBuilder.compute_op`, :meth:`FlatBuilder.instr` with ``(CommKind, stage, mb)``
members: no object per instruction) or as an object (:meth:`FlatBuilder.add`), and
:meth:`FlatBuilder.build` returns the :class:`~schedsim.program.flat.FlatProgram`.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from schedsim.program.flat import (
    I32,
    FlatProgram,
    _COMMKIND,
    _OPKIND,
    Opcode,
    _arr,
    _fb_arrays,
    _ptr,
)
from schedsim.program.ops import TAGS, Batch, Comm, Commit, Compute, Instr, Op, Post, Wait

#: a comm op as integers: ``(CommKind, stage, mb)`` as the issuing rank writes it
Member = tuple[int, int, int]


class FlatBuilder:
    """Appends instructions (objects or integer fields) rank by rank into a
    :class:`FlatProgram`: call :meth:`end_rank` after each rank, then :meth:`build`."""

    def __init__(self) -> None:
        self.code: list[int] = []
        self.kind: list[int] = []
        self.stage: list[int] = []
        self.mb: list[int] = []
        self.mptr: list[int] = [0]
        self.ck: list[int] = []
        self.cs: list[int] = []
        self.cm: list[int] = []
        self.fb: list[tuple[int, int, int, int]] = []
        self.rptr: list[int] = [0]
        self.peers: dict[int, int] = {}                          # member -> peer stage
        self.idents: dict[int, tuple[str | None, float | None]] = {}  # -> (tag, bytes)

    def end_rank(self) -> None:
        self.rptr.append(len(self.code))

    def rank_length(self) -> int:
        """Instructions appended to the current rank so far."""
        return len(self.code) - self.rptr[-1]

    # -- integer fields ----------------------------------------------------------------
    def compute_op(self, kind: int, stage: int, mb: int,
                   backward: tuple[int, int, int] | None = None) -> None:
        """A COMPUTE of :class:`OpKind` ``kind``; an ``FB`` names its backward part
        ``(OpKind, stage, mb)`` in ``backward`` (its forward is ``stage``, ``mb``)."""
        if backward is not None:
            self.fb.append((len(self.code), *backward))
        self.code.append(0)
        self.kind.append(kind)
        self.stage.append(stage)
        self.mb.append(mb)
        self.mptr.append(len(self.ck))

    def instr(self, code: Opcode | int, members: Iterable[Member] = ()) -> None:
        """A POST (one member), BATCH or WAIT (members) or COMMIT (none), members as
        integers (no peer, tag or bytes)."""
        for k, s, m in members:
            self.ck.append(k)
            self.cs.append(s)
            self.cm.append(m)
        self.code.append(int(code))
        self.kind.append(-1)
        self.stage.append(-1)
        self.mb.append(-1)
        self.mptr.append(len(self.ck))

    # -- objects -----------------------------------------------------------------------
    def compute(self, op: Op) -> None:
        b = op.parts[1] if op.parts else None
        self.compute_op(_OPKIND[op.kind], op.stage, op.mb,
                        None if b is None else (_OPKIND[b.kind], b.stage, b.mb))

    def comm_instr(self, code: Opcode | int, comms: Iterable[Comm]) -> None:
        """A POST (one member), BATCH or WAIT (members) or COMMIT (none)."""
        ck = _COMMKIND
        for c in comms:
            if c.peer is not None:
                self.peers[len(self.ck)] = c.peer
            if (c.tag is not None or c.nbytes is not None) and code != Opcode.WAIT:
                self.idents[len(self.ck)] = (c.tag, c.nbytes)
            self.ck.append(ck[c.kind])
            self.cs.append(c.stage)
            self.cm.append(c.mb)
        self.instr(code)

    def add(self, ins: Instr) -> None:
        """Append instruction object ``ins``. Raises TypeError for anything else."""
        t = type(ins)
        if t is Compute:
            self.compute(ins.op)
        elif t is Post:
            self.comm_instr(Opcode.POST, (ins.comm,))
        elif t is Batch:
            self.comm_instr(Opcode.BATCH, ins.comms)
        elif t is Wait:
            self.comm_instr(Opcode.WAIT, ins.comms)
        elif t is Commit:
            self.comm_instr(Opcode.COMMIT, ())
        else:
            raise TypeError(f"not an instruction: {ins!r}")

    def build(self) -> FlatProgram:
        """The program appended so far (every rank ended by :meth:`end_rank`)."""
        n, at, ids = len(self.ck), list(self.idents), self.idents.values()
        extra = {}
        if self.peers:
            extra["cpeer"] = np.full(n, -1, I32)
            extra["cpeer"][list(self.peers)] = list(self.peers.values())
        if ids:
            extra["ctag"], extra["cbytes"] = np.full(n, -1, I32), np.full(n, -1.0)
            extra["ctag"][at] = [-1 if t is None else TAGS.index(t) for t, _ in ids]
            extra["cbytes"][at] = [-1.0 if b is None else b for _, b in ids]
        return FlatProgram(_ptr(self.rptr), _arr(self.code), _arr(self.kind),
                           _arr(self.stage), _arr(self.mb), _ptr(self.mptr), _arr(self.ck),
                           _arr(self.cs), _arr(self.cm), *_fb_arrays(self.fb), **extra)


def flat_program(rows: Iterable[Iterable[Instr]]) -> FlatProgram:
    """Object rows (lists of instructions, per rank) converted once into a
    :class:`FlatProgram`. Raises TypeError on a row entry that is not an instruction."""
    b = FlatBuilder()
    for row in rows:
        for ins in row:
            b.add(ins)
        b.end_rank()
    return b.build()

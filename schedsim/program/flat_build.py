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


_POST, _BATCH, _WAIT, _COMMIT = (int(c) for c in (Opcode.POST, Opcode.BATCH, Opcode.WAIT,
                                                 Opcode.COMMIT))


class FlatBuilder:
    """Appends instructions (objects or integer fields) rank by rank into a
    :class:`FlatProgram`: call :meth:`end_rank` after each rank, then :meth:`build`.

    Per instruction it keeps only its opcode and member count (``mptr``); a compute's
    kind, stage and mb are kept with its position (-1 for the others at :meth:`build`)."""

    def __init__(self) -> None:
        self.code: list[int] = []
        self.mptr: list[int] = [0]
        self.at: list[int] = []                   # positions of the computes
        self.kind: list[int] = []
        self.stage: list[int] = []
        self.mb: list[int] = []
        self.ck: list[int] = []
        self.cs: list[int] = []
        self.cm: list[int] = []
        self.fb: list[tuple[int, int, int, int]] = []
        self.rptr: list[int] = [0]
        self.peers: dict[int, int] = {}                          # member -> peer stage
        self.idents: dict[int, tuple[str | None, float | None]] = {}  # -> (tag, bytes)

    def end_rank(self) -> None:
        self.rptr.append(len(self.code))

    # -- integer fields ----------------------------------------------------------------
    def compute_op(self, kind: int, stage: int, mb: int,
                   backward: tuple[int, int, int] | None = None) -> None:
        """A COMPUTE of :class:`OpKind` ``kind``; an ``FB`` names its backward part
        ``(OpKind, stage, mb)`` in ``backward`` (its forward is ``stage``, ``mb``)."""
        n = len(self.code)
        if backward is not None:
            self.fb.append((n, *backward))
        self.at.append(n)
        self.kind.append(kind)
        self.stage.append(stage)
        self.mb.append(mb)
        self.code.append(0)
        self.mptr.append(len(self.ck))

    def instr(self, code: Opcode | int, members: Iterable[Member] = ()) -> None:
        """A POST (one member), BATCH or WAIT (members) or COMMIT (none), members as
        integers (no peer, tag or bytes)."""
        ck, cs, cm = self.ck, self.cs, self.cm
        for k, s, m in members:
            ck.append(k)
            cs.append(s)
            cm.append(m)
        self.code.append(int(code))
        self.mptr.append(len(ck))

    # -- objects -----------------------------------------------------------------------
    def compute(self, op: Op) -> None:
        b = op.parts[1] if op.parts else None
        self.compute_op(_OPKIND[op.kind], op.stage, op.mb,
                        None if b is None else (_OPKIND[b.kind], b.stage, b.mb))

    def comm_instr(self, code: Opcode | int, comms: Iterable[Comm]) -> None:
        """A POST (one member), BATCH or WAIT (members) or COMMIT (none); a member's peer
        stage is kept, its tag and bytes unless the instruction is a WAIT."""
        kinds, ck, cs, cm = _COMMKIND, self.ck, self.cs, self.cm
        code = int(code)
        for c in comms:
            if c.peer is not None:
                self.peers[len(ck)] = c.peer
            if (c.tag is not None or c.nbytes is not None) and code != _WAIT:
                self.idents[len(ck)] = (c.tag, c.nbytes)
            ck.append(kinds[c.kind])
            cs.append(c.stage)
            cm.append(c.mb)
        self.code.append(code)
        self.mptr.append(len(ck))

    def add(self, ins: Instr) -> None:
        """Append instruction object ``ins``. Raises TypeError for anything else."""
        t = type(ins)
        if t is Compute:
            self.compute(ins.op)
        elif t is Post:
            self.comm_instr(_POST, (ins.comm,))
        elif t is Batch:
            self.comm_instr(_BATCH, ins.comms)
        elif t is Wait:
            self.comm_instr(_WAIT, ins.comms)
        elif t is Commit:
            self.comm_instr(_COMMIT, ())
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
        pos = np.asarray(self.at, dtype=np.int64)
        cols = []
        for vals in (self.kind, self.stage, self.mb):
            col = np.full(len(self.code), -1, I32)
            col[pos] = vals
            cols.append(col)
        return FlatProgram(_ptr(self.rptr), _arr(self.code), *cols, _ptr(self.mptr),
                           _arr(self.ck), _arr(self.cs), _arr(self.cm), *_fb_arrays(self.fb),
                           **extra)


def flat_program(rows: Iterable[Iterable[Instr]]) -> FlatProgram:
    """Object rows (lists of instructions, per rank) converted once into a
    :class:`FlatProgram`. Raises TypeError on a row entry that is not an instruction."""
    b = FlatBuilder()
    for row in rows:
        for ins in row:
            b.add(ins)
        b.end_rank()
    return b.build()

"""The flat program form: integer arrays per rank, what generators and lowering emit and
what compile and the engine read.

These arrays are the program (:class:`~schedsim.program.ir.Program` holds one
:class:`FlatProgram`, :class:`~schedsim.program.ir.Schedule` one :class:`FlatSchedule`);
the object rows (``Compute``/``Post``/``Batch``/``Wait``/``Commit``) are a read-only view
built from them on demand, and rows given to a constructor are converted once, there.

A :class:`FlatSchedule` holds a compute order; a :class:`FlatProgram` a program. Both
concatenate the ranks: rank r's entries are ``rptr[r]:rptr[r+1]``, in execution order.

:class:`FlatProgram`, one entry per instruction (length N):

- ``code``: the :class:`Opcode` (COMPUTE, POST, BATCH, WAIT, COMMIT);
- ``kind``, ``stage``, ``mb``: a compute op (:class:`OpKind`; for ``FB`` the forward
  part's stage and microbatch), -1 for other instructions;
- ``mptr`` (length N+1): the comm ops an instruction names are members
  ``mptr[i]:mptr[i+1]`` of the member arrays ``ckind`` (:class:`CommKind`), ``cstage``,
  ``cmb`` (as the issuing rank writes them: ``2SEND_F0`` is kind SEND_F, stage 2, mb 0).
  A POST has one member, a BATCH or WAIT one or more, COMPUTE and COMMIT none;
- FB's backward part, in side arrays: ``fb_at`` (increasing instruction positions of
  the FB ops), ``fb_kind``, ``fb_stage``, ``fb_mb``;
- optional per member (None: no member names one; -1: the default): ``cpeer``, a skip
  edge's other stage (``0SEND_F0>2``); ``ctag``, ``cbytes``: ``0SEND_F1:gradient@4MiB``.

:class:`FlatSchedule` has ``kind``, ``stage``, ``mb`` per op and the same FB side arrays.
Derived arrays (message id, peer, launch id) come from :mod:`schedsim.program.routing`'s
array functions and :meth:`FlatProgram.launch_ids`. Integers are int32 (int64 for
offsets).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from schedsim.program.ops import (
    COMM_KINDS,
    COMPUTE_KINDS,
    TAGS,
    Batch,
    Comm,
    Commit,
    Compute,
    Instr,
    Op,
    Post,
    Wait,
    identity_suffix,
)


class Opcode(IntEnum):
    """What an instruction does (see :mod:`schedsim.program.ops`)."""

    COMPUTE = 0
    POST = 1       # one bare isend / irecv launch
    BATCH = 2      # one batch_isend_irecv launch of its members
    WAIT = 3       # block until the members completed
    COMMIT = 4     # block until everything launched since the last COMMIT completed


class OpKind(IntEnum):
    """Compute op kinds, in :data:`~schedsim.program.ops.COMPUTE_KINDS` order."""

    F = 0
    B = 1
    W = 2
    BW = 3
    FB = 4


class CommKind(IntEnum):
    """P2P op kinds, in :data:`~schedsim.program.ops.COMM_KINDS` order: bit 0 is the
    side (0 send, 1 recv), bits 1-2 the message kind (its code in
    :data:`~schedsim.program.routing.MESSAGE_KINDS`: 0 activation F, 1 gradient B, 2 and 3
    their shape messages)."""

    SEND_F = 0
    RECV_F = 1
    SEND_B = 2
    RECV_B = 3
    SEND_FS = 4
    RECV_FS = 5
    SEND_BS = 6
    RECV_BS = 7


assert tuple(k.name for k in OpKind) == COMPUTE_KINDS and \
    tuple(k.name for k in CommKind) == COMM_KINDS

_OPKIND = {k.name: int(k) for k in OpKind}
_COMMKIND = {k.name: int(k) for k in CommKind}
I32 = np.int32


def index_dtype(bound: int) -> type:
    """The integer type of arrays of ids, offsets and counts whose every value is below
    ``bound``: int32 when ``bound`` fits in int32 (every program the default
    ``instructions`` limit admits: it halves the arrays the engine reads and the memory
    a large program's lowering and compile pass touch), else int64. One rule for the
    lowering's arrays and every builder of the compiled records, so that the numba
    kernels see one array type."""
    return np.int32 if bound < np.iinfo(np.int32).max else np.int64


def _arr(x: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=I32)


def _ptr(x: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


@dataclass(eq=False, frozen=True)
class RankRows:
    """Rows of ranks laid end to end in columns: rank r's are ``rptr[r]:rptr[r + 1]``
    (``rptr``: int64, ranks + 1 entries).

    A value: the fields cannot be reassigned, and no reader writes into the arrays (a
    program's arrays are the program; see :mod:`schedsim.program.ir`). They are not
    flagged read-only: the numba kernels would then be compiled a second time, for
    read-only array types.
    """

    rptr: np.ndarray

    @property
    def ranks(self) -> int:
        return len(self.rptr) - 1

    def __len__(self) -> int:
        return int(self.rptr[-1])


@dataclass(eq=False, frozen=True)
class FlatSchedule(RankRows):
    """Compute order per rank as arrays (module docstring)."""

    kind: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    fb_at: np.ndarray
    fb_kind: np.ndarray
    fb_stage: np.ndarray
    fb_mb: np.ndarray

    def atoms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(op index, kind, stage, mb)`` of every atom, int64 arrays in op order: one
        per op, two for an ``FB`` (its ``F`` part, then its backward part)."""
        n = len(self)
        cnt = np.ones(n, np.int64)
        cnt[self.fb_at] += 1
        op = np.repeat(np.arange(n, dtype=np.int64), cnt)
        first = np.cumsum(cnt) - cnt
        kind = np.where(self.kind == OpKind.FB, OpKind.F, self.kind).astype(np.int64)[op]
        stage = self.stage.astype(np.int64)[op]
        mb = self.mb.astype(np.int64)[op]
        if len(self.fb_at):
            second = first[self.fb_at] + 1
            kind[second] = self.fb_kind
            stage[second] = self.fb_stage
            mb[second] = self.fb_mb
        return op, kind, stage, mb

    @classmethod
    def from_rows(cls, rows: Iterable[Iterable[Op]]) -> FlatSchedule:
        """Convert object rows (lists of :class:`Op`)."""
        kind, stage, mb, fb = [], [], [], []
        rptr = [0]
        ok = _OPKIND
        for row in rows:
            for op in row:
                if op.parts:
                    b = op.parts[1]
                    fb.append((len(kind), ok[b.kind], b.stage, b.mb))
                kind.append(ok[op.kind])
                stage.append(op.stage)
                mb.append(op.mb)
            rptr.append(len(kind))
        return cls(_ptr(rptr), _arr(kind), _arr(stage), _arr(mb), *_fb_arrays(fb))

    @classmethod
    def from_columns(cls, rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]
                     ) -> FlatSchedule:
        """Build from per-rank ``(kinds, stages, mbs)`` integer columns (no FB ops): what
        the fast generators emit."""
        lens = [len(k) for k, _, _ in rows]
        rptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=rptr[1:])

        def cat(j: int) -> np.ndarray:
            parts = [np.asarray(r[j], dtype=I32) for r in rows]
            return np.concatenate(parts) if parts else np.zeros(0, I32)
        e = np.zeros(0, I32)
        return cls(rptr, cat(0), cat(1), cat(2), e.astype(np.int64), e, e, e)

    def rows(self) -> list[list[Op]]:
        """The object rows (a new list of :class:`Op` per rank)."""
        names = COMPUTE_KINDS
        kind, stage, mb = self.kind.tolist(), self.stage.tolist(), self.mb.tolist()
        fbm = _fb_map(self)
        out = []
        for r in range(self.ranks):
            row = []
            for i in range(int(self.rptr[r]), int(self.rptr[r + 1])):
                k = names[kind[i]]
                if k == "FB":
                    bk, bs, bm = fbm[i]
                    row.append(Op.fb(Op("F", stage[i], mb[i]), Op(names[bk], bs, bm)))
                else:
                    row.append(Op(k, stage[i], mb[i]))
            out.append(row)
        return out


def _fb_arrays(fb: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    if not fb:
        e = np.zeros(0, I32)
        return e.astype(np.int64), e, e, e
    a = np.asarray(fb, dtype=np.int64)
    return a[:, 0].copy(), a[:, 1].astype(I32), a[:, 2].astype(I32), a[:, 3].astype(I32)


def _fb_map(x: FlatSchedule | FlatProgram) -> dict[int, tuple[int, int, int]]:
    return {int(i): (int(k), int(s), int(m)) for i, k, s, m in
            zip(x.fb_at.tolist(), x.fb_kind.tolist(), x.fb_stage.tolist(), x.fb_mb.tolist())}


@dataclass(eq=False, frozen=True)
class FlatProgram(RankRows):
    """A program as arrays (module docstring)."""

    code: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    mptr: np.ndarray
    ckind: np.ndarray
    cstage: np.ndarray
    cmb: np.ndarray
    fb_at: np.ndarray
    fb_kind: np.ndarray
    fb_stage: np.ndarray
    fb_mb: np.ndarray
    ctag: np.ndarray | None = None
    cbytes: np.ndarray | None = None
    cpeer: np.ndarray | None = None

    def comm_token(self, j: int) -> str:
        """Token of member ``j`` without identity suffix (``0SEND_F0``, ``0SEND_F0>2``)."""
        q = -1 if self.cpeer is None else int(self.cpeer[j])
        return (f"{int(self.cstage[j])}{COMM_KINDS[int(self.ckind[j])]}{int(self.cmb[j])}"
                + ("" if q < 0 else ("<" if int(self.ckind[j]) & 1 else ">") + str(q)))

    def member_suffixes(self) -> list[str]:
        """Per member, its identity suffix (``:gradient@4MiB``, ``""``; needs ``ctag``)."""
        return [identity_suffix(TAGS[t] if t >= 0 else None, b if b >= 0 else None)
                for t, b in zip(self.ctag.tolist(), self.cbytes.tolist())]

    def row_length(self, r: int) -> int:
        return int(self.rptr[r + 1] - self.rptr[r])

    def has_comm(self) -> bool:
        """True if any instruction launches a send or recv."""
        return bool(np.any((self.code == Opcode.POST) | (self.code == Opcode.BATCH)))

    def rank_of_instr(self) -> np.ndarray:
        """Rank of every instruction (length N)."""
        return np.repeat(np.arange(self.ranks, dtype=I32), np.diff(self.rptr))

    def index_of_instr(self) -> np.ndarray:
        """Position of every instruction in its rank's program (length N)."""
        n = len(self)
        return (np.arange(n, dtype=np.int64) - np.repeat(self.rptr[:-1], np.diff(self.rptr))
                ).astype(I32)

    def launch_ids(self) -> np.ndarray:
        """Per instruction, its launch's number on its rank (0, 1, ...; a bare post and a
        BATCH are one launch each), -1 for instructions that launch nothing."""
        is_l = (self.code == Opcode.POST) | (self.code == Opcode.BATCH)
        c = np.cumsum(is_l, dtype=np.int64)
        base = np.concatenate(([0], c))[self.rptr[:-1]]
        ids = c - 1 - np.repeat(base, np.diff(self.rptr))
        return np.where(is_l, ids, -1).astype(I32)

    def member_instr(self) -> np.ndarray:
        """Instruction of every member (length of the member arrays)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.mptr))

    def schedule(self) -> FlatSchedule:
        """The compute order (comm instructions dropped)."""
        keep = self.code == Opcode.COMPUTE
        cum = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
        rptr = cum[self.rptr]
        new_pos = cum[:-1]
        return FlatSchedule(rptr, self.kind[keep], self.stage[keep], self.mb[keep],
                            new_pos[self.fb_at], self.fb_kind, self.fb_stage, self.fb_mb)

    # -- object view ------------------------------------------------------------------
    def rows(self) -> list[list[Instr]]:
        """The object rows (a new list of instructions per rank); equal instructions
        share one object."""
        ops_names, comm_names = COMPUTE_KINDS, COMM_KINDS
        code, kind = self.code.tolist(), self.kind.tolist()
        stage, mb, mptr = self.stage.tolist(), self.mb.tolist(), self.mptr.tolist()
        ck, cs, cm = self.ckind.tolist(), self.cstage.tolist(), self.cmb.tolist()
        fbm = _fb_map(self)
        comms: dict[tuple[int, int, int], Comm] = {}
        tags = self.ctag.tolist() if self.ctag is not None else None
        nbs = self.cbytes.tolist() if self.cbytes is not None else None
        peers = self.cpeer.tolist() if self.cpeer is not None else None

        def comm(j: int) -> Comm:
            peer = None if peers is None or peers[j] < 0 else peers[j]
            if tags is not None and (tags[j] >= 0 or nbs[j] >= 0):
                return Comm(comm_names[ck[j]], cs[j], cm[j], peer,
                            TAGS[tags[j]] if tags[j] >= 0 else None,
                            nbs[j] if nbs[j] >= 0 else None)
            key = (ck[j], cs[j], cm[j], peer)
            c = comms.get(key)
            if c is None:
                c = comms[key] = Comm(comm_names[ck[j]], cs[j], cm[j], peer)
            return c
        commit = Commit()
        out = []
        rptr = self.rptr.tolist()
        for r in range(self.ranks):
            row: list[Instr] = []
            for i in range(rptr[r], rptr[r + 1]):
                c = code[i]
                if c == 0:
                    k = ops_names[kind[i]]
                    if k == "FB":
                        bk, bs, bm = fbm[i]
                        op = Op.fb(Op("F", stage[i], mb[i]), Op(ops_names[bk], bs, bm))
                    else:
                        op = Op(k, stage[i], mb[i])
                    row.append(Compute(op))
                elif c == 1:
                    row.append(Post(comm(mptr[i])))
                elif c == 4:
                    row.append(commit)
                else:
                    cs_ = tuple(comm(j) for j in range(mptr[i], mptr[i + 1]))
                    row.append(Batch(cs_) if c == 2 else Wait(cs_))
            out.append(row)
        return out

    def token(self, i: int) -> str:
        """Program text token of flat instruction ``i``."""
        c = int(self.code[i])
        if c == Opcode.COMPUTE:
            k = int(self.kind[i])
            if k == OpKind.FB:
                bk, bs, bm = _fb_map(self)[i]
                return f"({int(self.stage[i])}F{int(self.mb[i])};{bs}{COMPUTE_KINDS[bk]}{bm})"
            return f"{int(self.stage[i])}{COMPUTE_KINDS[k]}{int(self.mb[i])}"
        if c == Opcode.COMMIT:
            return "COMMIT"
        lo, hi = int(self.mptr[i]), int(self.mptr[i + 1])
        suf = self.member_suffixes() if self.ctag is not None and c != Opcode.WAIT else None
        toks = [self.comm_token(j) + (suf[j] if suf else "") for j in range(lo, hi)]
        if c == Opcode.POST:
            return toks[0]
        return ("BATCH[" if c == Opcode.BATCH else "WAIT[") + "+".join(toks) + "]"

    def tokens(self) -> list[list[str]]:
        """Program text tokens per rank (:mod:`schedsim.program.tokens`), straight from
        the arrays."""
        ops_names, comm_names = COMPUTE_KINDS, COMM_KINDS
        code, kind = self.code.tolist(), self.kind.tolist()
        stage, mb, mptr = self.stage.tolist(), self.mb.tolist(), self.mptr.tolist()
        ck, cs, cm = self.ckind.tolist(), self.cstage.tolist(), self.cmb.tolist()
        fbm = _fb_map(self)
        ctok = [f"{s}{comm_names[k]}{m}" for k, s, m in zip(ck, cs, cm)]
        if self.cpeer is not None:
            ctok = [t + ("" if q < 0 else ("<" if k & 1 else ">") + str(q))
                    for t, k, q in zip(ctok, ck, self.cpeer.tolist())]
        ptok = ctok
        if self.ctag is not None:
            ptok = [t + x for t, x in zip(ctok, self.member_suffixes())]
        rptr = self.rptr.tolist()
        out = []
        for r in range(self.ranks):
            row = []
            for i in range(rptr[r], rptr[r + 1]):
                c = code[i]
                if c == 0:
                    k = kind[i]
                    if k == 4:
                        bk, bs, bm = fbm[i]
                        row.append(f"({stage[i]}F{mb[i]};{bs}{ops_names[bk]}{bm})")
                    else:
                        row.append(f"{stage[i]}{ops_names[k]}{mb[i]}")
                elif c == 1:
                    row.append(ptok[mptr[i]])
                elif c == 4:
                    row.append("COMMIT")
                else:
                    body = "+".join((ptok if c == 2 else ctok)[mptr[i]:mptr[i + 1]])
                    row.append(("BATCH[" if c == 2 else "WAIT[") + body + "]")
            out.append(row)
        return out


def same_arrays(a: RankRows, b: RankRows) -> bool:
    """True if ``a`` and ``b`` hold the same entries (same type, every array equal; an
    optional per-member array left None equals one of -1s)."""
    if type(a) is not type(b):
        return False
    for k, x in a.__dict__.items():
        y = b.__dict__[k]
        if x is None and y is None:
            continue
        if x is None or y is None:
            x, y = (y, x) if x is None else (x, y)
            if not np.all(x == -1):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def placement_rank_table(pl: Any) -> tuple[np.ndarray, int, int]:
    """``(table, half, last)`` for vectorized ``rank_of`` of a
    :class:`~schedsim.program.ir.Placement`: the rank of stage s is
    ``table[s]``, except under ``dual`` placement where microbatches ``>= half`` run
    stage s on ``last - s`` (see :meth:`Placement.rank_of`)."""
    table = np.asarray([pl.rank_of(s, 0) for s in range(pl.stages)], dtype=I32)
    if pl.kind == "dual":
        return table, (pl.microbatches or 0) // 2, pl.ranks - 1
    return table, -1, -1


def ranks_of(pl: Any, stage: np.ndarray, mb: np.ndarray) -> np.ndarray:
    """Vectorized :meth:`Placement.rank_of` (stages must be in range)."""
    table, half, last = placement_rank_table(pl)
    out = table[stage]
    if half >= 0:
        out = np.where(mb >= half, last - stage, out).astype(I32)
    return out

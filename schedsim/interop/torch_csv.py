"""Reading a torch schedule CSV straight into the flat form, in one pass over the text.

:mod:`schedsim.interop.torch_format` reads a CSV with :func:`read_columns` first: one
regular-expression match per cell, integer columns per rank, a placement check, the
array validator (:mod:`schedsim.program.validate_flat`) and, for a compute+comms file,
the runtime's waits placed by array operations (:func:`runtime_program`). Anything this
fast path does not handle (an ``OVERLAP_F_B`` cell, a bad cell, a misplaced or invalid op,
a recv posted twice) makes it return None, and the per-cell reader then reports the
exact cell, as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from schedsim.program.flat import (
    CommKind,
    FlatProgram,
    FlatSchedule,
    Opcode,
    OpKind,
    RankRows,
    ranks_of,
)
from schedsim.program.routing import cross_stage_inputs

I64 = np.int64
I32 = np.int32
#: torch action -> (is comm, schedsim kind code); bookkeeping -> None
_KINDS: dict[str, tuple[bool, int] | None] = {
    "F": (False, int(OpKind.F)), "I": (False, int(OpKind.B)), "W": (False, int(OpKind.W)),
    "B": (False, int(OpKind.BW)), "SEND_F": (True, int(CommKind.SEND_F)),
    "RECV_F": (True, int(CommKind.RECV_F)), "SEND_B": (True, int(CommKind.SEND_B)),
    "RECV_B": (True, int(CommKind.RECV_B)), "UNSHARD": None, "RESHARD": None,
    "REDUCE_GRAD": None}


@dataclass(eq=False, frozen=True)
class Columns(RankRows):
    """A CSV's actions per rank, in order: ``is_comm``, ``kind`` (OpKind or CommKind
    code), ``stage``, ``mb``; rank r's are ``rptr[r]:rptr[r+1]``."""

    is_comm: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    mb: np.ndarray


_BOOKKEEPING = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
#: torch action -> schedsim kind code, plus 8 for a comm action
_KIND_CODE = {k: v[1] + (8 if v[0] else 0) for k, v in _KINDS.items() if v is not None}


def read_columns(text: str) -> Columns | None:
    """Parse a torch CSV (one row per rank) into :class:`Columns`; None when a cell is not
    a plain compute, comm or bookkeeping action or empty (an ``OVERLAP_F_B`` pair, a
    quoted cell, a bad cell), or there is no row: the per-cell reader handles those.

    A cell is ``{stage}{kind}{mb}`` (bookkeeping: ``{stage}{kind}``): stripping the digits
    at both ends leaves the kind, which must be one of torch's."""
    if '"' in text or "(" in text:
        return None
    lines = text.splitlines()
    while lines and not lines[-1].replace(",", "").strip():
        lines.pop()
    if not lines:
        return None
    kinds = _KIND_CODE
    book = _BOOKKEEPING
    code: list[int] = []
    stage: list[str] = []
    mb: list[str] = []
    rptr = [0]
    for line in lines:
        for c in line.split(","):
            c = c.strip()
            if not c:
                continue
            k = c.strip("0123456789")
            n = len(c) - len(c.lstrip("0123456789"))      # the stage's digits
            if not n:
                return None
            x = kinds.get(k)
            if x is None:
                if k in book and len(c) == n + len(k):
                    continue
                return None
            m = c[n + len(k):]
            if not m:
                return None
            code.append(x)
            stage.append(c[:n])
            mb.append(m)
        rptr.append(len(code))
    cd = np.asarray(code, dtype=I32)
    return Columns(np.asarray(rptr, I64), cd >= 8, cd & 7,
                   np.asarray(stage, dtype=np.int64).astype(I32) if stage else
                   np.zeros(0, I32),
                   np.asarray(mb, dtype=np.int64).astype(I32) if mb else np.zeros(0, I32))


def compute_schedule(cols: Columns) -> FlatSchedule:
    """The compute actions as a :class:`FlatSchedule`."""
    keep = ~cols.is_comm
    cum = np.concatenate(([0], np.cumsum(keep, dtype=I64)))
    e = np.zeros(0, I32)
    return FlatSchedule(cum[cols.rptr], cols.kind[keep], cols.stage[keep], cols.mb[keep],
                        e.astype(I64), e, e, e)


def placement_ok(cols: Columns, pl: Any, microbatches: int) -> bool:
    """Every compute action's stage and microbatch in range and on the rank ``pl`` puts
    it on."""
    keep = ~cols.is_comm
    st, mb = cols.stage[keep].astype(I64), cols.mb[keep].astype(I64)
    if not (np.all((st >= 0) & (st < pl.stages)) and np.all((mb >= 0) & (mb < microbatches))):
        return False
    rank = np.repeat(np.arange(cols.ranks, dtype=I64), np.diff(cols.rptr))[keep]
    return bool(np.all(ranks_of(pl, st, mb) == rank))


def runtime_program(cols: Columns, pl: Any) -> FlatProgram | None:
    """The program torch's runtime runs for these actions (the rule of
    :func:`schedsim.program.torch_runtime.runtime_rows`): each SEND/RECV is posted where it
    stands (one launch each), each compute waits right before it the RECV of its
    cross-rank input when that RECV was posted before it, and at the end every SEND is
    waited, the last one posted first.
    None when a RECV is posted twice or two ops wait for one RECV (the per-action rule
    then decides)."""
    rank = np.repeat(np.arange(cols.ranks, dtype=I64), np.diff(cols.rptr))
    ci = np.flatnonzero(~cols.is_comm)
    w = _waited_inputs(cols, pl, rank, ci)
    if w is None:
        return None
    return _runtime_instructions(cols, rank, ci, *w)


def _waited_inputs(cols: Columns, pl: Any, rank: np.ndarray, ci: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """Which compute actions (at positions ``ci``; ``rank`` per action) wait for the
    RECV of their cross-rank input right before them: ``(mk, waited)``, the message kind
    of each compute's cross-stage input (0: F, 1: B) and the mask of those that wait (the
    RECV is posted on the same rank before the compute). None when a RECV is posted twice
    or two ops wait for one RECV."""
    S = pl.stages
    n = len(cols.kind)
    pos = np.arange(n, dtype=I64)
    # RECVs: (rank, kind, stage, mb) -> position (posted once)
    is_recv = cols.is_comm & ((cols.kind & 1) == 1)
    M = int(cols.mb.max(initial=0)) + 1
    rcode = (cols.kind.astype(I64) * S + cols.stage) * M + cols.mb      # a RECV's token
    rc = rcode[is_recv]
    if len(np.unique(rc)) != len(rc):
        return None
    table = np.full(4 * S * M, -1, I64)
    table[rc] = pos[is_recv]
    # each compute's cross-rank input: RECV_F of its stage (F) or RECV_B (B, BW)
    mk, ps = cross_stage_inputs(cols.kind[ci], cols.stage[ci], S)
    has = ps >= 0
    src = np.full(len(ci), -1, I64)
    src[has] = ranks_of(pl, ps[has], cols.mb[ci][has].astype(I64))
    need = has & (src != rank[ci])
    want = np.where(need, ((2 * mk + 1) * S + cols.stage[ci]) * M + cols.mb[ci], 0)
    at = np.where(need, table[want], -1)
    at = np.where(at >= 0, np.where(rank[np.maximum(at, 0)] == rank[ci], at, -1), -1)
    waited = need & (at >= 0) & (at < ci)
    wcodes = want[waited]
    if len(np.unique(wcodes)) != len(wcodes):
        return None
    return mk, waited


def _runtime_instructions(cols: Columns, rank: np.ndarray, ci: np.ndarray,
                          mk: np.ndarray, waited: np.ndarray) -> FlatProgram:
    """The flat program of :func:`runtime_program` once its waits are known
    (:func:`_waited_inputs`): the instruction positions, then each instruction's
    members."""
    P = cols.ranks
    n = len(cols.kind)
    is_c = ~cols.is_comm
    # instructions: each action, plus a WAIT before each compute that waits, plus, at the
    # end of each rank, a WAIT per SEND (the last posted first)
    is_send = cols.is_comm & ((cols.kind & 1) == 0)
    nsend = np.bincount(rank[is_send], minlength=P)
    extra = np.zeros(n, I64)
    extra[ci[waited]] = 1
    size = 1 + extra
    shift = np.concatenate(([0], np.cumsum(nsend)))[:-1][rank]   # earlier ranks' waits
    start = np.cumsum(size) - size + shift
    N = int(size.sum()) + int(nsend.sum())
    code = np.empty(N, I32)
    kind = np.full(N, -1, I32)
    stage = np.full(N, -1, I32)
    mb = np.full(N, -1, I32)
    own = start + extra                       # each action's own instruction
    code[own] = np.where(cols.is_comm, int(Opcode.POST), int(Opcode.COMPUTE))
    kind[own[is_c]] = cols.kind[is_c]
    stage[own[is_c]] = cols.stage[is_c]
    mb[own[is_c]] = cols.mb[is_c]
    wpos = start[ci[waited]]
    code[wpos] = int(Opcode.WAIT)
    ends = np.concatenate(([0], np.cumsum(np.bincount(rank, weights=size, minlength=P)
                                          .astype(I64) + nsend)))
    si = np.flatnonzero(is_send)                       # in posting order, rank by rank
    k_in = np.arange(len(si)) - (np.cumsum(nsend) - nsend)[rank[si]]
    fpos = ends[rank[si] + 1] - 1 - k_in               # the last send's wait first
    code[fpos] = int(Opcode.WAIT)
    # members, in instruction order: a post's comm, a wait's recv or send
    mcount = np.zeros(N, I64)
    mcount[own[cols.is_comm]] = 1
    mcount[wpos] = 1
    mcount[fpos] = 1
    mptr = np.zeros(N + 1, I64)
    np.cumsum(mcount, out=mptr[1:])
    ck = np.empty(int(mptr[-1]), I32)
    cs = np.empty_like(ck)
    cm = np.empty_like(ck)
    j = mptr[own[cols.is_comm]]
    ck[j], cs[j], cm[j] = (cols.kind[cols.is_comm], cols.stage[cols.is_comm],
                           cols.mb[cols.is_comm])
    j = mptr[wpos]
    wc = ci[waited]
    ck[j] = 2 * mk[waited] + 1
    cs[j] = cols.stage[wc]
    cm[j] = cols.mb[wc]
    j = mptr[fpos]
    ck[j], cs[j], cm[j] = cols.kind[si], cols.stage[si], cols.mb[si]
    rptr = ends.astype(I64)
    e = np.zeros(0, I32)
    return FlatProgram(rptr, code, kind, stage, mb, mptr, ck, cs, cm, e.astype(I64), e, e, e)

"""A simulated Timeline's span, message and wait objects, built when first needed from
a :class:`RunSource`: what they need of the compiled program (gathered when the Timeline
is made) and the run's raw results, so that the Timeline does not keep the compiled
program (:class:`~schedsim.sim.compiled.Compiled`: code, units, tables) alive."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from schedsim.program.flat import COMPUTE_KINDS, OpKind
from schedsim.program.routing import MESSAGE_KINDS, decode_codes
from schedsim.sim.compiled import Compiled, Messages
from schedsim.sim.opcodes import Step, WaitKind
from schedsim.timeline import Message, Part, Span, WaitRecord

I64 = np.int64
_FB = int(OpKind.FB)


@dataclass(frozen=True, eq=False)
class RunSource:
    """What a run's objects need (arrays; spans are the ops that ran, in rank order).

    Spans: ``span_gi`` (flat instruction index), ``span_rank``, ``span_index``
    (instruction index in its rank), ``span_kind``/``span_stage``/``span_mb`` (the
    program's :class:`~schedsim.program.flat.OpKind`, stage, mb), ``span_start``/
    ``span_end``; ``fb_at``/``fb_kind``/``fb_stage``/``fb_mb``: the program's FB ops and
    their second halves. Messages: the compiled :class:`~schedsim.sim.compiled.Messages`,
    decoded with ``stages``/``microbatches``/``skips``. Waits (one per record of
    ``st.waits``): ``wait_rank``, ``wait_index`` (instruction index), ``wait_kind``
    (:class:`~schedsim.sim.opcodes.WaitKind`), their handles
    ``wait_h[wait_ptr[k]:wait_ptr[k+1]]``. ``st``: the run's raw results.
    """

    placement: Any
    data_mode: bool
    stages: int
    microbatches: int
    skips: tuple
    messages: Messages
    st: Any           # the run's schedsim.sim.engine.RunState (engine imports this module)
    span_gi: np.ndarray
    span_rank: np.ndarray
    span_index: np.ndarray
    span_kind: np.ndarray
    span_stage: np.ndarray
    span_mb: np.ndarray
    span_start: np.ndarray
    span_end: np.ndarray
    fb_at: np.ndarray
    fb_kind: np.ndarray
    fb_stage: np.ndarray
    fb_mb: np.ndarray
    wait_rank: np.ndarray
    wait_index: np.ndarray
    wait_kind: np.ndarray
    wait_ptr: np.ndarray
    wait_h: np.ndarray

    @classmethod
    def of(cls, cp: Compiled, st: Any) -> RunSource:
        """The source of the run ``st`` of ``cp`` (numpy gathers; nothing per object)."""
        fl, code = cp.flat, cp.code
        ran = st.send >= 0.0
        if ran.all():                # a finished run: every span, no copies
            ran = slice(None)
        gi = cp.span_gi[ran]
        g = st.waits[0]
        kind = np.where(code.cop[g] == Step.LAUNCH, int(WaitKind.INIT), code.cwk[g])
        lo, cnt = code.chptr[g], code.chptr[g + 1] - code.chptr[g]
        offs = np.concatenate(([0], np.cumsum(cnt))).astype(I64)
        # the handles of every record, concatenated: record k's are ch[lo[k]:lo[k]+cnt[k]]
        # (the positions in the compiled program's index type: no int64 temporary)
        at = np.arange(int(offs[-1]), dtype=lo.dtype)
        at += np.repeat((lo - offs[:-1]).astype(lo.dtype), cnt)
        allh = code.ch[at]
        del at
        # each span's rank and index in it (fl.rank_of_instr()[gi], fl.index_of_instr()[gi]
        # without a per-instruction array)
        span_rank = (np.searchsorted(fl.rptr, gi, side="right") - 1).astype(np.int32)
        span_index = (gi - fl.rptr[span_rank]).astype(np.int32)
        pl = cp.program.placement
        return cls(placement=pl, data_mode=cp.data_mode, stages=cp.stages,
                   microbatches=cp.microbatches, skips=tuple(pl.skips),
                   messages=cp.messages, st=st, span_gi=gi,
                   span_rank=span_rank, span_index=span_index,
                   span_kind=fl.kind[gi], span_stage=fl.stage[gi], span_mb=fl.mb[gi],
                   span_start=st.sstart[ran],
                   span_end=st.send[ran], fb_at=fl.fb_at, fb_kind=fl.fb_kind,
                   fb_stage=fl.fb_stage, fb_mb=fl.fb_mb,
                   wait_rank=np.searchsorted(code.crptr, g, side="right") - 1,
                   wait_index=code.cipc[g], wait_kind=kind, wait_ptr=offs, wait_h=allh)

    def decode(self, codes: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`Compiled.decode <schedsim.sim.compiled.Compiled.decode>`."""
        return decode_codes(codes, self.stages, self.microbatches, self.skips)

    def handle_tokens(self, hs: np.ndarray) -> list[str]:
        """Program tokens of handles ``hs`` (``1RECV_F0``), built from the message
        arrays."""
        if not len(hs):
            return []
        ms = self.messages
        recv = (hs & 1) == 1
        code = ms.mcode[hs >> 1]
        if ms.mrcode is not None:       # a swapped recv names another message (identity)
            code = np.where(recv, ms.mrcode[hs >> 1], code)
        mk, ps, cs, mb = self.decode(code)
        stage = np.where(recv, cs, ps)
        names = [("SEND_" + k, "RECV_" + k) for k in MESSAGE_KINDS]
        toks = [f"{s}{names[k][r]}{m}" for s, k, r, m in
                zip(stage.tolist(), mk.tolist(), recv.tolist(), mb.tolist())]
        skip = cs != ps + 1 - 2 * (mk & 1)
        if skip.any():                  # a skip edge: the token names the other stage
            other = np.where(recv, ps, cs)
            for i in np.flatnonzero(skip).tolist():
                toks[i] += ("<" if recv[i] else ">") + str(int(other[i]))
        return toks


def _opt(a: np.ndarray) -> list:
    """A float array as a list with None where it is -1 (unknown)."""
    lst = a.tolist()
    if (a < 0).any():
        return [None if x < 0 else x for x in lst]
    return lst


def _spans(src: RunSource) -> list[Span]:
    """Spans of the ops that ran (a deadlock leaves some unreached)."""
    pl, gi = src.placement, src.span_gi
    kind, stage, mb = src.span_kind, src.span_stage, src.span_mb
    chunk = _chunks(pl, stage, mb)
    names = [COMPUTE_KINDS[k] for k in kind.tolist()]
    parts: list = [None] * len(gi)
    if len(src.fb_at):
        fb_pos = {g: k for k, g in enumerate(src.fb_at.tolist())}
        for j in np.flatnonzero(kind == _FB).tolist():
            k = fb_pos[int(gi[j])]
            bs, bm = int(src.fb_stage[k]), int(src.fb_mb[k])
            parts[j] = [Part("F", int(mb[j]), int(chunk[j]), int(stage[j])),
                        Part(COMPUTE_KINDS[int(src.fb_kind[k])], bm,
                             int(_chunks(pl, np.array([bs]), np.array([bm]))[0]), bs)]
    return list(map(Span, src.span_rank.tolist(), names, mb.tolist(), chunk.tolist(),
                    stage.tolist(), src.span_start.tolist(), src.span_end.tolist(),
                    src.span_index.tolist(), parts))


def _chunks(pl, stage: np.ndarray, mb: np.ndarray) -> np.ndarray:
    """Vectorized :meth:`Placement.chunk_of`."""
    if pl.kind == "dual":
        return (mb >= (pl.microbatches or 0) // 2).astype(np.int64)
    table = np.asarray([pl.chunk_of(s) for s in range(pl.stages)], dtype=np.int64)
    return table[stage]


def _messages(src: RunSource) -> list[Message]:
    ms, st = src.messages, src.st
    nm = len(ms.mcode)
    mk, ps, cs, mb = src.decode(ms.mcode)
    kinds = MESSAGE_KINDS
    kind = [kinds[k] for k in mk.tolist()]
    skip = cs != ps + 1 - 2 * (mk & 1)
    to = np.where(skip, cs, -1).tolist() if skip.any() else None
    sact = _opt(st.hact[0::2])
    if src.data_mode:
        sposts, rposts, ract = sact, [None] * nm, [None] * nm
    else:
        sposts, rposts, ract = _opt(st.hpost[0::2]), _opt(st.hpost[1::2]), \
            _opt(st.hact[1::2])
    out = list(map(Message, kind, ms.msrc.tolist(), ms.mdst.tolist(), mb.tolist(),
                   ps.tolist(), ms.mbytes.tolist(), sposts, rposts,
                   _opt(st.mstart), _opt(st.marr), _opt(st.hdone[0::2]),
                   _opt(st.hdone[1::2]), ms.hindex[0::2].tolist(), ms.hindex[1::2].tolist(),
                   sact, ract))
    if to is not None:              # skip edges: the consumer stage is not the chain's
        for msg, c in zip(out, to):
            if c >= 0:
                msg.to_stage = c
    return out


def _waits(src: RunSource) -> list[WaitRecord]:
    _, t0, t1 = src.st.waits
    if not len(t0):
        return []
    kinds = [k.name for k in WaitKind]
    toks = src.handle_tokens(src.wait_h)
    o = src.wait_ptr.tolist()
    comms = [toks[o[k]:o[k + 1]] for k in range(len(t0))]
    return list(map(WaitRecord, src.wait_rank.tolist(), src.wait_index.tolist(),
                    [kinds[k] for k in src.wait_kind.tolist()], t0.tolist(), t1.tolist(),
                    comms))


def run_span_kinds(src: RunSource) -> set[tuple[str, tuple[str, ...]]]:
    """:meth:`Timeline.span_kinds` from the arrays (the kind codes that occur, counted:
    ``np.unique`` would import ``numpy.ma`` into a small run's start-up)."""
    def present(codes: np.ndarray) -> list[int]:
        return np.flatnonzero(np.bincount(codes)).tolist()

    kinds = present(src.span_kind)
    out = {(COMPUTE_KINDS[k], ()) for k in kinds if k != _FB}
    if _FB in kinds:
        ran_fb = np.isin(src.fb_at, src.span_gi)
        out |= {("FB", ("F", COMPUTE_KINDS[b])) for b in present(src.fb_kind[ran_fb])}
    return out


def run_objects(src: RunSource) -> dict[str, list]:
    """The span, message and wait objects of a run (built when first needed)."""
    from schedsim.util.gc import no_gc

    with no_gc():
        return {"spans": _spans(src), "messages": _messages(src), "waits": _waits(src)}

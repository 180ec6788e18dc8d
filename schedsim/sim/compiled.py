"""The compiled form of a program: arrays over all ranks' steps that the engine runs, and
the message tables (built by :mod:`schedsim.sim.compile`).

Handles: message m has a send handle ``2m`` (owned by its source rank) and a recv handle
``2m+1`` (its destination rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from schedsim.program.flat import FlatProgram
from schedsim.program.ir import Op, Program
from schedsim.program.ops import recv_comm, send_comm
from schedsim.program.routing import MESSAGE_KINDS
from schedsim.sim.kernels import Step, WaitKind

I64 = np.int64


@dataclass
class Compiled:
    """A program compiled under one cost/link/comm setting (arrays over all ranks).

    Code: step ``pc`` of rank r lies in ``crptr[r]:crptr[r+1]``; ``cop`` (a
    :class:`~schedsim.sim.kernels.Step`), ``cipc`` (its program instruction index; a
    rank's ``END`` has the program length), ``cwk`` (:class:`~schedsim.sim.kernels.
    WaitKind` of a wait step), ``ccost``/``cspan`` (compute), handles
    ``ch[chptr[pc]:chptr[pc+1]]``, comm-stream units ``cuptr[pc]..cuptr[pc+1]-1``,
    ``cinit`` (lazy init: the rank pair whose communicator this bare post creates, -1).
    Spans: ``span_gi`` (flat instruction index of span s). Measured host times:
    ``delay`` (per step), measured sender completions: ``msend`` (per message).
    Messages (by id ``m``):
    ``mcode`` (key code), ``msrc``/``mdst``, ``mbytes``, ``mlat``, ``mocc`` (link
    occupancy), ``mlink``, ``meager``; handles ``hindex``/``hseq`` (instruction index and
    posting order of each handle's post); units ``unit_stream``, ``unit_h`` at
    ``unit_hptr``, ``hunit``.
    """

    program: Program
    flat: FlatProgram
    data_mode: bool
    ranks: int
    stages: int
    microbatches: int
    crptr: np.ndarray
    cop: np.ndarray
    cipc: np.ndarray
    cwk: np.ndarray
    ccost: np.ndarray
    cspan: np.ndarray
    chptr: np.ndarray
    ch: np.ndarray
    cuptr: np.ndarray
    cinit: np.ndarray
    span_gi: np.ndarray
    mcode: np.ndarray
    msrc: np.ndarray
    mdst: np.ndarray
    hindex: np.ndarray
    hseq: np.ndarray
    unit_stream: np.ndarray
    unit_hptr: np.ndarray
    unit_h: np.ndarray
    hunit: np.ndarray
    mbytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mlat: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mocc: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mlink: np.ndarray = field(default_factory=lambda: np.zeros(0, I64))
    meager: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    num_links: int = 0
    launch_cost: float = 0.0
    lazy_init: bool = False
    init_cost: float = 0.0
    #: measured sender completion per message, from its transfer's start
    #: (``LinkModel.messages``), -1 where not measured; None: no measured message
    msend: np.ndarray | None = None
    #: host time spent before each step (``CommModel.host``, a launch's own time folded in;
    #: ``launch_cost`` is then 0); None: no such times
    delay: np.ndarray | None = None
    pair_first: dict[int, dict[int, int]] = field(default_factory=dict)

    @property
    def num_messages(self) -> int:
        return len(self.mcode)

    @property
    def num_streams(self) -> int:
        return self.ranks + self.ranks * self.ranks

    # -- message identity ---------------------------------------------------------------
    @cached_property
    def mkey(self) -> list[tuple[str, int, int]]:
        """``(kind, producing stage, mb)`` of every message."""
        S, M = self.stages, self.microbatches
        code = self.mcode
        kinds = MESSAGE_KINDS
        return list(zip([kinds[k] for k in (code // (S * M)).tolist()],
                        ((code // M) % S).tolist(), (code % M).tolist()))

    def handle_token(self, h: int) -> str:
        """Program token of a handle (``1RECV_F0``) for messages and diagnostics."""
        key = self.mkey[h >> 1]
        return str(send_comm(key) if h & 1 == 0 else recv_comm(key))

    def owner(self, h: int) -> int:
        """The rank that posts handle h."""
        return int(self.msrc[h >> 1] if h & 1 == 0 else self.mdst[h >> 1])

    # -- positions ----------------------------------------------------------------------
    def instr_index(self, r: int, pc: int) -> int:
        """Program instruction index of rank r's compiled step ``pc`` (counted from the
        rank's first step; the program length past its end)."""
        g = int(self.crptr[r]) + pc
        if g >= int(self.crptr[r + 1]):
            return self.flat.row_length(r)
        return int(self.cipc[g])

    def token(self, r: int, i: int) -> str:
        """Token of rank r's instruction i (``END`` past the end)."""
        if i >= self.flat.row_length(r):
            return "END"
        return self.flat.token(int(self.flat.rptr[r]) + i)

    def step_handles(self, g: int) -> list[int]:
        """Handles of global step g."""
        return self.ch[self.chptr[g]:self.chptr[g + 1]].tolist()

    # -- object views (for analyses that walk the code as tuples) -----------------------
    @cached_property
    def span_meta(self) -> list[tuple[int, Op, int]]:
        """``(rank, op, instruction index)`` of every span."""
        fl = self.flat
        ranks = fl.rank_of_instr()[self.span_gi].tolist()
        idx = fl.index_of_instr()[self.span_gi].tolist()
        ops = fl.schedule().rows()
        flat_ops = [op for row in ops for op in row]
        return list(zip(ranks, flat_ops, idx))

    @cached_property
    def unit_handles(self) -> list[tuple[int, ...]]:
        hp, uh = self.unit_hptr.tolist(), self.unit_h.tolist()
        return [tuple(uh[hp[u]:hp[u + 1]]) for u in range(len(self.unit_stream))]

    @cached_property
    def code(self) -> list[list[tuple]]:
        """Per rank, the steps as tuples: ``(0, cost, span, (), send_handles)``,
        ``(1, handles, units)`` and ``(2, handles, kind, index)`` (kind ``WAIT``,
        ``COMMIT``, ``END`` or ``DATA``)."""
        cop, cost, span = self.cop.tolist(), self.ccost.tolist(), self.cspan.tolist()
        hp, ch, up = self.chptr.tolist(), self.ch.tolist(), self.cuptr.tolist()
        wk, ipc = self.cwk.tolist(), self.cipc.tolist()
        names = [k.name for k in WaitKind]
        out = []
        for r in range(self.ranks):
            row = []
            for g in range(int(self.crptr[r]), int(self.crptr[r + 1])):
                hs = tuple(ch[hp[g]:hp[g + 1]])
                if cop[g] == Step.COMPUTE:
                    row.append((0, cost[g], span[g], (), hs))
                elif cop[g] == Step.LAUNCH:
                    row.append((1, hs, tuple(range(up[g], up[g + 1]))))
                else:
                    row.append((2, hs, names[wk[g]], ipc[g]))
            out.append(row)
        return out

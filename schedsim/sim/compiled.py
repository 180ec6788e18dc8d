"""The compiled form of a program: frozen records of arrays over all ranks' steps that
the engine runs, and the message tables (built once by :mod:`schedsim.sim.compile`; the
kernels take the records as they are, :mod:`schedsim.sim.kernels`).

Handles: message m has a send handle ``2m`` (owned by its source rank) and a recv handle
``2m+1`` (its destination rank).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from schedsim.program.flat import FlatProgram
from schedsim.program.ir import Program
from schedsim.program.ops import recv_comm, send_comm
from schedsim.program.routing import MESSAGE_KINDS, decode_codes

I64 = np.int64


#: the type of ``Code.cop`` and ``Code.cwk`` (opcodes, :mod:`schedsim.sim.opcodes`)
OPCODE = np.int8


def message_keys(mk: np.ndarray, ps: np.ndarray, cs: np.ndarray, mb: np.ndarray) -> list[tuple]:
    """Message keys of decoded codes: 3 fields on a chain edge, 4 on a skip edge."""
    kinds = MESSAGE_KINDS
    chain = (cs == ps + 1 - 2 * (mk & 1)).tolist()
    return [(kinds[k], p, m) if ch else (kinds[k], p, m, c) for k, p, c, m, ch in
            zip(mk.tolist(), ps.tolist(), cs.tolist(), mb.tolist(), chain)]


class Code(NamedTuple):
    """The steps of every rank, one array per field over all ranks' steps (the
    event loop's code; frozen: :class:`Compiled` marks its arrays read-only).

    Step ``pc`` of rank r lies in ``crptr[r]:crptr[r+1]`` (``crptr``: ranks + 1);
    ``cop``: its :class:`~schedsim.sim.opcodes.Step`; ``cipc``: its program instruction
    index (a rank's ``END`` has the program length); ``cwk``: the
    :class:`~schedsim.sim.opcodes.WaitKind` of a wait step (-1 otherwise);
    ``ccost``/``cspan``: a compute's cost (in the cost model's unit) and span id (-1);
    its handles ``ch[chptr[pc]:chptr[pc+1]]``; its comm-stream units
    ``cuptr[pc]..cuptr[pc+1]-1``; ``cinit``: under lazy init, the rank pair
    (``min * ranks + max``) whose communicator this bare post creates, -1 (empty
    without lazy init: nothing reads it then; ``cuptr`` is empty without comm streams,
    when there are no units). ``cop`` and ``cwk`` are :data:`OPCODE`,
    the other integers :func:`~schedsim.program.flat.index_dtype`.
    """

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


class Messages(NamedTuple):
    """What each message is (by id m; handles ``2m`` send, ``2m+1`` recv): ``mcode``
    (its key code, :mod:`schedsim.program.routing`), ``msrc``/``mdst`` (ranks),
    ``mbytes`` (bytes), ``hindex``/``hseq`` (per handle: instruction index and posting
    order of its post, -1), ``mrcode`` (what each recv named when a silent swap re-paired
    it, key codes; None: as ``mcode``), ``mbytes_given`` (bytes the posts gave, -1: the
    cost model's; None: none given)."""

    mcode: np.ndarray
    msrc: np.ndarray
    mdst: np.ndarray
    mbytes: np.ndarray
    hindex: np.ndarray
    hseq: np.ndarray
    mrcode: np.ndarray | None = None
    mbytes_given: np.ndarray | None = None


class Links(NamedTuple):
    """How each message moves (the event loop's view, by message id): ``mlat`` (latency),
    ``mocc`` (link occupancy, bytes / bandwidth), ``mlink`` (link id ``src * ranks +
    dst``), ``meager`` (1: completes eagerly), ``msend`` (measured sender completion
    after the transfer's start, -1 where not measured; empty: nothing measured),
    ``num_links`` and ``strict`` (some occupancy > 0: links serve transfers in time
    order). Build it with :func:`links_of` (which computes ``strict``)."""

    mlat: np.ndarray
    mocc: np.ndarray
    mlink: np.ndarray
    meager: np.ndarray
    msend: np.ndarray
    num_links: int
    strict: bool


def links_of(mlat: np.ndarray, mocc: np.ndarray, mlink: np.ndarray, meager: np.ndarray,
             *, msend: np.ndarray | None = None, num_links: int = 0) -> Links:
    """A :class:`Links` record; ``strict`` from ``mocc`` (the one home of that rule)."""
    return Links(mlat=mlat, mocc=mocc, mlink=mlink, meager=meager,
                 msend=np.zeros(0) if msend is None else msend, num_links=num_links,
                 strict=bool(np.any(mocc > 0)))


class Units(NamedTuple):
    """Comm-stream units (a launch's handles on one stream): unit u runs on stream
    ``unit_stream[u]`` (rank r's own stream r, or ``ranks + r * ranks + peer``) with
    handles ``unit_h[unit_hptr[u]:unit_hptr[u+1]]``; ``hunit[h]``: handle h's unit, -1."""

    unit_stream: np.ndarray
    unit_hptr: np.ndarray
    unit_h: np.ndarray
    hunit: np.ndarray


class Host(NamedTuple):
    """The host's costs and rules (``CommModel``): ``launch_cost`` (per launch; 0 when
    ``delay`` has it folded in), ``lazy_init``/``init_cost`` (communicators created at
    a pair's first bare posts), ``atomic`` (NCCL-like atomic groups,
    :mod:`schedsim.sim.groups`), ``delay`` (host time spent before each step; empty:
    none)."""

    launch_cost: float = 0.0
    lazy_init: bool = False
    init_cost: float = 0.0
    atomic: bool = False
    delay: np.ndarray = np.zeros(0)


class Part(NamedTuple):
    """What a compile pass makes (:func:`schedsim.sim.compile._compile_comm`,
    :func:`~schedsim.sim.compile_data.compile_data`), before the message costs and the
    host's rules are added: the :class:`Compiled` records it fills (``messages.mbytes``
    still empty) and the identity findings."""

    code: Code
    span_gi: np.ndarray
    messages: Messages
    units: Units
    swaps: tuple = ()
    unmatched: str | None = None


#: the records of a :class:`Compiled` whose arrays are sealed read-only
RECORDS = ("code", "messages", "links", "units", "host")


def _seal(rec: tuple) -> None:
    for v in rec:
        if isinstance(v, np.ndarray) and v.flags.writeable:
            v.flags.writeable = False


@dataclass(frozen=True, eq=False)
class Compiled:
    """A program compiled under one cost/link/comm setting: frozen records of arrays
    over all ranks (:class:`Code`, :class:`Messages`, :class:`Links`, :class:`Units`,
    :class:`Host`), built once by :func:`schedsim.sim.compile.compile_program`; a
    counterfactual (:mod:`schedsim.sim.free`) returns a new one
    (``dataclasses.replace``). Construction seals every array of the records
    read-only. ``span_gi``: flat instruction index of span s. ``pair_first[pair][rank]``:
    the instruction index of the rank's first bare post to the pair (lazy init).
    Message identity (:mod:`schedsim.sim.identity`): ``swaps`` (the silent-swap
    findings), ``unmatched`` (the first unmatched op's sentence, compiled with
    ``allow_unmatched``).
    """

    program: Program
    flat: FlatProgram
    data_mode: bool
    ranks: int
    stages: int
    microbatches: int
    code: Code
    span_gi: np.ndarray
    messages: Messages
    links: Links
    units: Units
    host: Host = Host()
    pair_first: Mapping[int, Mapping[int, int]] = field(
        default_factory=lambda: MappingProxyType({}))
    swaps: tuple[tuple[int, int, str], ...] = ()
    unmatched: str | None = None

    def __post_init__(self) -> None:
        for name in RECORDS:
            _seal(getattr(self, name))
        _seal((self.span_gi,))

    @property
    def num_messages(self) -> int:
        return len(self.messages.mcode)

    @property
    def num_streams(self) -> int:
        return self.ranks + self.ranks * self.ranks

    # -- message identity ---------------------------------------------------------------
    def decode(self, codes: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(message kind, producing stage, consuming stage, mb)`` of key codes
        (:func:`schedsim.program.routing.decode_codes`, skip edges included)."""
        return decode_codes(codes, self.stages, self.microbatches,
                            tuple(self.program.placement.skips))

    @cached_property
    def mkey(self) -> list[tuple]:
        """``(kind, producing stage, mb)`` of every message, with the consuming stage on
        a skip edge (:mod:`schedsim.program.routing`)."""
        return message_keys(*self.decode(self.messages.mcode))

    def handle_token(self, h: int) -> str:
        """Program token of a handle (``1RECV_F0``) for messages and diagnostics: what
        its post named (a swapped recv names another message than its send)."""
        if h & 1 == 0:
            return str(send_comm(self.mkey[h >> 1]))
        mrcode = self.messages.mrcode
        if mrcode is not None:
            return str(recv_comm(message_keys(*self.decode(mrcode[h >> 1:(h >> 1) + 1]))[0]))
        return str(recv_comm(self.mkey[h >> 1]))

    def owner(self, h: int) -> int:
        """The rank that posts handle h."""
        ms = self.messages
        return int(ms.msrc[h >> 1] if h & 1 == 0 else ms.mdst[h >> 1])

    # -- positions ----------------------------------------------------------------------
    def instr_index(self, r: int, pc: int) -> int:
        """Program instruction index of rank r's compiled step ``pc`` (counted from the
        rank's first step; the program length past its end)."""
        g = int(self.code.crptr[r]) + pc
        if g >= int(self.code.crptr[r + 1]):
            return self.flat.row_length(r)
        return int(self.code.cipc[g])

    def token(self, r: int, i: int) -> str:
        """Token of rank r's instruction i (``END`` past the end)."""
        if i >= self.flat.row_length(r):
            return "END"
        return self.flat.token(int(self.flat.rptr[r]) + i)

    def step_handles(self, g: int) -> list[int]:
        """Handles of global step g."""
        c = self.code
        return c.ch[c.chptr[g]:c.chptr[g + 1]].tolist()

    def step_rank(self) -> np.ndarray:
        """The rank of every step (int64, one per step)."""
        c = self.code
        return np.repeat(np.arange(self.ranks, dtype=I64), np.diff(c.crptr))

    @cached_property
    def unit_handles(self) -> list[tuple[int, ...]]:
        """The handles of every unit, as tuples."""
        u = self.units
        hp, uh = u.unit_hptr.tolist(), u.unit_h.tolist()
        return [tuple(uh[hp[k]:hp[k + 1]]) for k in range(len(u.unit_stream))]

"""Atoms of the program model: compute ops, P2P ops and instructions, and their text tokens.

Vocabulary (see DESIGN.md): a *rank* runs one or more *stages*; each stage processes every
*microbatch* ``mb`` with a forward ``F``, a backward for inputs ``B``, a backward for
weights ``W`` (or the fused full backward ``BW``); ``FB`` is an overlapped pair (the forward
of one microbatch with the backward of another, as in DualPipe).

Atoms are frozen, slotted dataclasses: they are created by the hundred thousand and must be
cheap. Their text form (:func:`format_instr`) is the program token grammar of
:mod:`schedsim.program.tokens`, which parses it back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from schedsim.program.routing import Key, message_key, recv_parts, send_parts
from schedsim.util.units import SIZE_UNITS

#: compute op kinds, in the order the summary tables list them
COMPUTE_KINDS = ("F", "B", "W", "BW", "FB")
#: comm op kinds: ``_F`` moves activations downstream, ``_B`` input gradients upstream;
#: ``_FS``/``_BS`` the shape messages announcing them (Megatron's variable_seq_lengths)
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "SEND_FS", "RECV_FS", "SEND_BS",
              "RECV_BS")
#: message tags a post may name (``:tag`` in program text); index = tag code
TAGS = ("activation", "gradient", "shape", "other")
#: bytes units a post's ``@bytes`` suffix may carry (binary and decimal; case as
#: written): these of :data:`schedsim.util.units.SIZE_UNITS`, in this order
BYTE_UNITS = {k: SIZE_UNITS[k] for k in ("B", "KiB", "MiB", "GiB", "KB", "MB", "GB")}


def default_tag(comm_kind: str) -> str:
    """The tag a post carries unless it names one: ``activation`` for ``SEND_F`` /
    ``RECV_F``, ``gradient`` for ``SEND_B`` / ``RECV_B``, ``shape`` for the shape
    messages (``_FS``, ``_BS``)."""
    return "shape" if comm_kind.endswith("S") else (
        "activation" if comm_kind[-1] == "F" else "gradient")


def format_bytes(n: float) -> str:
    """``4194304`` -> ``4MiB``; a count that is no whole KiB, MiB or GiB stays plain."""
    for unit in ("GiB", "MiB", "KiB"):
        q = n / BYTE_UNITS[unit]
        if q >= 1 and float(q).is_integer():
            return f"{int(q)}{unit}"
    return str(int(n)) if float(n).is_integer() else repr(float(n))


def identity_suffix(tag: str | None, nbytes: float | None) -> str:
    """The identity suffix of a post token: ``:gradient@4MiB``, ``@2MiB``, or ``""``."""
    return ((f":{tag}" if tag is not None else "")
            + (f"@{format_bytes(nbytes)}" if nbytes is not None else ""))


@dataclass(frozen=True, slots=True)
class Op:
    """One compute op of one stage on one microbatch.

    ``kind`` is ``F``, ``B`` (input gradient), ``W`` (weight gradient), ``BW`` (full
    backward) or ``FB`` (overlapped pair). For ``FB``, ``parts`` holds the forward part then
    the backward part (``B`` or ``BW``), each an :class:`Op` with its own stage and
    microbatch, and ``stage``/``mb`` repeat the forward part's. ``stage`` is the global
    stage index (for DualPipe: the index within the microbatch's direction); ``mb`` the
    global microbatch id.
    """

    kind: str
    stage: int
    mb: int
    parts: tuple["Op", ...] = ()

    @staticmethod
    def fb(forward: "Op", backward: "Op") -> "Op":
        """Build an overlapped ``FB`` op from a forward op and a ``B``/``BW`` op."""
        return Op("FB", forward.stage, forward.mb, (forward, backward))

    def atoms(self) -> tuple["Op", ...]:
        """The non-overlapped ops this op performs: its parts for ``FB``, else itself."""
        return self.parts if self.kind == "FB" else (self,)

    def __str__(self) -> str:
        return format_op(self)


@dataclass(frozen=True, slots=True)
class Comm:
    """A point-to-point op as the rank that issues it names it (torch's convention).

    ``SEND_F`` at stage s sends the activation of stage s to stage s+1; ``RECV_F`` at stage
    s receives the activation of stage s-1; ``SEND_B`` at stage s sends the gradient of
    stage s's input to stage s-1; ``RECV_B`` at stage s receives it from stage s+1.

    ``peer`` names the other stage of a skip edge (``0SEND_F0>2``, ``2RECV_F0<0``;
    None: the chain neighbour). ``tag`` and ``nbytes`` are the message's identity as
    this side posts it (program
    text ``0SEND_F1:gradient@4MiB``): None means the default, :func:`default_tag` and
    the cost model's ``bytes_of`` of the producing stage. They take no part in
    equality: a ``WAIT`` names the op by kind, stage and microbatch alone. Compile pairs
    the k-th send with the k-th recv per directed link and checks that their bytes and
    tags agree (:mod:`schedsim.sim.identity`).
    """

    kind: str
    stage: int
    mb: int
    peer: int | None = None
    tag: str | None = field(default=None, compare=False)
    nbytes: float | None = field(default=None, compare=False)

    @property
    def is_send(self) -> bool:
        return self.kind[0] == "S"

    def token(self) -> str:
        """The post token with its identity suffix (``0SEND_F1:gradient@4MiB``)."""
        return str(self) + identity_suffix(self.tag, self.nbytes)

    def message_key(self) -> Key:
        """``(kind, producing stage, mb)``, with the consuming stage on a skip edge: the
        identity of the message this op moves (:mod:`schedsim.program.routing`)."""
        return message_key(self.kind, self.stage, self.mb, self.peer)

    def __str__(self) -> str:
        if self.peer is None:
            return f"{self.stage}{self.kind}{self.mb}"
        return f"{self.stage}{self.kind}{self.mb}{'>' if self.is_send else '<'}{self.peer}"


def send_comm(key: Key) -> Comm:
    """The SEND the producer of message ``key`` posts."""
    return Comm(*send_parts(key))


def recv_comm(key: Key) -> Comm:
    """The RECV the consumer of message ``key`` posts."""
    return Comm(*recv_parts(key))


@dataclass(frozen=True, slots=True)
class Compute:
    """Run a compute op on the rank's compute stream; the host waits for it to finish."""

    op: Op


@dataclass(frozen=True, slots=True)
class Post:
    """Launch one send or recv on its own (``dist.isend``/``dist.irecv``); does not block.

    Each bare post is one launch: it pays the launch cost once and, on a shared comm
    stream, is one unit in stream order. Several P2P ops launched together are a
    :class:`Batch`.
    """

    comm: Comm


@dataclass(frozen=True, slots=True)
class Batch:
    """Launch several sends and recvs as one call (``dist.batch_isend_irecv``); does not
    block. One launch: the launch cost is paid once and, on a shared comm stream, the batch
    runs as one unit (per stream it touches). Text form ``BATCH[a+b+...]``.
    """

    comms: tuple[Comm, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Block until the named, previously posted comm ops have completed (``Work.wait()``)."""

    comms: tuple[Comm, ...]


@dataclass(frozen=True, slots=True)
class Commit:
    """Block until everything posted since the previous ``Commit`` has completed.

    Together with the ``BATCH[...]`` before it this is DualPipe's ``batch_isend_irecv`` +
    ``wait()``.
    """


Instr = Union[Compute, Post, Batch, Wait, Commit]
#: instructions that launch P2P ops
LAUNCHES = (Post, Batch)


def launched(ins: Instr) -> tuple[Comm, ...]:
    """The P2P ops an instruction launches (empty for anything but a post or batch)."""
    t = type(ins)
    if t is Post:
        return (ins.comm,)
    if t is Batch:
        return ins.comms
    return ()


def format_op(op: Op) -> str:
    """Token of a compute op (inverse of :func:`parse_op`)."""
    if op.kind == "FB":
        f, b = op.parts
        return f"({f.stage}F{f.mb};{b.stage}{b.kind}{b.mb})"
    return f"{op.stage}{op.kind}{op.mb}"


def format_instr(ins: Instr | Op | str) -> str:
    """Token of an instruction (inverse of :func:`parse_instr`)."""
    if isinstance(ins, str):
        return ins
    if isinstance(ins, Op):
        return format_op(ins)
    if isinstance(ins, Compute):
        return format_op(ins.op)
    if isinstance(ins, Post):
        return ins.comm.token()
    if isinstance(ins, Batch):
        return "BATCH[" + "+".join(c.token() for c in ins.comms) + "]"
    if isinstance(ins, Commit):
        return "COMMIT"
    if isinstance(ins, Wait):
        return "WAIT[" + "+".join(str(c) for c in ins.comms) + "]"
    raise TypeError(f"not an instruction: {ins!r}")

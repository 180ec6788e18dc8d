"""The one home of the compiled code's numbering: step opcodes (:class:`Step`), what a
recorded wait was (:class:`WaitKind`), the compile pass's error codes (:class:`Err`) and
comm-stream modes (:class:`StreamMode`).

Every reader compares against these names (``code.cop == Step.COMPUTE``), never against
their numbers; the kernels (:mod:`schedsim.sim.kernels`,
:mod:`schedsim.sim.compile_kernel`) copy them into module constants (``int(Step.WAIT)``),
what both CPython and numba compare fastest.
"""
from __future__ import annotations

from enum import IntEnum

from schedsim.program.vocab import COMM_STREAMS


class Step(IntEnum):
    """Opcodes of compiled code (``Code.cop``)."""

    COMPUTE = 0
    LAUNCH = 1
    WAIT = 2


class WaitKind(IntEnum):
    """What a wait step waits for (``Code.cwk``) and what a recorded wait was
    (``Timeline.waits[].kind``)."""

    WAIT = 0
    COMMIT = 1
    END = 2
    DATA = 3
    INIT = 4


class Err(IntEnum):
    """Error codes of :func:`~schedsim.sim.compile_kernel.compile_comm_kernel` (formatted
    by :mod:`schedsim.sim.compile`)."""

    OK = 0
    NO_MESSAGE = 1      # a post names a message that does not exist
    LOCAL = 2           # a post moves a same-rank hand-off
    POST = 3            # posted by the wrong rank, or twice
    SEND_EARLY = 4      # a send before its data was made on this rank
    NEED = 5            # a compute op uses a cross-rank input not received and waited
    WAIT_UNPOSTED = 6   # a WAIT names an op this rank has not posted before


class StreamMode(IntEnum):
    """How launches are split into comm-stream units (``CommModel.comm_stream``): none,
    one stream per (rank, peer), one stream per rank."""

    NONE = 0
    PER_PEER = 1
    PER_RANK = 2


#: ``CommModel.comm_stream`` (its names: :data:`schedsim.program.vocab.COMM_STREAMS`, in
#: this order) -> :class:`StreamMode`
STREAM_MODES = dict(zip(COMM_STREAMS, (StreamMode.NONE, StreamMode.PER_PEER,
                                       StreamMode.PER_RANK), strict=True))

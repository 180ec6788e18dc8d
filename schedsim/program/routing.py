"""Message identity and routing: the one home of the producer -> consumer rules of
pipeline training, shared by lowering, compile, the engine, analysis, replay and import.

An output is named by the key of the message that would carry it: ``("F", s, mb)`` is
stage s's activation output for microbatch mb, ``("B", s, mb)`` the gradient w.r.t. stage
s's input (made by its ``B`` or ``BW``).

- ``F(s, mb)`` needs ``("F", s-1, mb)`` (nothing for s = 0);
- ``B(s, mb)`` / ``BW(s, mb)`` need ``("B", s+1, mb)`` or, on the last stage, the loss,
  i.e. ``("F", S-1, mb)``; they also need their own activations ``("F", s, mb)``;
- ``W(s, mb)`` needs ``("B", s, mb)`` (its ``B``).

A need met on another stage is a message with the same key: ``("F", s, mb)`` is consumed by
stage s+1 and moves by ``SEND_F`` at s / ``RECV_F`` at s+1; ``("B", s, mb)`` is consumed by
stage s-1 and moves by ``SEND_B`` at s / ``RECV_B`` at s-1 (a comm op is named by the stage
that issues it, as torch writes it). Which *rank* sends and receives follows from the
placement (``rank_of(stage, mb)``): :func:`route`. Source: the standard pipeline dependency
graph, e.g. Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 2.

This module imports nothing of schedsim: ops are anything with ``kind``, ``stage`` and
``mb`` attributes.
"""
from __future__ import annotations

from typing import Any, Callable

Key = tuple[str, int, int]

#: message kinds, by code: activations ``F`` and input gradients ``B``, and the shape
#: messages that announce them (``FS``, ``BS``: Megatron-LM's ``_communicate_shapes`` under
#: ``variable_seq_lengths``, three int64, sent ahead of the tensor between the same ranks).
#: Bit 0 of the code is the direction: 0 downstream (to stage s+1), 1 upstream.
MESSAGE_KINDS = ("F", "B", "FS", "BS")
#: bytes of a shape message (``torch.int64`` x 3)
SHAPE_BYTES = 24.0

#: comm kind -> (message kind, side: 0 send / 1 recv, producing stage - issuing stage)
COMM_SIDES: dict[str, tuple[str, int, int]] = {
    "SEND_F": ("F", 0, 0), "RECV_F": ("F", 1, -1),
    "SEND_B": ("B", 0, 0), "RECV_B": ("B", 1, 1),
    "SEND_FS": ("FS", 0, 0), "RECV_FS": ("FS", 1, -1),
    "SEND_BS": ("BS", 0, 0), "RECV_BS": ("BS", 1, 1),
}


def is_shape(kind: str) -> bool:
    """Whether message kind ``kind`` is a shape message (``FS``/``BS``)."""
    return kind.endswith("S")


def message_key(comm_kind: str, stage: int, mb: int) -> Key:
    """Key of the message a comm op ``{stage}{comm_kind}{mb}`` moves."""
    kind, _, off = COMM_SIDES[comm_kind]
    return (kind, stage + off, mb)


def consumer_stage(key: Key) -> int:
    """Stage that receives output ``key`` from another stage (may be out of range)."""
    return key[1] + 1 if key[0][0] == "F" else key[1] - 1


def send_parts(key: Key) -> tuple[str, int, int]:
    """``(comm kind, issuing stage, mb)`` of the SEND the producer of ``key`` posts."""
    return ("SEND_" + key[0], key[1], key[2])


def recv_parts(key: Key) -> tuple[str, int, int]:
    """``(comm kind, issuing stage, mb)`` of the RECV the consumer of ``key`` posts."""
    return ("RECV_" + key[0], consumer_stage(key), key[2])


def route(key: Key, rank_of: Callable[[int, int], int]) -> tuple[int, int]:
    """``(sending rank, receiving rank)`` of message ``key`` under ``rank_of(stage, mb)``."""
    return rank_of(key[1], key[2]), rank_of(consumer_stage(key), key[2])


def needs(atom: Any, stages: int) -> list[Key]:
    """Outputs ``atom`` (a non-FB op) consumes; the first entry is the cross-stage input."""
    k, s, mb = atom.kind, atom.stage, atom.mb
    if k == "F":
        return [("F", s - 1, mb)] if s > 0 else []
    if k == "B" or k == "BW":
        if s == stages - 1:
            return [("F", s, mb)]
        return [("B", s + 1, mb), ("F", s, mb)]
    if k == "W":
        return [("B", s, mb)]
    raise ValueError(f"needs() takes a non-FB op, got {atom.kind}")


def produces(atom: Any) -> Key | None:
    """Output made by ``atom`` (a non-FB op), or None for ``W``."""
    k = atom.kind
    if k == "F":
        return ("F", atom.stage, atom.mb)
    if k == "B" or k == "BW":
        return ("B", atom.stage, atom.mb)
    return None


def producer_atoms(key: Key) -> tuple[Key, ...]:
    """``(kind, stage, mb)`` of the ops that may produce output ``key``: ``F`` for an
    activation; ``B`` or ``BW`` (whichever the schedule runs) for an input gradient."""
    kind, s, mb = key
    if kind == "F":
        return (("F", s, mb),)
    return (("B", s, mb), ("BW", s, mb))


def consumer_atoms(key: Key) -> tuple[Key, ...]:
    """``(kind, stage, mb)`` of the ops on the consumer stage that may take output
    ``key`` as their cross-stage input (the next stage's ``F``; the previous stage's
    ``B`` or ``BW``)."""
    kind, _, mb = key
    to = consumer_stage(key)
    if kind == "F":
        return (("F", to, mb),)
    return (("B", to, mb), ("BW", to, mb))


# -- array forms (numpy; for the flat program form, :mod:`schedsim.program.flat`) -------
# The same rules as above, over integer arrays: message kind k is MESSAGE_KINDS[k]; a comm
# kind code is 2 * message kind + side (0 send, 1 recv), as
# :class:`schedsim.program.flat.CommKind`; compute kind codes are
# :class:`schedsim.program.flat.OpKind` (F 0, B 1, W 2, BW 3).

def comm_message_arrays(ckind, cstage):
    """``(message kind, side, producing stage)`` of comm ops given as kind codes and
    issuing stages (the array form of :func:`message_key`)."""
    import numpy as np

    ck = np.asarray(ckind)
    mk = ck >> 1
    side = ck & 1
    # RECV_F (1), RECV_FS (5): -1; RECV_B (3), RECV_BS (7): +1; sends: 0
    return mk, side, np.asarray(cstage) + side * (2 * (mk & 1) - 1)


def consumer_stages(mkind, pstage):
    """Array form of :func:`consumer_stage`."""
    import numpy as np

    return np.asarray(pstage) + 1 - 2 * (np.asarray(mkind) & 1)


def cross_stage_inputs(kind, stage, stages: int):
    """``(message kind, producing stage)`` of each op's input from *another stage* (the
    first entry of :func:`needs`): ``F`` of stage s-1 for ``F`` (s > 0), ``B`` of stage
    s+1 for ``B``/``BW`` (s < stages-1); producing stage -1 where there is none (the first
    stage's F, the last stage's backward, W)."""
    import numpy as np

    k, s = np.asarray(kind), np.asarray(stage)
    is_f = k == 0
    is_b = (k == 1) | (k == 3)
    ps = np.where(is_f & (s > 0), s - 1, np.where(is_b & (s < stages - 1), s + 1, -1))
    return np.where(is_f, 0, 1), ps


def outputs(kind, stage):
    """``(message kind, stage)`` of the output each op makes (array form of
    :func:`produces`); stage -1 for ``W``, which makes none."""
    import numpy as np

    k, s = np.asarray(kind), np.asarray(stage)
    return np.where(k == 0, 0, 1), np.where(k == 2, -1, s)


def key_codes(mkind, pstage, mb, stages: int, microbatches: int):
    """A dense integer per message key ``(kind, producing stage, mb)``:
    ``(kind * stages + stage) * microbatches + mb`` (int64; the caller checks ranges)."""
    import numpy as np

    return ((np.asarray(mkind, dtype=np.int64) * stages + np.asarray(pstage)) * microbatches
            + np.asarray(mb))

"""Producer -> consumer rules of pipeline training, shared by lowering, engine and analysis.

An output is named by the key of the message that would carry it: ``("F", s, mb)`` is
stage s's activation output for microbatch mb, ``("B", s, mb)`` the gradient w.r.t. stage
s's input (made by its ``B`` or ``BW``).

- ``F(s, mb)`` needs ``("F", s-1, mb)`` (nothing for s = 0);
- ``B(s, mb)`` / ``BW(s, mb)`` need ``("B", s+1, mb)`` or, on the last stage, the loss,
  i.e. ``("F", S-1, mb)``; they also need their own activations ``("F", s, mb)``;
- ``W(s, mb)`` needs ``("B", s, mb)`` (its ``B``).

A need met on another rank is a message with the same key: ``("F", s, mb)`` goes by
SEND_F at s / RECV_F at s+1, ``("B", s, mb)`` by SEND_B at s / RECV_B at s-1. Source: the
standard pipeline dependency graph, e.g. Qi et al., "Zero Bubble Pipeline Parallelism"
(ICLR 2024), Section 2.
"""
from __future__ import annotations

from .ir import Comm, Op

Key = tuple[str, int, int]


def needs(atom: Op, stages: int) -> list[Key]:
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


def produces(atom: Op) -> Key | None:
    """Output made by ``atom`` (a non-FB op), or None for ``W``."""
    k = atom.kind
    if k == "F":
        return ("F", atom.stage, atom.mb)
    if k == "B" or k == "BW":
        return ("B", atom.stage, atom.mb)
    return None


def consumer_stage(key: Key) -> int:
    """Stage that receives output ``key`` from another stage (may be out of range)."""
    return key[1] + 1 if key[0] == "F" else key[1] - 1


def send_comm(key: Key) -> Comm:
    """The SEND the producer of ``key`` posts."""
    return Comm("SEND_F" if key[0] == "F" else "SEND_B", key[1], key[2])


def recv_comm(key: Key) -> Comm:
    """The RECV the consumer of ``key`` posts."""
    if key[0] == "F":
        return Comm("RECV_F", key[1] + 1, key[2])
    return Comm("RECV_B", key[1] - 1, key[2])

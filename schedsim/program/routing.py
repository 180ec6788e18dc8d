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

**Stage graphs beyond a chain.** A placement may add *skip edges* ``(p, c)``, ``c > p + 1``
(skip connections, encoder-decoder cross inputs; ``[stages] edges`` in a scenario): stage
c's forward also consumes stage p's activation, and stage p's backward the gradient that
c's backward makes for that input. Such a message's key names its consumer too:
``("F", p, mb, c)`` and ``("B", c, mb, p)`` (kind, producing stage, mb, consuming stage);
chain messages keep their three-field key. A comm op names the other stage of a skip
edge after its microbatch: ``0SEND_F0>2``, ``2RECV_F0<0``, ``2SEND_B0>0``, ``0RECV_B0<2``
(``peer`` below; None: the chain neighbour). The graph always holds the chain, so the
chain's order rules imply the skip edges' (stages are numbered in topological order).

This module imports nothing of schedsim: ops are anything with ``kind``, ``stage`` and
``mb`` attributes.
"""
from __future__ import annotations

from typing import Any, Callable

Key = tuple  # (kind, producing stage, mb) or, on a skip edge, (..., consuming stage)
#: skip edges (producing stage, consuming stage), c > p + 1, in sorted order
Skips = tuple[tuple[int, int], ...]

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


def message_key(comm_kind: str, stage: int, mb: int, peer: int | None = None) -> Key:
    """Key of the message a comm op ``{stage}{comm_kind}{mb}`` moves (``peer``: the other
    stage, given for a skip edge; a chain neighbour gives the chain key)."""
    kind, side, off = COMM_SIDES[comm_kind]
    if peer is None:
        return (kind, stage + off, mb)
    prod, cons = (stage, peer) if side == 0 else (peer, stage)
    if cons == (prod + 1 if kind[0] == "F" else prod - 1):
        return (kind, prod, mb)
    return (kind, prod, mb, cons)


def consumer_stage(key: Key) -> int:
    """Stage that receives output ``key`` from another stage (may be out of range)."""
    if len(key) == 4:
        return key[3]
    return key[1] + 1 if key[0][0] == "F" else key[1] - 1


def send_parts(key: Key) -> tuple[str, int, int, int | None]:
    """``(comm kind, issuing stage, mb, peer stage or None)`` of the SEND the producer of
    ``key`` posts."""
    return ("SEND_" + key[0], key[1], key[2], key[3] if len(key) == 4 else None)


def recv_parts(key: Key) -> tuple[str, int, int, int | None]:
    """``(comm kind, issuing stage, mb, peer stage or None)`` of the RECV the consumer of
    ``key`` posts."""
    return ("RECV_" + key[0], consumer_stage(key), key[2],
            key[1] if len(key) == 4 else None)


def check_skips(edges: list, stages: int) -> Skips:
    """The skip edges of a stage graph given as ``[[p, c], ...]`` (the chain's edges
    ``[s, s+1]`` may be listed and must all be there when any edge is): sorted, each
    ``0 <= p < c - 1 < stages - 1``. Raises ValueError naming the bad edge."""
    out = set()
    chain = set()
    for e in edges:
        if len(e) != 2 or not all(isinstance(x, int) for x in e):
            raise ValueError(f"edge {e!r}: expected [producer stage, consumer stage]")
        p, c = e
        if not (0 <= p < stages and 0 <= c < stages):
            raise ValueError(f"edge {list(e)}: stages run from 0 to {stages - 1}")
        if c <= p:
            raise ValueError(f"edge {list(e)}: an edge goes to a later stage (stages "
                             f"are numbered in topological order)")
        (chain if c == p + 1 else out).add((p, c))
    missing = [[s, s + 1] for s in range(stages - 1) if (s, s + 1) not in chain]
    if missing and edges:
        raise ValueError(f"the stage graph must hold the chain: add {missing[0]} (every "
                         f"[s, s+1]); extra edges are skip edges")
    return tuple(sorted(out))


def skip_needs(atom: Any, skips: Skips) -> list[Key]:
    """Skip-edge inputs of ``atom`` (a non-FB op): a forward's activations from earlier
    stages, a backward's gradients from later ones."""
    k, s, mb = atom.kind, atom.stage, atom.mb
    if k == "F":
        return [("F", p, mb, s) for p, c in skips if c == s]
    if k == "B" or k == "BW":
        return [("B", c, mb, s) for p, c in skips if p == s]
    return []


def skip_outputs(atom: Any, skips: Skips) -> list[Key]:
    """Skip-edge outputs of ``atom`` (a non-FB op)."""
    k, s, mb = atom.kind, atom.stage, atom.mb
    if k == "F":
        return [("F", s, mb, c) for p, c in skips if p == s]
    if k == "B" or k == "BW":
        return [("B", s, mb, p) for p, c in skips if c == s]
    return []


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
    kind, s, mb = key[:3]
    if kind == "F":
        return (("F", s, mb),)
    return (("B", s, mb), ("BW", s, mb))


def consumer_atoms(key: Key) -> tuple[Key, ...]:
    """``(kind, stage, mb)`` of the ops on the consumer stage that may take output
    ``key`` as their cross-stage input (the next stage's ``F``; the previous stage's
    ``B`` or ``BW``)."""
    kind, _, mb = key[:3]
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


#: skip-edge key codes start after every chain code of every message kind
SKIP_BASE = len(MESSAGE_KINDS)


def skip_code(edge: int, mkind, mb, stages: int, microbatches: int):
    """Key code of the message of skip edge number ``edge`` (its index in the sorted
    skips; kind 0 activation, 1 gradient): after every chain code, ``SKIP_BASE * stages *
    microbatches + (2 * edge + kind) * microbatches + mb``."""
    import numpy as np

    return (SKIP_BASE * stages * microbatches + (2 * np.asarray(edge, dtype=np.int64)
                                         + np.asarray(mkind)) * microbatches
            + np.asarray(mb))


def decode_codes(code, stages: int, microbatches: int, skips: Skips = ()):
    """``(message kind, producing stage, consuming stage, mb)`` of key codes (chain
    codes of :func:`key_codes`, skip codes of :func:`skip_code`)."""
    import numpy as np

    S, M = stages, microbatches
    c = np.asarray(code, dtype=np.int64)
    mk, ps, mb = c // (S * M), (c // M) % S, c % M
    cs = ps + 1 - 2 * (mk & 1)
    if skips:
        sk = c >= SKIP_BASE * S * M
        if sk.any():
            e = (c[sk] - SKIP_BASE * S * M) // M
            edge, kind = e // 2, e % 2
            sp = np.asarray([p for p, _ in skips], dtype=np.int64)[edge]
            sc = np.asarray([q for _, q in skips], dtype=np.int64)[edge]
            mk, ps, cs = mk.copy(), ps.copy(), cs.copy()
            mk[sk] = kind
            ps[sk] = np.where(kind == 0, sp, sc)
            cs[sk] = np.where(kind == 0, sc, sp)
    return mk, ps, cs, mb


def key_codes(mkind, pstage, mb, stages: int, microbatches: int, dtype: type | None = None):
    """A dense integer per message key ``(kind, producing stage, mb)``:
    ``(kind * stages + stage) * microbatches + mb`` (int64, or ``dtype`` when the caller
    knows the code space fits it; the caller checks ranges, and masks the entries out of
    range, whose codes may wrap)."""
    import numpy as np

    out = np.asarray(mkind, dtype=dtype or np.int64) * stages
    ps, mb = np.asarray(pstage), np.asarray(mb)
    if not (isinstance(out, np.ndarray) and out.shape == ps.shape == mb.shape):
        return (out + ps) * microbatches + mb
    out += ps              # in place: one array of the result's size, no temporaries
    out *= microbatches
    out += mb
    return out

"""Message identity: how the posts of a program pair up, and whether each pair agrees on
what it moves.

NCCL and gloo match point-to-point ops per directed link in posting order: the k-th send
src posts to dst pairs with the k-th recv dst posts from src, whatever message either
side meant (torch's ``batch_isend_irecv`` keeps the list order; NCCL orders a group's ops
per peer). Each post names its message's *identity*: a tag (``activation`` for
``SEND_F``/``RECV_F``, ``gradient`` for ``SEND_B``/``RECV_B``, or one given in the program
text, ``1SEND_B0:shape``) and its bytes (the cost model's ``bytes_of`` of the producing
stage, or ``@4MiB`` on the post). For every pair:

- bytes differ: an error naming both sides (gloo and NCCL's network transport fail with
  a truncation error; NCCL's intra-node transports do not check, and a hang or corrupt
  data follows);
- bytes equal, tags differ: a **silent swap** (Megatron-LM issue #750, fixed by
  Megatron-LM PR #5271: interleaved PP=2 posted the activation and the gradient to the
  same peer in crossed order): both complete and the data lands in the other tensor's
  buffer. A finding; the run goes on with the ops paired as the library pairs them;
- tags and bytes equal but the two sides name different messages (another microbatch or
  stage): the error of :func:`schedsim.sim.compile._check_matching`, as before;
- a post with no partner on its link (nccl#2130): never completes; see
  :func:`unmatched_text`.

Everything here is numpy over the flat program's members (:mod:`schedsim.program.flat`),
run only when a post names an identity or a link's order pairs different messages.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedsim.errors import ProgramError
from schedsim.program.flat import FlatProgram, Opcode
from schedsim.program.ops import COMM_KINDS, TAGS, format_bytes
from schedsim.program.routing import SHAPE_BYTES
from schedsim.sim.costs import CostModel
from schedsim.sim.prep import I64, Prep


def ordinal(k: int) -> str:
    """The ordinal of 0-based position ``k``: ``0`` -> ``1st``, ``10`` -> ``11th``
    (:func:`schedsim.util.text.ordinal` of ``k + 1``)."""
    from schedsim.util.text import ordinal as nth

    return nth(k + 1)


@dataclass
class Pairs:
    """The posts of a program paired per directed link in posting order (member indices
    of the flat program): pair p is send member ``js[p]`` with recv member ``jr[p]``,
    the ``k[p]``-th of each on link ``src[p] -> dst[p]``; ``unmatched``: launch members
    with no partner, in member order."""

    js: np.ndarray
    jr: np.ndarray
    k: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    unmatched: np.ndarray


def pair_members(fl: FlatProgram, pr: Prep) -> Pairs:
    """Pair every launched send with the recv the comm library matches it with (module
    docstring). The members must be valid (compile's pass checked them)."""
    code_of = np.repeat(fl.code, np.diff(fl.mptr))
    j = np.flatnonzero((code_of == Opcode.POST) | (code_of == Opcode.BATCH))
    side = pr.side[j].astype(I64)
    link = pr.msrc[j].astype(I64) * pr.P + pr.mdst[j]
    grp = link * 2 + side
    o = np.lexsort((j, grp))                     # by (link, side), posting order within
    g = grp[o]
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    k = np.arange(len(o)) - np.repeat(start, np.diff(np.r_[start, len(o)]))
    kk = np.empty(len(j), I64)
    kk[o] = k
    slot = link * (len(j) + 1) + kk              # (link, k): one send and one recv
    s_at = side == 0
    ss, rs = slot[s_at], slot[~s_at]
    sj, rj = j[s_at], j[~s_at]
    common, si, ri = np.intersect1d(ss, rs, assume_unique=True, return_indices=True)
    paired = np.zeros(len(fl.ckind), bool)
    js, jr = sj[si], rj[ri]
    paired[js] = True
    paired[jr] = True
    un = j[~paired[j]]
    order = np.argsort(js, kind="stable")
    js, jr = js[order], jr[order]
    return Pairs(js, jr, kk[np.searchsorted(j, js)], pr.msrc[js].astype(I64),
                 pr.mdst[js].astype(I64), un)


def default_bytes(costs: CostModel, mk: np.ndarray, ps: np.ndarray, stages: int
                  ) -> np.ndarray:
    """Bytes of messages that name none: ``costs.bytes_of`` of the producing stage, a
    shape message's ``SHAPE_BYTES`` (message kinds ``mk``, producing stages ``ps``)."""
    table = np.array([costs.bytes_of(s) for s in range(stages)], dtype=np.float64)
    nb = table[np.clip(ps, 0, max(stages - 1, 0))] if len(ps) else np.zeros(0)
    return np.where(np.asarray(mk) >= 2, SHAPE_BYTES, nb)


def member_identity(fl: FlatProgram, pr: Prep, costs: CostModel
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(tag code, bytes)`` of every member as its post names it, the defaults filled
    in: the message kind's tag (0 activation, 1 gradient, 2 shape for FS and BS;
    :func:`~schedsim.program.ops.default_tag`) and :func:`default_bytes`."""
    nb = default_bytes(costs, pr.mk, pr.ps, pr.S)
    tag = np.minimum(pr.mk.astype(I64), 2)
    if fl.ctag is not None:
        tag = np.where(fl.ctag >= 0, fl.ctag, tag)
        nb = np.where(fl.cbytes >= 0, fl.cbytes, nb)
    return tag, nb


def _member_text(fl: FlatProgram, j: int, tag: int, nbytes: float) -> str:
    tok = f"{int(fl.cstage[j])}{COMM_KINDS[int(fl.ckind[j])]}{int(fl.cmb[j])}"
    return f"{tok} ({TAGS[tag]}, {format_bytes(nbytes)})"


def member_at(fl: FlatProgram, j: int) -> tuple[int, int]:
    """``(rank, instruction index)`` of the instruction holding member ``j``."""
    gi = int(np.searchsorted(fl.mptr, j, side="right")) - 1
    r = int(np.searchsorted(fl.rptr, gi, side="right")) - 1
    return r, gi - int(fl.rptr[r])


def member_where(fl: FlatProgram, j: int) -> str:
    """Member ``j`` and where it is posted: ``0SEND_F0 (rank 0, instr 2)``, and when its
    instruction is a BATCH of several posts ``0SEND_F0 (rank 0, instr 2, in
    BATCH[0SEND_F0+0SEND_F1])`` (the batch's token alone would hide which member
    collided)."""
    r, i = member_at(fl, j)
    tok = fl.token(int(fl.rptr[r]) + i)
    if not tok.startswith("BATCH["):
        return f"{tok} (rank {r}, instr {i})"
    own = fl.comm_token(j) + (fl.member_suffixes()[j] if fl.ctag is not None else "")
    return f"{own} (rank {r}, instr {i}, in {tok})"


def check_pairs(fl: FlatProgram, pr: Prep, costs: CostModel, pairs: Pairs
                ) -> list[tuple[int, int, str]]:
    """Check that each pair agrees on bytes and tag (module docstring). Raises
    :class:`ProgramError` naming both sides of the first pair whose bytes differ;
    returns the silent-swap findings, ``(rank, instruction index, sentence)`` of the
    send side of each pair whose tags differ."""
    tag, nb = member_identity(fl, pr, costs)
    js, jr = pairs.js, pairs.jr
    bad = np.flatnonzero(nb[js] != nb[jr])
    if len(bad):
        p = int(bad[0])
        a, b = int(js[p]), int(jr[p])
        k, s, d = int(pairs.k[p]), int(pairs.src[p]), int(pairs.dst[p])
        raise ProgramError(
            f"size mismatch: the {ordinal(k)} send on link {s}->{d} is "
            f"{member_where(fl, a)} but the {ordinal(k)} recv is {member_where(fl, b)}: "
            f"{_member_text(fl, a, int(tag[a]), float(nb[a]))} against "
            f"{_member_text(fl, b, int(tag[b]), float(nb[b]))}; P2P ops match in posting "
            f"order per link and both sides must give the same size (gloo and NCCL's "
            f"network transport fail with a 'message truncated' error; NCCL's intra-node "
            f"transports do not check: a hang or corrupt data)")
    out = []
    for p in np.flatnonzero(tag[js] != tag[jr]).tolist():
        a, b = int(js[p]), int(jr[p])
        k, s, d = int(pairs.k[p]), int(pairs.src[p]), int(pairs.dst[p])
        rtok = f"{int(fl.cstage[b])}{COMM_KINDS[int(fl.ckind[b])]}{int(fl.cmb[b])}"
        out.append((*member_at(fl, a),
            f"silent swap: the {ordinal(k)} send on link {s}->{d} is {member_where(fl, a)} "
            f"but the {ordinal(k)} recv is {member_where(fl, b)}: "
            f"{_member_text(fl, a, int(tag[a]), float(nb[a]))} meets "
            f"{_member_text(fl, b, int(tag[b]), float(nb[b]))}, the same size, so NCCL and "
            f"gloo pair them without an error and the {TAGS[int(tag[a])]} lands in the "
            f"{TAGS[int(tag[b])]} buffer of {rtok} (Megatron-LM #750)"))
    return out


def swap_of(fl: FlatProgram, pr: Prep, pairs: Pairs, msg_of_member: np.ndarray
            ) -> np.ndarray | None:
    """The recv-handle permutation that makes message ids follow the library's pairing:
    ``perm[h]`` is the new id of handle h (sends keep theirs; the recv paired with the
    send of message a becomes ``2a + 1``), or None when every pair names one message.
    ``msg_of_member``: the message id compile gave each member."""
    ma, mb_ = msg_of_member[pairs.js], msg_of_member[pairs.jr]
    if np.array_equal(ma, mb_):
        return None
    perm = np.arange(2 * (int(msg_of_member.max(initial=-1)) + 1), dtype=I64)
    perm[2 * mb_ + 1] = 2 * ma + 1
    return perm


def unmatched_text(fl: FlatProgram, pr: Prep, j: int) -> str:
    """The sentence for an unmatched member ``j`` (module docstring)."""
    is_send = int(pr.side[j]) == 0
    other, orank = ("recv", int(pr.mdst[j])) if is_send else ("send", int(pr.msrc[j]))
    return (f"{member_where(fl, j)}: unmatched {'send' if is_send else 'recv'}: rank {orank} "
            f"never posts the matching {other}")

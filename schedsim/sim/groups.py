"""NCCL-like atomic groups (``CommModel.group_semantics = "atomic"``): the arrays the
engine needs to hold each ``BATCH`` of two or more ops until every member is matched, and
to complete its members together.

Source of the rule: NCCL runs the ops between ``ncclGroupStart``/``ncclGroupEnd`` (torch's
``batch_isend_irecv``) as one kernel; a matched send inside a group whose other member
has no partner is not delivered (NVIDIA/nccl#2130), where gloo delivers it; a batch of
recvs that mixes a skip-connection recv with a recv gated by another rank's compute holds
them all (pytorch/PiPPy#969).
"""
from __future__ import annotations

import numpy as np

from schedsim.program.flat import Opcode
from schedsim.sim.compiled import Compiled
from schedsim.sim.opcodes import Step

I64 = np.int64


def atomic_groups(cp: Compiled) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(hgroup, gptr, gh, matom)``: per handle its group (-1: none), group g's handles
    ``gh[gptr[g]:gptr[g+1]]`` (in launch order), and per message 1 if either side is in
    a group. A group is the handles of one ``BATCH`` launch step with two or more (a
    bare post, or a batch of one, is no group). Read from the current code, so after
    :func:`schedsim.sim.free.make_free` too."""
    nh = 2 * cp.num_messages
    hgroup = np.full(max(nh, 1), -1, I64)
    code = cp.code
    ns = len(code.cop)
    step_rank = cp.step_rank()
    gi = cp.flat.rptr[step_rank] + np.minimum(code.cipc, np.diff(cp.flat.rptr)[step_rank] - 1)
    cnt = np.diff(code.chptr)
    is_g = (code.cop == Step.LAUNCH) & (cnt >= 2)
    if ns and is_g.any():
        is_g &= cp.flat.code[np.maximum(gi, 0)] == Opcode.BATCH
    steps = np.flatnonzero(is_g)
    sizes = cnt[steps]
    gptr = np.zeros(len(steps) + 1, I64)
    np.cumsum(sizes, out=gptr[1:])
    lo = code.chptr[steps]
    idx = np.repeat(lo - gptr[:-1], sizes) + np.arange(int(gptr[-1]), dtype=I64)
    gh = code.ch[idx].astype(I64)
    hgroup[gh] = np.repeat(np.arange(len(steps), dtype=I64), sizes)
    matom = ((hgroup[0:nh:2] >= 0) | (hgroup[1:nh:2] >= 0)).astype(I64)
    return hgroup, gptr, gh, matom

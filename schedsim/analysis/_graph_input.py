"""What the dependency graph needs of a compiled program (:class:`GraphInput`), read
from core's step arrays (:class:`schedsim.sim.compiled.Compiled`) with numpy."""
from __future__ import annotations

import numpy as np

from schedsim.analysis._graph_edges import ID, GraphInput, NodeNumbering
from schedsim.sim.compiled import Compiled
from schedsim.sim.opcodes import Step


def _gather(steps: np.ndarray, ptr: np.ndarray, vals: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(step repeated per entry, entry)`` of the CSR rows ``vals[ptr[g]:ptr[g+1]]`` of
    ``steps``, in order."""
    lo = ptr[steps].astype(np.int64)
    lens = ptr[steps + 1].astype(np.int64) - lo
    tot = int(lens.sum())
    idx = np.repeat(lo - (np.cumsum(lens) - lens), lens) + np.arange(tot, dtype=np.int64)
    return np.repeat(steps, lens), np.asarray(vals, dtype=np.int64)[idx]


def _dedupe(rep: np.ndarray, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(rep[k], hs[k])`` with a repeated pair's first occurrence kept."""
    if len(hs):
        key = rep.astype(np.int64) * (int(hs.max()) + 1) + hs
        _, first = np.unique(key, return_index=True)
        if len(first) < len(key):
            keep = np.sort(first)
            rep, hs = rep[keep], hs[keep]
    return rep, hs


def graph_input(cp: Compiled) -> GraphInput:
    """What the graph needs of ``cp`` (see :class:`GraphInput`), read from its step
    arrays with numpy (no per-step Python objects): each compute step puts its ``S``
    and ``E`` nodes on its rank's host chain, each launch or wait one ``P``/``W`` node."""
    code, un, ms = cp.code, cp.units, cp.messages
    cop = np.asarray(code.cop)
    crptr = np.asarray(code.crptr, dtype=np.int64)
    G, R = len(cop), int(cp.ranks)
    comp = cop == Step.COMPUTE
    pw = np.flatnonzero(~comp)
    nsp = len(cp.span_gi)
    lay = NodeNumbering(nsp, cp.num_messages, len(un.unit_stream), len(pw))
    node = np.empty(G, dtype=np.int64)                   # S node of a compute, else P/W
    span = np.asarray(code.cspan, dtype=np.int64)
    node[comp] = lay.s0 + span[comp]
    node[pw] = lay.pw0 + np.arange(len(pw))
    rank = np.repeat(np.arange(R, dtype=np.int64), np.diff(crptr))
    cnt = comp.astype(np.int64) + 1                      # chain entries per step
    before = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(cnt, out=before[1:])
    pos = before[:-1] + rank + 1                         # after each rank's leading 0
    chain = np.zeros(G + len(comp.nonzero()[0]) + R, dtype=ID)
    chain[pos] = node
    cs = np.flatnonzero(comp)
    chain[pos[cs] + 1] = lay.e0 + span[cs]
    chptr, ch = np.asarray(code.chptr, dtype=np.int64), np.asarray(code.ch, dtype=np.int64)
    launch = cop[pw] == Step.LAUNCH
    first = np.full(len(pw), -1, dtype=np.int64)
    first[launch] = ch[chptr[pw[launch]]]
    pindex = np.asarray(code.cipc, dtype=np.int64)[pw]
    pindex[launch] = np.asarray(ms.hindex, dtype=np.int64)[first[launch]]
    pw_pair = np.full(len(pw), -1, dtype=np.int64)
    if cp.host.lazy_init:
        pw_pair[launch] = np.asarray(code.cinit, dtype=np.int64)[pw[launch]]
    cuptr = np.asarray(code.cuptr, dtype=np.int64)
    if not len(cuptr):          # no comm streams: no step has units
        cuptr = np.zeros(len(cop) + 1, dtype=np.int64)
    unit_p = np.full(lay.units, -1, dtype=ID)
    ls = pw[launch]
    ustep, units = _gather(ls, cuptr, np.arange(lay.units, dtype=np.int64))
    unit_p[units] = node[ustep]
    bare = ls[cuptr[ls + 1] == cuptr[ls]]
    act_s, act_h = _gather(bare, chptr, ch)
    wait_s, wait_h = _gather(pw[~launch], chptr, ch)
    out_s, out_h = _gather(cs, chptr, ch)
    uh = np.asarray(un.unit_hptr, dtype=np.int64)
    unit_rep = np.repeat(np.arange(lay.u0, lay.pw0, dtype=ID), np.diff(uh[:lay.units + 1]))
    init_pairs, pw_init = np.unique(pw_pair[pw_pair >= 0]), np.full(len(pw), -1)
    if len(init_pairs):
        pw_init[pw_pair >= 0] = np.searchsorted(init_pairs, pw_pair[pw_pair >= 0])
        lay = NodeNumbering(lay.spans, lay.messages, lay.units, lay.pws, len(init_pairs))
    fl = cp.flat
    sg = np.asarray(cp.span_gi, dtype=np.int64)
    span_ri = list(zip(fl.rank_of_instr()[sg].tolist(), fl.index_of_instr()[sg].tolist()))
    none = (np.zeros(0, dtype=ID), np.zeros(0, dtype=np.int64))
    return GraphInput(
        lay, cp.data_mode, cp.host.launch_cost, span_ri,
        cp.mkey, np.asarray(ms.msrc, dtype=np.int64), np.asarray(ms.mdst, dtype=np.int64),
        chain, first, rank[pw].astype(ID), pindex.astype(ID), (~launch).astype(np.int8),
        unit_p, np.asarray(un.unit_stream, dtype=np.int64),
        (unit_rep, np.asarray(un.unit_h, dtype=np.int64)[:uh[lay.units]]),
        (node[act_s].astype(ID), act_h), _dedupe(node[wait_s].astype(ID), wait_h), none,
        ((lay.e0 + span[out_s]).astype(ID), out_h),
        pw_init, init_pairs, float(cp.host.init_cost), int(cp.ranks))

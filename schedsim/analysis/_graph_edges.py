"""The edges of a run's dependency graph, as numpy arrays (see :mod:`.graph`).

Built from the compiled program (:mod:`schedsim.sim.compile`: its launches, comm-stream
units and waits are the one home of what a ``COMMIT`` or a stream means) and from the
timeline's durations. One Python pass over the compiled instructions records, per rank,
the chain of host events and, per launch and wait, the handles involved; every edge
family is then made with numpy, block by block:

1. ``transfer`` / ``deliver`` (per message), 2. ``link`` (FIFO per directed link),
3. ``host`` / ``compute`` (each rank's program order), 4. ``post`` (launch -> its
comm-stream units), 5. ``stream`` (the previous unit on a stream must complete),
6. ``post`` / ``recv-post`` (a launch or unit activates its handles), 7. ``wait``,
8. ``data`` (data semantics: inputs -> consumer, producer -> transfer).

Within a node's in-edges, the block order is the tie-break order the critical path uses
after ``host`` and ``compute`` edges.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain as _chain
from operator import attrgetter

import numpy as np

from schedsim.analysis._index import key_label
from schedsim.errors import ProgramError
from schedsim.sim.compile import Compiled
from schedsim.sim.costs import CommModel, LinkModel
from schedsim.timeline import Message, Span, Timeline

#: edge kinds (``Edges.kind`` holds the index)
EDGE_KINDS = ("host", "compute", "data", "post", "recv-post", "stream", "link",
              "transfer", "deliver", "wait")
HOST, COMPUTE, DATA, POST, RECV_POST, STREAM, LINK, TRANSFER, DELIVER, WAIT = range(10)


@dataclass(frozen=True)
class Layout:
    """Node numbering: 0 is time 0; then ``S`` and ``E`` per span id; ``T``, ``A``,
    ``DS``, ``DR`` per message id; ``U`` per comm-stream unit; then the launches (``P``)
    and waits (``W``) of every rank, in program order (``pw`` ids)."""

    spans: int
    messages: int
    units: int
    pws: int

    @property
    def s0(self) -> int:
        return 1

    @property
    def e0(self) -> int:
        return 1 + self.spans

    @property
    def t0(self) -> int:
        return 1 + 2 * self.spans

    @property
    def a0(self) -> int:
        return self.t0 + self.messages

    @property
    def ds0(self) -> int:
        return self.t0 + 2 * self.messages

    @property
    def dr0(self) -> int:
        return self.t0 + 3 * self.messages

    @property
    def u0(self) -> int:
        return self.t0 + 4 * self.messages

    @property
    def pw0(self) -> int:
        return self.u0 + self.units

    @property
    def n(self) -> int:
        return self.pw0 + self.pws

    def done(self, h: np.ndarray) -> np.ndarray:
        """Completion node of each handle (``DS`` for a send ``2m``, ``DR`` for a recv)."""
        return self.ds0 + (h & 1) * self.messages + (h >> 1)


@dataclass
class Edges:
    """The graph's edges in block order (see the module docstring) and what the nodes
    stand for. Arrays: ``src``, ``dst`` (int64), ``weight`` (float64, in the timeline's
    unit), ``kind`` (uint8, index into :data:`EDGE_KINDS`); ``pw_rank``/``pw_index``/
    ``pw_wait`` (per launch or wait: rank, instruction index, 1 for a wait)."""

    lay: Layout
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    kind: np.ndarray
    pw_rank: np.ndarray
    pw_index: np.ndarray
    pw_wait: np.ndarray
    span_of: list[Span]
    msg_of: list[Message]
    t_run: np.ndarray           # each node's time as the timeline records it (float64)


@dataclass
class _Scan:
    """What one pass over the compiled instructions records."""

    chain: list[int]            # per rank: 0, then each host event's node(s)
    pw_first: list[int]         # per launch its first handle, per wait -1
    pw_rank: list[int]
    pw_index: list[int]
    pw_wait: list[int]
    act_node: list[int]         # a launch without units activates its handles itself
    act_hs: list[tuple]
    unit_p: list[int]           # per unit: its launch's node
    wait_node: list[int]
    wait_hs: list[tuple]
    din_node: list[int]         # data semantics: a compute op's input handles
    din_hs: list[tuple]
    dout_node: list[int]        # data semantics: a compute op's output handles
    dout_hs: list[tuple]


def _scan(cp: Compiled, lay: Layout) -> _Scan:
    sc = _Scan([], [], [], [], [], [], [], [-1] * lay.units, [], [], [], [], [], [])
    ch = sc.chain.append
    s0, e0, nxt = lay.s0, lay.e0, lay.pw0
    hindex = cp.hindex
    for r, code in enumerate(cp.code):
        ch(0)
        for ins in code:
            op = ins[0]
            if op == 0:
                sid = ins[2]
                ch(s0 + sid)
                ch(e0 + sid)
                if ins[3]:
                    sc.din_node.append(s0 + sid)
                    sc.din_hs.append(ins[3])
                if ins[4]:
                    sc.dout_node.append(e0 + sid)
                    sc.dout_hs.append(ins[4])
                continue
            ch(nxt)
            sc.pw_rank.append(r)
            if op == 1:
                sc.pw_first.append(ins[1][0])
                sc.pw_index.append(hindex[ins[1][0]])
                sc.pw_wait.append(0)
                if ins[2]:
                    for u in ins[2]:
                        sc.unit_p[u] = nxt
                else:
                    sc.act_node.append(nxt)
                    sc.act_hs.append(ins[1])
            else:
                sc.pw_first.append(-1)
                sc.pw_index.append(ins[3])
                sc.pw_wait.append(1)
                sc.wait_node.append(nxt)
                sc.wait_hs.append(ins[1])
            nxt += 1
    return sc


def _expand(nodes: list[int], groups: list[tuple], dedupe: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(node repeated per handle, handle)`` for groups of handles (first occurrence
    of a repeated (node, handle) pair kept when ``dedupe``)."""
    lens = np.fromiter(map(len, groups), np.int64, len(groups))
    hs = np.fromiter(_chain.from_iterable(groups), np.int64, int(lens.sum()))
    rep = np.repeat(np.asarray(nodes, dtype=np.int64), lens)
    if dedupe and len(hs):
        key = rep * (int(hs.max()) + 1) + hs
        _, first = np.unique(key, return_index=True)
        if len(first) < len(key):
            keep = np.sort(first)
            rep, hs = rep[keep], hs[keep]
    return rep, hs


def _spans(tl: Timeline, cp: Compiled) -> tuple[list[Span], np.ndarray]:
    """The timeline span of each compiled span id and its duration."""
    want = [(r, i) for r, _, i in cp.span_meta]
    if [(s.rank, s.index) for s in tl.spans] == want:     # the simulator's own order
        out = list(tl.spans)
    else:
        by_instr = {(s.rank, s.index): s for s in tl.spans}
        out = []
        for r, i in want:
            s = by_instr.get((r, i))
            if s is None:
                raise ProgramError(f"the timeline has no span for rank {r} instr {i}: it "
                                   f"is not a run of this program")
            out.append(s)
    dur = np.array([s.end for s in out], dtype=np.float64)
    dur -= np.array([s.start for s in out], dtype=np.float64)
    return out, dur


def _messages(tl: Timeline, cp: Compiled, semantics: str) -> list[Message]:
    """The timeline message of each compiled message id."""
    if [(m.kind, m.stage, m.mb) for m in tl.messages] == cp.mkey:   # the simulator's order
        out = list(tl.messages)
    else:
        msgs = {(m.kind, m.stage, m.mb): m for m in tl.messages}
        out = [msgs.get(key) for key in cp.mkey]
    for key, m in zip(cp.mkey, out):
        if m is None or m.start is None or m.arrival is None:
            raise ProgramError(f"the timeline has no transfer of {key_label(key)}: it is "
                               f"not a run of this program under {semantics}")
    return out


def _eager(comm: CommModel, nbytes: np.ndarray) -> np.ndarray:
    """Which messages complete eagerly (:meth:`CommModel.is_eager` on the bytes the
    timeline recorded)."""
    if comm.semantics != "rendezvous":
        return np.ones(len(nbytes), dtype=bool)
    if comm.eager_threshold_bytes is None:
        return np.zeros(len(nbytes), dtype=bool)
    return nbytes <= comm.eager_threshold_bytes


def _message_blocks(cp: Compiled, lay: Layout, msgs: list[Message], link: LinkModel,
                    eager: np.ndarray):
    """Blocks 1 (transfer, deliver) and 2 (link FIFO): ``[(src, dst, weight, kind)]``."""
    n = lay.messages
    m = np.arange(n, dtype=np.int64)
    start, arr = _col(msgs, "start"), _col(msgs, "arrival")
    T, A, DS, DR = lay.t0 + m, lay.a0 + m, lay.ds0 + m, lay.dr0 + m
    zero = np.zeros(n)
    out = [(T, A, arr - start, TRANSFER)]
    if cp.data_mode:
        out.append((A, DR, zero, DELIVER))
    else:
        sd = _col(msgs, "send_done")
        sd = np.where(np.isnan(sd) | (sd == 0), start, sd)     # as ``send_done or start``
        e, r = eager, ~eager
        out += [(T[e], DS[e], (sd - start)[e], TRANSFER), (A[r], DS[r], zero[r], DELIVER),
                (A, DR, zero, DELIVER)]
    # link FIFO: transfers on one directed link in start order
    msrc = np.asarray(cp.msrc, dtype=np.int64)
    mdst = np.asarray(cp.mdst, dtype=np.int64)
    lk = msrc * (int(max(msrc.max(initial=0), mdst.max(initial=0))) + 1) + mdst
    o = np.lexsort((m, start, lk))
    same = lk[o][1:] == lk[o][:-1]
    a, b = o[:-1][same], o[1:][same]
    nbytes = _col(msgs, "bytes")
    _, first, inv = np.unique(lk, return_index=True, return_inverse=True)
    bw = np.array([link.params(int(msrc[k]), int(mdst[k]))[1] for k in first.tolist()],
                  dtype=np.float64)[inv.reshape(-1)]
    fin = np.isfinite(bw)
    occ = np.zeros(n)
    occ[fin] = nbytes[fin] / bw[fin]
    out.append((lay.t0 + a, lay.t0 + b, occ[a], LINK))
    return out


def _activations(lay: Layout, eager: np.ndarray, act: np.ndarray, hs: np.ndarray):
    """Block 6: what activating each handle starts (its transfer) or, for an eager
    recv, completes."""
    m = hs >> 1
    send = (hs & 1) == 0
    dst = np.where(send | ~eager[m], lay.t0 + m, lay.dr0 + m)
    kind = np.where(send, POST, RECV_POST)
    return act, dst, np.zeros(len(hs)), kind


def _rank_blocks(cp: Compiled, lay: Layout, sc: _Scan, dur: np.ndarray,
                 eager: np.ndarray):
    """Blocks 3-8 from the scan."""
    ch = np.asarray(sc.chain, dtype=np.int64)
    a, b = ch[:-1], ch[1:]
    keep = b != 0                      # a 0 starts the next rank's chain
    a, b = a[keep], b[keep]
    is_e = (b >= lay.e0) & (b < lay.t0)
    w = np.zeros(len(b))
    w[is_e] = dur[b[is_e] - lay.e0]
    if cp.launch_cost:
        pw = b >= lay.pw0
        launch = np.zeros(len(b), bool)
        launch[pw] = np.asarray(sc.pw_wait, dtype=np.int8)[b[pw] - lay.pw0] == 0
        w[launch] = cp.launch_cost
    out = [(a, b, w, np.where(is_e, COMPUTE, HOST))]
    # comm-stream units: posted by their launch, after the stream's previous unit
    if lay.units:
        u = np.arange(lay.units, dtype=np.int64)
        U = lay.u0 + u
        out.append((np.asarray(sc.unit_p, dtype=np.int64), U, np.zeros(lay.units), POST))
        stream = np.asarray(cp.unit_stream, dtype=np.int64)
        o = np.lexsort((u, stream))
        same = stream[o][1:] == stream[o][:-1]
        prev = np.full(lay.units, -1, dtype=np.int64)
        prev[o[1:][same]] = o[:-1][same]
        has = np.flatnonzero(prev >= 0)
        node, h = _expand((lay.u0 + has).tolist(),
                          [cp.unit_handles[p] for p in prev[has].tolist()])
        out.append((lay.done(h), node, np.zeros(len(h)), STREAM))
        node, h = _expand(U.tolist(), cp.unit_handles)
    else:
        node, h = _expand(sc.act_node, sc.act_hs)
    out.append(_activations(lay, eager, node, h))
    node, h = _expand(sc.wait_node, sc.wait_hs, dedupe=True)
    out.append((lay.done(h), node, np.zeros(len(h)), WAIT))
    node, h = _expand(sc.din_node, sc.din_hs, dedupe=True)
    out.append((lay.done(h), node, np.zeros(len(h)), DATA))
    node, h = _expand(sc.dout_node, sc.dout_hs)
    out.append((node, lay.t0 + (h >> 1), np.zeros(len(h)), DATA))
    return out


def build_edges(tl: Timeline, cp: Compiled, link: LinkModel, comm: CommModel) -> Edges:
    """Every edge of the run's dependency graph (module docstring). Raises
    :class:`ProgramError` when ``tl`` lacks a span or a transfer that ``cp`` runs."""
    span_of, dur = _spans(tl, cp)
    msg_of = _messages(tl, cp, comm.semantics)
    eager = _eager(comm, _col(msg_of, "bytes"))
    n_pw = sum(len(code) for code in cp.code) - len(cp.span_meta)
    lay = Layout(len(cp.span_meta), cp.num_messages, len(cp.unit_stream), n_pw)
    sc = _scan(cp, lay)
    blocks = (_message_blocks(cp, lay, msg_of, link, eager)
              + _rank_blocks(cp, lay, sc, dur, eager))
    src = np.concatenate([np.asarray(b[0], dtype=np.int64) for b in blocks])
    dst = np.concatenate([np.asarray(b[1], dtype=np.int64) for b in blocks])
    weight = np.concatenate([np.asarray(b[2], dtype=np.float64) for b in blocks])
    kind = np.concatenate([np.broadcast_to(np.asarray(b[3], dtype=np.uint8), len(b[0]))
                           for b in blocks])
    t_run = _run_times(tl, lay, sc, span_of, msg_of)
    u = (dst >= lay.u0) & (dst < lay.pw0)          # a unit starts when its preds allow
    np.maximum.at(t_run, dst[u], t_run[src[u]])
    return Edges(lay, src, dst, weight, kind, np.asarray(sc.pw_rank, dtype=np.int64),
                 np.asarray(sc.pw_index, dtype=np.int64),
                 np.asarray(sc.pw_wait, dtype=np.int8), span_of, msg_of, t_run)


def _col(msgs: list[Message], name: str) -> np.ndarray:
    """One time field of every message (float64; NaN where not recorded)."""
    get = attrgetter(name)
    return np.array([get(m) for m in msgs], dtype=np.float64)


def _run_times(tl: Timeline, lay: Layout, sc: _Scan, span_of: list[Span],
               msg_of: list[Message]) -> np.ndarray:
    """Each node's time as the run recorded it: spans, transfers, completions and posts
    from the timeline; a wait releases at its recorded end, or (it did not block) when
    the rank reached it; units are filled in by the caller. Used to order the nodes."""
    t = np.zeros(lay.n)
    t[lay.s0:lay.e0] = [s.start for s in span_of]
    t[lay.e0:lay.t0] = [s.end for s in span_of]
    n = lay.messages
    for k, name in enumerate(("start", "arrival", "send_done", "recv_done")):
        t[lay.t0 + k * n:lay.t0 + (k + 1) * n] = _col(msg_of, name)
    first = np.asarray(sc.pw_first, dtype=np.int64)
    launch = np.flatnonzero(first >= 0)
    if launch.size:
        posts = np.stack([_col(msg_of, "send_posted"), _col(msg_of, "recv_posted")])
        h = first[launch]
        t[lay.pw0 + launch] = posts[h & 1, h >> 1]
    # waits: recorded ones released at their end; the others when the rank reached them
    ends = {(w.rank, w.index): w.end for w in tl.waits}
    waits = np.flatnonzero(first < 0)
    rec = [ends.get(ri, float("nan")) for ri in zip(
        np.asarray(sc.pw_rank)[waits].tolist(), np.asarray(sc.pw_index)[waits].tolist())]
    t[lay.pw0 + waits] = rec
    ch = np.asarray(sc.chain, dtype=np.int64)
    tc = t[ch]
    pos = np.where(np.isnan(tc), 0, np.arange(len(ch)))
    np.maximum.accumulate(pos, out=pos)
    t[ch] = tc[pos]
    return np.nan_to_num(t, nan=0.0)

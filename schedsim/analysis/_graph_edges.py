"""The edges of a run's dependency graph, as numpy arrays (see :mod:`.graph`).

Built in two steps. :func:`~schedsim.analysis._graph_input.graph_input` reads the compiled
program's arrays
(:mod:`schedsim.sim.compile` is the one home of what a launch, a ``COMMIT`` or a comm
stream means) into flat arrays — per rank the chain of host events, per launch and wait
the handles involved — so that the compiled form can be freed. :func:`build_edges` then
makes every edge family with numpy, block by block, from those arrays and the timeline's
durations:

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
from operator import attrgetter

import numpy as np

from schedsim.analysis._index import key_label
from schedsim.errors import ProgramError
from schedsim.sim.costs import CommModel, LinkModel
from schedsim.timeline import Message, Span, Timeline

#: edge kinds (``Edges.kind`` holds the index)
EDGE_KINDS = ("host", "compute", "data", "post", "recv-post", "stream", "link",
              "transfer", "deliver", "wait", "init")
HOST, COMPUTE, DATA, POST, RECV_POST, STREAM, LINK, TRANSFER, DELIVER, WAIT, INIT = range(11)
#: node and edge ids (a graph holds far fewer than 2**31 nodes or edges)
ID = np.int32


@dataclass(frozen=True)
class NodeNumbering:
    """Node numbering: 0 is time 0; then ``S`` and ``E`` per span id; ``T``, ``A``,
    ``DS``, ``DR`` per message id; ``U`` per comm-stream unit; then the launches (``P``)
    and waits (``W``) of every rank, in program order (``pw`` ids); then, under lazy
    communicator init, one ``I`` per rank pair whose communicator a bare post creates."""

    spans: int
    messages: int
    units: int
    pws: int
    inits: int = 0

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
    def i0(self) -> int:
        return self.pw0 + self.pws

    @property
    def n(self) -> int:
        return self.pw0 + self.pws + self.inits

    def done(self, h: np.ndarray) -> np.ndarray:
        """Completion node of each handle (``DS`` for a send ``2m``, ``DR`` for a recv)."""
        return (self.ds0 + (h & 1) * self.messages + (h >> 1)).astype(ID)


@dataclass
class GraphInput:
    """What the graph needs of a compiled program, as flat arrays (int32 node ids,
    int64 handles). Pairs ``(node, handle)`` list, per launch without comm-stream units
    (``act``), per unit (``unit_act``), per wait (``wait``) and, under data semantics,
    per compute op (``din``: inputs, ``dout``: outputs), each handle involved."""

    lay: NodeNumbering
    data_mode: bool
    launch_cost: float
    span_ri: list[tuple[int, int]]       # (rank, instruction index) per span id
    mkey: list[tuple[str, int, int]]     # message key per message id
    msrc: np.ndarray
    mdst: np.ndarray
    chain: np.ndarray                    # per rank: 0, then its host events' nodes
    pw_first: np.ndarray                 # per launch its first handle, per wait -1
    pw_rank: np.ndarray
    pw_index: np.ndarray
    pw_wait: np.ndarray
    unit_p: np.ndarray                   # per unit: its launch's node
    unit_stream: np.ndarray
    unit_act: tuple[np.ndarray, np.ndarray]
    act: tuple[np.ndarray, np.ndarray]
    wait: tuple[np.ndarray, np.ndarray]
    din: tuple[np.ndarray, np.ndarray]
    dout: tuple[np.ndarray, np.ndarray]
    # lazy communicator init: per launch or wait its init node's index (-1: none), the
    # rank pair (a * ranks + b) of each init node, and the init's cost
    pw_init: np.ndarray | None = None
    init_pairs: np.ndarray | None = None
    init_cost: float = 0.0
    ranks: int = 0


@dataclass
class Edges:
    """The graph's edges in block order (see the module docstring) and what the nodes
    stand for. Arrays: ``src``, ``dst`` (int32), ``weight`` (float64, in the timeline's
    unit), ``kind`` (uint8, index into :data:`EDGE_KINDS`); ``pw_rank``/``pw_index``/
    ``pw_wait`` (per launch or wait: rank, instruction index, 1 for a wait); ``t_run``:
    each node's time as the run recorded it (float64, used to order the nodes)."""

    lay: NodeNumbering
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    kind: np.ndarray
    pw_rank: np.ndarray
    pw_index: np.ndarray
    pw_wait: np.ndarray
    span_of: list[Span]
    msg_of: list[Message]
    t_run: np.ndarray
    init_pairs: np.ndarray | None = None     # rank pair of each I node
    gi: GraphInput | None = None             # for naming comm-stream units
    ranks: int = 0


class _Columns:
    """Fields of a list of messages or spans as float64 arrays (NaN where not recorded),
    each extracted once."""

    def __init__(self, items: list) -> None:
        self.items = items
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._cache.get(name)
        if col is None:
            vals = list(map(attrgetter(name), self.items))
            try:
                col = np.fromiter(vals, np.float64, len(vals))
            except TypeError:                   # a None: not recorded
                col = np.array(vals, dtype=np.float64)
            self._cache[name] = col
        return col


def _spans(tl: Timeline, gi: GraphInput) -> list[Span]:
    """The timeline span of each span id."""
    if [(s.rank, s.index) for s in tl.spans] == gi.span_ri:   # the simulator's own order
        return list(tl.spans)
    by_instr = {(s.rank, s.index): s for s in tl.spans}
    out = []
    for r, i in gi.span_ri:
        s = by_instr.get((r, i))
        if s is None:
            raise ProgramError(f"the timeline has no span for rank {r} instr {i}: it is "
                               f"not a run of this program")
        out.append(s)
    return out


def _messages(tl: Timeline, gi: GraphInput, semantics: str) -> list[Message]:
    """The timeline message of each message id."""
    if [m.key for m in tl.messages] == gi.mkey:   # the simulator's order
        out = list(tl.messages)
    else:
        msgs = {m.key: m for m in tl.messages}
        out = [msgs.get(key) for key in gi.mkey]
    for key, m in zip(gi.mkey, out):
        if m is None or m.start is None or m.arrival is None:
            raise ProgramError(f"the timeline has no transfer of {key_label(key)}: it is "
                               f"not a run of this program under {semantics}")
    return out


def _message_blocks(gi: GraphInput, mc: _Columns, link: LinkModel,
                    eager: np.ndarray, measured: bool) -> list[tuple]:
    """Blocks 1 (transfer, deliver) and 2 (link FIFO): ``[(src, dst, weight, kind)]``.
    In a measured run a rendezvous sender may see its completion after the arrival:
    its deliver edge carries that lag."""
    lay = gi.lay
    n = lay.messages
    m = np.arange(n, dtype=ID)
    start, arr = mc["start"], mc["arrival"]
    T, A, DS, DR = lay.t0 + m, lay.a0 + m, lay.ds0 + m, lay.dr0 + m
    zero = np.zeros(n)
    out = [(T, A, arr - start, TRANSFER)]
    if gi.data_mode:
        out.append((A, DR, zero, DELIVER))
    else:
        sd = mc["send_done"]
        sd = np.where(np.isnan(sd) | (sd == 0), start, sd)     # as ``send_done or start``
        e, r = eager, ~eager
        lag = zero
        if measured:
            lag = np.nan_to_num(np.maximum(mc["send_done"] - arr, 0.0), nan=0.0)
        out += [(T[e], DS[e], (sd - start)[e], TRANSFER), (A[r], DS[r], lag[r], DELIVER),
                (A, DR, zero, DELIVER)]
    # link FIFO: transfers on one directed link in start order
    msrc, mdst = gi.msrc, gi.mdst
    lk = msrc * (int(max(msrc.max(initial=0), mdst.max(initial=0))) + 1) + mdst
    o = np.lexsort((m, start, lk))
    same = lk[o][1:] == lk[o][:-1]
    a, b = o[:-1][same], o[1:][same]
    nbytes = mc["bytes"]
    _, first, inv = np.unique(lk, return_index=True, return_inverse=True)
    bw = np.array([link.params(int(msrc[k]), int(mdst[k]))[1] for k in first.tolist()],
                  dtype=np.float64)[inv.reshape(-1)]
    fin = np.isfinite(bw)
    occ = np.zeros(n)
    occ[fin] = nbytes[fin] / bw[fin]
    out.append((lay.t0 + a, lay.t0 + b, occ[a], LINK))
    return out


def _activations(lay: NodeNumbering, eager: np.ndarray, act: np.ndarray, hs: np.ndarray):
    """Block 6: what activating each handle starts (its transfer) or, for an eager
    recv, completes."""
    m = hs >> 1
    send = (hs & 1) == 0
    dst = np.where(send | ~eager[m], lay.t0 + m, lay.dr0 + m)
    return act, dst, np.zeros(len(hs)), np.where(send, POST, RECV_POST)


def _stream_block(gi: GraphInput) -> tuple:
    """Block 5: a unit starts after every handle of the previous unit on its stream."""
    lay = gi.lay
    u = np.arange(lay.units, dtype=np.int64)
    o = np.lexsort((u, gi.unit_stream))
    same = gi.unit_stream[o][1:] == gi.unit_stream[o][:-1]
    prev = np.full(lay.units, -1, dtype=np.int64)
    prev[o[1:][same]] = o[:-1][same]
    unode, uh = gi.unit_act
    cnt = np.bincount(unode - lay.u0, minlength=lay.units)
    off = np.zeros(lay.units + 1, dtype=np.int64)
    np.cumsum(cnt, out=off[1:])
    has = np.flatnonzero(prev >= 0)
    p = prev[has]
    k = cnt[p]
    idx = np.repeat(off[p] - (np.cumsum(k) - k), k) + np.arange(int(k.sum()))
    return (lay.done(uh[idx]), np.repeat(lay.u0 + has, k).astype(ID),
            np.zeros(len(idx)), STREAM)


def _host_gaps(tl: Timeline, gi: GraphInput, sc: _Columns, a: np.ndarray,
               b: np.ndarray) -> np.ndarray:
    """A measured run's host time between consecutive instructions (launches,
    interpreter overhead, a late start): per host edge ``a -> b``, how long after ``a``
    let the host go (a compute's end, a launch's effective post, a wait's release) the
    host reached ``b`` (a compute's start, a launch's post, a wait); 0 where ``b``'s time
    is not recorded."""
    from schedsim.timeline import effective_posts

    lay = gi.lay
    free = np.zeros(lay.n)
    reach = np.full(lay.n, np.nan)
    free[lay.e0:lay.t0] = sc["end"]
    reach[lay.s0:lay.e0] = sc["start"]
    eff = effective_posts(tl.messages)
    waits = {(w.rank, w.index): w for w in tl.waits}
    nan = float("nan")
    for k, (first, r, i) in enumerate(zip(gi.pw_first.tolist(), gi.pw_rank.tolist(),
                                          gi.pw_index.tolist())):
        if first >= 0:
            t = eff.get((r, i))
            if t is not None:
                free[lay.pw0 + k] = reach[lay.pw0 + k] = t
        else:
            w = waits.get((r, i))
            free[lay.pw0 + k], reach[lay.pw0 + k] = (0.0, nan) if w is None else \
                (w.end, w.start)
    return np.nan_to_num(np.maximum(reach[b] - free[a], 0.0), nan=0.0)


def _rank_blocks(tl: Timeline, gi: GraphInput, sc: _Columns, eager: np.ndarray
                 ) -> list[tuple]:
    """Blocks 3-8 from the program's flat arrays."""
    lay, ch = gi.lay, gi.chain
    a, b = ch[:-1], ch[1:]
    keep = b != 0                      # a 0 starts the next rank's chain
    a, b = a[keep], b[keep]
    is_e = (b >= lay.e0) & (b < lay.t0)
    w = np.zeros(len(b))
    w[is_e] = (sc["end"] - sc["start"])[b[is_e] - lay.e0]
    if tl.source == "measured":
        host = ~is_e
        w[host] = _host_gaps(tl, gi, sc, a[host], b[host])
    elif gi.launch_cost:
        pw = b >= lay.pw0
        launch = np.zeros(len(b), bool)
        launch[pw] = gi.pw_wait[b[pw] - lay.pw0] == 0
        w[launch] = gi.launch_cost
    kinds = np.where(is_e, COMPUTE, HOST)
    if lay.inits:       # lazy init: the pair's two first bare posts meet at its I node
        pw = (b >= lay.pw0) & (b < lay.i0)
        ii = np.full(len(b), -1)
        ii[pw] = gi.pw_init[b[pw] - lay.pw0]
        at = ii >= 0
        inode = (lay.i0 + ii[at]).astype(ID)
        out = [(a[~at], b[~at], w[~at], kinds[~at]), (a[at], inode, np.zeros(at.sum()), INIT),
               (inode, b[at], w[at] + gi.init_cost, INIT)]
    else:
        out = [(a, b, w, kinds)]
    if lay.units:
        out.append((gi.unit_p, np.arange(lay.u0, lay.pw0, dtype=ID), np.zeros(lay.units),
                    POST))
        out.append(_stream_block(gi))
        out.append(_activations(lay, eager, *gi.unit_act))
    else:
        out.append(_activations(lay, eager, *gi.act))
    node, h = gi.wait
    out.append((lay.done(h), node, np.zeros(len(h)), WAIT))
    node, h = gi.din
    out.append((lay.done(h), node, np.zeros(len(h)), DATA))
    node, h = gi.dout
    out.append((node, lay.t0 + (h >> 1), np.zeros(len(h)), DATA))
    return out


def build_edges(tl: Timeline, gi: GraphInput, link: LinkModel, comm: CommModel) -> Edges:
    """Every edge of the run's dependency graph (module docstring). Raises
    :class:`ProgramError` when ``tl`` lacks a span or a transfer that the program runs."""
    span_of = _spans(tl, gi)
    sc = _Columns(span_of)
    msg_of = _messages(tl, gi, comm.semantics)
    mc = _Columns(msg_of)
    eager = comm.eager_messages(link, mc["bytes"], mc["src"].astype(np.int64),
                                 mc["dst"].astype(np.int64))
    blocks = (_message_blocks(gi, mc, link, eager, tl.source == "measured")
              + _rank_blocks(tl, gi, sc, eager))
    src = np.concatenate([np.asarray(b[0], dtype=ID) for b in blocks])
    dst = np.concatenate([np.asarray(b[1], dtype=ID) for b in blocks])
    weight = np.concatenate([np.asarray(b[2], dtype=np.float64) for b in blocks])
    kind = np.concatenate([np.broadcast_to(np.asarray(b[3], dtype=np.uint8), len(b[0]))
                           for b in blocks])
    del blocks
    t_run = _run_times(tl, gi, sc, mc)
    u = (dst >= gi.lay.u0) & (dst < gi.lay.pw0)        # a unit starts when its preds allow
    np.maximum.at(t_run, dst[u], t_run[src[u]])
    return Edges(gi.lay, src, dst, weight, kind, gi.pw_rank, gi.pw_index, gi.pw_wait,
                 span_of, msg_of, t_run, gi.init_pairs, gi if gi.lay.units else None,
                 gi.ranks)


def _run_times(tl: Timeline, gi: GraphInput, sc: _Columns, mc: _Columns) -> np.ndarray:
    """Each node's time as the run recorded it: spans, transfers, completions and posts
    from the timeline; a wait releases at its recorded end, or (it did not block) when
    the rank reached it; units are filled in by the caller. Used to order the nodes."""
    lay = gi.lay
    t = np.zeros(lay.n)
    t[lay.s0:lay.e0] = sc["start"]
    t[lay.e0:lay.t0] = sc["end"]
    n = lay.messages
    for k, name in enumerate(("start", "arrival", "send_done", "recv_done")):
        t[lay.t0 + k * n:lay.t0 + (k + 1) * n] = mc[name]
    launch = np.flatnonzero(gi.pw_first >= 0)
    if launch.size:
        posts = np.stack([mc["send_posted"], mc["recv_posted"]])
        h = gi.pw_first[launch]
        t[lay.pw0 + launch] = posts[h & 1, h >> 1]
    # waits: recorded ones released at their end; the others when the rank reached them
    ends = {(w.rank, w.index): w.end for w in tl.waits}
    waits = np.flatnonzero(gi.pw_first < 0)
    t[lay.pw0 + waits] = [ends.get(ri, float("nan")) for ri in zip(
        gi.pw_rank[waits].tolist(), gi.pw_index[waits].tolist())]
    if lay.inits:       # an init node: no later than the posts it releases
        k = np.flatnonzero(gi.pw_init >= 0)
        ti = np.full(lay.inits, np.inf)
        np.minimum.at(ti, gi.pw_init[k], np.nan_to_num(t[lay.pw0 + k], nan=np.inf))
        t[lay.i0:] = np.where(np.isinf(ti), 0.0, ti)
    tc = t[gi.chain]
    pos = np.where(np.isnan(tc), 0, np.arange(len(tc)))
    np.maximum.accumulate(pos, out=pos)
    t[gi.chain] = tc[pos]
    return np.nan_to_num(t, nan=0.0)

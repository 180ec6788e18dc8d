"""The dependency graph of one run: which event waited for which.

The simulator's model (DESIGN.md, "Comm semantics") is a max-plus system once the order
of every rank's program and of every link's transfers is fixed: each event happens at
the latest of its predecessors' times plus a delay. This module builds that system from
the program and the timeline as numpy arrays (nodes are integers, edges ``src``,
``dst``, ``weight``, ``kind``; :mod:`._graph_edges` makes them), so that the critical
path, slack and "which wait links X to Y" are questions over one topological order.

Nodes and their time (:meth:`DepGraph.node` names node ``i`` as a tuple):

- ``("S", r, i)`` / ``("E", r, i)``: start / end of the compute at instruction i of rank r;
- ``("P", r, i)``: the host has posted comm instruction i (after ``launch_cost``);
- ``("U", u)``: comm-stream unit u (a launch's ops for one stream) starts;
- ``("T", key)``, ``("A", key)``: transfer start and arrival of message ``key``;
- ``("DS", key)``, ``("DR", key)``: the send / recv side of the message completes;
- ``("W", r, i)``: the wait (``COMMIT``/``WAIT``/``DATA``, or ``END`` at i = program
  length) of rank r releases;
- ``("0",)``: time 0.

An edge ``u -> v`` with weight d means "v cannot happen before u + d"; its kind is
``host`` (program order), ``compute``, ``data`` (data semantics: producer -> transfer,
arrival -> consumer), ``post`` (a send's post starts its transfer), ``recv-post``,
``stream``, ``link`` (FIFO order on a directed link), ``transfer``, ``deliver`` and
``wait``. Node times are computed by one longest-path pass in topological order (Kahn's
algorithm over the arrays) and equal the timeline's (checked by the tests); slack uses
one backward pass over the same order (the critical-path method, Kelley & Walker, 1959).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cached_property

import numpy as np

from schedsim.analysis._graph_edges import COMPUTE, EDGE_KINDS, HOST, Edges, build_edges
from schedsim.analysis._index import EPS, fmt_t, key_label, span_token
from schedsim.errors import ProgramError
from schedsim.program.ir import Program
from schedsim.program.ops import format_instr
from schedsim.sim.compile import Compiled, compile_program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.timeline import Message, Span, Timeline

Node = tuple
_MSG_KINDS = ("T", "A", "DS", "DR")


def kahn_order(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """A topological order (int64 [n]) of the graph ``src -> dst`` by Kahn's algorithm
    in Python (the general fallback of :func:`run_order`). Raises
    :class:`ProgramError` if the graph has a cycle."""
    o = np.argsort(src, kind="stable")
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    indeg_np = np.bincount(dst, minlength=n)
    od, offs, indeg = dst[o].tolist(), off.tolist(), indeg_np.tolist()
    order = np.flatnonzero(indeg_np == 0).tolist()
    push = order.append
    for v in order:          # the list grows while it is walked
        for x in od[offs[v]:offs[v + 1]]:
            k = indeg[x] - 1
            indeg[x] = k
            if not k:
                push(x)
    if len(order) < n:
        raise _cycle()
    return np.array(order, dtype=np.int64)


def _cycle() -> ProgramError:
    return ProgramError("the dependency graph has a cycle: the run cannot be explained as "
                        "a max-plus system (was it simulated from this program?)")


def _level_depth(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Longest path in edges to every node of the DAG ``src -> dst`` (int64 [n]),
    computed generation by generation with numpy; None if it has a cycle."""
    depth = np.zeros(n, dtype=np.int64)
    if not len(src):
        return depth
    indeg = np.bincount(dst, minlength=n)
    o = np.argsort(src, kind="stable")
    od = dst[o]
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    front = np.flatnonzero((indeg == 0) & (off[1:] > off[:-1]))
    level, seen = 0, 0
    while front.size:
        a = off[front]
        cnt = off[front + 1] - a
        tot = int(cnt.sum())
        idx = np.repeat(a - (np.cumsum(cnt) - cnt), cnt) + np.arange(tot)
        d = od[idx]
        seen += tot
        level += 1
        if tot * 16 < n:
            d, k = np.unique(d, return_counts=True)
            indeg[d] -= k
            front = d[indeg[d] == 0]
        else:
            k = np.bincount(d, minlength=n)
            indeg -= k
            front = np.flatnonzero((k > 0) & (indeg == 0))
        depth[front] = level
    return depth if seen == len(src) else None


def run_order(t_run: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """A topological order from the times the run recorded (int64 [n]): by time, and
    among nodes at one time by the depth of their chain of same-time edges (computed
    with numpy, level by level). None when a recorded time contradicts an edge."""
    ts, td = t_run[src], t_run[dst]
    if (td < ts).any():
        return None
    eq = td == ts
    depth = _level_depth(len(t_run), src[eq], dst[eq])
    if depth is None:
        return None
    return np.lexsort((depth, t_run))


#: edges relaxed per chunk of Python lists (bounds the transient memory)
_CHUNK = 1 << 18


def relax(order: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray,
          init: np.ndarray, forward: bool = True) -> np.ndarray:
    """One longest-path pass over the edges in topological ``order`` (float64 [n]).

    Forward: ``x[dst] = max(x[dst], x[src] + weight)`` with the sources' values final
    (times, from ``init`` = 0). Backward: ``x[src] = max(x[src], x[dst] + weight)`` in
    reverse order (longest delay to a sink, from ``init``). Nodes are renumbered by
    their position in ``order`` so that the pass walks memory in order.
    """
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    ps, pd = pos[src], pos[dst]
    o = np.argsort(ps if forward else -ps, kind="stable")
    a, b = (ps[o], pd[o]) if forward else (pd[o], ps[o])
    w = weight[o]
    x = init[order].tolist()
    for k in range(0, len(o), _CHUNK):
        for u, v, d in zip(a[k:k + _CHUNK].tolist(), b[k:k + _CHUNK].tolist(),
                           w[k:k + _CHUNK].tolist()):
            y = x[u] + d
            if y > x[v]:
                x[v] = y
    out = np.empty(n)
    out[order] = x
    return out


class NodeTimes(Mapping):
    """``node tuple -> time`` for the nodes that have an edge (a read-only view)."""

    def __init__(self, G: "DepGraph") -> None:
        self._g = G

    def __getitem__(self, v: Node) -> float:
        i = self._g.node_id(v)
        if i is None:
            raise KeyError(v)
        return float(self._g.t[i])

    def __contains__(self, v: object) -> bool:
        return isinstance(v, tuple) and self._g.node_id(v) is not None

    def __iter__(self) -> Iterator[Node]:
        return (self._g.node(i) for i in np.flatnonzero(self._g.present).tolist())

    def __len__(self) -> int:
        return int(self._g.present.sum())


class DepGraph:
    """A run's dependency graph over integer nodes (module docstring).

    ``e``: the edges (:class:`~schedsim.analysis._graph_edges.Edges`); ``t``: node times
    (float64, the timeline's unit); ``order``: a topological order; ``present``: nodes
    that have an edge; ``time``: the same times by node tuple.
    """

    def __init__(self, e: Edges, tl: Timeline, program: Program, t: np.ndarray,
                 order: np.ndarray) -> None:
        self.e, self.lay, self.tl, self.program = e, e.lay, tl, program
        self.t, self.order = t, order
        self.present = np.zeros(e.lay.n, dtype=bool)
        self.present[e.src] = True
        self.present[e.dst] = True
        self.time = NodeTimes(self)

    # -- naming ---------------------------------------------------------------------------
    def kind(self, i: int) -> str:
        """``"0"``, ``"S"``, ``"E"``, ``"T"``, ``"A"``, ``"DS"``, ``"DR"``, ``"U"``, ``"P"``
        or ``"W"``."""
        lay = self.lay
        if i == 0:
            return "0"
        if i < lay.e0:
            return "S"
        if i < lay.t0:
            return "E"
        if i < lay.u0:
            return _MSG_KINDS[(i - lay.t0) // lay.messages]
        if i < lay.pw0:
            return "U"
        return "W" if self.e.pw_wait[i - lay.pw0] else "P"

    def span(self, i: int) -> Span:
        """The timeline span of an ``S`` or ``E`` node."""
        lay = self.lay
        return self.e.span_of[(i - lay.s0) if i < lay.e0 else (i - lay.e0)]

    def message(self, i: int) -> Message:
        """The timeline message of a ``T``, ``A``, ``DS`` or ``DR`` node."""
        return self.e.msg_of[(i - self.lay.t0) % self.lay.messages]

    def rank_index(self, i: int) -> tuple[int, int]:
        """``(rank, instruction index)`` of an ``S``, ``E``, ``P`` or ``W`` node."""
        if i >= self.lay.pw0:
            k = i - self.lay.pw0
            return int(self.e.pw_rank[k]), int(self.e.pw_index[k])
        s = self.span(i)
        return s.rank, s.index

    def node(self, i: int) -> Node:
        """The tuple naming node ``i`` (module docstring)."""
        k = self.kind(i)
        if k == "0":
            return ("0",)
        if k in _MSG_KINDS:
            m = self.message(i)
            return (k, (m.kind, m.stage, m.mb))
        if k == "U":
            return ("U", i - self.lay.u0)
        return (k, *self.rank_index(i))

    def node_id(self, v: Node) -> int | None:
        """The integer of node ``v``, or None when the graph has no such node."""
        k, lay = v[0], self.lay
        i: int | None = None
        if k == "0":
            i = 0
        elif k in ("S", "E"):
            sid = self._sid.get((v[1], v[2]))
            i = None if sid is None else (lay.s0 if k == "S" else lay.e0) + sid
        elif k in _MSG_KINDS:
            m = self._mid.get(v[1])
            i = None if m is None else lay.t0 + _MSG_KINDS.index(k) * lay.messages + m
        elif k == "U" and 0 <= v[1] < lay.units:
            i = lay.u0 + v[1]
        elif k in ("P", "W"):
            i = self._pwid.get((k, v[1], v[2]))
        return i if i is not None and self.present[i] else None

    @cached_property
    def _sid(self) -> dict[tuple[int, int], int]:
        return {(s.rank, s.index): k for k, s in enumerate(self.e.span_of)}

    @cached_property
    def _mid(self) -> dict[tuple[str, int, int], int]:
        return {(m.kind, m.stage, m.mb): k for k, m in enumerate(self.e.msg_of)}

    @cached_property
    def _pwid(self) -> dict[tuple[str, int, int], int]:
        e, p0 = self.e, self.lay.pw0
        return {("W" if w else "P", r, i): p0 + k for k, (r, i, w) in enumerate(
            zip(e.pw_rank.tolist(), e.pw_index.tolist(), e.pw_wait.tolist()))}

    # -- structure --------------------------------------------------------------------------
    @cached_property
    def _in(self) -> tuple[np.ndarray, np.ndarray]:
        """In-edges by node, host edges first, then compute, then in block order:
        ``(offsets [n+1], edge ids)``."""
        e = self.e
        cls = np.where(e.kind == HOST, 0, np.where(e.kind == COMPUTE, 1, 2))
        ids = np.argsort(e.dst * 3 + cls, kind="stable")
        off = np.zeros(self.lay.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(e.dst, minlength=self.lay.n), out=off[1:])
        return off, ids

    @cached_property
    def _tight_in(self) -> tuple[list[int], list[int]]:
        """The binding in-edges (``time(u) + weight == time(v)``) by node, in the order
        of :attr:`_in`: ``(offsets, source nodes)`` as lists."""
        e, t = self.e, self.t
        off, ids = self._in
        tight = (t[e.src] + e.weight >= t[e.dst] - EPS)[ids]
        ids = ids[tight]
        toff = np.zeros(self.lay.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(e.dst[ids], minlength=self.lay.n), out=toff[1:])
        return toff.tolist(), e.src[ids].tolist()

    def tight_preds(self, v: int) -> list[tuple[int, str]]:
        """Binding in-edges of node ``v`` as ``(source node, kind)``, host edges first."""
        off, ids = self._in
        e, t = self.e, self.t
        out = []
        for k in ids[off[v]:off[v + 1]].tolist():
            u = int(e.src[k])
            if t[u] + e.weight[k] >= t[v] - EPS:
                out.append((u, EDGE_KINDS[e.kind[k]]))
        return out

    def backtrack(self, v: int, stop: set[int] | None = None) -> list[int]:
        """Follow binding in-edges back from node ``v`` to time 0 (or a node of
        ``stop``); returns the chain in time order, ``v`` last."""
        off, src = self._tight_in
        chain = [v]
        seen = {v}
        while v != 0 and not (stop and v in stop):
            a = off[v]
            if a == off[v + 1]:
                break
            v = src[a]
            if v in seen:          # a zero-weight cycle cannot come from a run
                break
            seen.add(v)
            chain.append(v)
        return chain[::-1]

    def tight_path(self, sources: set[int], target: int) -> list[int] | None:
        """A chain of binding edges from any node of ``sources`` to ``target``, or None
        when no binding chain links them (breadth-first over tight in-edges, never
        before the earliest source)."""
        if target in sources:
            return [target]
        if not sources:
            return None
        t = self.t
        tmin = float(min(t[s] for s in sources)) - EPS   # times only fall going back
        off, src = self._tight_in
        tl_ = t.tolist()
        parent: dict[int, int] = {}
        seen = bytearray(self.lay.n)
        seen[target] = 1
        frontier = [target]
        while frontier:
            nxt = []
            for v in frontier:
                for u in src[off[v]:off[v + 1]]:
                    if seen[u] or tl_[u] < tmin:
                        continue
                    seen[u] = 1
                    parent[u] = v
                    if u in sources:
                        path = [u]
                        while path[-1] != target:
                            path.append(parent[path[-1]])
                        return path
                    nxt.append(u)
            frontier = nxt
        return None

    def tail_lengths(self) -> np.ndarray:
        """For every node, the longest delay from it to the end of any compute op
        (float64 [n]; -inf when no compute end follows it): one pass in reverse
        topological order."""
        lay, e = self.lay, self.e
        init = np.full(lay.n, float("-inf"))
        init[lay.e0:lay.t0] = 0.0
        return relax(self.order, e.src, e.dst, e.weight, init, forward=False)

    def last_end(self) -> int | None:
        """The ``E`` node that ends last (the later rank on ties, then the earlier op)."""
        lay = self.lay
        if not lay.spans:
            return None
        ends = self.t[lay.e0:lay.t0]
        ranks = np.fromiter((s.rank for s in self.e.span_of), np.int64, lay.spans)
        sid = np.arange(lay.spans)
        return lay.e0 + int(np.lexsort((-sid, ranks, ends))[-1])

    # -- rendering --------------------------------------------------------------------------
    def instr_token(self, r: int, i: int) -> str:
        """Program token of rank r's instruction i (``END`` past the last one)."""
        row = self.program.ranks[r]
        return "END" if i >= len(row) else format_instr(row[i])

    def describe(self, v: Node | int) -> str:
        """One line for a node: ``rank 5 starts 5B0 (instr 10) at 10``, ``rank 4 posts
        ...``."""
        i = v if isinstance(v, int) else self.node_id(v)
        if i is None:
            raise KeyError(v)
        k, t = self.kind(i), fmt_t(float(self.t[i]))
        if k in ("S", "E"):
            s = self.span(i)
            return (f"rank {s.rank} {'starts' if k == 'S' else 'ends'} {span_token(s)} "
                    f"(instr {s.index}) at {t}")
        if k in ("P", "W"):
            r, idx = self.rank_index(i)
            tok = self.instr_token(r, idx)
            return (f"rank {r} posts {tok} (instr {idx}) at {t}" if k == "P" else
                    f"rank {r} {tok} (instr {idx}) releases at {t}")
        if k == "U":
            return f"comm-stream batch {i - self.lay.u0} starts at {t}"
        if k in _MSG_KINDS:
            what = {"T": "transfer starts", "A": "arrives", "DS": "send completes",
                    "DR": "recv completes"}[k]
            m = self.message(i)
            return f"{key_label((m.kind, m.stage, m.mb))} ({m.src}->{m.dst}) {what} at {t}"
        return "time 0"

    def to_networkx(self):
        """The graph as a networkx ``DiGraph`` over node tuples with edge attributes
        ``weight`` and ``kind`` (for small graphs: drawing, ad-hoc questions)."""
        import networkx as nx

        g = nx.DiGraph()
        e = self.e
        for u, v, w, k in zip(e.src.tolist(), e.dst.tolist(), e.weight.tolist(),
                              e.kind.tolist()):
            g.add_edge(self.node(u), self.node(v), weight=w, kind=EDGE_KINDS[k])
        return g


def build_graph(tl: Timeline, program: Program, link: LinkModel | None = None,
                comm: CommModel | None = None, *, compiled: Compiled | None = None
                ) -> DepGraph:
    """Build the dependency graph of ``tl`` (a run of ``program``).

    ``link`` gives each transfer's link occupancy (for the FIFO order on a link; default:
    infinite bandwidth); ``comm`` defaults to the timeline's semantics and comm stream;
    ``compiled``: the program as the simulator compiled it under ``comm`` (compiled here
    when not given). Compute durations and transfer times come from the timeline.
    Raises :class:`~schedsim.errors.ProgramError` for a deadlocked timeline (its graph
    has a cycle) or a timeline that is not a run of ``program``.
    """
    if tl.deadlock is not None:
        raise ProgramError("the timeline ends in a deadlock: it has no critical path "
                           "(see the deadlock cycle instead)")
    comm = comm or CommModel(semantics=tl.semantics, comm_stream=tl.comm_stream)
    link = link or LinkModel()
    cp = compiled or compile_program(program, CostModel(), link, comm)
    e = build_edges(tl, cp, link, comm)
    del cp
    n = e.lay.n
    order = run_order(e.t_run, e.src, e.dst)
    if order is None:
        order = kahn_order(n, e.src, e.dst)
    t = relax(order, e.src, e.dst, e.weight, np.zeros(n))
    return DepGraph(e, tl, program, t, order)

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
For a measured timeline (a replay, an imported trace) the host edges carry the measured
host time between instructions (launches, interpreter overhead, a late start) and a
sender's completion its measured lag, so the recomputed times are the measured ones.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cached_property

import numpy as np

from schedsim.analysis._graph_edges import (
    COMPUTE,
    EDGE_KINDS,
    HOST,
    Edges,
    GraphInput,
    build_edges,
)
from schedsim.analysis._graph_input import graph_input
from schedsim.analysis._index import EPS, key_label, span_token
from schedsim.analysis._longest_path import _CHUNK, PassEdges, kahn_order, run_order
from schedsim.analysis._rows import instr_token
from schedsim.errors import ProgramError
from schedsim.program.ir import Program
from schedsim.sim.compile import compile_program
from schedsim.sim.compiled import Compiled
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.timeline import Message, Span, Timeline
from schedsim.util.units import fmt_time

Node = tuple
_MSG_KINDS = ("T", "A", "DS", "DR")


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
                 passes: PassEdges) -> None:
        self.e, self.lay, self.tl, self.program = e, e.lay, tl, program
        self.t, self.passes, self.order = t, passes, passes.order
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
        if i >= lay.i0:
            return "I"
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
            return (k, m.key)
        if k == "U":
            return ("U", i - self.lay.u0)
        if k == "I":
            return ("I", int(self.e.init_pairs[i - self.lay.i0]))
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
        elif k == "I" and lay.inits:
            hit = np.flatnonzero(self.e.init_pairs == v[1])
            i = lay.i0 + int(hit[0]) if len(hit) else None
        return i if i is not None and self.present[i] else None

    @cached_property
    def _sid(self) -> dict[tuple[int, int], int]:
        return {(s.rank, s.index): k for k, s in enumerate(self.e.span_of)}

    @cached_property
    def _mid(self) -> dict[tuple[str, int, int], int]:
        return {m.key: k for k, m in enumerate(self.e.msg_of)}

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
        cls = np.full(len(e.kind), 2, dtype=np.int32)     # int32 keys: less memory
        cls[e.kind == COMPUTE] = 1
        cls[e.kind == HOST] = 0
        cls += e.dst.astype(np.int32) * 3                 # nodes < 2**31 / 3
        ids = np.argsort(cls, kind="stable")
        del cls
        off = np.zeros(self.lay.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(e.dst, minlength=self.lay.n), out=off[1:])
        return off, ids

    @cached_property
    def _tight_in(self) -> tuple[np.ndarray, np.ndarray]:
        """The binding in-edges (``time(u) + weight == time(v)``) by node, in the order
        of :attr:`_in`: ``(offsets [n+1], source nodes)``."""
        e, t = self.e, self.t
        off, ids = self._in
        ids = ids[(t[e.src] + e.weight >= t[e.dst] - EPS)[ids]]
        toff = np.zeros(self.lay.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(e.dst[ids], minlength=self.lay.n), out=toff[1:])
        return toff, e.src[ids]

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
            v = int(src[a])
            if v in seen:          # a zero-weight cycle cannot come from a run
                break
            seen.add(v)
            chain.append(v)
        return chain[::-1]

    def tight_path(self, sources: set[int], target: int) -> list[int] | None:
        """A chain of binding edges from any node of ``sources`` to ``target``, or None
        when no binding chain links them: the shortest, breadth-first from ``target``
        over tight in-edges in :attr:`_in` order (the first source discovered wins; a
        node's parent is its first discoverer), one numpy step per level, among the
        nodes that a binding chain from the sources reaches (:meth:`reached_from`)."""
        if target in sources:
            return [target]
        if not sources:
            return None
        reach = self.reached_from(sources, target)
        if not reach[target]:
            return None
        off, src = self._tight_in
        n = self.lay.n
        is_source = np.zeros(n, dtype=bool)
        is_source[list(sources)] = True
        parent = np.full(n, -1, dtype=np.int64)
        seen = np.zeros(n, dtype=bool)
        seen[target] = True
        frontier = np.array([target], dtype=np.int64)
        while frontier.size:
            a = off[frontier]
            cnt = off[frontier + 1] - a
            idx = np.repeat(a - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
            u, v = src[idx], np.repeat(frontier, cnt)
            keep = reach[u] & ~seen[u]
            u, v = u[keep], v[keep]
            first = np.sort(np.unique(u, return_index=True)[1])
            u, v = u[first], v[first]
            seen[u] = True
            parent[u] = v
            hit = np.flatnonzero(is_source[u])
            if hit.size:
                path = [int(u[hit[0]])]
                while path[-1] != target:
                    path.append(int(parent[path[-1]]))
                return path
            frontier = u.astype(np.int64)
        return None

    def reached_from(self, sources: set[int], upto: int) -> np.ndarray:
        """By node (bool [n]), True if a chain of binding edges leads from a node of
        ``sources`` to it (nodes up to ``upto`` in topological order): one pass over the
        binding edges in topological order."""
        pe, t = self.passes, self.t
        pos = np.empty(self.lay.n, dtype=np.int64)
        pos[pe.order] = np.arange(self.lay.n)
        lo, hi = int(min(pos[s] for s in sources)), int(pos[upto])
        k0, k1 = np.searchsorted(pe.a, [lo, hi])
        a, b, w = pe.a[k0:k1], pe.b[k0:k1], pe.w[k0:k1]
        tp = t[pe.order]
        keep = tp[a] + w >= tp[b] - EPS
        r = bytearray(self.lay.n)
        for s in sources:
            r[pos[s]] = 1
        a, b = a[keep], b[keep]
        for k in range(0, len(a), _CHUNK):   # bounded lists (peak memory), in order
            for u, v in zip(a[k:k + _CHUNK].tolist(), b[k:k + _CHUNK].tolist()):
                if r[u]:
                    r[v] = 1
        return np.frombuffer(r, dtype=np.uint8)[pos].astype(bool)

    def tail_lengths(self) -> np.ndarray:
        """For every node, the longest delay from it to the end of any compute op
        (float64 [n]; -inf when no compute end follows it): one pass in reverse
        topological order."""
        lay = self.lay
        init = np.full(lay.n, float("-inf"))
        init[lay.e0:lay.t0] = 0.0
        return self.passes.backward(init)

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
        tok = instr_token(self.program, r, i)
        return "END" if tok is None else tok

    def describe(self, v: Node | int) -> str:
        """One line for a node: ``rank 5 starts 5B0 (instr 10) at 10``, ``rank 4 posts
        ...``."""
        i = v if isinstance(v, int) else self.node_id(v)
        if i is None:
            raise KeyError(v)
        k, t = self.kind(i), fmt_time(float(self.t[i]))
        if k in ("S", "E"):
            s = self.span(i)
            return (f"rank {s.rank} {'starts' if k == 'S' else 'ends'} {span_token(s)} "
                    f"(instr {s.index}) at {t}")
        if k in ("P", "W"):
            r, idx = self.rank_index(i)
            tok = self.instr_token(r, idx)
            return (f"rank {r} posts {tok} (instr {idx}) at {t}" if k == "P" else
                    f"rank {r} {tok} (instr {idx}) releases at {t}")
        if k == "U":      # the rank, its stream and the unit ahead of it (stall blame)
            return self.unit(i)[2]
        if k == "I":
            a, b = divmod(int(self.e.init_pairs[i - self.lay.i0]), self.e.ranks)
            return (f"ranks {a} and {b} both reach their first bare P2P with each other "
                    f"and create their communicator (lazy init), ready at {t}")
        if k in _MSG_KINDS:
            what = {"T": "transfer starts", "A": "arrives", "DS": "send completes",
                    "DR": "recv completes"}[k]
            m = self.message(i)
            return f"{key_label(m.key)} ({m.src}->{m.dst}) {what} at {t}"
        return "time 0"

    def unit(self, i: int) -> tuple[int, str, str]:
        """``(rank, tokens, sentence)`` of a ``U`` node
        (:func:`schedsim.analysis.blame.unit_text`)."""
        from schedsim.analysis.blame import unit_text
        from schedsim.program.ops import recv_comm, send_comm

        gi = self.e.gi
        nodes, hs = gi.unit_act

        def handles(u: int) -> list[int]:
            return hs[nodes == self.lay.u0 + u].tolist()

        def token(h: int) -> str:
            key = gi.mkey[h >> 1]
            return str(send_comm(key) if h & 1 == 0 else recv_comm(key))
        return unit_text(gi.ranks, gi.unit_stream, handles, token, i - self.lay.u0,
                         float(self.t[i]))

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
                comm: CommModel | None = None, *,
                compiled: Compiled | GraphInput | None = None) -> DepGraph:
    """Build the dependency graph of ``tl`` (a run of ``program``).

    ``link`` gives each transfer's link occupancy (for the FIFO order on a link; default:
    infinite bandwidth); ``comm`` defaults to the timeline's semantics and comm stream;
    ``compiled``: the program as the simulator compiled it under ``comm``, or its
    :func:`~schedsim.analysis._graph_input.graph_input` (compiled here when not given).
    Compute durations and transfer times come from the timeline.
    Raises :class:`~schedsim.errors.ProgramError` for a deadlocked timeline (its graph
    has a cycle) or a timeline that is not a run of ``program``.
    """
    if tl.deadlock is not None:
        raise ProgramError("the timeline ends in a deadlock: it has no critical path "
                           "(see the deadlock cycle instead)")
    comm = comm or CommModel(semantics=tl.semantics, comm_stream=tl.comm_stream)
    link = link or LinkModel()
    if not isinstance(compiled, GraphInput):
        compiled = graph_input(compiled or compile_program(program, CostModel(), link, comm))
    e = build_edges(tl, compiled, link, comm)
    order = run_order(e.t_run, e.src, e.dst)
    e.t_run = None
    if order is None:
        order = kahn_order(e.lay.n, e.src, e.dst)
    passes = PassEdges.of(order, e.src, e.dst, e.weight)
    return DepGraph(e, tl, program, passes.forward(np.zeros(e.lay.n)), passes)

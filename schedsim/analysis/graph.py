"""The dependency graph of one run: which event waited for which.

The simulator's model (DESIGN.md, "Comm semantics") is a max-plus system once the order
of every rank's program and of every link's transfers is fixed: each event happens at
the latest of its predecessors' times plus a delay. This module builds that system as a
networkx ``DiGraph`` from the program and the timeline, so that the critical path, slack
and "which wait links X to Y" are graph questions.

Nodes (tuples) and their time:

- ``("S", r, i)`` / ``("E", r, i)``: start / end of the compute at instruction i of rank r;
- ``("P", r, i)``: the host posts comm instruction i (posting does not block);
- ``("U", u)``: comm-stream unit u (a batch's ops for one stream) starts;
- ``("T", key)``, ``("A", key)``: transfer start and arrival of message ``key``;
- ``("DS", key)``, ``("DR", key)``: the send / recv side of the message completes;
- ``("W", r, i)``: the wait (``COMMIT``/``WAIT``, or ``END`` at i = program length) of rank
  r releases;
- ``("0",)``: time 0.

An edge ``u -> v`` with ``weight`` d means "v cannot happen before u + d"; its ``kind`` is
``host`` (program order), ``compute``, ``data`` (data semantics: producer -> transfer,
arrival -> consumer), ``post`` (a send's post starts its transfer), ``recv-post``, ``stream``, ``link``
(FIFO order on a directed link), ``transfer``, ``deliver`` and ``wait``. Node times are
recomputed by longest-path propagation and equal the timeline's (checked by the tests).
For a measured timeline (a replay, an imported trace) the host edges carry the measured
host time between instructions (launches, interpreter overhead, a late start) and a
sender's completion its measured lag, so the recomputed times are the measured ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from schedsim.analysis._index import EPS, TimelineIndex, fmt_t, key_label, span_token
from schedsim.errors import ProgramError
from schedsim.program.ir import Program
from schedsim.program.tokens import format_instr
from schedsim.sim.compile import Compiled, compile_program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.timeline import Timeline

Node = tuple


@dataclass
class DepGraph:
    """A run's dependency graph: ``g`` (networkx DiGraph) plus node ``time``."""

    g: nx.DiGraph
    time: dict[Node, float]
    tl: Timeline
    program: Program
    cp: Compiled
    order: list[Node]

    # -- structure ----------------------------------------------------------------------
    def tight_preds(self, v: Node) -> list[tuple[Node, dict]]:
        """In-edges of ``v`` that bind: ``time(u) + weight == time(v)`` (host edges first)."""
        tv = self.time[v]
        time = self.time
        out = [(u, d) for u, d in self.g.pred[v].items()
               if time[u] + d["weight"] >= tv - EPS]
        if len(out) > 1:
            out.sort(key=lambda e: (e[1]["kind"] != "host", e[1]["kind"] != "compute"))
        return out

    def backtrack(self, v: Node, stop: set[Node] | None = None) -> list[Node]:
        """Follow binding in-edges back from ``v`` to time 0 (or a node of ``stop``);
        returns the chain in time order, ``v`` last."""
        chain = [v]
        while v != ("0",) and not (stop and v in stop):
            preds = self.tight_preds(v)
            if not preds:
                break
            v = preds[0][0]
            chain.append(v)
        return chain[::-1]

    def tight_path(self, sources: set[Node], target: Node) -> list[Node] | None:
        """A chain of binding edges from any node of ``sources`` to ``target``, or None
        when no binding chain links them (breadth-first over tight in-edges)."""
        if target in sources:
            return [target]
        if not sources:
            return None
        tmin = min(self.time[s] for s in sources) - EPS   # times only fall going back
        parent: dict[Node, Node] = {}
        frontier = [target]
        seen = {target}
        while frontier:
            nxt = []
            for v in frontier:
                for u, _ in self.tight_preds(v):
                    if u in seen or self.time[u] < tmin:
                        continue
                    seen.add(u)
                    parent[u] = v
                    if u in sources:
                        path = [u]
                        while path[-1] != target:
                            path.append(parent[path[-1]])
                        return path
                    nxt.append(u)
            frontier = nxt
        return None

    def tail_lengths(self) -> dict[Node, float]:
        """For every node, the longest delay from it to the end of any compute op
        (-inf when no compute end follows it)."""
        L: dict[Node, float] = {}
        succ = self.g.succ
        for v in reversed(self.order):
            best = 0.0 if v[0] == "E" else float("-inf")
            for w, d in succ[v].items():
                x = L[w] + d["weight"]
                if x > best:
                    best = x
            L[v] = best
        return L

    # -- rendering ----------------------------------------------------------------------
    def describe(self, v: Node) -> str:
        """One line for a node: ``rank 5 runs 5B0 [10, 11]``, ``rank 4 posts ...``."""
        t = fmt_t(self.time.get(v))
        k = v[0]
        if k in ("S", "E"):
            s = self.idx.by_instr[(v[1], v[2])]
            return (f"rank {v[1]} {'starts' if k == 'S' else 'ends'} {span_token(s)} "
                    f"(instr {v[2]}) at {t}")
        if k == "P":
            return f"rank {v[1]} posts {format_instr(self.program.ranks[v[1]][v[2]])} " \
                   f"(instr {v[2]}) at {t}"
        if k == "W":
            row = self.program.ranks[v[1]]
            tok = "END" if v[2] >= len(row) else format_instr(row[v[2]])
            return f"rank {v[1]} {tok} (instr {v[2]}) releases at {t}"
        if k == "U":
            return f"comm-stream batch {v[1]} starts at {t}"
        if k in ("T", "A", "DS", "DR"):
            what = {"T": "transfer starts", "A": "arrives", "DS": "send completes",
                    "DR": "recv completes"}[k]
            m = self.idx.msgs.get(v[1])
            where = f" ({m.src}->{m.dst})" if m is not None else ""
            return f"{key_label(v[1])}{where} {what} at {t}"
        return "time 0"

    @property
    def idx(self) -> TimelineIndex:
        """Lookup tables over the timeline (built once)."""
        if getattr(self, "_idx", None) is None:
            self._idx = TimelineIndex(self.tl)
        return self._idx


def build_graph(tl: Timeline, program: Program, link: LinkModel | None = None,
                comm: CommModel | None = None) -> DepGraph:
    """Build the dependency graph of ``tl`` (a run of ``program``).

    ``link`` gives each transfer's link occupancy (for the FIFO order on a link; default:
    infinite bandwidth); ``comm`` defaults to the timeline's semantics and comm stream.
    Compute durations and transfer times come from the timeline.
    Raises :class:`~schedsim.errors.ProgramError` for a deadlocked timeline (its graph
    has a cycle) or a timeline that is not a run of ``program``.
    """
    if tl.deadlock is not None:
        raise ProgramError("the timeline ends in a deadlock: it has no critical path "
                           "(see the deadlock cycle instead)")
    comm = comm or CommModel(semantics=tl.semantics, comm_stream=tl.comm_stream)
    cp = compile_program(program, CostModel(), link or LinkModel(), comm)
    idx = TimelineIndex(tl)
    edges: dict[tuple[Node, Node], tuple[float, str]] = {}
    key_of = cp.mkey

    def edge(u: Node, v: Node, w: float, kind: str) -> None:
        d = edges.get((u, v))
        if d is None or d[0] < w:
            edges[(u, v)] = (w, kind)

    def done(h: int) -> Node:
        return ("DS" if h & 1 == 0 else "DR", key_of[h >> 1])

    msgs = idx.msgs
    meas = _MeasuredHost(tl, idx) if tl.source == "measured" else None
    for m, key in enumerate(key_of):
        msg = msgs.get(key)
        if msg is None or msg.start is None or msg.arrival is None:
            raise ProgramError(f"the timeline has no transfer of {key_label(key)}: it is "
                               f"not a run of this program under {comm.semantics}")
        edge(("T", key), ("A", key), msg.arrival - msg.start, "transfer")
        if cp.data_mode:
            edge(("A", key), ("DR", key), 0.0, "deliver")
        elif cp.meager[m]:
            edge(("T", key), ("DS", key), (msg.send_done or msg.start) - msg.start,
                 "transfer")
            edge(("A", key), ("DR", key), 0.0, "deliver")
        else:
            lag = 0.0       # a measured sender saw its completion this much later
            if meas is not None and msg.send_done is not None:
                lag = max(msg.send_done - msg.arrival, 0.0)
            edge(("A", key), ("DS", key), lag, "deliver")
            edge(("A", key), ("DR", key), 0.0, "deliver")
    # link FIFO: transfers on one directed link in start order
    by_link: dict[tuple[int, int], list[int]] = {}
    for m, key in enumerate(key_of):
        by_link.setdefault((cp.msrc[m], cp.mdst[m]), []).append(m)
    link = link or LinkModel()
    for (src, dst), ms in by_link.items():
        bw = link.params(src, dst)[1]
        ms.sort(key=lambda m: (msgs[key_of[m]].start, m))
        for a, b in zip(ms, ms[1:]):
            occ = msgs[key_of[a]].bytes / bw if math.isfinite(bw) else 0.0
            edge(("T", key_of[a]), ("T", key_of[b]), occ, "link")
    # per-rank host chains
    stream_last: dict[int, int] = {}
    for r, code in enumerate(cp.code):
        prev: Node = ("0",)
        for ins in code:
            op = ins[0]
            if op == 0:
                _, _, sid, rh, sh = ins
                i = cp.span_meta[sid][2]
                s = idx.by_instr.get((r, i))
                if s is None:
                    raise ProgramError(f"the timeline has no span for rank {r} instr {i}: "
                                       f"it is not a run of this program")
                S, E = ("S", r, i), ("E", r, i)
                edge(prev, S, meas.gap(prev, s.start) if meas else 0.0, "host")
                for h in rh:
                    edge(done(h), S, 0.0, "data")
                edge(S, E, s.end - s.start, "compute")
                for h in sh:
                    edge(E, ("T", key_of[h >> 1]), 0.0, "data")
                prev = E
            elif op == 1:
                hs, units = ins[1], ins[2]
                P = ("P", r, cp.hindex[hs[0]])     # one launch: a bare post or a BATCH
                edge(prev, P, meas.gap(prev, meas.post(P)) if meas else 0.0, "host")
                prev = P
                if units:
                    for u in units:
                        U = ("U", u)
                        edge(prev, U, 0.0, "post")
                        sid_ = cp.unit_stream[u]
                        pu = stream_last.get(sid_)
                        if pu is not None:
                            for h2 in cp.unit_handles[pu]:
                                edge(done(h2), U, 0.0, "stream")
                        stream_last[sid_] = u
                        for h in cp.unit_handles[u]:
                            _activate(edge, cp, h, U, done)
                else:
                    for h in hs:
                        _activate(edge, cp, h, P, done)
            else:
                W = ("W", r, ins[3])
                edge(prev, W, meas.gap(prev, meas.reach(W)) if meas else 0.0, "host")
                for h in ins[1]:
                    edge(done(h), W, 0.0, "wait")
                prev = W
    g = nx.DiGraph()
    g.add_edges_from((u, v, {"weight": w, "kind": k}) for (u, v), (w, k) in edges.items())
    try:
        order = list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        raise ProgramError("the dependency graph has a cycle: the run cannot be explained "
                           "as a max-plus system (was it simulated from this program?)"
                           ) from None
    time: dict[Node, float] = {}
    pred = g.pred
    for v in order:
        best = 0.0
        for u, d in pred[v].items():
            x = time[u] + d["weight"]
            if x > best:
                best = x
        time[v] = best
    G = DepGraph(g, time, tl, program, cp, order)
    G._idx = idx
    return G


class _MeasuredHost:
    """Measured host times of a measured timeline's nodes, so that the graph's host edges
    carry the gaps the host really spent (launches, interpreter overhead, a late start)
    and its node times reproduce the measurement: the time a node let the host go (a
    compute's end, a launch's post, a wait's release) and the time the host reached a
    post or a wait."""

    def __init__(self, tl: Timeline, idx: TimelineIndex) -> None:
        from schedsim.timeline import effective_posts

        self.free: dict[Node, float] = {}
        self.posted = effective_posts(tl.messages)
        self.waits = {(w.rank, w.index): w for w in tl.waits}
        for (r, i), sp in idx.by_instr.items():
            self.free[("E", r, i)] = sp.end

    def gap(self, prev: Node, t: float | None) -> float:
        if t is None:
            return 0.0
        return max(t - self.free.get(prev, 0.0), 0.0)

    def post(self, P: Node) -> float | None:
        t = self.posted.get((P[1], P[2]))
        if t is not None:
            self.free[P] = t
        return t

    def reach(self, W: Node) -> float | None:
        w = self.waits.get((W[1], W[2]))
        if w is None:
            return None
        self.free[W] = w.end
        return w.start


def _activate(edge, cp: Compiled, h: int, act: Node, done) -> None:
    """Edges from a handle's activation node to what it starts or completes."""
    m = h >> 1
    key = cp.mkey[m]
    T = ("T", key)
    if h & 1 == 0:
        edge(act, T, 0.0, "post")
    elif cp.meager[m]:
        edge(act, ("DR", key), 0.0, "recv-post")
    else:
        edge(act, T, 0.0, "recv-post")

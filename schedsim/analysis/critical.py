"""Critical path and slack over a run's dependency graph (:mod:`.graph`).

The critical path is the chain of binding dependencies that ends at the op that ends last
(the makespan): walking back from it, each step takes the predecessor whose time plus
delay equals the node's time (program order first on ties, so a run of back-to-back ops on
one rank stays on that rank until the rank had to wait for a message). Slack of an op is
how long its start could slip, with every order fixed, before the makespan moves:
``makespan - start - (longest delay from its start to the end of any op)`` — the classic
critical-path-method total float (Kelley & Walker, 1959), computed over the max-plus
graph with networkx's topological order.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from schedsim.analysis._index import EPS, fmt_t, key_label, span_token
from schedsim.analysis.graph import DepGraph, Node


@dataclass
class Step:
    """One link of a chain: an op (``kind="op"``), a message, a post or a wait."""

    kind: str            # op | message | post | wait | stream | init
    rank: int | None
    index: int | None    # instruction index (ops, posts, waits)
    what: str            # token or message label
    start: float
    end: float
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def condense(G: DepGraph, nodes: list[Node]) -> list[Step]:
    """Turn a node chain into readable steps: an op's S and E become one step, a
    message's transfer/arrival/completion nodes become one step."""
    steps: list[Step] = []
    tl_idx = G.idx
    for v in nodes:
        t = G.time[v]
        k = v[0]
        if k in ("S", "E"):
            s = tl_idx.by_instr[(v[1], v[2])]
            last = steps[-1] if steps else None
            if last and last.kind == "op" and last.rank == v[1] and last.index == v[2]:
                last.end = max(last.end, t)
                continue
            steps.append(Step("op", v[1], v[2], span_token(s), s.start, s.end))
        elif k in ("T", "A", "DS", "DR"):
            m = tl_idx.msgs.get(v[1])
            label = m.label() if m is not None else str(v[1])
            last = steps[-1] if steps else None
            if last and last.kind == "message" and last.what == label:
                last.end = max(last.end, t)
                continue
            detail = (f"{key_label(v[1])}: send posted {fmt_t(m.send_posted)}, recv posted "
                      f"{fmt_t(m.recv_posted)}, moved {fmt_t(m.start)}-{fmt_t(m.arrival)}, "
                      f"send done {fmt_t(m.send_done)}, recv done {fmt_t(m.recv_done)}"
                      if m is not None else "")
            steps.append(Step("message", None if m is None else m.src, None, label, t, t,
                              detail))
        elif k == "P":
            steps.append(Step("post", v[1], v[2], G.describe(v).split(" posts ")[1]
                              .split(" (instr")[0], t, t))
        elif k == "W":
            d = G.describe(v)
            tok = d.split(" (instr")[0].split(f"rank {v[1]} ", 1)[1]
            steps.append(Step("wait", v[1], v[2], tok, t, t, d))
        elif k == "I":
            a, b = divmod(v[1], G.cp.ranks)
            steps.append(Step("init", None, None, f"communicator init {a}-{b}", t, t,
                              G.describe(v)))
        elif k == "U":
            from schedsim.analysis.blame import unit_text

            rank, toks, _ = unit_text(G.cp, v[1], t)
            steps.append(Step("stream", rank, None, toks, t, t, G.describe(v)))
    return steps


def critical_path(G: DepGraph) -> list[Step]:
    """The chain of ops, messages and waits that sets the makespan, in time order."""
    ends = [v for v in G.g.nodes if v[0] == "E"]
    if not ends:
        return []
    last = max(ends, key=lambda v: (G.time[v], v[1]))
    return condense(G, [v for v in G.backtrack(last) if v != ("0",)])


@dataclass
class OpSlack:
    """Slack of one op: how long its start can slip before the makespan moves."""

    rank: int
    index: int
    op: str
    start: float
    end: float
    slack: float

    def to_dict(self) -> dict:
        return asdict(self)


def op_slack(G: DepGraph) -> list[OpSlack]:
    """Slack of every op (ops on the critical path have 0), sorted by rank and start."""
    L = G.tail_lengths()
    M = G.tl.makespan
    out = []
    for s in G.tl.spans:
        S = ("S", s.rank, s.index)
        sl = M - G.time[S] - L[S]
        out.append(OpSlack(s.rank, s.index, span_token(s), s.start, s.end,
                           0.0 if abs(sl) < EPS else sl))
    out.sort(key=lambda o: (o.rank, o.start))
    return out

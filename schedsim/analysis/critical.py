"""Critical path and slack over a run's dependency graph (:mod:`.graph`).

The critical path is the chain of binding dependencies that ends at the op that ends last
(the makespan): walking back from it, each step takes the predecessor whose time plus
delay equals the node's time (program order first on ties, so a run of back-to-back ops on
one rank stays on that rank until the rank had to wait for a message). Slack of an op is
how long its start could slip, with every order fixed, before the makespan moves:
``makespan - start - (longest delay from its start to the end of any op)`` — the classic
critical-path-method total float (Kelley & Walker, 1959), from one backward pass over the
graph's topological order.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from schedsim.analysis._index import EPS, key_label, span_token
from schedsim.analysis.graph import DepGraph
from schedsim.timeline import Message
from schedsim.util.units import fmt_time, unit_text, with_unit


@dataclass
class PathStep:
    """One link of a chain: an op (``kind="op"``), a message, a post or a wait."""

    kind: str            # op | message | post | wait | stream | init
    rank: int | None
    index: int | None    # instruction index (ops, posts, waits)
    what: str            # token or message label
    start: float
    end: float
    detail: str = ""

    def to_dict(self) -> dict:
        """Every field, as a JSON-ready dict."""
        return {f: getattr(self, f) for f in _STEP_FIELDS}


_STEP_FIELDS = tuple(f.name for f in fields(PathStep))


def message_detail(m: Message) -> str:
    """One line with every time of message ``m``."""
    return (f"{key_label(m.key)}: send posted {fmt_time(m.send_posted)}, "
            f"recv posted {fmt_time(m.recv_posted)}, moved {fmt_time(m.start)}-"
            f"{fmt_time(m.arrival)}, send done {fmt_time(m.send_done)}, recv done "
            f"{fmt_time(m.recv_done)}")


def condense(G: DepGraph, nodes: list[int]) -> list[PathStep]:
    """Turn a chain of node ids into readable steps: an op's S and E become one step, a
    message's transfer/arrival/completion nodes become one step."""
    steps: list[PathStep] = []
    for v in nodes:
        k, t = G.kind(v), float(G.t[v])
        last = steps[-1] if steps else None
        if k in ("S", "E"):
            s = G.span(v)
            if last and last.kind == "op" and last.rank == s.rank and last.index == s.index:
                last.end = max(last.end, t)
                continue
            steps.append(PathStep("op", s.rank, s.index, span_token(s), s.start, s.end))
        elif k in ("T", "A", "DS", "DR"):
            m = G.message(v)
            label = m.label()
            if last and last.kind == "message" and last.what == label:
                last.end = max(last.end, t)
                continue
            steps.append(PathStep("message", m.src, None, label, t, t, message_detail(m)))
        elif k in ("P", "W"):
            r, i = G.rank_index(v)
            tok = G.instr_token(r, i)
            steps.append(PathStep("post", r, i, tok, t, t) if k == "P" else
                         PathStep("wait", r, i, tok, t, t, G.describe(v)))
        elif k == "U":       # names the rank, its stream and the unit ahead
            rank, toks, text = G.unit(v)
            steps.append(PathStep("stream", rank, None, toks, t, t, text))
        elif k == "I":
            a, b = divmod(int(G.e.init_pairs[v - G.lay.i0]), G.e.ranks)
            steps.append(PathStep("init", None, None, f"communicator init {a}-{b}", t, t,
                              G.describe(v)))
    return steps


def critical_path(G: DepGraph) -> list[PathStep]:
    """The chain of ops, messages and waits that sets the makespan, in time order."""
    last = G.last_end()
    if last is None:
        return []
    return condense(G, [v for v in G.backtrack(last) if v != 0])


@dataclass
class Segment:
    """Consecutive ops of the critical path on one rank, and the non-op steps (messages,
    waits) that led into them."""

    rank: int
    ops: list[PathStep]
    via: list[PathStep] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.ops[0].start

    @property
    def end(self) -> float:
        return self.ops[-1].end

    def text(self) -> str:
        """``3F0@r3`` for one op, ``r3: 16 ops 3F0..3BW7 [3,27]`` for several."""
        if len(self.ops) == 1:
            o = self.ops[0]
            return f"{o.what}@r{self.rank}"
        return (f"r{self.rank}: {len(self.ops)} ops {self.ops[0].what}..{self.ops[-1].what} "
                f"[{fmt_time(self.start)},{fmt_time(self.end)}]")


def segments(path: list[PathStep]) -> list[Segment]:
    """The path's ops grouped into runs on one rank (posts inside a run are dropped;
    messages and waits before a run are its ``via``)."""
    out: list[Segment] = []
    pending: list[PathStep] = []
    for s in path:
        if s.kind != "op":
            if s.kind in ("message", "wait", "stream"):
                pending.append(s)
            continue
        if out and out[-1].rank == s.rank and not any(p.kind == "message" for p in pending):
            out[-1].ops.append(s)
        else:
            out.append(Segment(s.rank, [s], pending))
        pending = []
    return out


def path_headline(path: list[PathStep], makespan: float, zero_slack: int | None = None,
                  ops: int | None = None, route_limit: int = 9, unit: str = "slot"
                  ) -> list[str]:
    """Two lines that say what sets the makespan: how much of it the path's ops compute
    and how much it waits, and the route over ranks (at most ``route_limit`` segments,
    the middle elided); times with their ``unit`` (the Timeline's)."""
    op_steps = [s for s in path if s.kind == "op"]
    busy = sum(s.end - s.start for s in op_steps)
    ranks = len({s.rank for s in op_steps})
    slack = ("" if zero_slack is None else
             f"; {zero_slack} of {ops} ops have zero slack")
    head = (f"makespan {with_unit(makespan, unit)} = {with_unit(busy, unit)} compute + "
            f"{with_unit(makespan - busy, unit)} waiting along {len(op_steps)} ops on the path "
            f"over {ranks} ranks{slack}")
    segs = segments(path)
    parts = [g.text() for g in segs]
    if len(parts) > route_limit:
        k = route_limit // 2
        parts = parts[:k] + [f"... {len(parts) - 2 * k} more ..."] + parts[-k:]
    return [head, f"route ({unit_text(unit)}): " + " -> ".join(parts)]


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
        """Every field, as a JSON-ready dict."""
        return {f: getattr(self, f) for f in _SLACK_FIELDS}


_SLACK_FIELDS = tuple(f.name for f in fields(OpSlack))


def slack_values(G: DepGraph) -> np.ndarray:
    """Slack of every op by span id (``G.e.span_of`` order; float64, 0 on the critical
    path; exact zeros below :data:`EPS`)."""
    lay = G.lay
    L = G.tail_lengths()
    S = np.arange(lay.s0, lay.e0)
    sl = G.tl.makespan - G.t[S] - L[S]
    sl[np.abs(sl) < EPS] = 0.0
    return sl


def op_slack(G: DepGraph) -> list[OpSlack]:
    """Slack of every op (ops on the critical path have 0), sorted by rank and start."""
    sl = slack_values(G).tolist()
    out = [OpSlack(s.rank, s.index, span_token(s), s.start, s.end, x)
           for s, x in zip(G.e.span_of, sl)]
    out.sort(key=lambda o: (o.rank, o.start))
    return out

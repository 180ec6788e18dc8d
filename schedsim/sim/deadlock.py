"""Explain a deadlock: every blocked rank, what it waits for, and the wait-for cycle.

A rank is blocked on a set of its own comm ops (or, under ``data`` semantics, on inputs).
Each op that has not completed is traced to the op some rank still has to *post*: the
partner of a rendezvous send/recv, the op at the head of a comm stream it is queued behind,
or the producer of its data. That rank is its successor in the wait-for graph; a cycle in
that graph (found with networkx) is the deadlock.
"""
from __future__ import annotations

import networkx as nx

from schedsim.program.tokens import format_instr
from schedsim.sim.compile import Compiled
from schedsim.sim.engine import RunState
from schedsim.timeline import BlockedRank, CycleStep, Deadlock


def _instr_token(cp: Compiled, r: int, idx: int) -> str:
    row = cp.program.ranks[r]
    if idx >= len(row):
        return "END (waits for everything it posted)"
    return format_instr(row[idx])


def _why(cp: Compiled, st: RunState, h: int, seen: set[int]
         ) -> tuple[list[tuple[int, int]], str]:
    """Trace handle ``h`` to the ranks it waits on: ``(hops, clause)``. ``hops`` lists
    ``(rank, handle)`` in order: a rank whose comm stream holds a queued op, ..., and last
    the rank that must post (or run) something; ``clause`` explains the chain, starting
    with ``h``'s own token."""
    m = h >> 1
    tok = cp.handle_token(h)
    if cp.data_mode:
        q, i = cp.msrc[m], cp.hindex[2 * m]
        return [(q, 2 * m)], (f"its input from instr {i} ({_instr_token(cp, q, i)}) on "
                              f"rank {q}, which has not run")
    owner = cp.msrc[m] if h & 1 == 0 else cp.mdst[m]
    if st.hpost[h] is None:
        return [(owner, h)], f"{tok}, which rank {owner} posts only at instr {cp.hindex[h]}"
    if st.hact[h] is None:   # posted, but queued on the owner's comm stream
        u = cp.hunit[h]
        head = st.stream_busy.get(cp.unit_stream[u], -1)
        if head >= 0:
            for h2 in cp.unit_handles[head]:
                if st.hdone[h2] is None and h2 not in seen:
                    seen.add(h2)
                    hops, txt = _why(cp, st, h2, seen)
                    return [(owner, h)] + hops, (f"{tok}, queued on rank {owner}'s comm "
                                                 f"stream behind {txt}")
        return [(owner, h)], f"{tok}, queued on rank {owner}'s comm stream"
    partner = h ^ 1
    if partner in seen:
        return [(owner, h)], f"{tok}, which waits for {cp.handle_token(partner)}"
    seen.add(partner)
    hops, txt = _why(cp, st, partner, seen)
    return hops, f"{tok}, which needs its partner {txt}"


def diagnose(cp: Compiled, st: RunState) -> Deadlock:
    """Build the :class:`~schedsim.timeline.Deadlock` record of a run that got stuck."""
    blocked: list[BlockedRank] = []
    edges: dict[int, list[tuple[int, int, str]]] = {}
    where: dict[int, tuple[int, str]] = {}
    for r, code in enumerate(cp.code):
        pc = st.pcs[r]
        if pc >= len(code):
            continue
        ins = code[pc]
        hs = ins[1]
        idx = cp.instr_index(r, pc)
        tok = _instr_token(cp, r, idx)
        where[r] = (idx, tok)
        waiting = []
        for h in hs:
            if st.hdone[h] is not None:
                continue
            hops, txt = _why(cp, st, h, {h})
            waiting.append(txt)
            prev, prev_h = r, h
            for q, hq in hops:
                if q != prev:
                    if prev == r:     # the blocked rank's own wait
                        edges.setdefault(prev, []).append((q, hq, txt, True))
                    else:             # a rank whose comm stream holds the awaited op
                        edges.setdefault(prev, []).append(
                            (q, hq, f"its comm stream holds {cp.handle_token(prev_h)} "
                                    f"behind an op that needs rank {q}", False))
                    prev, prev_h = q, hq
        since = st.reach[r] if st.reach[r] is not None else st.times[r]
        blocked.append(BlockedRank(rank=r, index=idx, instruction=tok, since=since,
                                   waiting_for=waiting))
    g = nx.DiGraph()
    for r, es in edges.items():
        for q, hq, txt, own in es:     # a rank's own wait explains an edge best
            if not g.has_edge(r, q) or (own and not g.edges[r, q]["own"]):
                g.add_edge(r, q, handle=hq, text=txt, own=own)
    cycle: list[CycleStep] = []
    try:
        found = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        found = []
    for r, q in found:
        e = g.edges[r, q]
        qi, qtok = where.get(q, (-1, "?"))
        cycle.append(CycleStep(
            rank=r, index=where[r][0], instruction=where[r][1],
            waits_for=cp.handle_token(e["handle"]), peer=q,
            because=f"rank {q} is blocked at instr {qi} ({qtok})"))
    lines = []
    for c in cycle:
        e = g.edges[c.rank, c.peer]
        if e["own"]:
            lines.append(f"rank {c.rank} waits at instr {c.index} ({c.instruction}) for "
                         f"{e['text']}; rank {c.peer} is blocked at instr "
                         f"{where[c.peer][0]} ({where[c.peer][1]})")
        else:
            lines.append(f"rank {c.rank} ({c.instruction}): {e['text']}")
    if not lines:
        lines = [f"rank {b.rank} is blocked at instr {b.index} ({b.instruction})"
                 for b in blocked]
    msg = ("deadlock: the program can never finish (instructions count from 0). "
           + ". ".join(lines) + ". Blocked ranks: "
           + ", ".join(str(b.rank) for b in blocked) + ".")
    return Deadlock(message=msg, blocked=blocked, cycle=cycle)

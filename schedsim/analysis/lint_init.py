"""Lint rule ``init-order``: the order in which each rank creates its 2-rank NCCL
communicators under lazy init, and the orders that cannot all be met.

With lazy communicator init (``--lazy-init``, ``[comm] lazy_init``) a rank's first bare
post (``isend``/``irecv``, not in a ``BATCH``) to a peer blocks until that peer reaches its
own first bare post to the rank. Each rank therefore creates its pair communicators in a
fixed order; if rank r needs pair (r, a) before (r, b) and the other ranks' orders chain
back to (r, a) only after (r, b), no order of events meets them all: a deadlock. Source:
torch ``ProcessGroupNCCL`` keys a lone ``isend``/``irecv`` by the rank pair and creates
its communicator on first use (``getNCCLComm``), a blocking ``ncclCommInitRank`` of both
ranks; ``batch_isend_irecv`` uses the group's communicator.

Findings: ``info`` per rank listing its order (only when the run uses lazy init), and one
``warning`` per cycle of pairs (always: the program deadlocks as soon as lazy init is on).
"""
from __future__ import annotations

from schedsim.program.ir import Program


def init_order_findings(program: Program, lazy_init: bool) -> list[tuple]:
    """The ``init-order`` findings of ``program`` (module docstring), as the fields of
    :class:`schedsim.analysis.lint.Finding` (rule, severity, rank, index, message, cost,
    pattern)."""
    import networkx as nx

    from schedsim.sim.compile import first_touch_order

    def Finding(*fields: object) -> tuple:      # noqa: N802 - the lint record's fields
        return fields

    orders = first_touch_order(program)
    out = []
    if lazy_init:
        for r, order in enumerate(orders):
            if len(order) < 1:
                continue
            seq = ", ".join(f"{r}-{q} (instr {i})" for q, i in order)
            offs = " ".join(f"{q - r:+d}" for q, _ in order)
            out.append(Finding("init-order", "info", r, order[0][1],
                               f"rank {r} creates its communicators (first bare P2P to "
                               f"each peer) in the order {seq}", 0.0,
                               f"peer offsets {offs}"))
    g = nx.DiGraph()
    where: dict[tuple[tuple[int, int], tuple[int, int]], tuple[int, int, int]] = {}
    for r, order in enumerate(orders):
        for (a, ia), (b, ib) in zip(order, order[1:]):
            u, v = tuple(sorted((r, a))), tuple(sorted((r, b)))
            g.add_edge(u, v)
            where.setdefault((u, v), (r, ia, ib))
    for cyc in nx.simple_cycles(g):
        if len(cyc) < 2:
            continue
        steps = []
        for k, u in enumerate(cyc):
            v = cyc[(k + 1) % len(cyc)]
            r, ia, ib = where[(u, v)]
            other = lambda p: p[0] if p[1] == r else p[1]      # noqa: E731
            steps.append(f"rank {r} creates {r}-{other(u)} (instr {ia}) before "
                         f"{r}-{other(v)} (instr {ib})")
        r0, i0, _ = where[(cyc[0], cyc[1 % len(cyc)])]
        out.append(Finding("init-order", "warning", r0, i0,
                           "first bare P2Ps in a cycle: " + "; ".join(steps) + ": under "
                           "lazy communicator init (--lazy-init) no rank gets past its "
                           "first, a deadlock; launch one of them in a BATCH or reorder",
                           0.0, f"cycle of {len(cyc)} communicator inits"))
        if len(out) > 100:        # bounded: one per cycle is plenty
            break
    return out

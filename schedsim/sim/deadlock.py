"""Explain a deadlock: every blocked rank, what it waits for, and the wait-for cycle.

A rank is blocked on a set of its own comm ops (or, under ``data`` semantics, on inputs),
or, under lazy communicator init, in the creation of a pair's communicator at a bare post.
Each op that has not completed is traced to the op some rank still has to *post*: the
partner of a rendezvous send/recv, the op at the head of a comm stream it is queued behind,
or the producer of its data; an init waits for the other rank of the pair to reach its own
first bare post to this rank. That rank is its successor in the wait-for graph; a cycle in
that graph (found with networkx) is the deadlock, reported once, a sentence per edge.
"""
from __future__ import annotations

from schedsim.sim.compiled import Compiled
from schedsim.sim.engine import RunState
from schedsim.sim.opcodes import Step
from schedsim.timeline import BlockedRank, CycleStep, Deadlock


def _instr_token(cp: Compiled, r: int, idx: int) -> str:
    tok = cp.token(r, idx)
    return "END (waits for everything it posted)" if tok == "END" else tok


def _why(cp: Compiled, st: RunState, h: int, seen: set[int]
         ) -> tuple[list[tuple[int, int]], list[tuple[str, int | None]]]:
    """Trace handle ``h`` to the ranks it waits on: ``(hops, pieces)``. ``hops`` lists
    ``(rank, handle)`` in order: a rank whose comm stream holds a queued op, ..., and last
    the rank that must post (or run) something; ``pieces`` are the clause explaining the
    chain (joined: it starts with ``h``'s own token), each with the index of the hop it
    reaches (None: none yet), so an edge's sentence can stop at its hop (:func:`_upto`)."""
    m = h >> 1
    tok = cp.handle_token(h)
    if cp.data_mode:
        q, i = int(cp.messages.msrc[m]), int(cp.messages.hindex[2 * m])
        return [(q, 2 * m)], [(f"its input from instr {i} ({_instr_token(cp, q, i)}) on "
                               f"rank {q}, which has not run", 0)]
    owner = cp.owner(h)
    if cp.messages.hindex[h] < 0:      # an unmatched op's partner: nobody posts it
        return [], [(f"{tok}, which rank {owner} never posts (the op waiting for it is "
                     f"unmatched)", None)]
    if st.hpost[h] < 0:
        return [(owner, h)], [(f"{tok}, which rank {owner} posts only at instr "
                               f"{cp.messages.hindex[h]}", 0)]
    if st.hact[h] < 0:   # posted, but queued on the owner's comm stream
        u = int(cp.units.hunit[h])
        head = int(st.stream_busy[cp.units.unit_stream[u]])
        if head >= 0:
            for h2 in cp.unit_handles[head]:
                if st.hdone[h2] < 0 and h2 not in seen:
                    seen.add(h2)
                    hops, pieces = _why(cp, st, h2, seen)
                    return [(owner, h)] + hops, [
                        (f"{tok}, queued on rank {owner}'s comm stream behind ", 0)] + [
                        (t, None if k is None else k + 1) for t, k in pieces]
        return [(owner, h)], [(f"{tok}, queued on rank {owner}'s comm stream", 0)]
    held = _group_hold(cp, st, h, seen) if cp.host.atomic else None
    if held is not None:
        return held
    partner = h ^ 1
    if partner in seen:
        return [(owner, h)], [(f"{tok}, which waits for {cp.handle_token(partner)}", 0)]
    seen.add(partner)
    hops, pieces = _why(cp, st, partner, seen)
    return hops, [(f"{tok}, which needs its partner ", None)] + pieces


def _upto(pieces: list[tuple[str, int | None]], hop: int) -> str:
    """The clause of ``pieces`` up to hop ``hop`` (a queued op named by the token it
    waits behind); the whole clause when no piece reaches it."""
    for j, (text, k) in enumerate(pieces):
        if k == hop:
            out = "".join(t for t, _ in pieces[:j + 1])
            if out.endswith(" behind ") and j + 1 < len(pieces):
                out += pieces[j + 1][0].split(",")[0]
            return out.removesuffix(" behind ")
    return "".join(t for t, _ in pieces)


def _group_hold(cp: Compiled, st: RunState, h: int, seen: set[int]
                ) -> tuple[list[tuple[int, int]], list[tuple[str, int | None]]] | None:
    """Atomic groups: handle h (active) held by a batch, its own or its partner's, whose
    other member is not matched (no data moves), or, once its data moved, by its own
    batch's member not complete (the group completes together); None if neither."""
    from schedsim.sim.groups import atomic_groups

    hgroup, gptr, gh, _ = atomic_groups(cp)
    m = h >> 1
    moved = st.mstart[m] >= 0
    for y in ((h,) if moved else (h, h ^ 1)):
        g = int(hgroup[y])
        if g < 0:
            continue
        for z in gh[gptr[g]:gptr[g + 1]].tolist():
            if z >> 1 == m:
                continue
            if moved:
                if st.hdone[z] >= 0 or z in seen:
                    continue
                blocker = z
            elif st.hact[z] >= 0 and st.hact[z ^ 1] >= 0:
                continue
            else:
                blocker = z if st.hact[z] < 0 else z ^ 1
                if blocker in seen:
                    continue
            seen.add(blocker)
            hops, pieces = _why(cp, st, blocker, seen)
            q = cp.owner(y)
            what = ("completes only with its atomic batch" if moved else
                    "is held by its atomic batch" if y == h else
                    f"needs its partner {cp.handle_token(h ^ 1)}, held by that op's atomic "
                    f"batch")
            if blocker != z:
                pieces = [(f"{cp.handle_token(z)}, which waits for ", None)] + pieces
            return [(q, y)] + hops, [
                (f"{cp.handle_token(h)}, which {what} (rank {q}, instr "
                 f"{int(cp.messages.hindex[y])}) with ", 0)] + [
                (t, None if k is None else k + 1) for t, k in pieces]
    return None


def _init_wait(cp: Compiled, r: int, g: int) -> tuple[int, str, str]:
    """A rank blocked in a lazy communicator init at step g: ``(peer, what it waits for,
    the clause)``."""
    pair = int(cp.code.cinit[g])
    q = pair // cp.ranks if pair % cp.ranks == r else pair % cp.ranks
    j = cp.pair_first.get(pair, {}).get(q)
    what = f"the communicator init of ranks {r}-{q}"
    if j is None:
        return q, what, (f"{what} (created at the first bare P2P between them), which rank "
                         f"{q} never joins: it posts nothing to rank {r} on its own, only "
                         f"in batches")
    return q, what, (f"{what} (created at the first bare P2P between them), which rank {q} "
                     f"joins only at instr {j} ({_instr_token(cp, q, j)})")


def diagnose(cp: Compiled, st: RunState) -> Deadlock:
    """Build the :class:`~schedsim.timeline.Deadlock` record of a run that got stuck."""
    import networkx as nx

    blocked: list[BlockedRank] = []
    edges: dict[int, list[tuple[int, str, str, bool]]] = {}
    where: dict[int, tuple[int, str]] = {}
    for r in range(cp.ranks):
        pc = int(st.pcs[r])
        g = int(cp.code.crptr[r]) + pc
        if g >= int(cp.code.crptr[r + 1]):
            continue
        idx = cp.instr_index(r, pc)
        tok = _instr_token(cp, r, idx)
        where[r] = (idx, tok)
        waiting = []
        if cp.code.cop[g] == Step.LAUNCH:           # blocked in a lazy communicator init
            q, what, txt = _init_wait(cp, r, g)
            waiting.append(txt)
            edges.setdefault(r, []).append((q, what, txt, True))
        else:
            for h in cp.step_handles(g):
                if st.hdone[h] >= 0:
                    continue
                hops, pieces = _why(cp, st, h, {h})
                waiting.append("".join(t for t, _ in pieces))
                prev, prev_h = r, h
                for k, (q, hq) in enumerate(hops):
                    if q != prev:
                        if prev == r:     # the blocked rank's own wait, up to rank q
                            edges.setdefault(prev, []).append(
                                (q, cp.handle_token(hq), _upto(pieces, k), True))
                        else:             # a rank whose comm stream holds the awaited op
                            edges.setdefault(prev, []).append(
                                (q, cp.handle_token(hq),
                                 f"its comm stream holds {cp.handle_token(prev_h)} behind "
                                 f"an op that needs rank {q}", False))
                        prev, prev_h = q, hq
        since = float(st.reach[r]) if st.reach[r] >= 0 else float(st.times[r])
        blocked.append(BlockedRank(rank=r, index=idx, instruction=tok, since=since,
                                   waiting_for=waiting))
    g_ = nx.DiGraph()
    for r, es in edges.items():
        for q, waits_for, txt, own in es:     # a rank's own wait explains an edge best
            if not g_.has_edge(r, q) or (own and not g_.edges[r, q]["own"]):
                g_.add_edge(r, q, waits_for=waits_for, text=txt, own=own)
    try:
        found = nx.find_cycle(g_)
    except nx.NetworkXNoCycle:
        found = []
    cycle: list[CycleStep] = []
    lines = []
    for r, q in found:
        e = g_.edges[r, q]
        qi, qtok = where.get(q, (-1, "?"))
        cycle.append(CycleStep(rank=r, index=where[r][0], instruction=where[r][1],
                               waits_for=e["waits_for"], peer=q,
                               because=f"rank {q} is blocked at instr {qi} ({qtok})"))
        if e["own"]:
            lines.append(f"rank {r} waits at instr {where[r][0]} ({where[r][1]}) for "
                         f"{e['text']}; rank {q} is blocked at instr {qi} ({qtok})")
        else:
            lines.append(f"rank {r} ({where[r][1]}): {e['text']}")
    if not lines:
        lines = [f"rank {b.rank} is blocked at instr {b.index} ({b.instruction})"
                 for b in blocked]
    # the cycle once, a sentence per edge (the CLI prints one line per edge:
    # schedsim.report.advice.format_deadlock)
    msg = ("deadlock: the program can never finish (instructions count from 0). "
           + ". ".join(lines) + ". Blocked ranks: "
           + ", ".join(str(b.rank) for b in blocked) + ".")
    return Deadlock(message=msg, blocked=blocked, cycle=cycle)


def unmatched_consequence(cp: Compiled, st: RunState) -> str:
    """What a run of a program with an unmatched op (``cp.unmatched``) did: the ranks it
    left blocked and what each waits for, and the ranks that finished."""
    done = [r for r in range(cp.ranks)
            if int(st.pcs[r]) + int(cp.code.crptr[r]) >= int(cp.code.crptr[r + 1])]
    if len(done) == cp.ranks:
        return ("the run still completes: the unmatched send completes without its recv "
                "(eager), and its data lands nowhere")
    d = diagnose(cp, st)
    parts = [f"rank {b.rank} blocks at instr {b.index} ({b.instruction}) waiting for "
             + "; ".join(b.waiting_for) for b in d.blocked]
    if done:
        parts.append(("rank " if len(done) == 1 else "ranks ")
                     + ", ".join(map(str, done)) + " finish" + ("es" if len(done) == 1
                                                               else ""))
    return "with it never completing, " + "; ".join(parts)

"""Lint rules on batches: ``unsafe-grouping`` and ``split-exchange``.

- ``unsafe-grouping`` (static): a ``BATCH`` on rank r holds recv x from rank q1 and recv
  y from rank q2, and q2 makes y's data with an op that itself needs data from q1. The
  batch (its wait, and under ``--group-semantics atomic`` every member) then waits for
  q2's compute although q1's data for x is there already: pytorch/PiPPy#969, a skip
  connection 0 -> 2 whose recv rank 2 batched with the recv from rank 1, fixed by one
  batch per peer (PiPPy PR #1000).
- ``split-exchange`` (runs under ``atomic`` groups only): two messages between ranks a
  and b that a posts in one launch and b in two. Each launch moves only once all its
  members are matched, and on one comm stream the second launch starts after the first
  completed: NCCL splitting one group into sequential kernel launches differently on
  two ranks hangs (pytorch/pytorch#174288; torch's fix chunks large batches the same
  way on every rank, PR #174942). Sub-launches (``max_batch_ops``,
  :mod:`schedsim.program.sublaunch`) make such splits.

Both return the fields of :class:`schedsim.analysis.lint.Finding` (rule, severity, rank,
index, message, cost, pattern).
"""
from __future__ import annotations

from schedsim.program.ir import Batch, Compute, Program
from schedsim.program.ops import launched
from schedsim.program.routing import needs, produces, route, skip_needs, skip_outputs


def _posts(program: Program) -> list[dict]:
    """Per rank: message key -> (instruction index, launch is a BATCH, comm) of its
    posts."""
    out = []
    for row in program.ranks:
        d: dict = {}
        for i, ins in enumerate(row):
            for c in launched(ins):
                d[(c.message_key(), c.is_send)] = (i, isinstance(ins, Batch), c)
        out.append(d)
    return out


def _makers(program: Program) -> dict:
    """Message key -> (rank, instruction index, compute op) of the op that makes it."""
    skips = tuple(program.placement.skips)
    out = {}
    for r, row in enumerate(program.ranks):
        for i, ins in enumerate(row):
            if isinstance(ins, Compute):
                for a in ins.op.atoms():
                    k = produces(a)
                    for key in ([k] if k is not None else []) + skip_outputs(a, skips):
                        out[key] = (r, i, ins.op, a)
    return out


def unsafe_groupings(program: Program) -> list[tuple]:
    """Rule ``unsafe-grouping`` (module docstring)."""
    pl = program.placement
    rank_of, skips, S = pl.rank_fn(), tuple(pl.skips), pl.stages
    makers = _makers(program)
    out = []
    for r, row in enumerate(program.ranks):
        for i, ins in enumerate(row):
            if not isinstance(ins, Batch):
                continue
            recvs = [(c, c.message_key()) for c in ins.comms if not c.is_send]
            srcs = {route(k, rank_of)[0] for _, k in recvs}
            if len(srcs) < 2:
                continue
            hit = _gated(recvs, makers, rank_of, skips, S)
            if hit is None:
                continue
            (x, q1), (y, q2), (mi, mop) = hit
            out.append(("unsafe-grouping", "warning", r, i,
                        f"rank {r} instr {i}: {x} from rank {q1} is batched with {y}, whose "
                        f"data rank {q2} makes with {mop} (instr {mi}), an op that needs "
                        f"data from rank {q1}: the batch waits for rank {q2}'s compute "
                        f"although rank {q1}'s data is there (with --group-semantics "
                        f"atomic nothing in it moves until then); post one batch per peer "
                        f"(pytorch/PiPPy#969, PR #1000)", 0.0,
                        f"{x.kind} batched with a {y.kind} gated by compute"))
    return out


def _gated(recvs, makers, rank_of, skips, S):
    """The first (x, y) pair of recvs of one batch where y's producer op needs data
    from x's sending rank: ``((x, q1), (y, q2), (instr, op))``, or None."""
    for y, ky in recvs:
        made = makers.get(ky)
        if made is None:
            continue
        q2, mi, mop, atom = made
        inputs = needs(atom, S) + skip_needs(atom, skips)
        from_ranks = {rank_of(k[1], k[2]) for k in inputs if 0 <= k[1] < S}
        for x, kx in recvs:
            q1 = route(kx, rank_of)[0]
            if x is not y and q1 != q2 and q1 in from_ranks:
                return (x, q1), (y, q2), (mi, mop)
    return None


def split_exchanges(program: Program) -> list[tuple]:
    """Rule ``split-exchange`` (module docstring): one finding per pair of ranks."""
    rank_of = program.placement.rank_fn()
    posts = _posts(program)
    out = []
    seen = set()
    for a, mine in enumerate(posts):
        together: dict[int, list] = {}          # launch instr -> [(key, is_send, comm)]
        for (key, is_send), (i, is_batch, c) in mine.items():
            if is_batch:
                together.setdefault(i, []).append((key, is_send, c))
        for i, members in sorted(together.items()):
            for n, (kx, sx, cx) in enumerate(members):
                for ky, sy, cy in members[n + 1:]:
                    bx, by = _peer_of(kx, sx, rank_of), _peer_of(ky, sy, rank_of)
                    if bx != by or (a, bx) in seen:
                        continue
                    fx = posts[bx].get((kx, not sx))
                    fy = posts[bx].get((ky, not sy))
                    if fx is None or fy is None or fx[0] == fy[0]:
                        continue
                    seen.add((a, bx))
                    seen.add((bx, a))
                    out.append(("split-exchange", "stream-risk", a, i,
                                f"rank {a} launches {cx} and {cy} together (instr {i}) but "
                                f"rank {bx} posts their partners {fx[2]} (instr {fx[0]}) "
                                f"and {fy[2]} (instr {fy[0]}) in two launches: an atomic "
                                f"launch moves only once every member is matched, so on "
                                f"one comm stream each side's launch can wait for one the "
                                f"other starts later (pytorch/pytorch#174288)", 0.0,
                                "one launch on one side, two on the other"))
    return out


def _peer_of(key, is_send: bool, rank_of) -> int:
    src, dst = route(key, rank_of)
    return dst if is_send else src

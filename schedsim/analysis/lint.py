"""Lints on programs: P2P patterns that cost time or can hang.

Rules (each :class:`Finding` has a ``rule``, a ``severity`` and a message naming the
instructions):

- ``late-send``: a send posted after another compute op ran since its data was made (the
  data waits on the sender while the receiver may be idle). Static; with a timeline the
  message also says how long after the data was ready it was posted.
- ``unrelated-recv``: a wait (a ``COMMIT`` batch or a ``WAIT`` on several ops) before op X
  whose release was set by a recv X does not need, whose data was not there when the rank
  reached the wait (its producer, or the sender's post, is gated by compute on the other
  rank). Needs a timeline; reports how long X was held.
- ``crossed-order``: two messages between the same two ranks whose posting orders differ
  between the two sides, in different batches. On one directed link this is an
  ``error`` (P2P ops match in posting order per link); in opposite directions it is a
  ``deadlock`` when each side waits for its first op before posting the second (both
  first ops sends: deadlocks under rendezvous only; a recv among them: always), else,
  when each side posts them in two different batches, a ``stream-risk`` (deadlocks on a
  shared comm stream under rendezvous). Within one batch on either side the order is
  free (``batch_isend_irecv`` launches them together).
- ``silent-swap``: the k-th send and the k-th recv of a directed link (the ops NCCL and
  gloo pair) have the same size but different tags, so the data lands in the other
  tensor's buffer (:mod:`schedsim.sim.identity`; from the run, ``Timeline.findings``).
- ``unsafe-grouping`` and ``split-exchange``: batches that wait for another rank's
  compute, and exchanges two ranks launch in different groupings (under atomic
  groups); :mod:`schedsim.analysis.lint_groups`.
- ``deadlock``: the run of the program deadlocked; one finding (severity ``deadlock``)
  giving the wait-for cycle the engine found (:mod:`schedsim.sim.deadlock`). The timed rules
  are skipped then (a stuck run has no complete timing); the static ones still run, so a
  ``crossed-order`` finding may name the crossing behind the cycle.

Each finding also has a ``pattern``: what it looks like with the ranks and microbatches
taken out (``late-send``: the send kind; ``unrelated-recv``: the wait and recv kinds;
``crossed-order``: the peer offset and the two comm kinds in the first rank's order), so
that :func:`group_findings` can fold the thousands of identical findings of a large
regular schedule into one line.
"""
from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import asdict, dataclass
from typing import NamedTuple

from schedsim.analysis._index import EPS, TimelineIndex, comm_of, span_token
from schedsim.program.ir import Comm, Commit, Compute, Program, Wait
from schedsim.program.ops import launched
from schedsim.program.routing import consumer_stage, produces, route
from schedsim.program.tokens import format_instr
from schedsim.timeline import Timeline
from schedsim.util.units import fmt_time

SEVERITY_ORDER = {"error": 0, "deadlock": 1, "stream-risk": 2, "warning": 3, "info": 4}


@dataclass
class Finding:
    """One lint finding on ``rank`` at instruction ``index``."""

    rule: str
    severity: str
    rank: int
    index: int
    message: str
    cost: float = 0.0     # time it cost in the timeline (0 when unknown)
    pattern: str = ""     # the finding with ranks and microbatches taken out (grouping)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FindingGroup:
    """Findings of one ``rule``, ``severity`` and ``pattern``, in :func:`lint` order (the
    first is the costliest)."""

    rule: str
    severity: str
    pattern: str
    findings: list[Finding]

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def cost(self) -> float:
        """Total time the findings cost in the timeline."""
        return sum(f.cost for f in self.findings)

    @property
    def ranks(self) -> list[int]:
        return sorted({f.rank for f in self.findings})


def group_findings(findings: list[Finding]) -> list[FindingGroup]:
    """Fold findings with the same rule, severity and pattern into groups, ordered by
    severity (the run's ``deadlock`` first among equals), then total cost (largest
    first), then size (largest first). Linear in the findings."""
    groups: dict[tuple[str, str, str], FindingGroup] = {}
    for f in findings:
        key = (f.rule, f.severity, f.pattern)
        g = groups.get(key)
        if g is None:
            groups[key] = FindingGroup(f.rule, f.severity, f.pattern, [f])
        else:
            g.findings.append(f)
    return sorted(groups.values(), key=lambda g: (SEVERITY_ORDER.get(g.severity, 9),
                                                  g.rule != "deadlock", -g.cost, -g.count,
                                                  g.rule, g.pattern))


def examples(group: FindingGroup, n: int = 3) -> list[Finding]:
    """Up to ``n`` findings of ``group`` after its first, from ranks not shown yet first."""
    seen = {group.findings[0].rank}
    out: list[Finding] = []
    for f in group.findings[1:]:
        if f.rank not in seen:
            seen.add(f.rank)
            out.append(f)
            if len(out) == n:
                return out
    rest = [f for f in group.findings[1:] if f not in out]
    return out + rest[:n - len(out)]


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def lint(program: Program, tl: Timeline | None = None,
         late_threshold: float = 0.0, lazy_init: bool = False) -> list[Finding]:
    """Run every rule on ``program`` (``tl``: a run of it under comm semantics, used by
    the timed rules; a ``data`` run is ignored, its posts carry no timing; a run that
    deadlocked gives the ``deadlock`` finding and no timed rule; ``lazy_init``: the run
    uses lazy communicator init, so ``init-order`` lists each rank's order,
    :mod:`schedsim.analysis.lint_init`). Findings are sorted by severity (the run's
    ``deadlock`` first among equals), then cost (largest first)."""
    from schedsim.analysis.lint_groups import split_exchanges, unsafe_groupings
    from schedsim.analysis.lint_init import init_order_findings

    dead = tl is not None and tl.deadlock is not None
    timed = tl if tl is not None and tl.semantics != "data" and not dead else None
    out = late_sends(program, timed, late_threshold) + crossed_orders(program)
    out += [Finding(*f) for f in init_order_findings(program, lazy_init)]
    out += [Finding(*f) for f in unsafe_groupings(program)]
    if tl is not None and tl.group_semantics == "atomic":
        out += [Finding(*f) for f in split_exchanges(program)]
    if dead:
        out += deadlock_findings(tl)
    if tl is not None:
        out += [Finding("silent-swap", "error", r, i, msg, 0.0,
                        "k-th send and k-th recv of a link carry different tags")
                for r, i, msg in tl.findings]
    if timed is not None:
        out += unrelated_recvs(program, timed)
    out.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), f.rule != "deadlock",
                            -f.cost, f.rank, f.index))
    return out


def deadlock_findings(tl: Timeline) -> list[Finding]:
    """Rule ``deadlock`` (module docstring): one finding for a run that got stuck, on the
    first rank of the wait-for cycle (or the first blocked rank when no cycle was found),
    naming the cycle and what each rank waits for; none when ``tl`` completed."""
    d = tl.deadlock
    if d is None:
        return []
    run = f"the {tl.semantics} run" + ("" if tl.comm_stream == "none" else
                                       f" ({tl.comm_stream} comm stream)")
    if d.cycle:
        first = d.cycle[0]
        ring = " -> ".join(f"rank {c.rank}" for c in d.cycle) + f" -> rank {first.rank}"
        steps = ", ".join(f"rank {c.rank} at instr {c.index} ({c.instruction}) waits for "
                          f"{c.waits_for} (rank {c.peer})" for c in d.cycle)
        why = next((b.waiting_for for b in d.blocked if b.rank == first.rank), [])
        return [Finding("deadlock", "deadlock", first.rank, first.index,
                        f"{run} deadlocks, wait-for cycle {ring}: {steps}"
                        + (f"; rank {first.rank} waits for {'; '.join(why)}" if why else ""),
                        0.0, f"cycle of {len(d.cycle)} ranks")]
    b = d.blocked[0] if d.blocked else None
    where = "; ".join(f"rank {x.rank} at instr {x.index} ({x.instruction}) waits for "
                      f"{'; '.join(x.waiting_for) or 'nothing it can name'}"
                      for x in d.blocked)
    return [Finding("deadlock", "deadlock", b.rank if b else 0, b.index if b else 0,
                    f"{run} deadlocks (no wait-for cycle found): {where}", 0.0,
                    "no cycle found")]


def _waited_at(row: list) -> dict[Comm, int]:
    """Posted comm op -> index of the first wait that covers it (a COMMIT after its
    launch, or a WAIT naming it); ``len(row)`` (END) when none does."""
    out: dict[Comm, int] = {}
    pending: list[Comm] = []
    for i, ins in enumerate(row):
        comms = launched(ins)
        if comms:
            pending += comms
        elif isinstance(ins, Commit):
            for c in pending:
                out.setdefault(c, i)
            pending = []
        elif isinstance(ins, Wait):
            for c in ins.comms:
                out.setdefault(c, i)
    for c in pending:
        out.setdefault(c, len(row))
    return out


def late_sends(program: Program, tl: Timeline | None = None,
               late_threshold: float = 0.0) -> list[Finding]:
    """Rule ``late-send`` (module docstring)."""
    idx = TimelineIndex(tl) if tl is not None else None
    out = []
    for r, row in enumerate(program.ranks):
        computes: list[tuple[int, str]] = []     # (instr index, token) in program order
        made: dict = {}                          # key -> position in computes of producer
        for i, ins in enumerate(row):
            if isinstance(ins, Compute):
                computes.append((i, format_instr(ins)))
                for a in ins.op.atoms():
                    k = produces(a)
                    if k is not None:
                        made[k] = len(computes) - 1
            for c in launched(ins):
                if not c.is_send:
                    continue
                key = c.message_key()
                pos = made.get(key)
                if pos is None or pos == len(computes) - 1:
                    continue
                between = computes[pos + 1:pos + 4]
                cost = 0.0
                timing = ""
                if idx is not None:
                    m, prod = idx.msgs.get(key), idx.producer(key)
                    if m is not None and prod is not None and m.send_posted is not None:
                        cost = max(0.0, m.send_posted - prod.end)
                        timing = (f"; in the run it was posted at {fmt_time(m.send_posted)}, "
                                  f"{fmt_time(cost)} after the data was ready "
                                  f"({span_token(prod)} ended {fmt_time(prod.end)})")
                if idx is not None and cost <= late_threshold + EPS:
                    continue
                ops = ", ".join(f"{t} (instr {j})" for j, t in between)
                j, t = computes[pos]
                out.append(Finding(
                    "late-send", "warning", r, i,
                    f"rank {r} instr {i}: {c} is posted after {ops} although its data "
                    f"was made by {t} (instr {j}){timing}", cost,
                    f"{c.kind} posted after other compute"))
    return out


def unrelated_recvs(program: Program, tl: Timeline) -> list[Finding]:
    """Rule ``unrelated-recv`` (module docstring); needs a comm-semantics timeline."""
    idx = TimelineIndex(tl)
    out = []
    for w in tl.waits:
        if w.kind not in ("COMMIT", "WAIT") or len(w.comms) < 2:
            continue
        nxt = idx.span_after(w.rank, w.index)
        if nxt is None:
            continue
        needed = idx.needs_of(nxt)
        members = []
        for tok in w.comms:
            _, key, is_send = comm_of(tok)
            m = idx.msgs.get(key)
            done = None if m is None else (m.send_done if is_send else m.recv_done)
            members.append((tok, key, is_send, m, done))
        need_done = max([d for _, k, s, _, d in members if not s and k in needed
                         and d is not None] + [w.start])
        for tok, key, is_send, m, done in members:
            if is_send or key in needed or done is None or m is None:
                continue
            if done >= w.end - EPS and done > need_done + EPS:
                prod = idx.producer(key)
                why = (f"rank {m.src} posted the send at {fmt_time(m.send_posted)} (instr "
                       f"{m.send_index})" + (f", its data made by {span_token(prod)} ended "
                                             f"{fmt_time(prod.end)}" if prod else ""))
                out.append(Finding(
                    "unrelated-recv", "warning", w.rank, w.index,
                    f"rank {w.rank} instr {w.index} ({w.kind}): {tok} is batched before "
                    f"{span_token(nxt)}, which does not need it, and holds it from "
                    f"{fmt_time(need_done)} to {fmt_time(w.end)}: {why}", w.end - need_done,
                    f"{w.kind} held by a {comm_of(tok)[0].kind} the next op does not need"))
    return out


class _PostAt(NamedTuple):
    """One posted P2P op of a rank: its posting position, launch instruction, message key,
    side, peer rank and the op itself."""

    pos: int
    i: int
    key: tuple
    is_send: bool
    peer: int
    comm: Comm
    batch: bool = False     # launched in a BATCH of several posts (else a bare post)


def crossed_orders(program: Program) -> list[Finding]:
    """Rule ``crossed-order`` (module docstring); static."""
    rank_of = program.placement.rank_fn()
    S = program.placement.stages
    posts: list[list[_PostAt]] = []      # per rank, in posting order
    waited: list[dict[Comm, int]] = []
    for r, row in enumerate(program.ranks):
        lst: list[_PostAt] = []
        for i, ins in enumerate(row):
            cs = launched(ins)
            for c in cs:
                key = c.message_key()
                if not (0 <= key[1] < S and 0 <= consumer_stage(key) < S):
                    continue
                src, dst = route(key, rank_of)
                lst.append(_PostAt(len(lst), i, key, c.is_send, dst if c.is_send else src, c,
                                   len(cs) > 1))
        posts.append(lst)
        waited.append(_waited_at(row))
    out = []
    seen = set()
    for a, lst in enumerate(posts):
        by_peer: dict[int, list[_PostAt]] = {}
        for e in lst:
            by_peer.setdefault(e.peer, []).append(e)
        for b, mine in by_peer.items():
            if b <= a:
                continue
            theirs = {e.key: e for e in posts[b] if e.peer == a}
            seen_b: list[int] = []                      # b's positions of a's earlier posts
            at_b: dict[int, _PostAt] = {}
            for ey in mine:                             # in a's posting order
                fy = theirs.get(ey.key)
                if fy is None:
                    continue
                k = bisect_right(seen_b, fy.pos)
                later = seen_b[k:]                      # posted earlier by a, later by b
                insort(seen_b, fy.pos)
                at_b[fy.pos] = ey
                for pb in later:
                    ex = at_b[pb]
                    fx = theirs[ex.key]
                    blocked = (waited[a].get(ex.comm, -1) < ey.i
                               and waited[b].get(fy.comm, -1) < fx.i)
                    split = ex.i != ey.i and fy.i != fx.i    # each side in two launches
                    pair = (a, b, ex.key, ey.key)
                    if pair in seen:
                        continue
                    seen.add(pair)
                    out.append(_crossed(a, b, ex, ey, fx, fy, blocked, split))
    return [f for f in out if f is not None]


def _crossed(a: int, b: int, ex: _PostAt, ey: _PostAt, fx: _PostAt, fy: _PostAt,
             blocked: bool, split: bool) -> Finding | None:
    same_dir = ex.is_send == ey.is_send
    pattern = (f"ranks r and r+{b - a}: {ex.comm.kind} before {ey.comm.kind} vs "
               f"{fy.comm.kind} before {fx.comm.kind}")
    where = (f"rank {a} posts {ex.comm} (instr {ex.i}) before {ey.comm} (instr "
             f"{ey.i}) but rank {b} posts {fy.comm} (instr {fy.i}) before {fx.comm} "
             f"(instr {fx.i})")
    if same_dir:
        return Finding("crossed-order", "error", a, ex.i,
                       f"{where}: on one directed link P2P ops match in posting order, so "
                       f"the two sides pair different messages", 0.0, pattern)
    if blocked:
        both_sends = ex.is_send and fy.is_send
        what = ("deadlocks under rendezvous (each send waits for a recv the peer posts "
                "only after its own send completed); eager completes" if both_sends else
                "deadlocks under any semantics (a recv waits for a send the peer posts "
                "only after its own first op completed)")
        return Finding("crossed-order", "deadlock", a, ex.i,
                       f"{where}, and each side waits for its first op before posting the "
                       f"second: {what}", 0.0, pattern)
    if split:
        word = "batches" if all(e.batch for e in (ex, ey, fx, fy)) else "launches"
        return Finding("crossed-order", "stream-risk", a, ex.i,
                       f"{where}, each side in two {word}: on a comm stream shared by both "
                       f"(rank {a}'s to rank {b} and rank {b}'s to rank {a} per peer, or "
                       f"each rank's one stream) under rendezvous each side's second "
                       f"{word[:-2]} queues behind a "
                       f"first one the other side has not matched yet", 0.0, pattern)
    return None

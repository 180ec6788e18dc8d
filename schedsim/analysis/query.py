"""Counterfactual queries: does X delay Y, by how much, and through which waits?

The answer is measured, not inferred: the program is simulated once as it is and once
with the cause made *free*, and the delay is the difference of the effect's time, so
indirect effects (a later wait, a queued link) count. Free means:

- an op: it costs 0;
- a message (selected by either of its comm ops): under ``eager``/``rendezvous`` each side
  completes the moment it is posted (no rank waits for it, it occupies no link or comm
  stream); under ``data`` semantics, where there are no comm ops, it costs nothing on the
  link (its consumer still waits for its producer).

The effect's time is an op's start, or a comm op's completion (``Answer.effect_event``
says which; ``effect_start`` holds it either way). A cause may not be the effect's own
instruction (:func:`check_causes`). Besides the delay each
answer carries the *binding wait* (the instruction the effect's rank was blocked on right
before the effect, with each awaited message and when it completed) and the *chain*: the
binding dependencies that link the cause to the effect in the actual run (empty when none
does). Several causes can be freed together.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from schedsim.analysis._index import (
    EPS,
    TimelineIndex,
    comm_of,
    fmt_t,
    key_label,
    partner_token,
)
from schedsim.analysis.critical import condense
from schedsim.analysis.graph import build_graph
from schedsim.analysis.select import Target
from schedsim.errors import ScenarioError
from schedsim.program.ir import Program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.timeline import Timeline

SEMANTICS = ("data", "eager", "rendezvous")


def simulate_free(program: Program, costs: CostModel, link: LinkModel, comm: CommModel,
                  causes: list[Target]) -> Timeline:
    """Simulate ``program`` with every cause made free (module docstring), through the
    ``free_ops`` / ``free_messages`` arguments of :func:`~schedsim.sim.simulate.simulate`.
    A counterfactual that deadlocks is returned with its ``deadlock`` set. Raises what
    :func:`simulate` raises."""
    from schedsim.sim.simulate import simulate

    ops = [(t.rank, t.index) for t in causes if t.op is not None]
    keys = list(dict.fromkeys(t.message_key for t in causes if t.comm is not None))
    return simulate(program, costs, link, comm, raise_on_deadlock=False, free_ops=ops,
                    free_messages=keys)


def effect_time(tl: Timeline, target: Target) -> float | None:
    """When ``target`` happened in ``tl``: an op's start, a comm op's completion."""
    if target.op is not None:
        for s in tl.spans:
            if s.rank == target.rank and s.index == target.index:
                return s.start
        return None
    key = target.message_key
    for m in tl.messages:
        if (m.kind, m.stage, m.mb) == key:
            return m.send_done if target.comm.is_send else m.recv_done
    return None


def binding_wait(tl: Timeline, target: Target) -> dict | None:
    """The wait ``target``'s rank was blocked on right before ``target`` (an op), with
    each awaited comm op, its message and when it completed; None if the op started as
    soon as the previous one ended."""
    if target.op is None:
        return None
    idx = TimelineIndex(tl)
    span = idx.by_instr.get((target.rank, target.index))
    if span is None:
        return None
    prev = idx.span_before(target.rank, span.index)
    prev_idx = -1 if prev is None else prev.index
    cands = [w for w in idx.rank_waits[target.rank]
             if (w.kind == "DATA" and w.index == span.index)
             or (w.kind != "DATA" and prev_idx < w.index < span.index)]
    cands = [w for w in cands if w.end >= span.start - EPS]
    if not cands:
        return None
    w = max(cands, key=lambda w: w.index)
    comms = []
    for tok in w.comms:
        _, key, is_send = comm_of(tok)
        m = idx.msgs.get(key)
        done = None if m is None else (m.send_done if is_send else m.recv_done)
        comms.append({
            "comm": tok, "message": key_label(key),
            "src": None if m is None else m.src, "dst": None if m is None else m.dst,
            "posted": None if m is None else (m.send_posted if is_send else m.recv_posted),
            "partner": partner_token(tok),
            "partner_posted": None if m is None else (m.recv_posted if is_send
                                                      else m.send_posted),
            "done": done, "binding": done is not None and done >= w.end - EPS})
    return {"rank": w.rank, "index": w.index, "kind": w.kind, "reached": w.start,
            "released": w.end, "comms": comms}


def cause_nodes(target: Target, tl: Timeline) -> set:
    """Graph nodes that stand for a cause (its op, or every event of its message: its
    transfer, arrival and each side's completion; not the launches that post it, which
    a batch shares with other messages)."""
    if target.op is not None:
        return {("S", target.rank, target.index), ("E", target.rank, target.index)}
    key = target.message_key
    return {("T", key), ("A", key), ("DS", key), ("DR", key)}


@dataclass
class Answer:
    """One semantics' answer (see the module docstring); times in the costs' unit."""

    semantics: str
    effect: str
    causes: list[str]
    effect_start: float | None
    counterfactual_start: float | None
    delay: float | None
    makespan: float
    counterfactual_makespan: float
    makespan_delta: float
    binding_wait: dict | None
    chain: list[dict] = field(default_factory=list)
    deadlock: str | None = None
    #: what ``effect_start`` / ``counterfactual_start`` time: an op's "start" or a comm
    #: op's "completion"
    effect_event: str = "start"

    @property
    def delays(self) -> bool:
        return self.delay is not None and self.delay > EPS

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def check_causes(effect: Target, causes: list[Target]) -> None:
    """Raise :class:`ScenarioError` if a cause is the effect itself: the effect's own
    instruction (same rank and index), or, for a comm-op effect, a comm op of the same
    message (freeing a message frees both of its sides, the effect included). Freeing
    the effect says nothing about what delays it."""
    for c in causes:
        if (c.rank, c.index) == (effect.rank, effect.index):
            what = "is the effect itself"
        elif (effect.comm is not None and c.comm is not None
              and c.message_key == effect.message_key):
            what = (f"frees the message of the effect {effect} (freeing a message frees "
                    f"both its send and its recv), so it is the effect itself")
        else:
            continue
        raise ScenarioError(
            f"--cause {c} {what}: a cause must be another instruction than the effect "
            f"(freeing the effect cannot say what delays it); name an op or comm op it "
            f"waits for (see 'schedsim stalls', or the binding wait a query on the op "
            f"after it prints)")


def answer(program: Program, effect: Target, causes: list[Target], costs: CostModel,
           link: LinkModel, comm: CommModel) -> Answer:
    """Answer "do ``causes`` delay ``effect``" under ``comm``'s semantics.

    ``delay = effect time - effect time with the causes free``; ``makespan_delta =
    makespan - makespan with the causes free`` (both >= 0 when freeing helps). A program
    that deadlocks under these semantics is answered with ``deadlock`` set and no delay.
    Raises :class:`ScenarioError` when a cause is the effect's own instruction
    (:func:`check_causes`).
    """
    from schedsim.sim.simulate import simulate

    check_causes(effect, causes)
    event = "start" if effect.op is not None else "completion"
    tl = simulate(program, costs, link, comm, raise_on_deadlock=False)
    names = [str(c) for c in causes]
    if tl.deadlock is not None:
        return Answer(comm.semantics, str(effect), names, None, None, None, tl.makespan,
                      tl.makespan, 0.0, None, [], tl.deadlock.message, event)
    cf = simulate_free(program, costs, link, comm, causes)
    t0, t1 = effect_time(tl, effect), effect_time(cf, effect)
    delay = None if t0 is None or t1 is None else t0 - t1
    chain: list[dict] = []
    G = build_graph(tl, program, link, comm)
    target = (("S", effect.rank, effect.index) if effect.op is not None else
              ("DS" if effect.comm.is_send else "DR", effect.message_key))
    sources = set().union(*(cause_nodes(c, tl) for c in causes)) if causes else set()
    if target in G.time:
        path = G.tight_path(sources & set(G.time), target)
        if path is not None:
            chain = [s.to_dict() for s in condense(G, path)]
    return Answer(comm.semantics, str(effect), names, t0, t1,
                  None if delay is None else (0.0 if abs(delay) < EPS else delay),
                  tl.makespan, cf.makespan,
                  0.0 if abs(tl.makespan - cf.makespan) < EPS else tl.makespan - cf.makespan,
                  binding_wait(tl, effect), chain, None, event)


def explain(a: Answer) -> list[str]:
    """The answer in a few plain sentences (what the CLI prints under the table)."""
    lines = []
    if a.deadlock:
        return [f"{a.semantics}: {a.deadlock}"]
    causes = " + ".join(a.causes)
    if a.effect_start is None:
        lines.append(f"{a.semantics}: {a.effect} did not run")
        return lines
    if a.delay is None:
        lines.append(f"{a.semantics}: with the cause free {a.effect} never happens")
        return lines
    verdict = (f"delays it by {fmt_t(a.delay)}" if a.delays else "does not delay it")
    mk = ("the makespan does not move" if abs(a.makespan_delta) < EPS else
          f"the makespan moves by {fmt_t(a.makespan_delta)} "
          f"({fmt_t(a.counterfactual_makespan)} instead of {fmt_t(a.makespan)})")
    when = "starts at" if a.effect_event == "start" else "completes at"
    lines.append(f"{a.semantics}: {causes} {verdict} ({a.effect} {when} "
                 f"{fmt_t(a.effect_start)}, {fmt_t(a.counterfactual_start)} with the cause "
                 f"free); {mk}.")
    bw = a.binding_wait
    if bw:
        parts = []
        for c in bw["comms"]:
            flag = " <- binding" if c["binding"] else ""
            parts.append(f"{c['comm']} done {fmt_t(c['done'])} (partner {c['partner']} "
                         f"posted {fmt_t(c['partner_posted'])}){flag}")
        what = "its inputs" if bw["kind"] == "DATA" else f"{bw['kind']} at instr {bw['index']}"
        lines.append(f"  blocked on {what} from {fmt_t(bw['reached'])} to "
                     f"{fmt_t(bw['released'])}: " + "; ".join(parts))
    elif a.effect_event == "start":
        lines.append("  not blocked: it started as soon as the previous op ended")
    if a.chain:
        lines.append("  chain: " + " -> ".join(_step_text(s) for s in a.chain))
    else:
        lines.append("  chain: none (no binding dependency links the cause to the effect)")
    return lines


def _step_text(s: dict) -> str:
    if s["kind"] == "op":
        return f"{s['what']}@r{s['rank']} [{fmt_t(s['start'])},{fmt_t(s['end'])}]"
    if s["kind"] == "message":
        return f"msg {s['what']} ({fmt_t(s['end'])})"
    if s["kind"] == "post":
        return f"r{s['rank']} posts {s['what']} ({fmt_t(s['start'])})"
    if s["kind"] == "wait":
        return f"r{s['rank']} {s['what']}#{s['index']} ({fmt_t(s['start'])})"
    return f"{s['what']} ({fmt_t(s['start'])})"

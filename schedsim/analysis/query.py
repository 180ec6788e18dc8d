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

from schedsim.analysis._index import EPS, comm_of, key_label, partner_token
from schedsim.analysis._simulated import simulate_compiled
from schedsim.analysis.critical import condense
from schedsim.analysis.graph import build_graph
from schedsim.analysis.select import Target, select
from schedsim.errors import ScenarioError
from schedsim.program.ir import Program
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.program.vocab import SEMANTICS
from schedsim.timeline import Message, Timeline


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
    rank = target.rank
    spans = [s for s in tl.spans if s.rank == rank]
    span = next((s for s in spans if s.index == target.index), None)
    if span is None:
        return None
    prev_idx = max((s.index for s in spans if s.index < span.index), default=-1)
    cands = [w for w in tl.waits if w.rank == rank and w.end >= span.start - EPS
             and ((w.kind == "DATA" and w.index == span.index)
                  or (w.kind != "DATA" and prev_idx < w.index < span.index))]
    if not cands:
        return None
    w = max(cands, key=lambda w: w.index)
    parsed = [comm_of(tok) for tok in w.comms]
    keys = {key for _, key, _ in parsed}
    msgs = {k: m for m in tl.messages if (k := (m.kind, m.stage, m.mb)) in keys}
    comms = [_member(tok, key, is_send, msgs.get(key), w.end)
             for tok, (_, key, is_send) in zip(w.comms, parsed)]
    return {"rank": w.rank, "index": w.index, "kind": w.kind, "reached": w.start,
            "released": w.end, "comms": comms}


def _member(tok: str, key: tuple, is_send: bool, m: Message | None, released: float
            ) -> dict:
    """One comm op of a binding wait: when it and its partner were posted, when it
    completed, and whether it completed at the release (binding)."""
    done = None if m is None else (m.send_done if is_send else m.recv_done)
    return {"comm": tok, "message": key_label(key),
            "src": None if m is None else m.src, "dst": None if m is None else m.dst,
            "posted": None if m is None else (m.send_posted if is_send else m.recv_posted),
            "partner": partner_token(tok),
            "partner_posted": None if m is None else (m.recv_posted if is_send
                                                      else m.send_posted),
            "done": done, "binding": done is not None and done >= released - EPS}


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
    """One semantics' answer (see the module docstring); times in the costs' unit.

    ``co_causes``: when the causes alone do not delay the effect although they bind it
    (a chain links them), the other binding members of the wait right before the
    effect (tokens with rank and instruction); ``joint_start``/``joint_delay``: the
    effect's time and delay with the causes and those freed together.
    """

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
    co_causes: list[str] = field(default_factory=list)
    joint_start: float | None = None
    joint_delay: float | None = None
    joint_makespan_delta: float | None = None

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


def _snap(x: float | None) -> float | None:
    return None if x is None else (0.0 if abs(x) < EPS else x)


def answer(program: Program, effect: Target, causes: list[Target], costs: CostModel,
           link: LinkModel, comm: CommModel) -> Answer:
    """Answer "do ``causes`` delay ``effect``" under ``comm``'s semantics.

    ``delay = effect time - effect time with the causes free``; ``makespan_delta =
    makespan - makespan with the causes free`` (both >= 0 when freeing helps). When the
    causes bind the effect but do not delay it, the other members that bind the same
    wait are freed with them too (``co_causes``, ``joint_delay``). A program that
    deadlocks under these semantics is answered with ``deadlock`` set and no delay.
    Raises :class:`ScenarioError` when a cause is the effect's own instruction
    (:func:`check_causes`).
    """
    check_causes(effect, causes)
    event = "start" if effect.op is not None else "completion"
    tl, gi = simulate_compiled(program, costs, link, comm)
    names = [str(c) for c in causes]
    if tl.deadlock is not None:
        return Answer(comm.semantics, str(effect), names, None, None, None, tl.makespan,
                      tl.makespan, 0.0, None, [], tl.deadlock.message, event)
    cf = simulate_free(program, costs, link, comm, causes)
    t1, cf_makespan = effect_time(cf, effect), cf.makespan
    del cf        # its objects go before the run's are built (peak memory)
    t0 = effect_time(tl, effect)
    path, G = _binding_chain(tl, program, link, comm, gi, effect, causes)
    del gi
    a = Answer(comm.semantics, str(effect), names, t0, t1,
               _snap(None if t0 is None or t1 is None else t0 - t1), tl.makespan,
               cf_makespan, _snap(tl.makespan - cf_makespan), binding_wait(tl, effect),
               [] if path is None else [s.to_dict() for s in condense(G, path)], None,
               event)
    on_chain = set() if path is None else {
        (m.kind, m.stage, m.mb) for v in path if G.kind(v) in ("T", "A", "DS", "DR")
        for m in (G.message(v),)}
    del G
    if path is not None and not a.delays and t0 is not None:
        co = co_binding(program, a.binding_wait, causes, on_chain)
        if co:
            both = simulate_free(program, costs, link, comm, causes + co)
            tj = effect_time(both, effect)
            a.co_causes = [str(c) for c in co]
            a.joint_start = tj
            a.joint_delay = _snap(None if tj is None else t0 - tj)
            a.joint_makespan_delta = _snap(tl.makespan - both.makespan)
    return a


def _binding_chain(tl: Timeline, program: Program, link: LinkModel, comm: CommModel,
                   gi, effect: Target, causes: list[Target]):
    """``(node path, graph)``: the binding chain from the causes to the effect in the
    run's dependency graph (path None when no binding chain links them)."""
    G = build_graph(tl, program, link, comm, compiled=gi)
    target = G.node_id(("S", effect.rank, effect.index) if effect.op is not None else
                       ("DS" if effect.comm.is_send else "DR", effect.message_key))
    sources = {i for c in causes for v in cause_nodes(c, tl)
               if (i := G.node_id(v)) is not None}
    return (None if target is None else G.tight_path(sources, target)), G


def co_binding(program: Program, bw: dict | None, causes: list[Target],
               on_chain: set) -> list[Target]:
    """The binding members of wait ``bw`` (see :func:`binding_wait`) that the causes do
    not free and that are not how the causes reach the effect (``on_chain``: message
    keys on the causes' binding chain): the other causes that hold the same wait."""
    if bw is None:
        return []
    freed = {c.message_key for c in causes if c.comm is not None} | on_chain
    out = []
    for c in bw["comms"]:
        key = comm_of(c["comm"])[1]
        if not c["binding"] or key in freed:
            continue
        try:
            out.append(select(program, c["comm"]))
        except ScenarioError:        # a wait on an op the program does not post
            continue
        freed.add(key)
    return out

"""A query's answer in words: a headline a person can quote, then the details.

The headline (one or two lines) states the answer for the causes as given: they delay
the effect by d, or they do not; when they bind the effect's wait but another member of
that wait binds it too (:attr:`Answer.co_causes`), it names that member and gives the
delay with both freed. The details name the binding wait, each of its members, and the
chain of binding dependencies from the causes to the effect (long chains elided in the
middle).
"""
from __future__ import annotations

from schedsim.analysis._index import EPS
from schedsim.analysis.query import Answer
from schedsim.util.units import fmt_time, unit_text, with_unit

#: chain steps printed before the middle of a long chain is elided
CHAIN_LIMIT = 12


def _makespan(delta: float | None, before: float, after: float | None = None,
              unit: str = "slot") -> str:
    if delta is None or abs(delta) < EPS:
        return "the makespan does not move"
    after = before - delta if after is None else after
    return (f"the makespan moves by {with_unit(delta, unit)} ({fmt_time(after)} instead of "
            f"{with_unit(before, unit)})")


def _wait_text(bw: dict | None) -> str:
    if bw is None:
        return "wait"
    return "inputs" if bw["kind"] == "DATA" else f"{bw['kind']} (instr {bw['index']})"


def _held_by(a: Answer) -> str:
    """``, held by X on COMMIT (instr 28)``: the binding members of the effect's wait
    (empty when it did not wait)."""
    bw = a.binding_wait
    if not bw:
        return ""
    toks = [c["comm"] for c in bw["comms"] if c["binding"]]
    return f", held by {' + '.join(toks)} on {_wait_text(bw)}" if toks else ""


def _moved(a: Answer, data_start: float | None, unit: str = "slot") -> str:
    """`` (1 later than under data semantics, 11)``: how the effect moved against data
    semantics (what the papers' figures draw); empty under data or when it did not."""
    if data_start is None or a.semantics == "data" or a.effect_start is None:
        return ""
    d = a.effect_start - data_start
    if abs(d) <= EPS:
        return ""
    return (f" ({with_unit(abs(d), unit)} {'later' if d > 0 else 'earlier'} than under "
            f"data semantics, {with_unit(data_start, unit)})")


def headline(a: Answer, data_start: float | None = None, unit: str = "slot") -> list[str]:
    """One or two lines: the answer for the causes as given, and, when another member
    binds the same wait, the delay with both freed. ``data_start``: the effect's time
    under data semantics; when the effect moved against it, the line says by how much
    and, if the cause does not delay it, that the cause is not why it moved. Times with
    their ``unit`` (the costs')."""
    sem, causes = a.semantics, " + ".join(a.causes)
    many = len(a.causes) > 1
    moved = _moved(a, data_start, unit)
    if a.deadlock:
        return [f"{sem}: the program deadlocks, so nothing is delayed by a finite time: "
                f"{a.deadlock}"]
    if a.effect_start is None:
        return [f"{sem}: {a.effect} did not run"]
    if a.delay is None:
        return [f"{sem}: with the cause free {a.effect} never happens"]
    when = "starts" if a.effect_event == "start" else "completes"
    t0 = with_unit(a.effect_start, unit)
    if a.delays:
        verb = "together delay" if many else "delays"
        return [f"{sem}: {causes} {verb} {a.effect} by {with_unit(a.delay, unit)}: it "
                f"{when} at {t0}{moved}, at {with_unit(a.counterfactual_start, unit)} with "
                f"the cause free; "
                f"{_makespan(a.makespan_delta, a.makespan, a.counterfactual_makespan, unit)}."]
    if not a.co_causes:
        verb = "do not delay" if many else "does not delay"
        alone = (f"; the cause{'s' if many else ''} alone {'are' if many else 'is'} not why "
                 f"it moved" if moved else "")
        return [f"{sem}: {causes} {verb} {a.effect}: it {when} at {t0} either way{moved}"
                f"{_held_by(a)}{alone}; {_makespan(a.makespan_delta, a.makespan, unit=unit)}."]
    co = " + ".join(a.co_causes)
    verb = "binds" if len(a.co_causes) == 1 else "bind"
    first = (f"{sem}: {causes} alone {'do' if many else 'does'} not delay {a.effect}, "
             f"which {when} at {t0} either way{moved}: {co} {verb} the same "
             f"{_wait_text(a.binding_wait)} too.")
    both = "both" if len(a.causes) + len(a.co_causes) == 2 else "all"
    if a.joint_delay is not None and a.joint_delay > EPS:
        second = (f"  freeing {both}: delay {with_unit(a.joint_delay, unit)} (it {when} at "
                  f"{with_unit(a.joint_start, unit)} instead of {t0}); "
                  f"{_makespan(a.joint_makespan_delta, a.makespan, unit=unit)}.")
    else:
        second = (f"  freeing {both}: delay {fmt_time(a.joint_delay)}"
                  f"{'' if a.joint_delay is None else ' ' + unit_text(unit, a.joint_delay)}"
                  f" (something else holds it as well)")
    return [first, second]


def details(a: Answer, unit: str = "slot") -> list[str]:
    """The binding wait before the effect and the chain from the causes to it (times in
    ``unit``, stated once a line)."""
    if a.deadlock or a.effect_start is None or a.delay is None:
        return []
    lines = []
    bw = a.binding_wait
    if bw:
        parts = []
        for c in bw["comms"]:
            flag = " <- binding" if c["binding"] else ""
            parts.append(f"{c['comm']} done {fmt_time(c['done'])} (partner {c['partner']} "
                         f"posted {fmt_time(c['partner_posted'])}){flag}")
        what = "its inputs" if bw["kind"] == "DATA" else f"{bw['kind']} at instr {bw['index']}"
        lines.append(f"  blocked on {what} from {fmt_time(bw['reached'])} to "
                     f"{with_unit(bw['released'], unit)}: " + "; ".join(parts))
    elif a.effect_event == "start":
        lines.append("  not blocked: it started as soon as the previous op ended")
    lines.append(chain_text(a.chain, unit=unit))
    return lines


def chain_text(chain: list[dict], limit: int = CHAIN_LIMIT, unit: str = "slot") -> str:
    """``  chain (slots): a -> b -> ...`` (at most ``limit`` steps: the first third, the
    elided count, the rest from the end; its times in ``unit``)."""
    if not chain:
        return "  chain: none (no binding dependency links the cause to the effect)"
    steps = [step_text(s) for s in chain]
    if len(steps) > limit:
        k = limit // 3
        steps = steps[:k] + [f"... {len(steps) - limit} more steps ..."] + \
            steps[-(limit - k):]
    return f"  chain ({unit_text(unit)}): " + " -> ".join(steps)


def explain(a: Answer, unit: str = "slot") -> list[str]:
    """The headline, then the details (what the CLI prints for one semantics)."""
    return headline(a, unit=unit) + details(a, unit)


def step_text(s: dict) -> str:
    """One chain step (a :class:`~schedsim.analysis.critical.PathStep` as a dict) in a few
    characters: ``5W0@r5 [12,13]``, ``msg B mb0 5->4 (12)``, ``r5 COMMIT#28 (12)``."""
    if s["kind"] == "op":
        return f"{s['what']}@r{s['rank']} [{fmt_time(s['start'])},{fmt_time(s['end'])}]"
    if s["kind"] == "message":
        return f"msg {s['what']} ({fmt_time(s['end'])})"
    if s["kind"] == "post":
        return f"r{s['rank']} posts {s['what']} ({fmt_time(s['start'])})"
    if s["kind"] == "wait":
        return f"r{s['rank']} {s['what']}#{s['index']} ({fmt_time(s['start'])})"
    return f"{s['what']} ({fmt_time(s['start'])})"

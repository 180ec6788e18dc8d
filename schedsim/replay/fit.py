"""Calibration from a measured Timeline (a replay or an imported profiler trace): the
costs, link and launch cost that explain it. No torch.

:func:`fit_timeline` reads what a measured run shows and writes it as a cost file (the
format of :mod:`schedsim.replay.calibrate`: ``[costs]``, ``[link]``, ``[comm]``; read with
``schedsim simulate --costs-file``):

- **op costs**: per stage and kind (F, B, W, BW, FB; an FB span counts at its forward
  part's stage), the median of the span durations over microbatches (ms); the global
  F/B/W/BW are the means over the stages that ran the kind. In one step the median:
  a stall (a rank losing the CPU for 10-20 ms inside one op) in one of 4 microbatches
  would be spread over all 4 by the mean, onto the critical path (a GPipe trace
  recorded under contention: +36% with the mean, +9% with the median; the shipped one,
  recorded at real-time priority: -0.4% and -9.2%, docs/traces.md). The durations are kept
  (``durations``): the contended calibration merges several steps with their mean
  (:func:`schedsim.replay.contended.merge_fits`);
- **link** (contended: the run's own messages, moving while both hosts computed),
  fitted by **wait matching** (:func:`wait_matched_latency`): every paired message whose
  receiver waited for it gives one sample, ``(offset, wait)``: ``offset = max(wait
  start - start, 0)``, how far into the message's transfer the receiver began waiting
  (``start``: both sides posted, :class:`~schedsim.timeline.Message`), and ``wait =
  recv_done - max(start, wait start)``, at least 0 (:func:`observed_transfer`; 0 when
  the message was in before the wait began), the time the wait took once the message
  could move. The latency ``L`` per message size is the one under which the simulator,
  which moves a message from its ``start`` and lets the wait go at ``start + L``, gives
  the same summed waits: ``sum(max(L - offset, 0)) = sum(wait)`` (on a run with a
  constant transfer time ``T`` this gives ``T`` exactly); the sizes' latencies are
  fitted with :func:`~schedsim.replay.calibrate.fit_link` (latency, bandwidth; one
  size: latency only). No sample: latency 0. (The mean of the waits, the earlier rule,
  counted a wait that began while its message was already moving as a whole transfer:
  with every other duration exact, 1F1B replays were simulated 6% short; the median of
  the transfers seen with the receiver already waiting, the rule before it, 10-57%: the
  fast ones are the ones seen waiting.)
- **launch cost**: the mean host time of the run's launches (the Timeline's ``posts``:
  one ``isend``/``irecv``/``batch_isend_irecv`` call each; the mean because the
  simulator charges one constant per launch and must get a rank's summed launch time
  right, :mod:`schedsim.replay.calibrate`);
- **host cost** (``[comm] host_cost``, when the program is known): the mean host time
  before an instruction (:func:`host_times`' ``before``, over every instruction of every
  rank): the interpreter's and the profiler's work between the actions, measured in the
  run itself, so contended as the run was. Its samples are heavy-tailed (a rank that
  loses the CPU for 10-20 ms at one instruction): the mean gets each rank's summed host
  time about right, not where the long pauses fall. On the real torch traces of
  ``docs/examples/traces`` (recorded at real-time priority) it is 0.026 - 0.036 ms per
  instruction, 14-18% of the makespan summed over a rank; without it the fitted model
  predicts them 12% and 20% short (traces recorded while other processes ran: 0.3 -
  1.2 ms, 45-51%, 40% short: mostly the ranks waiting for a CPU).

With ``exact``, every op's own measured duration becomes a ``(stage, mb, kind)``
override, every paired message's measured transfer a ``[[link.messages]]`` entry
(:class:`~schedsim.sim.costs.MessageTime`) and every instruction's host time a
``[[comm.host]]`` entry (:class:`~schedsim.sim.costs.HostTime`: the time the host spent
before it since the previous instruction let go, and a launch's own time up to its post),
so that a simulation with the file differs from the measurement only by what the engine's
semantics get wrong. Needs the program (the Timeline's ``program``, or given).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from schedsim.errors import ScenarioError
from schedsim.program.ir import Program
from schedsim.program.tokens import parse_comm
from schedsim.replay.calibrate import fit_link, toml_number
from schedsim.sim.costs import (
    CommModel,
    CostModel,
    CostOverride,
    HostTime,
    LinkModel,
    MessageTime,
    Semantics,
)
from schedsim.timeline import Message, Timeline, effective_posts

_KINDS = ("F", "B", "W", "BW", "FB")


@dataclass
class TimelineFit:
    """What :func:`fit_timeline` found (module docstring); times in ms.

    ``stages``: stage -> kind -> median cost; ``durations``: (stage, kind) -> every
    span's duration; ``samples``: ``[bytes, wait ms, offset ms]`` per usable message
    (:func:`wait_matched_latency`); ``launches``: every launch's host time;
    ``overrides`` and ``transfers`` only with ``exact``.
    """

    unit: str
    stages: dict[int, dict[str, float]]
    message_bytes: float
    samples: list[list[float]]
    launches: list[float]
    exact: bool = False
    overrides: list[CostOverride] = field(default_factory=list)
    transfers: list[MessageTime] = field(default_factory=list)
    host: list[HostTime] = field(default_factory=list)
    source: str = ""
    host_cost: float = 0.0
    #: the link latency fitted elsewhere (the contended calibration's makespan fit,
    #: :func:`schedsim.replay.contended.fit_latency`), replacing the wait-matched one
    latency: float | None = None
    durations: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    #: the launch cost set elsewhere (the contended calibration's median over its steps,
    #: :func:`schedsim.replay.contended.merge_fits`), replacing the launches' mean
    launch: float | None = None

    def link(self) -> tuple[float, float]:
        """``(latency, bandwidth)``: each size's wait-matched latency, fitted (module
        docstring)."""
        by: dict[float, list[tuple[float, float]]] = {}
        for b, w, d in self.samples:
            by.setdefault(b, []).append((w, d))
        lat, bw = fit_link([[b, wait_matched_latency([d for _, d in v],
                                                     sum(w for w, _ in v))]
                            for b, v in sorted(by.items())])
        return (lat if self.latency is None else self.latency), bw

    def launch_cost(self) -> float:
        if self.launch is not None:
            return self.launch
        return statistics.fmean(self.launches) if self.launches else 0.0

    def cost_model(self) -> CostModel:
        kinds = {k: [c[k] for c in self.stages.values() if k in c] for k in _KINDS[:4]}
        top = {k: statistics.fmean(v) for k, v in kinds.items() if v}
        return CostModel(unit=self.unit, message_bytes=self.message_bytes,
                         stage={s: dict(c) for s, c in self.stages.items()},
                         overrides=self.overrides, **top)

    def link_model(self) -> LinkModel:
        lat, bw = self.link()
        return LinkModel(latency=lat, bandwidth=bw, messages=self.transfers)

    def comm_model(self, semantics: Semantics = "rendezvous", **fields: Any) -> CommModel:
        return CommModel(semantics=semantics, launch_cost=self.launch_cost(),
                         host=self.host, host_cost=self.host_cost, **fields)

    def to_toml(self, title: str = "") -> str:
        """The cost file text (module docstring); every number exactly (``repr``), so a
        simulation with the file gives the same timeline as with the models."""
        lines = [f"# schedsim calibrate --from-timeline{' --exact' if self.exact else ''}"
                 + (f": {title}" if title else ""),
                 f"# fitted from a measured timeline{f' ({self.source})' if self.source else ''}"
                 ": op costs = median over microbatches per stage (ms); link = the latency "
                 "that gives the paired messages' receiver waits (wait matching, per size); "
                 "launch cost = mean launch host time; host cost = mean host time before an "
                 "instruction",
                 "", "[costs]", f'unit = "{self.unit}"']
        cm = self.cost_model()
        for k in ("F", "B", "W", "BW"):
            if any(k in c for c in self.stages.values()):
                lines.append(f"{k} = {toml_number(getattr(cm, k))}")
        lines.append(f"message_bytes = {self.message_bytes:.0f}")
        for s in sorted(self.stages):
            lines += ["", f"[costs.stage.{s}]"]
            lines += [f"{k} = {toml_number(v)}" for k, v in self.stages[s].items()]
        for o in self.overrides:
            lines += ["", "[[costs.overrides]]",
                      f'stage = {o.stage}\nmb = {o.mb}\nkind = "{o.kind}"\ncost = {o.cost!r}']
        lat, bw = self.link()
        lines += ["", "[link]", f"latency = {toml_number(lat)}   # ms "
                  f"({len(self.samples)} message samples)"]
        if math.isinf(bw):
            lines.append("# bandwidth: not fitted (one message size): infinite")
        else:
            lines.append(f"bandwidth = {toml_number(bw)}   # bytes per ms")
        for t in self.transfers:
            lines += ["", "[[link.messages]]",
                      f'kind = "{t.kind}"\nstage = {t.stage}\nmb = {t.mb}\ntime = {t.time!r}'
                      + ("" if t.send is None else f"\nsend = {t.send!r}")]
        how = (f"mean of {len(self.launches)}" if self.launch is None else
               f"median of the steps' means; {len(self.launches)} launches")
        lines += ["", "[comm]", f"launch_cost = {toml_number(self.launch_cost())}   # ms "
                  f"per launch ({how})",
                  f"host_cost = {toml_number(self.host_cost)}   # ms before each "
                  "instruction (mean)"]
        for x in self.host:
            lines += ["", "[[comm.host]]", f"rank = {x.rank}\nindex = {x.index}\n"
                      f"before = {x.before!r}" + ("" if x.launch is None else
                                                   f"\nlaunch = {x.launch!r}")]
        return "\n".join(lines) + "\n"


def timeline_program(tl: Timeline) -> Program | None:
    """The Program a measured timeline carries (extra field ``program``), or None."""
    data = getattr(tl, "program", None)
    return Program.model_validate(data) if data else None


def _released(w: Any, msgs: dict[tuple[str, int, int], Message]) -> float:
    """When a measured wait could let go: the latest completion of what it waits for
    (the host's own time from there to the wait's recorded end is host time), or its
    recorded end when a completion is unknown."""
    t = w.start
    for tok in w.comms:
        c = parse_comm(tok)
        m = msgs.get(c.message_key())
        done = None if m is None else (m.send_done if c.is_send else m.recv_done)
        if done is None:
            return w.end
        t = max(t, done)
    return min(t, w.end)


def host_times(tl: Timeline, program: Program) -> list[HostTime]:
    """Per instruction of ``program``, the host time the timeline shows (module
    docstring): ``before`` = its start minus when the previous instruction let the host
    go (a compute's end, a launch's post, a wait's release: the latest completion it
    waited for; 0 for the first: the run's origin), ``launch`` = a launch's post
    (:func:`~schedsim.timeline.effective_posts`) minus its start (without a record of
    the launch in ``posts``: its post minus when the host was free). Instructions without
    a record (a zero-length wait the run did not record) pass the host on unchanged."""
    msgs = {m.key: m for m in tl.messages}
    spans = {(s.rank, s.index): (s.start, s.end) for s in tl.spans}
    waits = {(w.rank, w.index): (w.start, _released(w, msgs)) for w in tl.waits}
    posted = effective_posts(tl.messages)
    launches = {(p["rank"], p["index"]): (p["start"], p["end"])
                for p in getattr(tl, "posts", None) or []}
    out = []
    for r, row in enumerate(program.ranks):
        free = 0.0
        for i in range(len(row) + 1):
            k = (r, i)
            if k in launches:
                a, b = launches[k]
                b = posted.get(k, b)
                out.append(HostTime(rank=r, index=i, before=max(a - free, 0.0),
                                    launch=max(b - a, 0.0)))
            elif k in posted:       # a launch without its own record: host time to its post
                b = posted[k]
                out.append(HostTime(rank=r, index=i, before=0.0, launch=max(b - free, 0.0)))
            elif k in spans or k in waits:
                a, b = spans.get(k) or waits[k]
                out.append(HostTime(rank=r, index=i, before=max(a - free, 0.0)))
            else:
                continue
            free = max(free, b)
    return out


def observed_transfer(m: Message, waiting_since: float | None) -> float | None:
    """How long the receiver's wait for a measured message took once the message could
    move: ``recv_done - max(start, waiting_since)`` (``waiting_since``: when the wait
    covering it began), at least 0; None when a time is unknown or the wait began only
    after the message was done (it did not wait for it; module docstring)."""
    if m.start is None or m.recv_done is None or waiting_since is None:
        return None
    if waiting_since > m.recv_done:
        return None
    return max(m.recv_done - max(m.start, waiting_since), 0.0)


def wait_matched_latency(offsets: list[float], waited: float) -> float:
    """The latency ``L >= 0`` with ``sum(max(L - d, 0) for d in offsets) = waited``: the
    simulator's summed receiver waits equal the measured ones (module docstring).

    ``offsets`` (ms, each >= 0): per message, how far into its transfer the receiver
    began waiting; ``waited``: the measured waits' sum (ms). The left side is continuous,
    piecewise linear and increasing in ``L`` once ``L`` passes the smallest offset, so the
    root is found in one pass over the sorted offsets. 0 without offsets or waits.
    """
    if not offsets or waited <= 0:
        return 0.0
    ds = sorted(offsets)
    acc = 0.0
    for k, d in enumerate(ds):      # on [ds[k], ds[k+1]]: sum over the first k+1 offsets
        acc += d
        lat = (waited + acc) / (k + 1)
        if k + 1 == len(ds) or lat <= ds[k + 1]:
            return lat
    return 0.0      # not reached: the last segment always holds the root


def _recv_wait_starts(tl: Timeline) -> dict[tuple[str, int, int], float]:
    """Message key -> when the receiver's wait covering it began."""
    out: dict[tuple[str, int, int], float] = {}
    for w in tl.waits:
        for tok in w.comms:
            if "RECV" in tok:
                k = parse_comm(tok).message_key()
                out.setdefault(k, w.start)
    return out


def fit_timeline(tl: Timeline, program: Program | None = None, *,
                 exact: bool = False) -> TimelineFit:
    """Fit costs, link and launch cost to a measured timeline (module docstring).

    ``program``: what the run executed (default: the Timeline's ``program``); needed
    with ``exact``. Raises :class:`ScenarioError` for a timeline without spans, or
    ``exact`` without a program.
    """
    if not tl.spans:
        raise ScenarioError("the timeline has no ops: nothing to calibrate from")
    if exact and program is None:
        program = timeline_program(tl)
        if program is None:
            raise ScenarioError("--exact needs the program the timeline ran: the timeline "
                                "carries none (a partial trace?); give --program FILE")
    per: dict[tuple[int, str], list[float]] = {}
    overrides = []
    for s in tl.spans:
        st, mb = (s.parts[0].stage, s.parts[0].mb) if s.parts else (s.stage, s.mb)
        per.setdefault((st, s.kind), []).append(s.duration)
        if exact:
            overrides.append(CostOverride(stage=st, mb=mb, kind=s.kind,
                                          cost=max(s.duration, 0.0)))
    stages: dict[int, dict[str, float]] = {}
    for (st, k), v in sorted(per.items(), key=lambda kv: (kv[0][0], _KINDS.index(kv[0][1]))):
        stages.setdefault(st, {})[k] = statistics.median(v)
    since = _recv_wait_starts(tl)
    samples, transfers = [], []
    for m in tl.messages:
        key = m.key
        w0 = since.get(key)
        if m.start is not None and m.recv_done is not None and w0 is not None:
            samples.append([m.bytes, observed_transfer(m, w0) or 0.0,
                            max(w0 - m.start, 0.0)])
        if exact and m.start is not None and m.arrival is not None:
            send = None if m.send_done is None else max(m.send_done - m.start, 0.0)
            transfers.append(MessageTime(kind=m.kind, stage=m.stage, mb=m.mb,
                                         time=max(m.arrival - m.start, 0.0), send=send))
    sizes = [m.bytes for m in tl.messages if m.bytes]
    posts = getattr(tl, "posts", None) or []
    known = program if program is not None else timeline_program(tl)
    every = host_times(tl, known) if known is not None else []
    host = every if exact else []
    return TimelineFit(unit=tl.unit, stages=stages,
                       message_bytes=statistics.median(sizes) if sizes else 0.0,
                       samples=samples, launches=[p["end"] - p["start"] for p in posts],
                       exact=exact, overrides=overrides, transfers=transfers,
                       host=host, durations=per, host_cost=0.0 if exact or not every else
                       statistics.fmean(h.before for h in every),
                       source=f"{tl.schedule}, {tl.ranks} ranks, {tl.semantics}")

"""From one rank's recognised ranges and P2P calls to the program it ran and its timed
records. No torch.

The program a trace shows (per rank, in time order; rules per executor):

- **schedsim** ranges are the program's instructions themselves;
- **torch runtime** (``PP:``): a ``SEND``/``RECV`` action is one bare post; a compute
  action first waits the recvs it consumes that this rank posted and has not waited
  (``WAIT[...]``, inside the action's range: ``_wait_batch_p2p`` before the compute), the
  rule of :func:`schedsim.program.torch_runtime.runtime_rows`; an ``OVERLAP_F_B`` action
  runs as its two parts in turn (forward, then backward, each after its own recv wait:
  the range is split where the backward's recv completed, else at its first autograd
  node; the forward ends with its last operator before that); at the end every send is
  waited, the last posted first (the runtime pops its ``send_ops``), one ``WAIT`` each;
- **torch single-stage** (``Forward i``/``Backward i``): inside each range, each recv
  call is a bare post of the op's input recv, waited before the compute; each send call
  a bare post of its output send; a send is waited by a ``WAIT`` before the first range
  that starts after its wait returned (``ScheduleGPipe`` waits the forward sends after
  the last forward), or by one at the end, in the order the waits returned.

Times of a compute span: from the end of the waits (and recv calls) inside its range to
the first send call inside it (or the range's end). A wait record of a torch wait runs
from the host being free to the latest completion (work range end) of what it waits for.
P2P calls bind to the comms of their range in order and by direction. A side is posted at
the start of its P2P call (the comm library has the op from then: gloo hands the buffer
to its transport before it builds the work object, and a call can go on for
milliseconds after that: profiler overhead on the first call of a step, a descheduled
host), else at the end of its launch range.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from schedsim.interop.kineto_events import Call, Range, RankEvents
from schedsim.program.ir import Comm, Commit, Compute, Instr, Op, Placement, Post, Wait
from schedsim.program.comm_plan import op_recvs, op_sends
from schedsim.program.ops import launched


@dataclass
class RankRun:
    """One rank's program and timed records (µs on the common clock).

    ``spans``: ``(op, start, end, index)``; ``launches``: ``(index, start, end)``;
    ``waits``: ``(index, kind, start, end, comms)``; ``posted``: comm -> ``(index,
    time)`` (the end of its launch); ``done``: comm -> completion; ``nbytes``: comm ->
    bytes (when recorded); ``loose``: P2P calls outside any range; ``unbound``: calls in a
    range that no comm of the range took.
    """

    instrs: list[Instr] = field(default_factory=list)
    spans: list[tuple[Op, float, float, int]] = field(default_factory=list)
    launches: list[tuple[int, float, float]] = field(default_factory=list)
    waits: list[tuple[int, str, float, float, list[Comm]]] = field(default_factory=list)
    posted: dict[Comm, tuple[int, float]] = field(default_factory=dict)
    done: dict[Comm, float] = field(default_factory=dict)
    nbytes: dict[Comm, float] = field(default_factory=dict)
    loose: int = 0
    unbound: int = 0


def _assign(ranges: list[Range], calls: list[Call]) -> tuple[dict[int, list[Call]], int]:
    """Calls per range position (the innermost launch/compute range holding the call's
    start) and the number of calls in no range."""
    cand = [k for k, rg in enumerate(ranges) if rg.what in ("launch", "compute")]
    starts = [ranges[k].t0 for k in cand]
    longest = max((ranges[k].t1 - ranges[k].t0 for k in cand), default=0.0)
    out: dict[int, list[Call]] = {}
    loose = 0
    for c in calls:
        j = bisect_right(starts, c.t0) - 1
        best = None
        # the latest-starting range that holds the call (an outer range of a nested pair
        # starts earlier: walk back no further than the longest range)
        while j >= 0 and c.t0 - starts[j] <= longest:
            rg = ranges[cand[j]]
            if c.t0 <= rg.t1:
                best = cand[j]
                break
            j -= 1
        if best is None:
            loose += 1
        else:
            out.setdefault(best, []).append(c)
    return out, loose


class _Builder:
    """Walks one rank's ranges in time order (module docstring)."""

    def __init__(self, rank: int, pl: Placement) -> None:
        self.r, self.pl = rank, pl
        self.run = RankRun()
        self.outstanding: list[Comm] = []
        self.since_commit: list[Comm] = []
        self.call_of: dict[Comm, Call] = {}
        self.free = None        # when the host was last free (end of the last instruction)

    @property
    def index(self) -> int:
        return len(self.run.instrs)

    def bind(self, comms: list[Comm], calls: list[Call]) -> None:
        """Give each comm the next unused call of its direction."""
        left = list(calls)
        for c in comms:
            k = next((j for j, x in enumerate(left) if x.is_send == c.is_send), None)
            if k is not None:
                call = left.pop(k)
                self.call_of[c] = call
                if call.nbytes is not None:
                    self.run.nbytes[c] = call.nbytes
        self.run.unbound += len(left)

    def launch(self, ins: Instr, t0: float, t1: float) -> None:
        i = self.index
        self.run.instrs.append(ins)
        self.run.launches.append((i, t0, t1))
        for c in launched(ins):
            call = self.call_of.get(c)
            self.run.posted[c] = (i, t1 if call is None else call.t0)
            self.outstanding.append(c)
            self.since_commit.append(c)
        self.free = t1

    def finish(self, comms: list[Comm], t_end: float) -> None:
        """Mark ``comms`` waited; each completes when its work range ended (else at
        ``t_end``)."""
        for c in comms:
            call = self.call_of.get(c)
            self.run.done[c] = (call.done if call is not None and call.done is not None
                                else t_end)
        gone = set(comms)
        self.outstanding = [c for c in self.outstanding if c not in gone]

    def latest_done(self, comms: list[Comm], t0: float) -> float:
        ds = [self.call_of[c].done for c in comms
              if c in self.call_of and self.call_of[c].done is not None]
        return max([t0, *ds])

    def wait(self, ins: Instr | None, kind: str, comms: list[Comm], t0: float,
             t1: float) -> None:
        i = self.index
        if ins is not None:
            self.run.instrs.append(ins)
        self.run.waits.append((i, kind, t0, t1, list(comms)))
        self.finish(comms, t1)
        self.free = t1

    # -- ranges -------------------------------------------------------------------------
    def schedsim_wait(self, rg: Range) -> None:
        ins = rg.instr
        if ins is None:
            comms, kind = list(self.outstanding), "END"
        elif isinstance(ins, Commit):
            comms, kind = self.since_commit, "COMMIT"
            self.since_commit = []
        else:
            comms, kind = list(ins.comms), "WAIT"
        self.wait(ins, kind, comms, rg.t0, rg.t1)

    def runtime_waits(self) -> None:
        """torch runtime: the end of the step waits every send, the last posted first."""
        for c in [c for c in reversed(self.outstanding) if c.is_send]:
            t0 = self.free if self.free is not None else 0.0
            self.wait(Wait((c,)), "WAIT", [c], t0, self.latest_done([c], t0))

    def overlap(self, rg: Range, ops: list[tuple[float, float, bool]]) -> None:
        """An ``OVERLAP_F_B`` range of the torch runtime: its two parts in turn (module
        docstring)."""
        assert rg.op is not None
        f, b = rg.op.parts
        need_f = [c for c in op_recvs(f, self.r, self.pl) if c in self.outstanding]
        need_b = [c for c in op_recvs(b, self.r, self.pl) if c in self.outstanding]
        start = rg.t0
        if need_f:
            w1 = min(self.latest_done(need_f, start), rg.t1)
            self.wait(Wait(tuple(need_f)), "WAIT", need_f, start, w1)
            start = w1
        inside = [x for x in ops if start <= x[0] and x[1] <= rg.t1]
        cut = self.latest_done(need_b, start) if need_b else None
        if cut is None or cut >= rg.t1:
            cut = next((x[0] for x in inside if x[2]), rg.t1)
        f_end = max([start] + [x[1] for x in inside if x[1] <= cut])
        self.span(f, start, f_end)
        if need_b:
            self.wait(Wait(tuple(need_b)), "WAIT", need_b, f_end, cut)
        self.span(b, cut, rg.t1)

    def span(self, op: Op, start: float, end: float) -> None:
        i = self.index
        self.run.instrs.append(Compute(op))
        self.run.spans.append((op, start, max(start, end), i))
        self.free = max(start, end)

    def compute(self, rg: Range, calls: list[Call]) -> None:
        op, r, pl = rg.op, self.r, self.pl
        assert op is not None
        start, end = rg.t0, rg.t1
        sends: list[Comm] = []
        send_calls: list[Call] = []
        if rg.source == "torch-single":
            recv_calls = [c for c in calls if not c.is_send]
            send_calls = [c for c in calls if c.is_send]
            recvs = op_recvs(op, r, pl)[:len(recv_calls)]
            self.bind(recvs, recv_calls)
            for c, call in zip(recvs, recv_calls):
                self.launch(Post(c), call.t0, call.t1)
                start = max(start, call.t1)
            sends = op_sends(op, r, pl)[:len(send_calls)]
            self.bind(sends, send_calls)
            if send_calls:
                end = min(end, send_calls[0].t0)
        elif rg.source == "torch-runtime" and calls:
            self.run.unbound += len(calls)
        if rg.source != "schedsim":
            need = [c for c in op_recvs(op, r, pl) if c in self.outstanding]
            if need:
                w1 = min(self.latest_done(need, start), rg.t1)
                self.wait(Wait(tuple(need)), "WAIT", need, start, w1)
                start = w1
        self.span(op, start, end)
        for c, call in zip(sends, send_calls):
            self.launch(Post(c), call.t0, call.t1)
        self.free = max(self.free, rg.t1)

    def single_waits(self, before: float) -> None:
        """torch single-stage: a send whose wait returned before ``before`` is waited by
        a ``WAIT`` here, in the order the waits returned."""
        due = sorted((self.call_of[c].done, k, c) for k, c in enumerate(self.outstanding)
                     if c.is_send and c in self.call_of and self.call_of[c].done is not None
                     and self.call_of[c].done <= before)
        for done, _, c in due:
            t0 = self.free if self.free is not None else done
            self.wait(Wait((c,)), "WAIT", [c], min(t0, done), done)


def build_rank(ev: RankEvents, rank: int, pl: Placement) -> RankRun:
    """The program and timed records of one rank (module docstring)."""
    b = _Builder(rank, pl)
    by_range, b.run.loose = _assign(ev.ranges, ev.calls)
    single = runtime = False
    for k, rg in enumerate(ev.ranges):
        if rg.what == "bookkeeping":
            continue
        single = single or rg.source == "torch-single"
        runtime = runtime or rg.source == "torch-runtime"
        if single:
            b.single_waits(rg.t0)
        calls = by_range.get(k, [])
        if rg.what == "launch":
            b.bind(list(launched(rg.instr)), calls)
            b.launch(rg.instr, rg.t0, rg.t1)
        elif rg.what == "wait":
            b.schedsim_wait(rg)
        elif rg.source == "torch-runtime" and rg.op is not None and rg.op.kind == "FB":
            b.run.unbound += len(calls)
            b.overlap(rg, ev.ops)
        else:
            b.compute(rg, calls)
    if single:
        b.single_waits(float("inf"))
    if runtime:
        b.runtime_waits()
    if b.outstanding:       # the implicit END: everything still outstanding
        t0 = b.free if b.free is not None else 0.0
        b.wait(None, "END", list(b.outstanding), t0, b.latest_done(b.outstanding, t0))
    return b.run


def summary(runs: dict[int, RankRun]) -> dict[str, Any]:
    """Counts for the import's notes: launches, P2P calls bound / unbound / loose."""
    return {"launches": sum(len(x.launches) for x in runs.values()),
            "unbound_calls": sum(x.unbound for x in runs.values()),
            "loose_calls": sum(x.loose for x in runs.values())}

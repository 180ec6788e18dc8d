"""Clocks of the replay and assembly of the measured :class:`~schedsim.timeline.Timeline`.

- CPU: ``time.perf_counter_ns`` (``CLOCK_MONOTONIC`` on Linux: one clock for every
  process of a host, so ranks on one host need no alignment).
- GPU: a CUDA event is recorded on the current stream at every stamp and resolved after
  the step as ``host time of a base event + elapsed_time(base, event)``, so compute spans
  are GPU execution times and comm waits end when the stream got its data.
- Several hosts: each rank's offset to rank 0's clock is estimated by ping-pong with rank
  0 (Cristian's algorithm: ``offset = t_rank0 - (t_send + t_recv) / 2`` from the round
  trip with the smallest delay, error at most half that round trip).

Measured Timeline: times in milliseconds from the earliest rank's start of the step
(each rank's first stamp after the start barrier); ``source = "measured"``,
``semantics`` = the backend. Spans are compute instructions (``index`` = instruction
position, as in the simulator). Messages carry ``send_posted``/``recv_posted`` (the end
of the post run that launched each side, as the simulator's post time is the end of the
launch: :class:`~schedsim.timeline.Message`), ``send_done``/``recv_done`` (when the
``wait()`` of that op returned, inside the covering wait instruction) and the indices;
``start``/``arrival`` are not observable and are set by the builder's rule (both sides
posted / receiver done: :class:`~schedsim.timeline.Message`). ``waits`` has one record per
``COMMIT``/``WAIT``/``END`` instruction, whatever its length. Extra fields: ``posts``
lists each launch (``{rank, index, last_index, start, end}``: the host time spent in its
``isend``/``irecv``/``batch_isend_irecv`` call, which the simulator charges as
``launch_cost``) and ``program`` the Program JSON that ran.
"""
from __future__ import annotations

import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from schedsim.program.ir import Program
from schedsim.program.routing import route
from schedsim.program.tokens import parse_comm
from schedsim.timeline import Message, Timeline, WaitRecord
from schedsim.timeline_build import SpanColumns, TimelineHeader, timeline_from_columns


class Clock:
    """Stamps on ``device``'s timeline; :meth:`resolve` turns a stamp into host ns."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.base_ev = torch.cuda.Event(enable_timing=True)
            self.base_ev.record()
            torch.cuda.synchronize(self.device)
            self.base_ns = time.perf_counter_ns()

    def stamp(self) -> Any:
        """Now (CPU: an int of ns; GPU: a recorded CUDA event)."""
        if not self.cuda:
            return time.perf_counter_ns()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, st: Any) -> int:
        """Host-clock ns of a stamp (GPU: call after :meth:`sync`)."""
        if not self.cuda:
            return int(st)
        return self.base_ns + int(round(self.base_ev.elapsed_time(st) * 1e6))

    def sync(self) -> None:
        """Wait until every stamped event has happened (no-op on CPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)


def resolve_records(rec: dict[str, Any], clock: Clock, offset_ns: int) -> dict[str, Any]:
    """Records of :meth:`RankExecutor.step` with every stamp as int ns on rank 0's clock."""
    clock.sync()
    r = clock.resolve

    def f(x: Any) -> int:
        return r(x) + offset_ns

    return {
        "spans": [(i, f(a), f(b)) for i, a, b in rec["spans"]],
        "posts": [(i, j, f(a), f(b)) for i, j, a, b in rec["posts"]],
        "waits": [(i, k, f(a), f(b), c) for i, k, a, b, c in rec["waits"]],
        "comm_post": {k: (i, f(t)) for k, (i, t) in rec["comm_post"].items()},
        "comm_done": {k: f(t) for k, t in rec["comm_done"].items()},
        "comm_bytes": dict(rec["comm_bytes"]),
        "begin": f(rec["begin"]),
    }


def same_host(group: Any = None) -> bool:
    """True if every rank of the group runs on this host (hostnames gathered)."""
    names: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, socket.gethostname(), group=group)
    return len(set(names)) == 1


def estimate_offsets(rounds: int = 8, group: Any = None, device: Any = "cpu") -> int:
    """This rank's offset (ns) to add to its ``perf_counter_ns`` to get rank 0's.

    Collective: every rank must call it. Rank 0 answers ``rounds`` pings from each other
    rank in turn; a rank keeps the sample with the smallest round trip (Cristian 1989).
    Rank 0 returns 0.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                dist.recv(buf, peer, group=group)
                buf.fill_(time.perf_counter_ns())
                dist.send(buf, peer, group=group)
        return 0
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        t1 = time.perf_counter_ns()
        buf.fill_(t1)
        dist.send(buf, 0, group=group)
        dist.recv(buf, 0, group=group)
        t2 = time.perf_counter_ns()
        rtt, off = t2 - t1, int(buf.item()) - (t1 + t2) // 2
        if best is None or rtt < best[0]:
            best = (rtt, off)
    assert best is not None
    return best[1]


def measured_timeline(program: Program, records: list[dict[str, Any]], *,
                      backend: str, **extra: Any) -> Timeline:
    """Assemble the measured Timeline from every rank's resolved records (rank order),
    with the one builder :func:`schedsim.timeline_build.timeline_from_columns`.

    ``extra`` fields (``world_size``, ``grad_check``, ...) are added to the Timeline, as
    are ``backend``, ``posts`` (module docstring) and ``program`` (the Program JSON, so
    that analyses of the saved timeline find the program it ran).
    """
    origin = min(rec["begin"] for rec in records)

    def ms(t: int | None) -> float | None:
        return None if t is None else (t - origin) / 1e6

    cols: tuple[list, ...] = ([], [], [], [], [])
    waits: list[WaitRecord] = []
    posts: list[dict[str, Any]] = []
    msgs: dict[tuple[str, int, int], Message] = {}
    rank_of = program.placement.rank_fn()
    for r, rec in enumerate(records):
        row = program.ranks[r]
        for i, t0, t1 in rec["spans"]:
            for col, v in zip(cols, (r, row[i].op, ms(t0), ms(t1), i)):
                col.append(v)
        for i, j, t0, t1 in rec["posts"]:
            posts.append({"rank": r, "index": i, "last_index": j, "start": ms(t0),
                          "end": ms(t1)})
        for i, kind, t0, t1, comms in rec["waits"]:
            waits.append(WaitRecord(r, i, kind, ms(t0), ms(t1), list(comms)))
        for tok, (i, tp) in rec["comm_post"].items():
            c = parse_comm(tok)
            key = c.message_key()
            m = msgs.get(key)
            if m is None:
                m = msgs[key] = Message(key[0], *route(key, rank_of), key[2], key[1],
                                        float(rec["comm_bytes"][tok]))
            done = ms(rec["comm_done"].get(tok))
            if c.is_send:
                m.send_posted, m.send_done, m.send_index = ms(tp), done, i
            else:
                m.recv_posted, m.recv_done, m.recv_index = ms(tp), done, i
    head = TimelineHeader(program.placement, program.name, program.microbatches, backend,
                          "ms", "measured", params=dict(program.params))
    return timeline_from_columns(
        head, SpanColumns(*cols), sorted(msgs.values(), key=lambda m: (m.src, m.send_index)),
        waits, order="rank-start", backend=backend, posts=posts,
        program=program.model_dump(mode="json"), **extra)

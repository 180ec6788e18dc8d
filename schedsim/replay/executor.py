"""One rank's program run for real: :class:`RankExecutor`.

Instruction mapping (DESIGN.md, "Executors share the program"):

- a bare post (``1SEND_F0``) is one ``dist.isend``/``dist.irecv`` call; a
  ``BATCH[a+b+...]`` is one ``torch.distributed.batch_isend_irecv`` call of one ``P2POp``
  per op, in the order listed — the simulator (:mod:`schedsim.sim.engine`) likewise treats
  each as one launch. On gloo the batch is a loop of ``isend``/``irecv`` (one ``Work``
  each); on NCCL it is coalesced (the batch's works cover all its ops, and waiting for one
  op waits for the batch). Tag 0 everywhere: P2P ops match per directed link in posting
  order, as in the simulator;
- ``COMMIT`` waits for every op posted since the previous ``COMMIT`` (DualPipe's
  ``batch_isend_irecv`` + ``wait()``); ``WAIT[...]`` waits for the named ops; the implicit
  ``END`` waits for everything still outstanding;
- compute ops run the rank's model chunks (:mod:`schedsim.replay.stage_modules`): ``F`` the
  forward (plus the loss on the last stage), ``B`` the input gradient with the weight
  gradient deferred, ``W`` the deferred weight gradient, ``BW`` both, ``FB`` its forward
  part then its backward part (sequentially).

Where an input comes from: stage 0's forward reads the microbatch, the last stage's
backward seeds ``1/M`` into its loss; any other input is the received message with that
key if the rank posted a recv for it, else the local output of the neighbouring stage
(the V placement's turn on the last rank, or two adjacent stages on one rank).

Every wait has a deadline: ``Work.wait(timeout)`` with the time left, so a rank whose peer
died or hangs raises :class:`RankFailure` naming its instruction instead of hanging.
"""
from __future__ import annotations

import re
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from schedsim.program.ir import Batch, Comm, Commit, Compute, Op, Post, Program
from schedsim.program.tokens import format_instr
from schedsim.replay.config import Fault, ReplayConfig
from schedsim.replay.timing import Clock
from schedsim.replay.stage_modules import (
    DTYPES,
    WEIGHT_GRADS,
    build_stage,
    loss_fn,
    microbatch_input,
    microbatch_target,
)


class RankFailure(RuntimeError):
    """A rank could not go on. ``origin`` is True when this rank caused the failure (an
    exception in its own work) and False when it only saw a peer fail or timed out."""

    def __init__(self, message: str, origin: bool) -> None:
        super().__init__(message)
        self.origin = origin


class InjectedFault(RuntimeError):
    """The fault asked for with ``--inject-fault`` (testing aid)."""


class RankExecutor:
    """Runs rank ``rank``'s instruction list of ``program`` on torch.distributed.

    Holds one :class:`~schedsim.replay.stage_modules.StageModule` per (stage, direction) the
    rank computes — DualPipe's ``dual`` placement gives a rank two copies of stage
    parameters, one per direction — built on ``device`` from the shared seed. ``step()``
    runs the program once and returns the raw timing records; ``grads()``/``losses``
    give the results. ``group`` is the process group (default: the world).
    """

    def __init__(self, program: Program, rank: int, cfg: ReplayConfig,
                 device: torch.device | str = "cpu", clock: Clock | None = None,
                 group: Any = None, profile: bool = False, tp: Any = None) -> None:
        self.program = program
        self.rank = rank
        self.cfg = cfg
        self.device = torch.device(device)
        self.group = group
        self.clock = clock or Clock(self.device)
        self.profile = profile
        pl = program.placement
        self.pl = pl
        self.S, self.M = pl.stages, program.microbatches
        self.rank_of = pl.rank_fn()
        self.row = program.ranks[rank]
        self.tokens = [format_instr(i) for i in self.row] + ["END"]
        atoms = [a for i in self.row if type(i) is Compute for a in i.op.atoms()]
        keys = sorted({self.key(a.stage, a.mb) for a in atoms})
        # tensor-parallel stages (``tp``: a TPContext): this process is TP rank tp.rank of
        # pipeline rank ``rank``; its P2P peers are the same TP rank of the other stages
        self.tp = tp
        if tp is None:
            self.modules = {k: build_stage(cfg, k[0], self.device) for k in keys}
        else:
            from schedsim.replay.tensor_parallel import build_tp_stage

            self.modules = {k: build_tp_stage(cfg, k[0], tp, self.device) for k in keys}
        self._index = -1
        self.dtype = DTYPES[cfg.dtype]
        #: where P2P tensors live: the device, or the host when the backend (gloo) cannot
        #: move device tensors (copied there before a send, back after a recv's wait)
        self.wire = (torch.device("cpu") if self.device.type == "cuda"
                     and cfg.backend == "gloo" else self.device)
        self.scale = torch.tensor(1.0 / self.M, dtype=self.dtype, device=self.device)
        self.data = {a.mb: microbatch_input(cfg, a.mb, self.device)
                     for a in atoms if a.kind == "F" and a.stage == 0}
        self.targets = {a.mb: microbatch_target(cfg, a.mb, self.device)
                        for a in atoms if a.kind == "F" and a.stage == self.S - 1}
        self.losses: dict[int, float] = {}
        self._dispatch: dict[str, Callable[[Op], None]] = {
            "F": self._forward, "B": self._backward, "BW": self._backward,
            "W": self._weight}

    def key(self, stage: int, mb: int) -> tuple[int, int]:
        """Module key of (stage, mb): ``(stage, direction)``."""
        return (stage, self.pl.direction(mb))

    # -- results --------------------------------------------------------------------
    def grads(self) -> dict[tuple[int, int], list[torch.Tensor]]:
        """Parameter gradients per module key, ``named_parameters`` order (zeros if
        a parameter got none)."""
        return {k: [p.grad if p.grad is not None else torch.zeros_like(p)
                    for p in m.parameters()] for k, m in self.modules.items()}

    def zero_grad(self) -> None:
        for m in self.modules.values():
            for p in m.parameters():
                p.grad = None

    # -- compute --------------------------------------------------------------------
    def _forward(self, op: Op) -> None:
        s, mb = op.stage, op.mb
        if s == 0:
            x = self.data[mb]
        else:
            buf = self.recvd.pop(("F", s - 1, mb), None)
            x = buf if buf is not None else self.acts.pop((s - 1, mb))
            x.requires_grad_(True)
        out = self.modules[self.key(s, mb)](x)
        self.inputs[(s, mb)] = x
        if s == self.S - 1:
            loss = loss_fn(out, self.targets[mb])
            self.outputs[(s, mb)] = loss
            self.loss_t[mb] = loss
        else:
            self.outputs[(s, mb)] = out
            self.acts[(s, mb)] = out.detach()

    def _backward(self, op: Op) -> None:
        s, mb = op.stage, op.mb
        out = self.outputs.pop((s, mb))
        if s == self.S - 1:
            g = self.scale
        else:
            g = self.recvd.pop(("B", s + 1, mb), None)
            if g is None:
                g = self.in_grads.pop((s + 1, mb))
        if op.kind == "B":
            with WEIGHT_GRADS.capture() as fns:
                torch.autograd.backward(out, g)
            self.deferred[(self.key(s, mb), mb)] = fns
        else:
            torch.autograd.backward(out, g)
        x = self.inputs.pop((s, mb))
        if s > 0:
            self.in_grads[(s, mb)] = x.grad

    def _weight(self, op: Op) -> None:
        for fn in self.deferred.pop((self.key(op.stage, op.mb), op.mb)):
            fn()

    def _compute(self, op: Op) -> None:
        for a in op.atoms():
            if self.tp is not None:
                self.tp.log.at(self._index, a.kind, a.stage, a.mb)
            self._dispatch[a.kind](a)

    def _peer(self, pp_rank: int) -> int:
        """Global rank of ``pp_rank``'s process that holds this process's TP rank."""
        return pp_rank if self.tp is None else pp_rank * self.tp.size + self.tp.rank

    # -- comm -----------------------------------------------------------------------
    def _p2p(self, c: Comm) -> tuple[Any, Any, tuple[str, int, int]]:
        """(P2POp, tensor, message key) of a post."""
        k = c.kind
        s, mb = c.stage, c.mb
        if k.endswith("S"):         # a shape message (Megatron's _communicate_shapes)
            peer = self.rank_of(s + 1 if k[-2] == "F" else s - 1, mb) if c.is_send else \
                self.rank_of(s - 1 if k[-2] == "F" else s + 1, mb)
            if c.is_send:
                t, op = torch.tensor(list(self.cfg.activation_shape), dtype=torch.int64,
                                     device=self.wire), dist.isend
            else:
                t, op = torch.empty(len(self.cfg.activation_shape), dtype=torch.int64,
                                    device=self.wire), dist.irecv
        elif k == "SEND_F":
            t, peer, op = self.acts.pop((s, mb)).contiguous(), self.rank_of(s + 1, mb), \
                dist.isend
        elif k == "SEND_B":
            t, peer, op = self.in_grads.pop((s, mb)).contiguous(), self.rank_of(s - 1, mb), \
                dist.isend
        else:
            t = torch.empty(self.cfg.activation_shape, dtype=self.dtype, device=self.wire)
            peer = self.rank_of(s - 1 if k == "RECV_F" else s + 1, mb)
            op = dist.irecv
        if op is dist.isend and t.device != self.wire:
            t = t.to(self.wire)
        return dist.P2POp(op, t, self._peer(peer), self.group), t, c.message_key()

    def _launch(self, comms: list[Comm], batch: bool) -> None:
        """Launch ``comms``: one ``batch_isend_irecv`` if ``batch``, else (one op) a bare
        ``isend``/``irecv``."""
        ops = [self._p2p(c) for c in comms]
        if batch:
            works = dist.batch_isend_irecv([o[0] for o in ops])
        else:
            p2p = ops[0][0]
            works = [p2p.op(p2p.tensor, p2p.peer, group=p2p.group, tag=p2p.tag)]
        per_op = len(works) == len(ops)
        for j, (c, (_, t, key)) in enumerate(zip(comms, ops)):
            self.works[c] = [works[j]] if per_op else list(works)
            self.tensors[c] = (t, key)
            self.pending.append(c)
            self.since_commit.append(c)

    def _wait(self, comms: list[Comm], index: int) -> dict[Comm, Any]:
        """Wait for ``comms`` in order; returns a clock stamp per comm taken when its own
        ``wait()`` returned (its completion as this host saw it; comms already waited
        are left out)."""
        done: dict[Comm, Any] = {}
        stamp = self.clock.stamp
        for c in comms:
            ws = self.works.pop(c, None)
            if ws is None:      # already waited (a batch-wide work on NCCL, or twice)
                continue
            for w in ws:
                left = self.deadline - time.time()
                try:
                    if left <= 0:
                        raise RuntimeError("Timed out: the run's deadline has passed")
                    w.wait(timeout=timedelta(seconds=left))
                except RuntimeError as e:
                    what = "timed out" if "Timed out" in str(e) else "comm failed"
                    why = re.sub(r"^\[[^\]]*\]\s*", "", str(e).splitlines()[0])[:300]
                    raise RankFailure(
                        f"rank {self.rank} {what} at instr {index} ({self.tokens[index]}) "
                        f"waiting for {c}: {why}", False) from None
            done[c] = stamp()
            t, key = self.tensors.pop(c)
            if not c.is_send:
                self.recvd[key] = t if t.device == self.device else t.to(self.device)
        return done

    # -- the step -------------------------------------------------------------------
    def step(self, deadline: float | None = None, fault: Fault | None = None
             ) -> dict[str, Any]:
        """Run the program once. Returns the raw records (stamps are the clock's).

        ``{"spans": [(index, t0, t1)], "posts": [(first index, last index, t0, t1)],
        "waits": [(index, kind, t0, t1, [tokens])], "comm_post": {token: (index, t)},
        "comm_done": {token: t}, "comm_bytes": {token: bytes}, "begin": t}``; a comm's
        done time is when its own ``wait()`` returned (inside the covering wait); a
        post's ``t`` is the end of the launch (bare post or batch) that holds it (the
        simulator's post time is likewise the end of the launch:
        :class:`~schedsim.timeline.Message`).
        Raises :class:`RankFailure` (or :class:`InjectedFault`).
        """
        self.deadline = deadline if deadline is not None else time.time() + self.cfg.timeout
        self._reset_step()
        row = self.row
        n = len(row)
        fault_at = fault.index if fault is not None and fault.rank == self.rank else -1
        rec = _StepRecords(begin=self.clock.stamp())
        for i in range(n + 1):
            if i == fault_at:
                self._inject(fault, i)   # type: ignore[arg-type]
            if i == n:                     # END: everything still outstanding
                comms = [c for c in self.pending if c in self.works]
                if comms:
                    self._run_wait(rec, n, comms, "END")
                break
            ins = row[i]
            t = type(ins)
            if t is Compute:
                self._run_compute(rec, i, ins.op)
            elif t is Post or t is Batch:
                self._run_launch(rec, i, [ins.comm] if t is Post else list(ins.comms),
                                 t is Batch)
            elif t is Commit:
                comms, self.since_commit = self.since_commit, []
                self._run_wait(rec, i, comms, "COMMIT")
            else:
                self._run_wait(rec, i, list(ins.comms), "WAIT")
        self.losses = {mb: float(v.detach()) for mb, v in self.loss_t.items()}
        leftover = [k for k, v in self.deferred.items() if v]
        if leftover:
            raise RankFailure(f"rank {self.rank}: program ended with weight gradients of "
                              f"{len(leftover)} B op(s) never run by a W", True)
        out = rec.as_dict()
        if self.tp is not None:       # TP collectives: (index, ..., t0, t1, bytes)
            out["collectives"] = self.tp.log.drain()
        return out

    def _reset_step(self) -> None:
        """Empty the per-step state: activations, gradients, received tensors, deferred
        weight gradients, losses and the outstanding comm ops."""
        self.inputs: dict = {}
        self.outputs: dict = {}
        self.acts: dict = {}
        self.in_grads: dict = {}
        self.recvd: dict = {}
        self.deferred: dict = {}
        self.loss_t: dict[int, torch.Tensor] = {}
        self.works: dict[Comm, list] = {}
        self.tensors: dict[Comm, tuple] = {}
        self.pending: list[Comm] = []
        self.since_commit: list[Comm] = []

    def _profiled(self, i: int) -> Any:
        """The profiler range of instruction ``i`` (``schedsim:<token>``; ``END`` at the
        end of the row), or no context when not profiling."""
        return _record("schedsim:" + self.tokens[i]) if self.profile else nullcontext()

    def _run_compute(self, rec: _StepRecords, i: int, op: Op) -> None:
        """Run compute instruction ``i`` and record its span."""
        stamp = self.clock.stamp
        self._index = i
        t0 = stamp()
        with self._profiled(i):
            self._compute(op)
        rec.spans.append((i, t0, stamp()))

    def _run_launch(self, rec: _StepRecords, i: int, comms: list[Comm],
                    batch: bool) -> None:
        """Launch instruction ``i`` (a bare post or a batch) and record it: the launch's
        span, and per comm its post time (the end of the launch) and its bytes."""
        stamp = self.clock.stamp
        t0 = stamp()
        with self._profiled(i):
            self._launch(comms, batch)
        t1 = stamp()
        rec.posts.append((i, i, t0, t1))
        for c in comms:
            tok = rec.tok_of[c] = str(c)
            rec.comm_post[tok] = (i, t1)    # posted = the launch has ended
            tt = self.tensors[c][0]
            rec.comm_bytes[tok] = tt.numel() * tt.element_size()

    def _run_wait(self, rec: _StepRecords, i: int, comms: list[Comm], kind: str) -> None:
        """Run blocking instruction ``i`` (``COMMIT``, ``WAIT`` or ``END``) and record
        the wait and each comm's first completion stamp."""
        stamp = self.clock.stamp
        t0 = stamp()
        with self._profiled(i):
            got = self._wait(comms, i)
        t1 = stamp()
        tok_of = rec.tok_of
        rec.waits.append((i, kind, t0, t1, [tok_of.get(c) or str(c) for c in comms]))
        for c, td in got.items():
            rec.comm_done.setdefault(tok_of.get(c) or str(c), td)

    def _inject(self, fault: Fault, i: int) -> None:
        tok = self.tokens[i]
        if fault.kind == "hang":
            while True:            # until the launcher kills this process
                time.sleep(1.0)
        raise InjectedFault(f"injected fault at instr {i} ({tok})")


@dataclass
class _StepRecords:
    """The raw records of one :meth:`RankExecutor.step` (the layout is in its
    docstring); ``tok_of`` is each launched comm's token."""

    begin: Any
    spans: list[tuple] = field(default_factory=list)
    posts: list[tuple] = field(default_factory=list)
    waits: list[tuple] = field(default_factory=list)
    comm_post: dict[str, tuple[int, Any]] = field(default_factory=dict)
    comm_done: dict[str, Any] = field(default_factory=dict)
    comm_bytes: dict[str, int] = field(default_factory=dict)
    tok_of: dict[Comm, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"spans": self.spans, "posts": self.posts, "waits": self.waits,
                "comm_post": self.comm_post, "comm_done": self.comm_done,
                "comm_bytes": self.comm_bytes, "begin": self.begin}


def _record(name: str) -> Any:
    from torch.profiler import record_function

    return record_function(name)

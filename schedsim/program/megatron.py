"""The ``megatron`` comm policy: Megatron-LM's pipeline P2P, call for call.

Source: NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``,
``forward_backward_pipelining_with_interleaving``, ``get_schedule_table``,
``get_pp_rank_microbatches``) and ``megatron/core/pipeline_parallel/p2p_communication.py``
(``P2PCommunicator._communicate``, ``_batched_p2p_ops``, ``_p2p_ops``).

Megatron moves activations and gradients with combined calls (``recv_forward``,
``send_forward_recv_backward``, ``send_backward_recv_forward``, ...; the interleaved
schedule's ``send_forward_recv_forward``, ``send_backward_recv_backward`` and
``send_forward_backward_recv_forward_backward``). Each is one ``_communicate``:

- ``batch_p2p_comm`` (Megatron's default): one ``batch_isend_irecv`` of the call's ops in
  ``_batched_p2p_ops`` order -- send to the previous rank, recv from the previous rank,
  send to the next rank, recv from the next rank -- written ``BATCH[...]`` (a single op
  too: it still goes through ``batch_isend_irecv``), then every op waited at once;
- unbatched: ``_p2p_ops`` launches each op on its own, even ranks in the order send-next,
  recv-prev, send-prev, recv-next and odd ranks recv-prev, send-next, recv-next,
  send-prev (so that neighbours always pair a send with a recv), then waits all of them;
- ``overlap_p2p_comm`` (interleaved only, unbatched): the steady state's calls return
  their handles instead of waiting: each recv is waited by the forward or backward that
  consumes it (``pp_pre_forward``/``pp_pre_backward`` pop the oldest recv handle), each
  send when the next send in the same direction has been launched; the warmup and
  cooldown calls still wait at once.

A call with nothing to move launches nothing (the first stage's ``recv_forward``, the last
stage's ``send_forward``). The policy runs Megatron's own compute order -- the 1F1B order
of ``1f1b`` (one stage per rank) or the table-driven interleaved order of
``interleaved-1f1b --variant megatron`` (its microbatch group size N is read off the
schedule) -- and refuses any other order, naming the first op that differs. Sends still
pending when the step ends are waited by the program's implicit end.
"""
from __future__ import annotations

from collections import deque

from schedsim.errors import ScheduleError
from schedsim.program.ir import Batch, Comm, Compute, Instr, Op, Post, Program, Schedule, Wait
from schedsim.program.lowering import has_backward, op_recvs, op_sends, program_of

_SOURCE = "megatron/core/pipeline_parallel/schedules.py"


# -- Megatron's interleaved order: one home for its rules ------------------------------
def megatron_group_size(ranks: int, microbatches: int, group_size: int | None) -> int:
    """Check Megatron-LM's rules on ``microbatch_group_size_per_vp_stage`` N; return N.

    Megatron needs ``p >= 2`` (with one rank it runs no pipeline schedule),
    ``p <= N <= m`` (a group must hold at least p microbatches to fill the pipeline before
    the next model chunk starts, and cannot hold more than exist) and ``m % N == 0`` or
    ``m % N >= p`` (a short last group leaves dependency bubbles, which Megatron refuses).
    Raises :class:`ScheduleError` naming the broken rule.
    """
    p, m = ranks, microbatches
    name = "interleaved-1f1b --variant megatron"
    if p < 2:
        raise ScheduleError(f"{name}: needs ranks >= 2 (Megatron-LM runs no pipeline "
                            f"schedule, interleaved or not, on one pipeline rank)")
    n = p if group_size is None else group_size
    if not isinstance(n, int) or isinstance(n, bool):
        raise ScheduleError(f"{name}: group_size must be an integer (got {n!r})")
    if m < p:
        raise ScheduleError(
            f"{name}: impossible with {m} microbatches on {p} ranks: Megatron needs "
            f"p <= N <= m for N = microbatch_group_size_per_vp_stage (each group of N "
            f"consecutive microbatches must fill the {p}-rank pipeline before the next "
            f"model chunk starts), so it needs m >= p = {p}")
    if not p <= n <= m:
        raise ScheduleError(
            f"{name}: group_size N = {n} must lie in [p, m] = [{p}, {m}] (Megatron's "
            f"microbatch_group_size_per_vp_stage: a group of N microbatches fills the "
            f"pipeline only if N >= p, and cannot exceed the {m} microbatches)")
    if 0 < m % n < p:
        ok = [k for k in range(p, m + 1) if m % k == 0 or m % k >= p]
        raise ScheduleError(
            f"{name}: the last microbatch group would hold m % N = {m} % {n} = {m % n} "
            f"microbatches, fewer than p = {p}; Megatron requires m % N == 0 or >= p "
            f"(a short group leaves dependency bubbles); valid group_size for m = {m}: "
            f"{', '.join(map(str, ok))}")
    return n


def megatron_schedule_table(microbatches: int, chunks: int,
                            group_size: int) -> list[tuple[int, int]]:
    """Megatron-LM's ``get_schedule_table``: virtual microbatch k -> (microbatch, chunk).

    Microbatches go in groups of ``group_size``; each group visits chunk 0, 1, ... in
    turn; the last group (the first one reaching ``microbatches``) takes all the rest.
    """
    table: list[tuple[int, int]] = []
    for start in range(0, microbatches, group_size):
        end = min(microbatches, start + group_size)
        table.extend((mb, c) for c in range(chunks) for mb in range(start, end))
        if end == microbatches:
            break
    return table


def megatron_warmup(ranks: int, rank: int, chunks: int, group_size: int,
                    microbatches: int) -> int:
    """Warmup forwards of ``rank`` in Megatron's interleaved schedule
    (``get_pp_rank_microbatches``): ``2*(p-1-r) + (v-1)*N``, at most ``m*v``."""
    return min(2 * (ranks - rank - 1) + (chunks - 1) * group_size, microbatches * chunks)


# -- the policy ---------------------------------------------------------------------------
def lower_megatron(schedule: Schedule, *, batch_p2p_comm: bool | None = None,
                   overlap_p2p_comm: bool | None = None) -> Program:
    """The ``megatron`` policy (module docstring).

    ``batch_p2p_comm`` defaults to ``not overlap_p2p_comm`` (as Megatron's training
    arguments set it); ``overlap_p2p_comm`` defaults to false. Raises
    :class:`ScheduleError` for a placement other than ``loop``, a forward-only schedule,
    both parameters true (Megatron refuses it), ``overlap_p2p_comm`` without interleaving,
    interleaving on 2 ranks without ``overlap_p2p_comm`` (Megatron's arguments refuse it:
    one call would put two sends and two recvs between the same pair of ranks), and an
    order Megatron does not run.
    """
    pl = schedule.placement
    p, m = pl.ranks, schedule.microbatches
    if pl.kind != "loop":
        raise ScheduleError(f"megatron policy: Megatron-LM places stage s on rank s mod p "
                            f"(loop placement); this schedule has a {pl.kind} placement")
    if not has_backward(schedule):
        raise ScheduleError("megatron policy: the schedule has no backward; Megatron's "
                            "forward-only path is not modelled")
    overlap = bool(overlap_p2p_comm)
    batch = (not overlap) if batch_p2p_comm is None else batch_p2p_comm
    if overlap and batch:
        raise ScheduleError("megatron policy: Megatron-LM refuses overlap_p2p_comm together "
                            "with batch_p2p_comm ('Can not use both overlap_p2p_comm and "
                            "batch_p2p_comm'); add --param batch_p2p_comm=false")
    v = pl.stages // p
    if v == 1:
        if overlap:
            raise ScheduleError(
                "megatron policy: overlap_p2p_comm needs the interleaved schedule; "
                "Megatron's forward_backward_pipelining_without_interleaving refuses it "
                "('Non-interleaved pipeline parallelism does not support overlapping p2p "
                "communication')")
        traces = [_Rank(schedule, r, batch) for r in range(p)]
        for x in traces:
            _run_1f1b(x, p, m)
        _check_order(schedule, traces, "forward_backward_pipelining_without_interleaving",
                     "1f1b")
    else:
        if p == 2 and not overlap:
            raise ScheduleError(
                "megatron policy: interleaving on 2 ranks needs overlap_p2p_comm=true: "
                "Megatron-LM's arguments refuse it otherwise ('pipeline-model-parallel size "
                "should be greater than 2 to avoid having multiple p2p sends and recvs "
                "between same 2 ranks per communication batch')")
        n = megatron_group_size(p, m, _group_size(schedule, v))
        traces = [_Rank(schedule, r, batch) for r in range(p)]
        for x in traces:
            _Interleaved(x, p, m, v, n, overlap).run()
        _check_order(schedule, traces, "forward_backward_pipelining_with_interleaving",
                     "interleaved-1f1b --variant megatron")
    return program_of(schedule, [x.out for x in traces])


def _group_size(schedule: Schedule, chunks: int) -> int | None:
    """Megatron's N read off the order: the forwards of rank 0 start with a group of N
    microbatches on chunk 0 (the whole of m when N = m)."""
    chunk_of = schedule.placement.chunk_fn()
    fwd = [op for op in schedule.ranks[0] if op.kind == "F"]
    run = 0
    for op in fwd:
        if chunk_of(op.stage, op.mb) != 0:
            break
        run += 1
    return run or None


def _check_order(schedule: Schedule, traces: list["_Rank"], fn: str, gen: str) -> None:
    """Megatron's compute order (the traces) must be the schedule's; raise
    :class:`ScheduleError` at the first op that differs."""
    for r, x in enumerate(traces):
        want = [i.op for i in x.out if type(i) is Compute]
        got = schedule.ranks[r]
        if got == want:
            continue
        k = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b),
                 min(len(got), len(want)))
        have = str(got[k]) if k < len(got) else "the end of the rank"
        runs = str(want[k]) if k < len(want) else "nothing more"
        raise ScheduleError(f"megatron policy: rank {r} op {k} is {have} but Megatron-LM's "
                            f"{fn} runs {runs} there; the policy runs Megatron's own "
                            f"order: generate the schedule with {gen}")


class _Rank:
    """One rank's instructions, built with Megatron's ``P2PCommunicator._communicate``."""

    def __init__(self, schedule: Schedule, rank: int, batch: bool) -> None:
        self.pl, self.r, self.batch = schedule.placement, rank, batch
        self.out: list[Instr] = []

    def recv_for(self, op: Op) -> Comm | None:
        """The recv of ``op``'s input from another rank (None when local or the input)."""
        c = op_recvs(op, self.r, self.pl)
        return c[0] if c else None

    def send_of(self, op: Op) -> Comm | None:
        """The send of ``op``'s output to another rank (None on the last/first stage)."""
        c = op_sends(op, self.r, self.pl)
        return c[0] if c else None

    def compute(self, op: Op) -> None:
        self.out.append(Compute(op))

    def wait(self, *comms: Comm) -> None:
        self.out.append(Wait(comms))

    def communicate(self, *, send_next: Comm | None = None, send_prev: Comm | None = None,
                    recv_prev: Comm | None = None, recv_next: Comm | None = None,
                    wait: bool = True) -> dict[str, Comm]:
        """``_communicate``: launch the given ops (``_batched_p2p_ops`` or ``_p2p_ops``
        order, see the module docstring); with ``wait`` wait them all and return {},
        else return the launched ops by Megatron's handle names."""
        if self.batch:       # _batched_p2p_ops
            named = [("send_prev", send_prev), ("recv_prev", recv_prev),
                     ("send_next", send_next), ("recv_next", recv_next)]
        elif self.r % 2 == 0:   # _p2p_ops, even rank
            named = [("send_next", send_next), ("recv_prev", recv_prev),
                     ("send_prev", send_prev), ("recv_next", recv_next)]
        else:                   # _p2p_ops, odd rank
            named = [("recv_prev", recv_prev), ("send_next", send_next),
                     ("recv_next", recv_next), ("send_prev", send_prev)]
        ops = {k: c for k, c in named if c is not None}
        if not ops:
            return {}
        comms = tuple(ops.values())
        if self.batch:
            self.out.append(Batch(comms))
        else:
            self.out.extend(Post(c) for c in comms)
        if wait:
            self.out.append(Wait(comms))
            return {}
        return ops


def _run_1f1b(x: _Rank, p: int, m: int) -> None:
    """``forward_backward_pipelining_without_interleaving`` (training) for rank ``x.r``:
    ``p-r-1`` warmup forwards, 1F1B steady state, cooldown backwards."""
    r = x.r

    def F(i: int) -> Op:
        return Op("F", r, i)

    def B(i: int) -> Op:
        return Op("BW", r, i)

    warmup = min(p - r - 1, m)
    remaining = m - warmup
    for i in range(warmup):
        x.communicate(recv_prev=x.recv_for(F(i)))                      # recv_forward
        x.compute(F(i))
        x.communicate(send_next=x.send_of(F(i)))                       # send_forward
    if remaining > 0:
        x.communicate(recv_prev=x.recv_for(F(warmup)))                 # recv_forward
    for i in range(remaining):
        f, b = F(warmup + i), B(i)
        x.compute(f)
        x.communicate(send_next=x.send_of(f),                          # send_forward_
                      recv_next=x.recv_for(b))                         # recv_backward
        x.compute(b)
        if i == remaining - 1:
            x.communicate(send_prev=x.send_of(b))                      # send_backward
        else:
            x.communicate(send_prev=x.send_of(b),                      # send_backward_
                          recv_prev=x.recv_for(F(warmup + i + 1)))     # recv_forward
    for i in range(remaining, m):
        b = B(i)
        x.communicate(recv_next=x.recv_for(b))                         # recv_backward
        x.compute(b)
        x.communicate(send_prev=x.send_of(b))                          # send_backward


class _Interleaved:
    """``forward_backward_pipelining_with_interleaving`` (training, no
    ``overlap_p2p_comm_warmup_flush``) for one rank, step for step: warmup, steady state
    (with or without ``overlap_p2p_comm``), cooldown, with Megatron's handle lists.

    A recv is named by the model chunk Megatron files its tensor under
    (``recv_tensor_from_previous_stage``): the k-th recv for chunk c carries the k-th
    microbatch chunk c runs (forward order for activations, backward order for
    gradients).
    """

    def __init__(self, x: _Rank, p: int, m: int, v: int, n: int, overlap: bool) -> None:
        self.x, self.p, self.v, self.overlap = x, p, v, overlap
        self.table = megatron_schedule_table(m, v, n)
        self.total = m * v
        self.all_warmup = 2 * (p - x.r - 1) + (v - 1) * n >= self.total
        self.warmup = megatron_warmup(p, x.r, v, n, m)
        self.remaining = self.total - self.warmup
        self.first, self.last = x.r == 0, x.r == p - 1
        self.fwd_mbs = {c: deque(mb for mb, cc in self.table if cc == c) for c in range(v)}
        self.bwd_mbs = {c: deque(mb for mb, cc in self.table if v - 1 - cc == c)
                        for c in range(v)}
        self.recv_prev_handles: list[Comm] = []
        self.recv_next_handles: list[Comm] = []
        self.send_next_handle: Comm | None = None
        self.send_prev_handle: Comm | None = None

    # -- Megatron's helpers ---------------------------------------------------------------
    def chunk(self, k: int, forward: bool) -> int:
        """``get_model_chunk_id``."""
        c = self.table[k % self.total][1]
        return c if forward else self.v - 1 - c

    def f_op(self, k: int) -> Op:
        mb, c = self.table[k]
        return Op("F", c * self.p + self.x.r, mb)

    def b_op(self, k: int) -> Op:
        mb, c = self.table[k]
        return Op("BW", (self.v - 1 - c) * self.p + self.x.r, mb)

    def recv_from_previous_stage(self, k: int, forward: bool) -> tuple[bool, int]:
        """``recv_tensor_from_previous_stage``: whether iteration k receives, and for
        which model chunk."""
        leading = self.first if forward else self.last
        if not leading:
            return True, self.chunk(k + 1, forward)
        last_chunk = self.v - 1 if forward else 0
        if k < self.p - 1:        # the ending stage has produced nothing yet
            recv, nxt = False, self.chunk(k + 1, forward)
        else:                     # aligned with the ending stage's microbatch k-(p-1)
            recv, nxt = True, self.chunk(k - (self.p - 1), forward)
        if nxt == last_chunk:
            recv = False
        return recv, nxt + 1 if forward else nxt - 1

    def recv_prev(self, recv: bool, chunk: int) -> Comm | None:
        if not recv:
            return None
        op = Op("F", chunk * self.p + self.x.r, self.fwd_mbs[chunk].popleft())
        c = self.x.recv_for(op)
        assert c is not None, op
        return c

    def recv_next(self, recv: bool, chunk: int) -> Comm | None:
        if not recv:
            return None
        op = Op("BW", chunk * self.p + self.x.r, self.bwd_mbs[chunk].popleft())
        c = self.x.recv_for(op)
        assert c is not None, op
        return c

    def track_forward(self, handles: dict[str, Comm]) -> None:
        """After an overlapped ``send_forward_recv_forward``: wait the previous send,
        keep the new one, queue the recv."""
        if self.send_next_handle is not None:
            self.x.wait(self.send_next_handle)
        self.send_next_handle = handles.get("send_next")
        if "recv_prev" in handles:
            self.recv_prev_handles.append(handles["recv_prev"])

    def track_backward(self, handles: dict[str, Comm]) -> None:
        """After an overlapped ``send_backward_recv_backward`` (same, other direction)."""
        if self.send_prev_handle is not None:
            self.x.wait(self.send_prev_handle)
        self.send_prev_handle = handles.get("send_prev")
        if "recv_next" in handles:
            self.recv_next_handles.append(handles["recv_next"])

    def pop_wait(self, handles: list[Comm]) -> None:
        if handles:
            self.x.wait(handles.pop(0))

    # -- the three phases -----------------------------------------------------------------
    def run(self) -> None:
        x = self.x
        if not self.first:                          # recv_forward for chunk 0
            x.communicate(recv_prev=self.recv_prev(True, 0))
        self.warmup_phase()
        if self.overlap:
            for k in range(self.remaining):
                self.steady_overlapped(k)
        else:
            for k in range(self.remaining):
                self.steady(k)
        self.cooldown_phase()
        assert not self.recv_prev_handles and not self.recv_next_handles

    def warmup_phase(self) -> None:
        x, v = self.x, self.v
        for k in range(self.warmup):
            recv, nxt = self.recv_from_previous_stage(k, True)
            if k == self.total - 1:
                recv = False
            f = self.f_op(k)
            x.compute(f)
            last_warmup = k == self.warmup - 1 and not self.all_warmup
            if last_warmup and not self.overlap:
                # send_forward_backward_recv_forward_backward
                x.communicate(send_next=x.send_of(f), recv_prev=self.recv_prev(recv, nxt),
                              recv_next=self.recv_next(not self.last, v - 1))
            else:                                   # send_forward_recv_forward
                x.communicate(send_next=x.send_of(f), recv_prev=self.recv_prev(recv, nxt))
            if last_warmup and self.overlap:        # send_backward_recv_backward, async
                self.track_backward(x.communicate(
                    recv_next=self.recv_next(not self.last, v - 1), wait=False))

    def steady(self, k: int) -> None:
        """One 1F1B step without overlap: forward, backward, then one combined
        ``send_forward_backward_recv_forward_backward``."""
        x = self.x
        fk, bk = k + self.warmup, k
        f, b = self.f_op(fk), self.b_op(bk)
        x.compute(f)
        x.compute(b)
        recv_f, nf = self.recv_from_previous_stage(fk, True)
        recv_b, nb = self.recv_from_previous_stage(bk, False)
        if k == self.remaining - 1:
            recv_f = False
        x.communicate(send_next=x.send_of(f), send_prev=x.send_of(b),
                      recv_prev=self.recv_prev(recv_f, nf),
                      recv_next=self.recv_next(recv_b, nb))

    def steady_overlapped(self, k: int) -> None:
        """One 1F1B step with ``overlap_p2p_comm``: pp_pre_forward, forward,
        pp_post_forward, pp_pre_backward, backward, pp_post_backward."""
        x = self.x
        fk, bk = k + self.warmup, k
        if not (self.chunk(fk, True) == 0 and self.first):
            self.pop_wait(self.recv_prev_handles)
        f = self.f_op(fk)
        x.compute(f)
        recv, nxt = self.recv_from_previous_stage(fk, True)
        if k == self.remaining - 1:
            recv = False
        self.track_forward(x.communicate(send_next=x.send_of(f),
                                         recv_prev=self.recv_prev(recv, nxt), wait=False))
        if not (self.chunk(bk, False) == self.v - 1 and self.last):
            self.pop_wait(self.recv_next_handles)
        b = self.b_op(bk)
        x.compute(b)
        recv, nxt = self.recv_from_previous_stage(bk, False)
        self.track_backward(x.communicate(send_prev=x.send_of(b),
                                          recv_next=self.recv_next(recv, nxt), wait=False))

    def cooldown_phase(self) -> None:
        x = self.x
        if self.all_warmup:                          # recv_backward for the last chunk
            x.communicate(recv_next=self.recv_next(not self.last, self.v - 1))
        for k in range(self.remaining, self.total):
            if not (self.chunk(k, False) == self.v - 1 and self.last) and k != 0:
                self.pop_wait(self.recv_next_handles)
            recv, nxt = self.recv_from_previous_stage(k, False)
            if k == self.total - 1:
                recv = False
            b = self.b_op(k)
            x.compute(b)                             # then send_backward_recv_backward
            x.communicate(send_prev=x.send_of(b), recv_next=self.recv_next(recv, nxt))
        if self.send_prev_handle is not None:
            x.wait(self.send_prev_handle)

"""The ``megatron`` comm policy: Megatron-LM's pipeline P2P, call for call and wait for wait.

Source: NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``,
``forward_backward_pipelining_with_interleaving``, ``get_schedule_table``,
``get_pp_rank_microbatches``) and ``megatron/core/pipeline_parallel/p2p_communication.py``
(``P2PCommunicator._communicate``, ``_communicate_shapes``, ``_batched_p2p_ops``,
``_p2p_ops``), pinned at :data:`MEGATRON_COMMIT` (the tree of the megatron-core 0.19.2
wheel). The programs equal, token for token, what those functions issue per rank
(recorded by ``benchmarks/record_megatron.py``, checked by
``tests/test_megatron_exact.py``).

Megatron moves activations and gradients with combined calls (``recv_forward``,
``send_forward_recv_backward``, ``send_backward_recv_forward``, ...; the interleaved
schedule's ``send_forward_recv_forward``, ``send_backward_recv_backward`` and
``send_forward_backward_recv_forward_backward``). Each is one ``_communicate``:

- ``batch_p2p_comm`` (Megatron's default): one ``batch_isend_irecv`` of the call's ops in
  ``_batched_p2p_ops`` order -- send to the previous rank, recv from the previous rank,
  send to the next rank, recv from the next rank -- written ``BATCH[...]`` (a single op
  too: it still goes through ``batch_isend_irecv``), then its one NCCL work waited
  (``WAIT[...]`` of all its ops);
- unbatched: ``_p2p_ops`` launches each op on its own, even ranks in the order send-next,
  recv-prev, send-prev, recv-next and odd ranks recv-prev, send-next, recv-next,
  send-prev (so that neighbours always pair a send with a recv), then waits each request
  in launch order, one ``WAIT`` each;
- ``overlap_p2p_comm`` (interleaved only, unbatched): the steady state's calls return
  their handles instead of waiting: each recv is waited by the forward or backward that
  consumes it (``pp_pre_forward``/``pp_pre_backward`` pop the oldest recv handle), each
  send when the next send in the same direction has been launched; the warmup and
  cooldown calls still wait at once, unless ``overlap_p2p_comm_warmup_flush``
  (:mod:`schedsim.program.megatron_interleaved`).

A call with nothing to move launches nothing (the first stage's ``recv_forward``, the last
stage's ``send_forward``). The policy runs Megatron's own compute order -- the 1F1B order
of ``1f1b`` (one stage per rank) or the table-driven interleaved order of
``interleaved-1f1b --variant megatron`` (its microbatch group size N is read off the
schedule) -- and refuses any other order, naming the first op that differs. Sends still
pending when the step ends are waited by the program's implicit end.
"""
from __future__ import annotations


from schedsim.errors import ScheduleError
from schedsim.program.ir import Batch, Comm, Compute, Instr, Op, Post, Program, Schedule, Wait
from schedsim.program.lowering import has_backward, op_recvs, op_sends, program_of

_SOURCE = "megatron/core/pipeline_parallel/schedules.py"
#: the Megatron-LM tree modelled: branch core_r0.19.0, whose megatron/core/pipeline_parallel/
#: is byte for byte the one the megatron-core 0.19.2 wheel ships
MEGATRON_COMMIT = "f8837c04ef6cbef6cdefb8de001aad63178aebbf"


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
                   overlap_p2p_comm: bool | None = None,
                   overlap_p2p_comm_warmup_flush: bool = False,
                   deallocate_pipeline_outputs: bool = False) -> Program:
    """The ``megatron`` policy (module docstring); the parameters are Megatron's
    ``ModelParallelConfig`` fields of the same names.

    ``batch_p2p_comm`` defaults to ``not overlap_p2p_comm`` (as Megatron's training
    arguments set it); the others default to megatron.core's false. Raises
    :class:`ScheduleError` for a placement other than ``loop``, a forward-only schedule,
    what Megatron refuses (``overlap_p2p_comm`` with ``batch_p2p_comm``;
    ``overlap_p2p_comm`` without interleaving; ``overlap_p2p_comm_warmup_flush`` without
    ``overlap_p2p_comm``), and an order Megatron does not run. Interleaving on 2 ranks
    without ``overlap_p2p_comm`` lowers as megatron.core runs it (Megatron-LM's training
    arguments refuse it): unbatched, ``_p2p_ops``'s rank-parity order matches the two
    sides; batched, one call holds a send and a recv each way between the same two ranks
    in orders the two sides do not share, and the simulator refuses the program, naming
    the first send and recv that NCCL's launch-order matching would cross.
    """
    pl = schedule.placement
    p, m = pl.ranks, schedule.microbatches
    if pl.kind != "loop":
        raise ScheduleError(f"megatron policy: Megatron-LM places stage s on rank s mod p "
                            f"(loop placement); this schedule has a {pl.kind} placement")
    if not has_backward(schedule):
        raise ScheduleError("megatron policy: the schedule has no backward; Megatron's "
                            "forward-only path is not modelled")
    overlap, flush = bool(overlap_p2p_comm), bool(overlap_p2p_comm_warmup_flush)
    batch = (not overlap) if batch_p2p_comm is None else batch_p2p_comm
    if overlap and batch:
        raise ScheduleError("megatron policy: Megatron-LM refuses overlap_p2p_comm together "
                            "with batch_p2p_comm ('Can not use both overlap_p2p_comm and "
                            "batch_p2p_comm'); add --param batch_p2p_comm=false")
    if flush and not overlap:
        raise ScheduleError("megatron policy: overlap_p2p_comm_warmup_flush needs "
                            "overlap_p2p_comm=true and batch_p2p_comm=false (Megatron's "
                            "ModelParallelConfig refuses it otherwise)")
    v = pl.stages // p
    traces = [_Rank(schedule, r, batch) for r in range(p)]
    if v == 1:
        if overlap:
            raise ScheduleError(
                "megatron policy: overlap_p2p_comm needs the interleaved schedule; "
                "Megatron's forward_backward_pipelining_without_interleaving refuses it "
                "('Non-interleaved pipeline parallelism does not support overlapping p2p "
                "communication')")
        for x in traces:
            _run_1f1b(x, p, m)
        _check_order(schedule, traces, "forward_backward_pipelining_without_interleaving",
                     "1f1b")
    else:
        from schedsim.program.megatron_interleaved import Interleaved

        n = megatron_group_size(p, m, _group_size(schedule, v))
        for x in traces:
            Interleaved(x, p, m, v, n, overlap, flush, deallocate_pipeline_outputs).run()
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
        order, see the module docstring); with ``wait`` wait them (the batch's one work,
        or each request in launch order) and return {}, else return the launched ops by
        Megatron's handle names."""
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
            assert wait, "Megatron asserts wait_on_reqs with batch_p2p_comm"
            self.out += [Batch(comms), Wait(comms)]
            return {}
        self.out.extend(Post(c) for c in comms)
        if wait:
            self.out.extend(Wait((c,)) for c in comms)
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




"""The ``megatron`` comm policy: Megatron-LM's pipeline P2P, call for call and wait for wait.

Source: NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``,
``forward_backward_pipelining_with_interleaving``, ``get_schedule_table``,
``get_pp_rank_microbatches``) and ``megatron/core/pipeline_parallel/p2p_communication.py``
(``P2PCommunicator._communicate``, ``_communicate_shapes``, ``_batched_p2p_ops``,
``_p2p_ops``), pinned at :data:`~schedsim.program.megatron_comm.MEGATRON_COMMIT` (the
tree of the megatron-core 0.19.2 wheel). The programs equal, token for token, what those
functions issue per rank (recorded by ``benchmarks/record_megatron.py``, checked by
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
  (:mod:`schedsim.program.megatron_interleaved`);
- ``variable_seq_lengths``: every call with something to move first runs
  ``_communicate_shapes``: one ``batch_isend_irecv`` of the shape messages of the call's
  tensors (``SEND_FS``/``RECV_FS`` for an activation, ``SEND_BS``/``RECV_BS`` for a
  gradient; 3 int64) in ``_batched_p2p_ops`` order, whatever ``batch_p2p_comm``, and its
  one work waited, before the tensors are launched.

A call with nothing to move launches nothing (the first stage's ``recv_forward``, the last
stage's ``send_forward``). The policy runs Megatron's own compute order -- the 1F1B order
of ``1f1b`` (one stage per rank) or the table-driven interleaved order of
``interleaved-1f1b --variant megatron`` (its microbatch group size N is read off the
schedule) -- and refuses any other order, naming the first op that differs. Sends still
pending when the step ends are waited by the program's implicit end.
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.program.comm_plan import has_backward, lowered
from schedsim.program.flat_build import FlatBuilder
from schedsim.program.ir import Op, Program, Schedule
from schedsim.program.megatron_comm import (
    MEGATRON_COMMIT,
    Communicator,
    megatron_group_size,
    megatron_schedule_table,
    megatron_warmup,
)
from schedsim.program.megatron_interleaved import Interleaved

#: the helpers of Megatron's order live in :mod:`schedsim.program.megatron_comm`
__all__ = ["MEGATRON_COMMIT", "lower_megatron", "megatron_group_size",
           "megatron_schedule_table", "megatron_warmup"]

# -- the policy ---------------------------------------------------------------------------
def lower_megatron(schedule: Schedule, *, batch_p2p_comm: bool | None = None,
                   overlap_p2p_comm: bool | None = None,
                   overlap_p2p_comm_warmup_flush: bool = False,
                   deallocate_pipeline_outputs: bool = False,
                   variable_seq_lengths: bool = False) -> Program:
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
    if v == 1 and overlap:
        raise ScheduleError(
            "megatron policy: overlap_p2p_comm needs the interleaved schedule; "
            "Megatron's forward_backward_pipelining_without_interleaving refuses it "
            "('Non-interleaved pipeline parallelism does not support overlapping p2p "
            "communication')")
    n = megatron_group_size(p, m, _group_size(schedule, v)) if v > 1 else 0
    out = FlatBuilder()
    traces = []
    for r in range(p):
        x = Communicator(schedule, r, batch, out, variable_seq_lengths)
        if v == 1:
            _run_1f1b(x, p, m)
        else:
            Interleaved(x, p, m, v, n, overlap, flush, deallocate_pipeline_outputs).run()
        out.end_rank()
        traces.append(x)
    if v == 1:
        _check_order(schedule, traces, "forward_backward_pipelining_without_interleaving",
                     "1f1b")
    else:
        _check_order(schedule, traces, "forward_backward_pipelining_with_interleaving",
                     "interleaved-1f1b --variant megatron")
    return lowered(schedule, out.build())


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


def _check_order(schedule: Schedule, traces: list["Communicator"], fn: str, gen: str) -> None:
    """Megatron's compute order (the traces) must be the schedule's; raise
    :class:`ScheduleError` at the first op that differs."""
    for r, x in enumerate(traces):
        want = x.ops
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


def _run_1f1b(x: Communicator, p: int, m: int) -> None:
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




"""Megatron-LM's P2P layer and the rules of its interleaved order, for the ``megatron``
policy (:mod:`schedsim.program.megatron`, :mod:`schedsim.program.megatron_interleaved`).

Source: NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/p2p_communication.py``
(``P2PCommunicator._communicate``, ``_communicate_shapes``, ``_batched_p2p_ops``,
``_p2p_ops``) and ``schedules.py`` (``get_schedule_table``, ``get_pp_rank_microbatches``,
the checks of ``forward_backward_pipelining_with_interleaving``) at
:data:`MEGATRON_COMMIT`.
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.program.comm_plan import op_recvs, op_sends
from schedsim.program.flat import Opcode
from schedsim.program.flat_build import FlatBuilder
from schedsim.program.ir import Comm, Op, Schedule

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


class Communicator:
    """One rank's instructions, built with Megatron's ``P2PCommunicator._communicate`` and
    written into ``out`` (the ranks in turn: :meth:`FlatBuilder.end_rank` after each);
    ``ops``: the rank's compute ops, in order."""

    def __init__(self, schedule: Schedule, rank: int, batch: bool, out: FlatBuilder,
                 shapes: bool = False) -> None:
        self.pl, self.r, self.batch, self.shapes = schedule.placement, rank, batch, shapes
        self.out = out
        self.ops: list[Op] = []

    def recv_for(self, op: Op) -> Comm | None:
        """The recv of ``op``'s input from another rank (None when local or the input)."""
        c = op_recvs(op, self.r, self.pl)
        return c[0] if c else None

    def send_of(self, op: Op) -> Comm | None:
        """The send of ``op``'s output to another rank (None on the last/first stage)."""
        c = op_sends(op, self.r, self.pl)
        return c[0] if c else None

    def compute(self, op: Op) -> None:
        self.ops.append(op)
        self.out.compute(op)

    def wait(self, *comms: Comm) -> None:
        self.out.comm_instr(Opcode.WAIT, comms)

    def launch_and_wait(self, comms: tuple[Comm, ...]) -> None:
        """One ``batch_isend_irecv`` of ``comms``, waited at once (its one work)."""
        self.out.comm_instr(Opcode.BATCH, comms)
        self.out.comm_instr(Opcode.WAIT, comms)

    def communicate(self, *, send_next: Comm | None = None, send_prev: Comm | None = None,
                    recv_prev: Comm | None = None, recv_next: Comm | None = None,
                    wait: bool = True) -> dict[str, Comm]:
        """``_communicate``: launch the given ops (``_batched_p2p_ops`` or ``_p2p_ops``
        order, see the module docstring); with ``wait`` wait them (the batch's one work,
        or each request in launch order) and return {}, else return the launched ops by
        Megatron's handle names. With ``variable_seq_lengths`` the shape round
        (``_communicate_shapes``) comes first: one ``batch_isend_irecv`` of the shape
        messages in ``_batched_p2p_ops`` order, whatever ``batch_p2p_comm``, waited at
        once (one NCCL work)."""
        batched = [("send_prev", send_prev), ("recv_prev", recv_prev),
                   ("send_next", send_next), ("recv_next", recv_next)]
        if self.shapes:
            sh = tuple(Comm(c.kind + "S", c.stage, c.mb) for _, c in batched if c is not None)
            if sh:
                self.launch_and_wait(sh)
        if self.batch:       # _batched_p2p_ops
            named = batched
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
            self.launch_and_wait(comms)
            return {}
        for c in comms:
            self.out.comm_instr(Opcode.POST, (c,))
        if wait:
            for c in comms:
                self.out.comm_instr(Opcode.WAIT, (c,))
            return {}
        return ops

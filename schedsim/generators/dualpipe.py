"""DualPipe, instruction for instruction as deepseek-ai/DualPipe runs it.

Source: deepseek-ai/DualPipe @3da1bbe, ``dualpipe/dualpipe.py`` (``DualPipe.step``);
DeepSeek-V3 technical report, Section 3.2.1. The chunk helpers it shares with DualPipeV
are in :mod:`schedsim.generators.dualpipe_trace`; ``step()`` below follows the original
line for line (its eight steps, loop counts and arguments), so the program has its compute
order (zero-bubble ``B`` whose ``W`` is deferred FIFO, overlapped ``FB`` pairs), its P2P
ops in the order they are appended, and a ``COMMIT`` wherever ``_commit_and_wait_comm``
finds a non-empty list.

Naming: chunk 0 flows rank 0 -> P-1 (stage = rank) and carries microbatches
``0..M/2-1``; chunk 1 flows P-1 -> 0 (stage = P-1-rank) and carries ``M/2..M-1``. For the
first half of the ranks phase 0 is chunk 0; the second half swaps them
(``phase ^= is_in_second_half``).
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.generators.dualpipe_trace import ChunkTrace, traced_program
from schedsim.program.flat_build import FlatBuilder
from schedsim.program.ir import Placement, Program


class _DualPipeTrace(ChunkTrace):
    """``DualPipe`` on one rank (``dualpipe/dualpipe.py``)."""

    def __init__(self, num_ranks: int, num_chunks: int, rank: int, overlap: bool,
                 out: FlatBuilder) -> None:
        super().__init__(num_ranks, num_chunks, rank, overlap, out)
        self.is_in_second_half = rank >= num_ranks // 2
        self.is_middle_rank = rank in (num_ranks // 2 - 1, num_ranks // 2)

    def _chunk(self, phase: int) -> int:
        return phase ^ int(self.is_in_second_half)

    def _stage(self, chunk: int) -> int:
        return self.rank if chunk == 0 else self.num_ranks - 1 - self.rank

    def _mb(self, chunk: int, i: int) -> int:
        return i if chunk == 0 else self.num_chunks // 2 + i

    def step(self) -> None:
        """``DualPipe.step()``, steps 1-8."""
        num_ranks, rank, num_chunks = self.num_ranks, self.rank, self.num_chunks
        num_half_ranks = num_ranks // 2
        half_rank = min(rank, num_ranks - 1 - rank)
        half_num_chunks = num_chunks // 2

        # Step 1: nF0
        step_1 = (num_half_ranks - half_rank - 1) * 2
        for _ in range(step_1):
            self._forward_chunk(0)

        # Step 2: nF0F1
        step_2 = half_rank + 1
        self._recv_forward(0)
        for i in range(step_2):
            self._forward_chunk(0, recv=False, send=self.is_middle_rank)
            self._recv_forward(0)
            self._forward_chunk(1, send=(not self.is_middle_rank) or (i < step_2 - 1))
            if not self.is_middle_rank:
                self._send_forward(0)

        # Step 3: nB1W1F1 (Use zero bubble)
        step_3 = num_half_ranks - half_rank - 1
        for _ in range(step_3):
            self._backward_chunk(1, enable_zb=True)
            self._recv_forward(1)
            self._weight_chunk()
            self._forward_chunk(1, recv=False)

        # Step 4 (Main step): nF0B1F1B0
        step_4 = half_num_chunks - num_ranks + half_rank + 1
        for i in range(step_4):
            if i == 0:
                if self.is_middle_rank:
                    # NOTE: We don't overlap these two chunks to further reduce bubble size.
                    self._forward_chunk(0, recv=False, send=False)
                    self._send_forward(1)
                    self._backward_chunk(1, send=False)
                    self._send_forward(0)
                    self._send_backward(1)
                else:
                    self._forward_backward_chunk(0, 1, recv0=False)
            else:
                self._forward_backward_chunk(0, 1)
            self._forward_backward_chunk(1, 0)

        # Step 5: nB1F1B0
        step_5 = num_half_ranks - half_rank - 1
        for _ in range(step_5):
            self._backward_chunk(1)
            self._forward_backward_chunk(1, 0)

        # Step 6: nB1B0 (The second half of the chunks use zero bubble)
        step_6 = half_rank + 1
        enable_zb = False
        for i in range(step_6):
            if i == step_6 // 2 and half_rank % 2 == 1:
                enable_zb = True
            self._backward_chunk(1, enable_zb=enable_zb)
            if i == step_6 // 2 and half_rank % 2 == 0:
                enable_zb = True
            self._backward_chunk(0, enable_zb=enable_zb)

        # Step 7: nWB0 (Use zero bubble)
        step_7 = num_half_ranks - half_rank - 1
        for _ in range(step_7):
            self._weight_chunk()
            self._backward_chunk(0, enable_zb=True)

        # Step 8: nW
        step_8 = half_rank + 1
        for _ in range(step_8):
            self._weight_chunk()
        self._finish()


@register("dualpipe", summary="DeepSeek DualPipe: two directions, overlapped F&B pairs, "
          "zero-bubble W", constraints="ranks even, microbatches even, microbatches >= 2 x "
          "ranks", placement="dual (rank r: stage r of direction 0, stage P-1-r of "
          "direction 1)", source="deepseek-ai/DualPipe dualpipe/dualpipe.py DualPipe.step()",
          params={"overlap": "run F&B pairs as one overlapped FB op (default true)"})
def dualpipe(ranks: int, microbatches: int, overlap: bool = True) -> Program:
    """DualPipe's program: compute, P2P appends and commit batches of ``DualPipe.step()``.

    Raises :class:`ScheduleError` unless ranks is even, microbatches even and
    microbatches >= 2 x ranks (the original's assertions).
    """
    if ranks % 2:
        raise ScheduleError(f"dualpipe needs an even number of ranks (got {ranks}): each "
                            f"rank pairs with rank P-1-r for the two directions")
    if microbatches % 2 or microbatches < 2 * ranks:
        raise ScheduleError(f"dualpipe needs an even number of microbatches >= 2 x ranks = "
                            f"{2 * ranks} (got {microbatches}): half go in each direction "
                            f"and each direction needs >= ranks to fill its pipeline")
    pl = Placement(kind="dual", ranks=ranks, stages=ranks, microbatches=microbatches)
    return traced_program(_DualPipeTrace, "dualpipe", pl, microbatches, overlap)

"""DualPipeV (DualPipe cut in half, V-shape), instruction for instruction as
deepseek-ai/DualPipe runs it.

Source: deepseek-ai/DualPipe @3da1bbe, ``dualpipe/dualpipev.py`` (``DualPipeV.step``).
The chunk helpers it shares with DualPipe are in
:mod:`schedsim.generators.dualpipe_trace`; ``step()`` below follows the original line for
line.

Naming (``v`` placement, 2P stages): chunk 0 is stage r, chunk 1 is stage 2P-1-r; every
microbatch goes down the ranks on chunk 0 and back up on chunk 1, turning on the last
rank without a message.
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.generators.dualpipe_trace import ChunkTrace, traced_program
from schedsim.program.ir import Placement, Program


class _DualPipeVTrace(ChunkTrace):
    """``DualPipeV`` on one rank (``dualpipe/dualpipev.py``)."""

    def _stage(self, chunk: int) -> int:
        return self.rank if chunk == 0 else 2 * self.num_ranks - 1 - self.rank

    def step(self) -> None:
        """``DualPipeV.step()``, steps 1-8."""
        num_ranks, rank, num_chunks = self.num_ranks, self.rank, self.num_chunks

        # Step 1: nF0
        step_1 = (num_ranks - rank - 1) * 2
        for _ in range(step_1):
            self._forward_chunk(0)

        # Step 2: nF0F1
        step_2 = rank + 1
        self._recv_forward(0)
        for i in range(step_2):
            self._forward_chunk(0, recv=False, send=False)
            self._recv_forward(0)
            self._forward_chunk(1, send=(not self.is_last_rank) or (i < step_2 - 1))
            self._send_forward(0)

        # Step 3: nB1W1F1 (Use zero bubble)
        step_3 = num_ranks - rank - 1
        for _ in range(step_3):
            self._backward_chunk(1, enable_zb=True)
            self._recv_forward(1)
            self._weight_chunk()
            self._forward_chunk(1, recv=False)

        # Step 4 (Main step): nF0B1F1B0
        step_4 = num_chunks - num_ranks * 2 + rank + 1
        for i in range(step_4):
            if i == 0:
                if self.is_last_rank:
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
        step_5 = num_ranks - rank - 1
        for _ in range(step_5):
            self._backward_chunk(1)
            self._forward_backward_chunk(1, 0)

        # Step 6: nB1B0 (The second half of the chunks use zero bubble)
        step_6 = rank + 1
        enable_zb = False
        for i in range(step_6):
            if i == step_6 // 2 and rank % 2 == 1:
                enable_zb = True
            self._backward_chunk(1, enable_zb=enable_zb)
            if i == step_6 // 2 and rank % 2 == 0:
                enable_zb = True
            self._backward_chunk(0, enable_zb=enable_zb)

        # Step 7: nWB0 (Use zero bubble)
        step_7 = num_ranks - rank - 1
        for _ in range(step_7):
            self._weight_chunk()
            self._backward_chunk(0, enable_zb=True)

        # Step 8: nW
        step_8 = rank + 1
        for _ in range(step_8):
            self._weight_chunk()
        self._finish()


@register("dualpipev", summary="DeepSeek DualPipeV (cut-in-half DualPipe, V-shape)",
          constraints="microbatches >= 2 x ranks", placement="v (rank r: stages r and "
          "2P-1-r)", source="deepseek-ai/DualPipe dualpipe/dualpipev.py DualPipeV.step()",
          params={"overlap": "run F&B pairs as one overlapped FB op (default true)"})
def dualpipev(ranks: int, microbatches: int, overlap: bool = True) -> Program:
    """DualPipeV's program: compute, P2P appends and commit batches of ``DualPipeV.step()``.

    Raises :class:`ScheduleError` unless microbatches >= 2 x ranks (the original's
    assertion).
    """
    if microbatches < 2 * ranks:
        raise ScheduleError(f"dualpipev needs microbatches >= 2 x ranks = {2 * ranks} (got "
                            f"{microbatches}) to fill the V")
    pl = Placement(kind="v", ranks=ranks, stages=2 * ranks)
    return traced_program(_DualPipeVTrace, "dualpipev", pl, microbatches, overlap)

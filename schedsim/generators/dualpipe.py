"""DualPipe and DualPipeV, instruction for instruction as deepseek-ai/DualPipe runs them.

Source: deepseek-ai/DualPipe @3da1bbe, ``dualpipe/dualpipe.py`` (``DualPipe.step``) and
``dualpipe/dualpipev.py`` (``DualPipeV.step``); DeepSeek-V3 technical report, Section 3.2.1.

A symbolic trace of ``step()``: the same eight steps and loop counts, the same helpers
(``_forward_chunk``, ``_backward_chunk``, ``_forward_backward_chunk``, ``_weight_chunk``)
and the same per-phase counters, so the program has the same compute order (zero-bubble
``B`` whose ``W`` is deferred FIFO, overlapped ``FB`` pairs), the same P2P ops in the order
they are appended, and a ``COMMIT`` wherever ``_commit_and_wait_comm`` finds a non-empty
list (``batch_isend_irecv`` + ``wait()``).

Naming: the chunk is the direction (module index actually used). DualPipe: chunk 0 flows
rank 0 -> P-1 (stage = rank) and carries microbatches ``0..M/2-1``; chunk 1 flows P-1 -> 0
(stage = P-1-rank) and carries ``M/2..M-1``. DualPipeV (``v`` placement, 2P stages): chunk 0
is stage r, chunk 1 is stage 2P-1-r, every microbatch goes down and back up.
"""
from __future__ import annotations

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.program.ir import (
    Batch,
    Comm,
    Commit,
    Compute,
    Instr,
    Op,
    Placement,
    Program,
)


class _Trace:
    """Replays ``step()`` for one rank, appending instructions instead of running them."""

    def __init__(self, P: int, M: int, rank: int, v: bool, overlap: bool) -> None:
        self.P, self.M, self.rank, self.v, self.overlap = P, M, rank, v, overlap
        self.first, self.last = rank == 0, rank == P - 1
        self.second_half = (not v) and rank >= P // 2
        self.f = [0, 0]
        self.b = [0, 0]
        self.sf = [0, 0]
        self.sb = [0, 0]
        self.rf = [0, 0]
        self.rb = [0, 0]
        self.pending: list[Comm] = []  # P2P ops appended, launched at the next commit
        self.wq: list[Op] = []        # WeightGradStore queue (FIFO)
        self.out: list[Instr] = []

    # -- naming -----------------------------------------------------------------------
    def _chunk(self, phase: int) -> int:
        return phase ^ int(self.second_half)

    def _stage(self, c: int) -> int:
        if self.v:
            return self.rank if c == 0 else 2 * self.P - 1 - self.rank
        return self.rank if c == 0 else self.P - 1 - self.rank

    def _mb(self, c: int, i: int) -> int:
        return i if (self.v or c == 0) else self.M // 2 + i

    def _first_stage(self, c: int) -> bool:
        return (self.first and c == 0) or (self.last and c == 1)

    def _last_stage(self, c: int) -> bool:
        if self.v:
            return self.first and c == 1
        return (self.first and c == 1) or (self.last and c == 0)

    def _no_send_f(self, c: int) -> bool:     # output stays on the rank or is the loss
        return (self.first and c == 1) or (self.last and c == 0)

    def _post(self, kind: str, c: int, i: int) -> None:
        self.pending.append(Comm(kind, self._stage(c), self._mb(c, i)))

    # -- comm helpers (append only) ---------------------------------------------------
    def recv_forward(self, phase: int) -> None:
        c = self._chunk(phase)
        if self._first_stage(c):
            return
        self._post("RECV_F", c, self.rf[c])
        self.rf[c] += 1

    def send_forward(self, phase: int) -> None:
        c = self._chunk(phase)
        if self._no_send_f(c):
            return
        self._post("SEND_F", c, self.sf[c])
        self.sf[c] += 1

    def recv_backward(self, phase: int) -> None:
        c = self._chunk(phase)
        if self._no_send_f(c):     # the last stage of c (or V's local turn) gets no grad
            return
        self._post("RECV_B", c, self.rb[c])
        self.rb[c] += 1

    def send_backward(self, phase: int) -> None:
        c = self._chunk(phase)
        if self._first_stage(c):
            return
        self._post("SEND_B", c, self.sb[c])
        self.sb[c] += 1

    def commit(self) -> None:
        """``_commit_and_wait_comm``: one ``batch_isend_irecv`` of everything appended since
        the last commit, then ``wait()`` on all of it."""
        if self.pending:
            self.out += [Batch(tuple(self.pending)), Commit()]
            self.pending = []

    # -- compute ----------------------------------------------------------------------
    def _f_op(self, phase: int) -> Op:
        c = self._chunk(phase)
        op = Op("F", self._stage(c), self._mb(c, self.f[c]))
        self.f[c] += 1
        return op

    def _b_op(self, phase: int, zb: bool) -> Op:
        c = self._chunk(phase)
        op = Op("B" if zb else "BW", self._stage(c), self._mb(c, self.b[c]))
        self.b[c] += 1
        if zb:
            self.wq.append(Op("W", op.stage, op.mb))
        return op

    def forward_chunk(self, phase: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            self.recv_forward(phase)
        self.commit()
        self.out.append(Compute(self._f_op(phase)))
        if send:
            self.send_forward(phase)

    def backward_chunk(self, phase: int, zb: bool = False, recv: bool = True,
                       send: bool = True) -> None:
        if recv:
            self.recv_backward(phase)
        self.commit()
        self.out.append(Compute(self._b_op(phase, zb)))
        if send:
            self.send_backward(phase)

    def forward_backward_chunk(self, phase0: int, phase1: int, recv0: bool = True) -> None:
        if recv0:
            self.recv_forward(phase0)
        self.recv_backward(phase1)
        self.commit()
        f = self._f_op(phase0)
        b = self._b_op(phase1, False)
        if self.overlap:
            self.out.append(Compute(Op.fb(f, b)))
        else:
            self.out += [Compute(f), Compute(b)]
        self.send_forward(phase0)
        self.send_backward(phase1)

    def weight_chunk(self) -> None:
        self.commit()
        self.out.append(Compute(self.wq.pop(0)))

    # -- DualPipe.step() / DualPipeV.step() --------------------------------------------
    def step(self) -> list[Instr]:
        P, M, v = self.P, self.M, self.v
        if v:
            n_half, half_rank, chunks = P, self.rank, M
            middle = self.last
        else:
            n_half = P // 2
            half_rank = min(self.rank, P - 1 - self.rank)
            chunks = M // 2
            middle = self.rank in (P // 2 - 1, P // 2)
        # Step 1: nF0
        for _ in range((n_half - half_rank - 1) * 2):
            self.forward_chunk(0)
        # Step 2: nF0F1
        step_2 = half_rank + 1
        self.recv_forward(0)
        for i in range(step_2):
            self.forward_chunk(0, recv=False, send=(not v) and middle)
            self.recv_forward(0)
            self.forward_chunk(1, send=(not middle) or (i < step_2 - 1))
            if v or not middle:
                self.send_forward(0)
        # Step 3: nB1W1F1 (zero bubble)
        for _ in range(n_half - half_rank - 1):
            self.backward_chunk(1, zb=True)
            self.recv_forward(1)
            self.weight_chunk()
            self.forward_chunk(1, recv=False)
        # Step 4 (main): nF0B1F1B0
        step_4 = (chunks - n_half * 2 + half_rank + 1) if v else (chunks - P + half_rank + 1)
        for i in range(step_4):
            if i == 0:
                if middle:
                    self.forward_chunk(0, recv=False, send=False)
                    self.send_forward(1)
                    self.backward_chunk(1, send=False)
                    self.send_forward(0)
                    self.send_backward(1)
                else:
                    self.forward_backward_chunk(0, 1, recv0=False)
            else:
                self.forward_backward_chunk(0, 1)
            self.forward_backward_chunk(1, 0)
        # Step 5: nB1F1B0
        for _ in range(n_half - half_rank - 1):
            self.backward_chunk(1)
            self.forward_backward_chunk(1, 0)
        # Step 6: nB1B0 (second half of the chunks use zero bubble)
        step_6 = half_rank + 1
        zb = False
        for i in range(step_6):
            if i == step_6 // 2 and half_rank % 2 == 1:
                zb = True
            self.backward_chunk(1, zb=zb)
            if i == step_6 // 2 and half_rank % 2 == 0:
                zb = True
            self.backward_chunk(0, zb=zb)
        # Step 7: nWB0
        for _ in range(n_half - half_rank - 1):
            self.weight_chunk()
            self.backward_chunk(0, zb=True)
        # Step 8: nW
        for _ in range(half_rank + 1):
            self.weight_chunk()
        assert not self.wq, "WeightGradStore not empty"
        self.commit()
        return self.out


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
    rows = [_Trace(ranks, microbatches, r, False, overlap).step() for r in range(ranks)]
    return Program(name="dualpipe", placement=pl, microbatches=microbatches, ranks=rows,
                   params={"ranks": ranks, "microbatches": microbatches, "overlap": overlap})


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
    rows = [_Trace(ranks, microbatches, r, True, overlap).step() for r in range(ranks)]
    return Program(name="dualpipev", placement=pl, microbatches=microbatches, ranks=rows,
                   params={"ranks": ranks, "microbatches": microbatches, "overlap": overlap})

"""What DualPipe and DualPipeV share: the per-rank chunk helpers of deepseek-ai/DualPipe,
traced symbolically.

Source: deepseek-ai/DualPipe @3da1bbe, ``dualpipe/dualpipe.py`` and
``dualpipe/dualpipev.py``: both classes have the same helpers (``_forward_chunk``,
``_backward_chunk``, ``_forward_backward_chunk``, ``_weight_chunk``, ``_recv_forward``,
``_send_forward``, ``_recv_backward``, ``_send_backward``, ``_commit_and_wait_comm``) and
differ only in how a *phase* names a model chunk (DualPipe's second half of the ranks
swaps the two phases) and which stage and microbatch a chunk's i-th op is. A trace
writes program instructions where the original runs compute or appends P2P ops:

- the P2P helpers append to the pending list (``comm.append_irecv``/``append_isend``);
- ``_commit_and_wait_comm`` turns a non-empty pending list into ``BATCH[...]`` (one
  ``batch_isend_irecv``) and ``COMMIT`` (``wait()`` on every request);
- a zero-bubble backward (``enable_zb``) is an input-gradient ``B`` whose weight gradient
  is queued FIFO (``WeightGradStore``) and run by ``_weight_chunk`` as a ``W``; otherwise a
  backward is the full ``BW``; ``_forward_backward_chunk`` runs one overlapped ``FB``
  (``overlapped_forward_backward``), or ``F`` then ``BW`` without overlap.

Naming: the chunk is the model chunk (module index) a phase uses; chunk 0 receives
activations from the previous rank, chunk 1 from the next one.
"""
from __future__ import annotations

from schedsim.program.flat import CommKind, Opcode, OpKind
from schedsim.program.flat_build import FlatBuilder, Member
from schedsim.program.ir import Placement, Program

#: a compute op as integers: (OpKind, stage, mb)
_Op = tuple[int, int, int]
# plain ints (not enum members): the builder's lists go to numpy in one pass
_F, _B, _W, _BW, _FB = (int(k) for k in OpKind)
_SEND_F, _RECV_F, _SEND_B, _RECV_B = (int(k) for k in list(CommKind)[:4])


class ChunkTrace:
    """One rank of a DualPipe-family ``step()``: its helpers, writing instructions into a
    :class:`~schedsim.program.flat_build.FlatBuilder` as integers (the flat form; no
    object per instruction).

    Subclasses name the chunks (:meth:`_chunk`, :meth:`_stage`, :meth:`_mb`) and write
    ``step()`` as the original does, with these helpers; :meth:`_finish` ends the rank.
    """

    def __init__(self, num_ranks: int, num_chunks: int, rank: int, overlap: bool,
                 out: FlatBuilder) -> None:
        self.num_ranks, self.num_chunks, self.rank = num_ranks, num_chunks, rank
        self.overlapped_forward_backward = overlap
        self.is_first_rank, self.is_last_rank = rank == 0, rank == num_ranks - 1
        # per chunk: compute counters and P2P counters, as the original keeps them
        self.current_f_chunk_id = [0, 0]
        self.current_b_chunk_id = [0, 0]
        self.current_send_f_chunk_id = [0, 0]
        self.current_send_b_chunk_id = [0, 0]
        self.current_recv_f_chunk_id = [0, 0]
        self.current_recv_b_chunk_id = [0, 0]
        self.comm_ops: list[Member] = []   # P2P ops appended, launched at the next commit
        self.weight_grads: list[_Op] = []  # WeightGradStore's queue (FIFO)
        self.out = out

    # -- naming (the only difference between DualPipe and DualPipeV) -------------------
    def _chunk(self, phase: int) -> int:
        """The model chunk a phase uses on this rank."""
        return phase

    def _stage(self, chunk: int) -> int:
        raise NotImplementedError

    def _mb(self, chunk: int, i: int) -> int:
        """Global microbatch of chunk ``chunk``'s i-th microbatch."""
        return i

    def _comm(self, kind: int, chunk: int, counter: list[int]) -> None:
        self.comm_ops.append((kind, self._stage(chunk), self._mb(chunk, counter[chunk])))
        counter[chunk] += 1

    # -- P2P helpers: append only --------------------------------------------------------
    def _recv_forward(self, phase: int) -> None:
        c = self._chunk(phase)
        if (self.is_first_rank and c == 0) or (self.is_last_rank and c == 1):
            return                       # first stage of the chunk (or the V's turn)
        self._comm(_RECV_F, c, self.current_recv_f_chunk_id)

    def _send_forward(self, phase: int) -> None:
        c = self._chunk(phase)
        if (self.is_first_rank and c == 1) or (self.is_last_rank and c == 0):
            return                       # last stage of the chunk (or the V's turn)
        self._comm(_SEND_F, c, self.current_send_f_chunk_id)

    def _recv_backward(self, phase: int) -> None:
        c = self._chunk(phase)
        if (self.is_first_rank and c == 1) or (self.is_last_rank and c == 0):
            return
        self._comm(_RECV_B, c, self.current_recv_b_chunk_id)

    def _send_backward(self, phase: int) -> None:
        c = self._chunk(phase)
        if (self.is_first_rank and c == 0) or (self.is_last_rank and c == 1):
            return
        self._comm(_SEND_B, c, self.current_send_b_chunk_id)

    def _commit_and_wait_comm(self) -> None:
        """One ``batch_isend_irecv`` of everything appended since the last commit, then
        ``wait()`` on all of it."""
        if self.comm_ops:
            self.out.instr(Opcode.BATCH, self.comm_ops)
            self.out.instr(Opcode.COMMIT)
            self.comm_ops = []

    # -- compute -------------------------------------------------------------------------
    def _forward_compute_chunk(self, phase: int) -> _Op:
        c = self._chunk(phase)
        op = (_F, self._stage(c), self._mb(c, self.current_f_chunk_id[c]))
        self.current_f_chunk_id[c] += 1
        return op

    def _backward_compute_chunk(self, phase: int, enable_zb: bool = False) -> _Op:
        c = self._chunk(phase)
        op = (_B if enable_zb else _BW, self._stage(c),
              self._mb(c, self.current_b_chunk_id[c]))
        self.current_b_chunk_id[c] += 1
        if enable_zb:
            self.weight_grads.append((_W, op[1], op[2]))
        return op

    def _forward_chunk(self, phase: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            self._recv_forward(phase)
        self._commit_and_wait_comm()
        self.out.compute_op(*self._forward_compute_chunk(phase))
        if send:
            self._send_forward(phase)

    def _backward_chunk(self, phase: int, enable_zb: bool = False, recv: bool = True,
                        send: bool = True) -> None:
        if recv:
            self._recv_backward(phase)
        self._commit_and_wait_comm()
        self.out.compute_op(*self._backward_compute_chunk(phase, enable_zb))
        if send:
            self._send_backward(phase)

    def _forward_backward_chunk(self, phase0: int, phase1: int, recv0: bool = True) -> None:
        if recv0:
            self._recv_forward(phase0)
        self._recv_backward(phase1)
        self._commit_and_wait_comm()
        f = self._forward_compute_chunk(phase0)
        b = self._backward_compute_chunk(phase1)
        if self.overlapped_forward_backward:
            self.out.compute_op(_FB, f[1], f[2], b)
        else:
            self.out.compute_op(*f)
            self.out.compute_op(*b)
        self._send_forward(phase0)
        self._send_backward(phase1)

    def _weight_chunk(self) -> None:
        self._commit_and_wait_comm()
        self.out.compute_op(*self.weight_grads.pop(0))     # assume FIFO

    def _finish(self) -> None:
        """End of ``step()``: the WeightGradStore is empty, the last commit is made, the
        rank's program ends."""
        assert not self.weight_grads, "WeightGradStore not empty"
        self._commit_and_wait_comm()
        self.out.end_rank()


def traced_program(trace: type[ChunkTrace], name: str, placement: Placement,
                   microbatches: int, overlap: bool) -> Program:
    """The program of ``trace``'s ``step()`` run on every rank in turn, in the flat form;
    validated (the generators' tests prove it against deepseek-ai/DualPipe's own
    order, tests/test_dualpipe.py)."""
    ranks = placement.ranks
    out = FlatBuilder()
    for r in range(ranks):
        trace(ranks, microbatches, r, overlap, out).step()
    return Program.from_flat(out.build(), name=name, placement=placement,
                             microbatches=microbatches, validated=True,
                             params={"ranks": ranks, "microbatches": microbatches,
                                     "overlap": overlap})

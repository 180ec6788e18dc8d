"""The ``megatron`` policy's interleaved schedule: Megatron-LM's
``forward_backward_pipelining_with_interleaving`` (training) for one rank, step for step.

Source: NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py`` (branch
``core_r0.19.0``, the tree of the megatron-core 0.19.2 wheel; see
:data:`schedsim.program.megatron_comm.MEGATRON_COMMIT`): the warmup loop, the steady state's
``pp_pre_forward``/``pp_post_forward``/``pp_pre_backward``/``pp_post_backward`` under
``overlap_p2p_comm`` (one combined ``send_forward_backward_recv_forward_backward``
without it), the cooldown loop, with Megatron's handle lists
(``recv_prev_wait_handles``, ``recv_next_wait_handles``, ``send_next_wait_handle``,
``send_prev_wait_handle``), ``overlap_p2p_comm_warmup_flush`` (warmup and cooldown
receives prefetched one iteration ahead, sends launched without waiting) and
``deallocate_pipeline_outputs`` (each overlapped forward send waited right after its
launch, before the output is freed).
"""
from __future__ import annotations

from collections import deque

from schedsim.program.ir import Comm, Op
from schedsim.program.megatron_comm import Communicator, megatron_schedule_table, megatron_warmup


class Interleaved:
    """One rank's interleaved step (module docstring).

    A recv is named by the model chunk Megatron files its tensor under
    (``recv_tensor_from_previous_stage``): the k-th recv for chunk c carries the k-th
    microbatch chunk c runs (forward order for activations, backward order for
    gradients).
    """

    def __init__(self, x: Communicator, p: int, m: int, v: int, n: int, overlap: bool,
                 flush: bool = False, dealloc: bool = False) -> None:
        self.x, self.p, self.v, self.overlap = x, p, v, overlap
        self.flush, self.dealloc = flush, dealloc
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

    def recv(self, recv: bool, chunk: int, forward: bool) -> Comm | None:
        """The recv Megatron files under ``chunk`` (None when ``recv`` is false): the
        input of that chunk's next forward (``forward``) or backward."""
        if not recv:
            return None
        mbs = self.fwd_mbs if forward else self.bwd_mbs
        op = Op("F" if forward else "BW", chunk * self.p + self.x.r, mbs[chunk].popleft())
        c = self.x.recv_for(op)
        assert c is not None, op
        return c

    def recv_prev(self, recv: bool, chunk: int) -> Comm | None:
        return self.recv(recv, chunk, True)

    def recv_next(self, recv: bool, chunk: int) -> Comm | None:
        return self.recv(recv, chunk, False)

    def track_forward(self, handles: dict[str, Comm]) -> None:
        """After an overlapped ``send_forward_recv_forward``: wait the previous send,
        keep the new one (waited at once under ``deallocate_pipeline_outputs``), queue
        the recv."""
        if self.send_next_handle is not None:
            self.x.wait(self.send_next_handle)
        self.send_next_handle = handles.get("send_next")
        if "recv_prev" in handles:
            self.recv_prev_handles.append(handles["recv_prev"])
        if self.send_next_handle is not None and self.dealloc:
            self.x.wait(self.send_next_handle)
            self.send_next_handle = None

    def track_backward(self, handles: dict[str, Comm]) -> None:
        """After an overlapped ``send_backward_recv_backward`` (same, other direction;
        gradients are not freed, so no early wait)."""
        if self.send_prev_handle is not None:
            self.x.wait(self.send_prev_handle)
        self.send_prev_handle = handles.get("send_prev")
        if "recv_next" in handles:
            self.recv_next_handles.append(handles["recv_next"])

    def pop_wait(self, handles: list[Comm]) -> None:
        """Wait the oldest pending recv (Megatron asserts one is pending under
        ``overlap_p2p_comm_warmup_flush``; it skips the wait otherwise)."""
        assert handles or not self.flush, "Megatron: 'should have registered recv handle'"
        if handles:
            self.x.wait(handles.pop(0))

    # -- the three phases -----------------------------------------------------------------
    def run(self) -> None:
        x = self.x
        if not self.first:                          # recv_forward for chunk 0
            x.communicate(recv_prev=self.recv_prev(True, 0))
        for k in range(self.warmup):
            self.warmup_step(k)
        for k in range(self.remaining):
            (self.steady_overlapped if self.overlap else self.steady)(k)
        if self.all_warmup:                          # recv_backward for the last chunk
            x.communicate(recv_next=self.recv_next(not self.last, self.v - 1))
        for k in range(self.remaining, self.total):
            self.cooldown_step(k)
        if self.send_prev_handle is not None:
            x.wait(self.send_prev_handle)
        assert not self.recv_prev_handles and not self.recv_next_handles

    def head(self, k: int, forward: bool) -> tuple[bool, int]:
        """The start of warmup iteration k (``forward``) or cooldown iteration k: wait the
        oldest pending recv (cooldown always; warmup under
        ``overlap_p2p_comm_warmup_flush``) unless the op takes the model's input (or the
        loss); whether iteration k receives for k+1, and for which chunk (none at the
        last iteration); under the flush option a rank that is not the leading one
        prefetches that recv now, unwaited."""
        leading = self.first if forward else self.last
        edge = 0 if forward else self.v - 1
        handles = self.recv_prev_handles if forward else self.recv_next_handles
        if ((self.flush or not forward) and k != 0
                and not (self.chunk(k, forward) == edge and leading)):
            self.pop_wait(handles)
        recv, nxt = self.recv_from_previous_stage(k, forward)
        if k == self.total - 1:
            recv = False
        if self.flush and not leading:              # prefetch the recv of k+1
            name = "recv_prev" if forward else "recv_next"
            c = (self.recv_prev if forward else self.recv_next)(recv, nxt)
            h = self.x.communicate(**{name: c}, wait=False)
            if h:
                handles.append(h[name])
        return recv, nxt

    def warmup_step(self, k: int) -> None:
        x, v = self.x, self.v
        recv, nxt = self.head(k, True)
        f = self.f_op(k)
        x.compute(f)
        last_warmup = k == self.warmup - 1 and not self.all_warmup
        if self.flush:                               # launched, waited by track_forward
            self.track_forward(x.communicate(
                send_next=x.send_of(f),
                recv_prev=self.recv_prev(recv, nxt) if self.first else None, wait=False))
        elif last_warmup and not self.overlap:
            # send_forward_backward_recv_forward_backward
            x.communicate(send_next=x.send_of(f), recv_prev=self.recv_prev(recv, nxt),
                          recv_next=self.recv_next(not self.last, v - 1))
        else:                                       # send_forward_recv_forward
            x.communicate(send_next=x.send_of(f), recv_prev=self.recv_prev(recv, nxt))
        if last_warmup and self.overlap:            # send_backward_recv_backward, async
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

    def cooldown_step(self, k: int) -> None:
        x = self.x
        recv, nxt = self.head(k, False)
        b = self.b_op(k)
        x.compute(b)
        if self.flush:
            self.track_backward(x.communicate(
                send_prev=x.send_of(b),
                recv_next=self.recv_next(recv, nxt) if self.last else None, wait=False))
        else:                                        # send_backward_recv_backward
            x.communicate(send_prev=x.send_of(b), recv_next=self.recv_next(recv, nxt))

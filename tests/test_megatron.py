"""The ``megatron`` comm policy against Megatron-LM's own code (NVIDIA/Megatron-LM,
``megatron/core/pipeline_parallel/p2p_communication.py`` and ``schedules.py``): the op
order of every ``_communicate`` call, the program text of small cases traced by hand
through ``forward_backward_pipelining_without_interleaving`` /
``forward_backward_pipelining_with_interleaving``, and the runs the issue asks for."""
from __future__ import annotations

import copy
import re

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScheduleError
from schedsim.generators import build_program, generate
from schedsim.program.ir import Batch, Comm, Compute, Placement, Post, Schedule, Wait
from schedsim.program.lower import POLICIES, lower
from schedsim.program.comm_plan import op_recvs
from schedsim.program.flat_build import FlatBuilder
from schedsim.program.megatron_comm import Communicator
from schedsim.program.ops import launched
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

runner = CliRunner()
COSTS = CostModel(F=1, BW=2)


def _call(rank: int, batch: bool, wait: bool = True) -> tuple[list[str], dict]:
    """One ``_communicate`` with all four tensors on a middle rank of a 4-stage pipe."""
    sched = generate("1f1b", 4, 4)
    x = Communicator(sched, rank, batch, FlatBuilder())
    handles = x.communicate(send_next=Comm("SEND_F", rank, 0), send_prev=Comm("SEND_B", rank, 0),
                            recv_prev=Comm("RECV_F", rank, 1), recv_next=Comm("RECV_B", rank, 1),
                            wait=wait)
    return [str(c) for i in _written(x) for c in launched(i)], handles


def _written(x: Communicator) -> list:
    """The instructions ``x`` wrote so far (its rank ended in a copy of the builder)."""
    b = copy.deepcopy(x.out)
    b.end_rank()
    return b.build().rows()[0]


def test_batched_call_op_order() -> None:
    """p2p_communication.py ``_batched_p2p_ops``: send_prev, recv_prev, send_next,
    recv_next in one ``batch_isend_irecv``; ``_communicate`` then waits every request."""
    for rank in (1, 2):
        got, handles = _call(rank, batch=True)
        s = str(rank)
        assert got == [s + "SEND_B0", s + "RECV_F1", s + "SEND_F0", s + "RECV_B1"]
        sched = generate("1f1b", 4, 4)
        x = Communicator(sched, rank, True, FlatBuilder())
        x.communicate(send_next=Comm("SEND_F", rank, 0), recv_next=Comm("RECV_B", rank, 1))
        assert _written(x) == [Batch((Comm("SEND_F", rank, 0), Comm("RECV_B", rank, 1))),
                         Wait((Comm("SEND_F", rank, 0), Comm("RECV_B", rank, 1)))]
        assert handles == {}


def test_unbatched_call_op_order_even_and_odd() -> None:
    """p2p_communication.py ``_p2p_ops``: an even pipeline rank isends to next, irecvs
    from prev, isends to prev, irecvs from next; an odd rank irecvs from prev, isends to
    next, irecvs from next, isends to prev (so neighbours pair each send with a recv).
    Each is its own launch; with ``wait_on_reqs`` all are waited after the launches, else
    the handles come back by Megatron's names."""
    assert _call(2, batch=False)[0] == ["2SEND_F0", "2RECV_F1", "2SEND_B0", "2RECV_B1"]
    assert _call(1, batch=False)[0] == ["1RECV_F1", "1SEND_F0", "1RECV_B1", "1SEND_B0"]
    sched = generate("1f1b", 4, 4)
    x = Communicator(sched, 1, False, FlatBuilder())
    h = x.communicate(send_next=Comm("SEND_F", 1, 0), recv_prev=Comm("RECV_F", 1, 1),
                      wait=False)
    assert h == {"recv_prev": Comm("RECV_F", 1, 1), "send_next": Comm("SEND_F", 1, 0)}
    assert _written(x) == [Post(Comm("RECV_F", 1, 1)), Post(Comm("SEND_F", 1, 0))]
    x.communicate()                      # nothing to move: Megatron launches nothing
    assert len(_written(x)) == 2


ONE_F_ONE_B_BATCHED = (
    "rank 0: 0F0 BATCH[0SEND_F0] WAIT[0SEND_F0] 0F1 BATCH[0SEND_F1] WAIT[0SEND_F1] "
    "0F2 BATCH[0SEND_F2+0RECV_B0] WAIT[0SEND_F2+0RECV_B0] 0BW0 0F3 "
    "BATCH[0SEND_F3+0RECV_B1] WAIT[0SEND_F3+0RECV_B1] 0BW1 BATCH[0RECV_B2] "
    "WAIT[0RECV_B2] 0BW2 BATCH[0RECV_B3] WAIT[0RECV_B3] 0BW3\n"
    "rank 1: BATCH[1RECV_F0] WAIT[1RECV_F0] 1F0 BATCH[1SEND_F0] WAIT[1SEND_F0] "
    "BATCH[1RECV_F1] WAIT[1RECV_F1] 1F1 BATCH[1SEND_F1+1RECV_B0] "
    "WAIT[1SEND_F1+1RECV_B0] 1BW0 BATCH[1SEND_B0+1RECV_F2] WAIT[1SEND_B0+1RECV_F2] "
    "1F2 BATCH[1SEND_F2+1RECV_B1] WAIT[1SEND_F2+1RECV_B1] 1BW1 "
    "BATCH[1SEND_B1+1RECV_F3] WAIT[1SEND_B1+1RECV_F3] 1F3 BATCH[1SEND_F3+1RECV_B2] "
    "WAIT[1SEND_F3+1RECV_B2] 1BW2 BATCH[1SEND_B2] WAIT[1SEND_B2] BATCH[1RECV_B3] "
    "WAIT[1RECV_B3] 1BW3 BATCH[1SEND_B3] WAIT[1SEND_B3]\n"
    "rank 2: BATCH[2RECV_F0] WAIT[2RECV_F0] 2F0 2BW0 BATCH[2SEND_B0+2RECV_F1] "
    "WAIT[2SEND_B0+2RECV_F1] 2F1 2BW1 BATCH[2SEND_B1+2RECV_F2] "
    "WAIT[2SEND_B1+2RECV_F2] 2F2 2BW2 BATCH[2SEND_B2+2RECV_F3] "
    "WAIT[2SEND_B2+2RECV_F3] 2F3 2BW3 BATCH[2SEND_B3] WAIT[2SEND_B3]\n"
)
ONE_F_ONE_B_UNBATCHED = (
    "rank 0: 0F0 0SEND_F0 WAIT[0SEND_F0] 0F1 0SEND_F1 WAIT[0SEND_F1] 0F2 0SEND_F2 "
    "0RECV_B0 WAIT[0SEND_F2] WAIT[0RECV_B0] 0BW0 0F3 0SEND_F3 0RECV_B1 WAIT[0SEND_F3] "
    "WAIT[0RECV_B1] 0BW1 0RECV_B2 WAIT[0RECV_B2] 0BW2 0RECV_B3 WAIT[0RECV_B3] 0BW3\n"
    "rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1SEND_F0 WAIT[1SEND_F0] 1RECV_F1 "
    "WAIT[1RECV_F1] 1F1 1SEND_F1 1RECV_B0 WAIT[1SEND_F1] WAIT[1RECV_B0] 1BW0 1RECV_F2 "
    "1SEND_B0 WAIT[1RECV_F2] WAIT[1SEND_B0] 1F2 1SEND_F2 1RECV_B1 WAIT[1SEND_F2] "
    "WAIT[1RECV_B1] 1BW1 1RECV_F3 1SEND_B1 WAIT[1RECV_F3] WAIT[1SEND_B1] 1F3 1SEND_F3 "
    "1RECV_B2 WAIT[1SEND_F3] WAIT[1RECV_B2] 1BW2 1SEND_B2 WAIT[1SEND_B2] 1RECV_B3 "
    "WAIT[1RECV_B3] 1BW3 1SEND_B3 WAIT[1SEND_B3]\n"
    "rank 2: 2RECV_F0 WAIT[2RECV_F0] 2F0 2BW0 2RECV_F1 2SEND_B0 WAIT[2RECV_F1] "
    "WAIT[2SEND_B0] 2F1 2BW1 2RECV_F2 2SEND_B1 WAIT[2RECV_F2] WAIT[2SEND_B1] 2F2 2BW2 "
    "2RECV_F3 2SEND_B2 WAIT[2RECV_F3] WAIT[2SEND_B2] 2F3 2BW3 2SEND_B3 WAIT[2SEND_B3]\n"
)
INTERLEAVED_BATCHED = (
    "rank 0: 0F0 BATCH[0SEND_F0] WAIT[0SEND_F0] 0F1 BATCH[0SEND_F1] WAIT[0SEND_F1] "
    "0F2 BATCH[3RECV_F0+0SEND_F2] WAIT[3RECV_F0+0SEND_F2] 3F0 "
    "BATCH[3RECV_F1+3SEND_F0] WAIT[3RECV_F1+3SEND_F0] 3F1 BATCH[3RECV_F2+3SEND_F1] "
    "WAIT[3RECV_F2+3SEND_F1] 3F2 BATCH[3SEND_F2] WAIT[3SEND_F2] BATCH[3RECV_B0] "
    "WAIT[3RECV_B0] 3BW0 BATCH[3SEND_B0+3RECV_B1] WAIT[3SEND_B0+3RECV_B1] 3BW1 "
    "BATCH[3SEND_B1+3RECV_B2] WAIT[3SEND_B1+3RECV_B2] 3BW2 BATCH[3SEND_B2+0RECV_B0] "
    "WAIT[3SEND_B2+0RECV_B0] 0BW0 BATCH[0RECV_B1] WAIT[0RECV_B1] 0BW1 BATCH[0RECV_B2] "
    "WAIT[0RECV_B2] 0BW2\n"
    "rank 1: BATCH[1RECV_F0] WAIT[1RECV_F0] 1F0 BATCH[1RECV_F1+1SEND_F0] "
    "WAIT[1RECV_F1+1SEND_F0] 1F1 BATCH[1RECV_F2+1SEND_F1] WAIT[1RECV_F2+1SEND_F1] 1F2 "
    "BATCH[4RECV_F0+1SEND_F2] WAIT[4RECV_F0+1SEND_F2] 4F0 BATCH[4RECV_F1+4SEND_F0] "
    "WAIT[4RECV_F1+4SEND_F0] 4F1 BATCH[4RECV_F2+4SEND_F1+4RECV_B0] "
    "WAIT[4RECV_F2+4SEND_F1+4RECV_B0] 4F2 4BW0 BATCH[4SEND_B0+4SEND_F2+4RECV_B1] "
    "WAIT[4SEND_B0+4SEND_F2+4RECV_B1] 4BW1 BATCH[4SEND_B1+4RECV_B2] "
    "WAIT[4SEND_B1+4RECV_B2] 4BW2 BATCH[4SEND_B2+1RECV_B0] WAIT[4SEND_B2+1RECV_B0] "
    "1BW0 BATCH[1SEND_B0+1RECV_B1] WAIT[1SEND_B0+1RECV_B1] 1BW1 "
    "BATCH[1SEND_B1+1RECV_B2] WAIT[1SEND_B1+1RECV_B2] 1BW2 BATCH[1SEND_B2] "
    "WAIT[1SEND_B2]\n"
    "rank 2: BATCH[2RECV_F0] WAIT[2RECV_F0] 2F0 BATCH[2RECV_F1+2SEND_F0] "
    "WAIT[2RECV_F1+2SEND_F0] 2F1 BATCH[2RECV_F2+2SEND_F1] WAIT[2RECV_F2+2SEND_F1] 2F2 "
    "BATCH[5RECV_F0+2SEND_F2] WAIT[5RECV_F0+2SEND_F2] 5F0 5BW0 "
    "BATCH[5SEND_B0+5RECV_F1] WAIT[5SEND_B0+5RECV_F1] 5F1 5BW1 "
    "BATCH[5SEND_B1+5RECV_F2] WAIT[5SEND_B1+5RECV_F2] 5F2 5BW2 "
    "BATCH[5SEND_B2+2RECV_B0] WAIT[5SEND_B2+2RECV_B0] 2BW0 BATCH[2SEND_B0+2RECV_B1] "
    "WAIT[2SEND_B0+2RECV_B1] 2BW1 BATCH[2SEND_B1+2RECV_B2] WAIT[2SEND_B1+2RECV_B2] "
    "2BW2 BATCH[2SEND_B2] WAIT[2SEND_B2]\n"
)
INTERLEAVED_OVERLAP = (
    "rank 0: 0F0 0SEND_F0 WAIT[0SEND_F0] 0F1 0SEND_F1 WAIT[0SEND_F1] 0F2 0SEND_F2 "
    "3RECV_F0 WAIT[0SEND_F2] WAIT[3RECV_F0] 3F0 3SEND_F0 3RECV_F1 WAIT[3SEND_F0] "
    "WAIT[3RECV_F1] 3F1 3SEND_F1 3RECV_F2 WAIT[3SEND_F1] WAIT[3RECV_F2] 3F2 3SEND_F2 "
    "WAIT[3SEND_F2] 3RECV_B0 WAIT[3RECV_B0] 3BW0 3SEND_B0 3RECV_B1 WAIT[3SEND_B0] "
    "WAIT[3RECV_B1] 3BW1 3SEND_B1 3RECV_B2 WAIT[3SEND_B1] WAIT[3RECV_B2] 3BW2 "
    "3SEND_B2 0RECV_B0 WAIT[3SEND_B2] WAIT[0RECV_B0] 0BW0 0RECV_B1 WAIT[0RECV_B1] "
    "0BW1 0RECV_B2 WAIT[0RECV_B2] 0BW2\n"
    "rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1RECV_F1 1SEND_F0 WAIT[1RECV_F1] "
    "WAIT[1SEND_F0] 1F1 1RECV_F2 1SEND_F1 WAIT[1RECV_F2] WAIT[1SEND_F1] 1F2 4RECV_F0 "
    "1SEND_F2 WAIT[4RECV_F0] WAIT[1SEND_F2] 4F0 4RECV_F1 4SEND_F0 WAIT[4RECV_F1] "
    "WAIT[4SEND_F0] 4F1 4RECV_F2 4SEND_F1 WAIT[4RECV_F2] WAIT[4SEND_F1] 4RECV_B0 4F2 "
    "4SEND_F2 WAIT[4RECV_B0] 4BW0 4RECV_B1 4SEND_B0 WAIT[4RECV_B1] 4BW1 4RECV_B2 "
    "4SEND_B1 WAIT[4RECV_B2] WAIT[4SEND_B1] 4BW2 1RECV_B0 4SEND_B2 WAIT[1RECV_B0] "
    "WAIT[4SEND_B2] 1BW0 1RECV_B1 1SEND_B0 WAIT[1RECV_B1] WAIT[1SEND_B0] 1BW1 "
    "1RECV_B2 1SEND_B1 WAIT[1RECV_B2] WAIT[1SEND_B1] 1BW2 1SEND_B2 WAIT[1SEND_B2] "
    "WAIT[4SEND_B0]\n"
    "rank 2: 2RECV_F0 WAIT[2RECV_F0] 2F0 2SEND_F0 2RECV_F1 WAIT[2SEND_F0] "
    "WAIT[2RECV_F1] 2F1 2SEND_F1 2RECV_F2 WAIT[2SEND_F1] WAIT[2RECV_F2] 2F2 2SEND_F2 "
    "5RECV_F0 WAIT[2SEND_F2] WAIT[5RECV_F0] 5F0 5RECV_F1 5BW0 5SEND_B0 WAIT[5RECV_F1] "
    "5F1 5RECV_F2 5BW1 5SEND_B1 WAIT[5SEND_B0] WAIT[5RECV_F2] 5F2 5BW2 5SEND_B2 "
    "2RECV_B0 WAIT[5SEND_B1] WAIT[2RECV_B0] 2BW0 2SEND_B0 2RECV_B1 WAIT[2SEND_B0] "
    "WAIT[2RECV_B1] 2BW1 2SEND_B1 2RECV_B2 WAIT[2SEND_B1] WAIT[2RECV_B2] 2BW2 "
    "2SEND_B2 WAIT[2SEND_B2] WAIT[5SEND_B2]\n"
)


def test_1f1b_program_text() -> None:
    """schedules.py ``forward_backward_pipelining_without_interleaving``, p=3, m=4, traced
    by hand: rank r runs p-r-1 warmup forwards (recv_forward, F, send_forward), one more
    recv_forward, then per step F, send_forward_recv_backward, BW,
    send_backward_recv_forward (send_backward on the last step), then the cooldown
    (recv_backward, BW, send_backward); the first stage never receives activations, the
    last never sends them."""
    s = generate("1f1b", 3, 4)
    assert lower(s, "megatron").to_text() == ONE_F_ONE_B_BATCHED
    assert lower(s, "megatron", batch_p2p_comm=False).to_text() == ONE_F_ONE_B_UNBATCHED


def test_interleaved_program_text() -> None:
    """schedules.py ``forward_backward_pipelining_with_interleaving``, p=3, m=3, v=2 (N=3),
    traced by hand. Rank 0 (warmup 2*2+3 >= 6: every forward in warmup) receives chunk
    1's input from rank 2 only from k = p-1 on (``recv_tensor_from_previous_stage``), then
    takes the cooldown's leading recv_backward. Rank 1's last warmup call is the combined
    send_forward_backward_recv_forward_backward (recv_prev, send_next, recv_next). With
    overlap_p2p_comm the last rank's steady state launches without waiting: each recv is
    waited by the forward or backward that pops it, each send after the next send in its
    direction; the last send backward is waited after the cooldown."""
    s = generate("interleaved-1f1b", 3, 3, variant="megatron")
    assert lower(s, "megatron").to_text() == INTERLEAVED_BATCHED
    assert lower(s, "megatron", overlap_p2p_comm=True).to_text() == INTERLEAVED_OVERLAP


def _batch_shape(prog) -> None:
    """Every BATCH is followed by the WAIT of exactly its ops (``_communicate`` waits at
    once); no bare post."""
    for row in prog.ranks:
        for i, ins in enumerate(row):
            assert not isinstance(ins, Post)
            if isinstance(ins, Batch):
                assert row[i + 1] == Wait(ins.comms)


def _unbatched_shape(prog, overlap: bool) -> None:
    """No BATCH; every launch is a bare post; without overlap each run of posts is
    followed by one WAIT per op, in launch order (``_communicate`` waits each request)."""
    for row in prog.ranks:
        i = 0
        while i < len(row):
            assert not isinstance(row[i], Batch)
            run = []
            while i < len(row) and isinstance(row[i], Post):
                run.append(row[i].comm)
                i += 1
            if run and not overlap:
                assert row[i:i + len(run)] == [Wait((c,)) for c in run]
                i += len(run)
            i += not run


def _inputs_waited_before_use(prog) -> None:
    """Every compute op's cross-rank input has been waited before the op runs (Megatron's
    handle lists pop the right recv)."""
    for r, row in enumerate(prog.ranks):
        waited: set = set()
        for ins in row:
            if isinstance(ins, Wait):
                waited |= set(ins.comms)
            elif isinstance(ins, Compute):
                assert set(op_recvs(ins.op, r, prog.placement)) <= waited, (r, ins.op)


@pytest.mark.parametrize("batch", [True, False])
def test_1f1b_makespan_33_under_rendezvous_per_rank_stream(batch: bool) -> None:
    """The issue's case: 1f1b p=4 m=8, F=1, BW=2, rendezvous, one comm stream per rank:
    Megatron's blocking calls still give the ideal (m+p-1)(F+BW) = 33."""
    prog = lower(generate("1f1b", 4, 8), "megatron", batch_p2p_comm=batch)
    (_batch_shape if batch else lambda p: _unbatched_shape(p, False))(prog)
    tl = simulate(prog, COSTS, LinkModel(), CommModel(semantics="rendezvous",
                                                      comm_stream="per-rank"))
    assert tl.deadlock is None and tl.makespan == 33


@pytest.mark.parametrize("overlap", [False, True])
def test_interleaved_completes_under_rendezvous_per_peer_stream(overlap: bool) -> None:
    """interleaved-1f1b --variant megatron p=4 v=2 m=8 under rendezvous with a per-peer
    comm stream, both overlap_p2p_comm settings; with zero latency both reach the
    schedule's own makespan 57 (= async's), with latency 0.5 the blocking calls cost
    5.5 more than overlapping them."""
    s = generate("interleaved-1f1b", 4, 8, variant="megatron")
    prog = lower(s, "megatron", overlap_p2p_comm=overlap)
    (_unbatched_shape(prog, True) if overlap else _batch_shape(prog))
    _inputs_waited_before_use(prog)
    comm = CommModel(semantics="rendezvous", comm_stream="per-peer")
    assert simulate(prog, COSTS, LinkModel(), comm).makespan == 57
    slow = simulate(prog, COSTS, LinkModel(latency=0.5), comm).makespan
    assert slow == (64 if overlap else 69.5)
    assert simulate(lower(s, "async"), COSTS, LinkModel(latency=0.5), comm).makespan == 64


def test_interleaved_sweep_never_deadlocks() -> None:
    """Every valid (p, v, m, N) with p <= 5, v <= 3, m <= 2p+1, for all three settings:
    inputs waited before use, and no deadlock under rendezvous on a shared stream (per
    peer and per rank) with latency (2 ranks batched excepted: its calls cross on the
    wire, see the 2-rank test)."""
    runs = 0
    for p in range(2, 6):
        for v in (2, 3):
            for m in range(p, 2 * p + 2):
                for n in range(p, m + 1):
                    if 0 < m % n < p:
                        continue
                    s = generate("interleaved-1f1b", p, m, chunks=v, variant="megatron",
                                 group_size=n)
                    for opts in ({}, {"batch_p2p_comm": False},
                                 {"overlap_p2p_comm": True}):
                        if p == 2 and opts == {}:
                            continue        # crossed on the wire: see the 2-rank test
                        prog = lower(s, "megatron", **opts)
                        _inputs_waited_before_use(prog)
                        for stream in ("per-peer", "per-rank"):
                            tl = simulate(prog, COSTS, LinkModel(latency=0.3),
                                          CommModel(semantics="rendezvous",
                                                    comm_stream=stream),
                                          raise_on_deadlock=False)
                            assert tl.deadlock is None, (p, v, m, n, opts, stream)
                        runs += 1
    assert runs == 168


def test_group_size_is_read_off_the_order() -> None:
    """N (microbatch_group_size_per_vp_stage) is not passed to the policy: it is the
    length of rank 0's first run of chunk-0 forwards. torch's interleaved order with 2
    rounds of 5 is Megatron's with N = 5, so it lowers too."""
    meg5 = generate("interleaved-1f1b", 4, 10, variant="megatron", group_size=5)
    torch_order = generate("interleaved-1f1b", 4, 10)
    assert torch_order.ranks == meg5.ranks
    assert lower(torch_order, "megatron").ranks == lower(meg5, "megatron").ranks


@pytest.mark.parametrize("name,kw,opts,needle", [
    ("looped-bfs", {}, {}, "rank 0 op 15 is 4F7 but Megatron-LM's "
     "forward_backward_pipelining_with_interleaving runs 4BW0 there"),
    ("gpipe", {}, {}, "rank 0 op 4 is 0F4 but Megatron-LM's "
     "forward_backward_pipelining_without_interleaving runs 0BW0"),
    ("zbv", {}, {}, "loop placement"),
    ("1f1b", {}, {"overlap_p2p_comm": True}, "needs the interleaved schedule"),
    ("interleaved-1f1b", {"variant": "megatron"},
     {"overlap_p2p_comm": True, "batch_p2p_comm": True}, "Can not use both"),
    ("1f1b", {}, {"chunks": 2}, "takes no parameter 'chunks' (it takes: batch_p2p_comm, "
     "overlap_p2p_comm, overlap_p2p_comm_warmup_flush, deallocate_pipeline_outputs, "
     "variable_seq_lengths)"),
    ("interleaved-1f1b", {"variant": "megatron"}, {"overlap_p2p_comm_warmup_flush": True},
     "needs overlap_p2p_comm=true"),
])
def test_refusals(name: str, kw: dict, opts: dict, needle: str) -> None:
    with pytest.raises(ScheduleError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        lower(generate(name, 4, 8, **kw), "megatron", **opts)


def test_two_ranks_interleaved_runs_and_states_the_same_peer_exchange() -> None:
    """megatron.core runs interleaving on 2 ranks without overlap_p2p_comm (only
    Megatron-LM's training arguments refuse it), so the policy lowers it. Unbatched,
    ``_p2p_ops``'s rank-parity order makes both sides post activation then gradient, and
    the program runs. Batched, the warmup's last call and every steady call hold a send and
    a recv each way between the two ranks in orders the sides do not share (rank 0's
    BATCH[2SEND_B0+0SEND_F2+2RECV_B1] sends the gradient first, rank 1's
    BATCH[3SEND_B1+1RECV_F2+1RECV_B0] receives the activation first): the simulator
    reports the silent swap, naming that send and recv (the two tensors have one size;
    docs/messages.md). With overlap_p2p_comm it runs. Both that run
    take the ideal m*v*(F+BW) + (p-1)(F+BW) = 24 + 3 = 27 with zero latency; with latency
    0.5 the blocking unbatched calls cost 32.5 against the overlapped 30."""
    s = generate("interleaved-1f1b", 2, 4, variant="megatron")
    rdv = CommModel(semantics="rendezvous")
    # the gradient and the activation have the same size: NCCL pairs them silently, a
    # silent swap (Megatron-LM #750; docs/messages.md) the run reports and goes on with
    swaps = simulate(lower(s, "megatron"), COSTS, LinkModel(), rdv).findings
    assert re.search(r"silent swap: the 5th send on link 0->1 is 2SEND_B0 \(rank 0, "
                     r"instr 14, in BATCH\[2SEND_B0\+0SEND_F2\+2RECV_B1\]\) but the 5th "
                     r"recv is 1RECV_F2 \(rank 1, instr 14, in "
                     r"BATCH\[3SEND_B1\+1RECV_F2\+1RECV_B0\]\)", swaps[0][2]), swaps
    for opts, slow in (({"batch_p2p_comm": False}, 32.5), ({"overlap_p2p_comm": True}, 30)):
        prog = lower(s, "megatron", **opts)
        tl = simulate(prog, COSTS, LinkModel(), rdv)
        assert tl.deadlock is None and tl.makespan == 27
        assert simulate(prog, COSTS, LinkModel(latency=0.5), rdv).makespan == slow


def test_cli_and_scenario_params() -> None:
    """--param reaches the policy; a policy parameter without its policy, an unknown one
    and a bad value are one clear line, exit 2."""
    assert "megatron" in POLICIES and set(POLICIES["megatron"].params) == {
        "batch_p2p_comm", "overlap_p2p_comm", "overlap_p2p_comm_warmup_flush",
        "deallocate_pipeline_outputs", "variable_seq_lengths"}
    base = ["generate", "1f1b", "-p", "3", "-m", "4", "--comm-policy", "megatron"]
    r = runner.invoke(app, base + ["--param", "batch_p2p_comm=false"])
    assert r.exit_code == 0 and r.stdout == ONE_F_ONE_B_UNBATCHED
    r = runner.invoke(app, base)
    assert r.exit_code == 0 and r.stdout == ONE_F_ONE_B_BATCHED
    for args, msg in (
            (["generate", "1f1b", "-p", "3", "-m", "4", "--param", "batch_p2p_comm=false"],
             "batch_p2p_comm is a parameter of the megatron comm policy, not of schedule "
             "'1f1b': add --comm-policy megatron"),
            (base + ["--param", "batch_p2p_comm=maybe"], "bad value batch_p2p_comm='maybe'"),
            (base + ["--param", "flush=1"], "schedule '1f1b' takes no parameter 'flush'")):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and msg in r.stderr and "Traceback" not in r.output
    prog = build_program("1f1b", 3, 4, "megatron", batch_p2p_comm=False)
    assert prog.to_text() == ONE_F_ONE_B_UNBATCHED

"""Comm policies ``torch`` and ``commit``: torch's real P2P order, DualPipe-style batches,
and link-order recv posting (shared with ``async``)."""
from __future__ import annotations

import json

import pytest
import torch_ref  # noqa: E402  (tests/ is on sys.path: conftest)
from conftest import ref_path

from schedsim.errors import ScheduleError
from schedsim.generators import generate
from schedsim.generators.torch_family import interleaved_1f1b, interleaved_zb, looped_bfs, zbv_torch
from schedsim.program.ir import Batch, Commit, Compute, Op, Placement, Post, Schedule, Wait
from schedsim.program.lower import POLICIES, lower
from schedsim.program.lowering import link_ordered_recvs, op_recvs
from schedsim.program.tokens import format_instr, format_op
from schedsim.program.torch_runtime import add_send_recv, torch_runtime_kind
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate


def tokens(prog) -> list[list[str]]:
    return [[format_instr(i) for i in row] for row in prog.ranks]


def ref_trace_tokens(trace: list[str]) -> list[str]:
    """The recorded trace as program tokens: post[a+b] -> BATCH[a+b] when it mixes sends
    and recvs (torch's ``_batch_p2p`` calls ``batch_isend_irecv``) else ``a b`` (one
    ``isend``/``irecv`` each), wait[a+b] -> WAIT[a+b], torch's full backward B -> BW,
    REDUCE_GRAD dropped."""
    out = []
    for t in trace:
        if t.endswith("REDUCE_GRAD"):
            continue
        if t.startswith("post["):
            out += torch_ref.launch_tokens(t[5:-1].split("+"))
        elif t.startswith("wait["):
            out.append("WAIT[" + t[5:-1] + "]")
        else:
            out.append(t.replace("B", "BW"))
    return out


def test_policies_registered() -> None:
    assert {"async", "torch", "commit"} <= set(POLICIES)


def test_torch_policy_reproduces_schedule1f1b_reference() -> None:
    ref = json.loads(ref_path("torch", "Schedule1F1B_pp4_mb8.json").read_text())
    prog = lower(generate("1f1b", 4, 8), "torch")
    assert tokens(prog) == [ref_trace_tokens(t) for t in ref["trace"]]


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (3, 3), (3, 7), (4, 4), (4, 9), (5, 12)])
def test_torch_policy_equals_live_schedule1f1b(p: int, m: int) -> None:
    """The general rule: torch's Schedule1F1B runtime recorded live for other sizes."""
    assert tokens(lower(generate("1f1b", p, m), "torch")) == \
        torch_ref.record_single("Schedule1F1B", p, m)


@pytest.mark.parametrize("p,m", [(2, 2), (3, 3), (3, 5), (4, 8), (4, 2)])
def test_torch_policy_equals_live_gpipe(p: int, m: int) -> None:
    assert tokens(lower(generate("gpipe", p, m), "torch")) == \
        torch_ref.record_single("ScheduleGPipe", p, m)


def test_runtime_kind() -> None:
    assert torch_runtime_kind(generate("1f1b", 4, 8)) == "1F1B"
    assert torch_runtime_kind(generate("gpipe", 4, 8)) == "GPipe"
    # 1F1B with m < p: torch's Schedule1F1B refuses it, so it runs as a generic runtime
    assert torch_runtime_kind(generate("1f1b", 4, 2)) == "runtime"
    assert torch_runtime_kind(interleaved_1f1b(4, 8)) == "runtime"


MULTI = [("Interleaved1F1B", interleaved_1f1b), ("LoopedBFS", looped_bfs),
         ("InterleavedZeroBubble", interleaved_zb), ("ZBVZeroBubble", None),
         ("DualPipeV", None)]


def _ours(name: str, fn, p: int, m: int) -> Schedule:
    if name == "ZBVZeroBubble":
        return zbv_torch(p, m)
    if name == "DualPipeV":
        return generate("dualpipev", p, m).schedule()
    return fn(p, m)


@pytest.mark.parametrize("name,fn", MULTI, ids=[n for n, _ in MULTI])
@pytest.mark.parametrize("p,mf", [(2, 1), (2, 2), (4, 1), (4, 2), (4, 3)])
def test_torch_policy_equals_runtime_lowering(name: str, fn, p: int, mf: int) -> None:
    """Multi-stage schedules: SEND/RECV placement equals torch's
    ``_PipelineScheduleRuntime._prepare_schedule_with_comms`` (bookkeeping dropped), and
    each compute waits exactly its cross-rank inputs right before it runs."""
    m = mf * p
    want = torch_ref.torch_compute(name, p, m, 2, with_comms=True)
    if want is None:                      # torch refuses (DualPipeV needs m >= 2p): so do we
        with pytest.raises(ScheduleError, match="microbatches >= 2 x ranks"):
            _ours(name, fn, p, m)
        return
    sched = _ours(name, fn, p, m)
    got = [[format_op(x) if isinstance(x, Op) else str(x) for x in row]
           for row in add_send_recv(sched)]
    assert got == want
    prog = lower(sched, "torch")
    pl = prog.placement
    for r, row in enumerate(prog.ranks):
        assert [format_instr(i) for i in row if not isinstance(i, Wait)] == want[r]
        for i, ins in enumerate(row):
            if isinstance(ins, Compute):
                need = op_recvs(ins.op, r, pl)
                assert (row[i - 1].comms == tuple(need)) if need else \
                    not isinstance(row[i - 1], Wait)


@pytest.mark.parametrize("name,fn", MULTI[:3], ids=[n for n, _ in MULTI[:3]])
@pytest.mark.parametrize("p,k", [(2, 4), (3, 5)])
def test_torch_policy_with_more_stages_than_fsdp_keeps_active(name, fn, p, k) -> None:
    """With more than 3 stages per rank torch un/reshards stages during the step; those
    bookkeeping actions take sweep steps and so move RECVs: still equal."""
    m = 2 * p
    want = torch_ref.torch_compute(name, p, m, k, with_comms=True)
    got = [[format_op(x) if isinstance(x, Op) else str(x) for x in row]
           for row in add_send_recv(fn(p, m, chunks=k))]
    assert got == want


@pytest.mark.parametrize("name,kw", [("interleaved-1f1b", {}),
                                     ("interleaved-1f1b", {"variant": "megatron"}),
                                     ("looped-bfs", {}),
                                     ("interleaved-zb", {}), ("zbv", {"variant": "torch"}),
                                     ("dualpipev", {}), ("dualpipe", {}), ("1f1b", {}),
                                     ("gpipe", {})])
@pytest.mark.parametrize("semantics,stream", [("eager", "none"), ("rendezvous", "none"),
                                              ("rendezvous", "per-rank")])
def test_torch_policy_never_deadlocks(name: str, kw: dict, semantics: str,
                                      stream: str) -> None:
    """torch's runtime places every RECV when its SEND is issued, so per link both sides
    post in the same order and nothing waits on a message sent later: no deadlock, even
    on a shared comm stream with rendezvous sends."""
    for p, m in ((2, 4), (4, 8)):
        out = generate(name, p, m, **kw)
        sched = out.schedule() if hasattr(out, "has_comm") else out
        tl = simulate(lower(sched, "torch"), CostModel(), LinkModel(latency=0.25),
                      CommModel(semantics=semantics, comm_stream=stream))
        assert tl.deadlock is None and len(tl.spans) == sched.num_ops()


def test_commit_policy_exact_program() -> None:
    prog = lower(generate("1f1b", 2, 2), "commit")
    assert prog.to_text() == (
        "rank 0: 0F0 BATCH[0SEND_F0] COMMIT 0F1 BATCH[0SEND_F1+0RECV_B0] COMMIT 0BW0 "
        "BATCH[0RECV_B1] COMMIT 0BW1\n"
        "rank 1: BATCH[1RECV_F0] COMMIT 1F0 1BW0 BATCH[1SEND_B0+1RECV_F1] COMMIT 1F1 1BW1 "
        "BATCH[1SEND_B1] COMMIT\n")


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved-1f1b", "interleaved-zb",
                                  "looped-bfs"])
def test_commit_policy_shape(name: str) -> None:
    """Every compute is preceded by a COMMIT iff something was launched since the previous
    compute, every launch is one BATCH right before its COMMIT; no WAIT, no bare post;
    under eager semantics it runs to the end."""
    sched = generate(name, 4, 8)
    prog = lower(sched, "commit")
    for row in prog.ranks:
        posted = False
        for i, ins in enumerate(row):
            assert not isinstance(ins, Wait)
            assert not isinstance(ins, Post)
            if isinstance(ins, Compute):
                assert isinstance(row[i - 1], Commit) == posted if i else True
                posted = False
            elif isinstance(ins, Batch):
                assert isinstance(row[i + 1], Commit)
                posted = True
        assert not posted or isinstance(row[-1], Commit)
    assert prog.schedule().ranks == sched.ranks
    tl = simulate(prog, CostModel(), LinkModel(latency=0.5), CommModel(semantics="eager"))
    assert tl.deadlock is None


def test_commit_deadlock_under_rendezvous_is_reported() -> None:
    """A commit waits its sends: on interleaved 1F1B (2 ranks, 4 microbatches) the ranks
    commit sends to each other before either posts the matching recv, which rendezvous
    semantics (large NCCL messages) cannot complete."""
    prog = lower(interleaved_1f1b(2, 4), "commit")
    tl = simulate(prog, CostModel(), LinkModel(), CommModel(semantics="rendezvous"),
                  raise_on_deadlock=False)
    assert tl.deadlock is not None
    assert simulate(prog, CostModel(), LinkModel(),
                    CommModel(semantics="eager")).deadlock is None


def test_link_ordered_recvs() -> None:
    """Rank 1 consumes rank 0's messages out of send order (zbv on 2 ranks): recvs are
    posted in send order, so per link the k-th send and k-th recv match."""
    sched = zbv_torch(2, 4)
    posts = link_ordered_recvs(sched)
    for r in range(2):
        flat = [c for batch in posts[r] for c in batch]
        need = [c for op in sched.ranks[r] for c in op_recvs(op, r, sched.placement)]
        assert sorted(map(str, flat)) == sorted(map(str, need))     # each once
        for k, op in enumerate(sched.ranks[r]):                      # posted in time
            before = {str(c) for batch in posts[r][:k + 1] for c in batch}
            assert {str(c) for c in op_recvs(op, r, sched.placement)} <= before
    # the program compiles (matching per link) under every policy
    for pol in ("async", "commit", "torch"):
        simulate(lower(sched, pol), CostModel(), LinkModel(), CommModel(semantics="eager"))
    # where the consumer order equals the send order nothing moves
    one = generate("1f1b", 4, 8)
    assert link_ordered_recvs(one) == [[op_recvs(op, r, one.placement) for op in row]
                                       for r, row in enumerate(one.ranks)]


def test_out_of_order_consumer_gets_early_recv() -> None:
    """Hand-made: rank 0 sends F of mb 0 then mb 1; rank 1 runs mb 1 first."""
    pl = Placement(kind="loop", ranks=2, stages=2)
    s = Schedule(placement=pl, microbatches=2, ranks=[
        [Op("F", 0, 0), Op("F", 0, 1), Op("BW", 0, 1), Op("BW", 0, 0)],
        [Op("F", 1, 1), Op("BW", 1, 1), Op("F", 1, 0), Op("BW", 1, 0)]])
    assert [[str(c) for c in b] for b in link_ordered_recvs(s)[1]] == \
        [["1RECV_F0", "1RECV_F1"], [], [], []]
    assert lower(s, "async").to_text().splitlines()[1] == (
        "rank 1: 1RECV_F0 1RECV_F1 WAIT[1RECV_F1] 1F1 1BW1 1SEND_B1 WAIT[1RECV_F0] 1F0 "
        "1BW0 1SEND_B0")
    tl = simulate(lower(s, "async"), CostModel(), LinkModel(), CommModel(semantics="eager"))
    # rank 1: F(mb1) [2,3], BW [3,5], F(mb0) [5,6], BW [6,8]; rank 0's BW(mb0) [8,10]
    assert tl.makespan == 10.0


def test_dualpipev_deepseek_program_vs_torch_runtime() -> None:
    """torch's DualPipeV runs deepseek's compute order (see test_torch_families) with
    torch's runtime comms instead of deepseek's commit batches; the README's numbers."""
    deepseek = generate("dualpipev", 4, 8)
    torch_run = lower(deepseek.schedule(), "torch")
    assert torch_run.schedule().ranks == deepseek.schedule().ranks
    assert any(isinstance(i, Commit) for row in deepseek.ranks for i in row)
    assert not any(isinstance(i, Commit) for row in torch_run.ranks for i in row)
    costs = CostModel(F=1, B=1, W=1, BW=2, FB=3)
    link = LinkModel(latency=0.25)
    got = {sem: (simulate(deepseek, costs, link, CommModel(semantics=sem)).makespan,
                 simulate(torch_run, costs, link, CommModel(semantics=sem)).makespan)
           for sem in ("data", "eager", "rendezvous")}
    assert got == {"data": (58.5, 58.5), "eager": (59.5, 58.5),
                   "rendezvous": (60.75, 58.75)}

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
from schedsim.program.comm_plan import link_ordered_recvs, op_recvs
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
def test_torch_comm_placement_equals_add_send_recv(name: str, fn, p: int, mf: int) -> None:
    """Multi-stage schedules: SEND/RECV placement equals torch's
    ``_PipelineScheduleRuntime._prepare_schedule_with_comms`` (bookkeeping dropped)."""
    m = mf * p
    want = torch_ref.torch_compute(name, p, m, 2, with_comms=True)
    if want is None:                      # torch refuses (DualPipeV needs m >= 2p): so do we
        with pytest.raises(ScheduleError, match="microbatches >= 2 x ranks"):
            _ours(name, fn, p, m)
        return
    got = [[format_op(x) if isinstance(x, Op) else str(x) for x in row]
           for row in add_send_recv(_ours(name, fn, p, m))]
    assert got == want


def _ours_k(name: str, fn, p: int, m: int, k: int) -> Schedule:
    return fn(p, m, chunks=k) if fn is not None else _ours(name, fn, p, m)


def _runtime_shapes(name: str) -> list[tuple[int, int, int]]:
    """(p, m, k) beyond the refs (which hold only Schedule1F1B p=4 m=8): 2-3 stages per
    rank for the loop classes, any m including non-multiples of p."""
    if name in ("ZBVZeroBubble", "DualPipeV"):
        return [(p, m, 2) for p in range(1, 7) for m in (p, 2 * p, 2 * p + 1, 3 * p, 4 * p + 1,
                                                          5 * p)]
    return [(p, m, k) for p in (2, 3, 4, 5) for m in (p - 1, p, p + 1, 2 * p, 3 * p)
            for k in (2, 3)]


@pytest.mark.parametrize("name,fn", MULTI, ids=[n for n, _ in MULTI])
def test_torch_policy_equals_recorded_runtime(name: str, fn) -> None:
    """Token for token what torch 2.13's ``_PipelineScheduleRuntime._step_microbatches``
    issues (recorded with stand-in stages, tests/torch_ref.py): compute, launches, each
    recv's wait, OVERLAP_F_B run as forward then backward (each after its recv's wait)
    and the final waits on every send, last posted first. Where torch refuses, so do we."""
    compared = 0
    for p, m, k in _runtime_shapes(name):
        want = torch_ref.record_runtime(name, p, m, k)
        if want is None:
            with pytest.raises(ScheduleError):
                _ours_k(name, fn, p, m, k)
            continue
        assert tokens(lower(_ours_k(name, fn, p, m, k), "torch")) == want, (p, m, k)
        compared += 1
    assert compared >= 30


@pytest.mark.parametrize("name,fn", MULTI, ids=[n for n, _ in MULTI])
@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (5, 10)])
def test_torch_policy_options_equal_recorded_runtime(name: str, fn, p: int, m: int) -> None:
    """``defer_pp_recv`` (torch's ``_defer_recv_ops``) and ``overlap_f_b`` (a custom
    OVERLAP_F_B function registered, as torchtitan's DualPipeV overlap does) against the
    runtime recorded with the same options."""
    sched = _ours_k(name, fn, p, m, 2)
    for opts in ({"defer_pp_recv": True}, {"overlap_f_b": True},
                 {"defer_pp_recv": True, "overlap_f_b": True}):
        want = torch_ref.record_runtime(name, p, m, 2, **opts)
        assert tokens(lower(sched, "torch", **opts)) == want, opts


def test_torch_runtime_final_waits_and_overlap_f_b() -> None:
    """The shape of the runtime's program, stated without torch: every rank ends with one
    WAIT per SEND it posted, in reverse posting order; by default no FB op is left (each
    pair runs F then B, each after its own recv's wait); with overlap_f_b the FB ops stay
    and each waits its forward's recv, then its backward's, right before it."""
    sched = generate("dualpipev", 4, 8).schedule()
    n_fb = sum(op.kind == "FB" for row in sched.ranks for op in row)
    plain, fb = lower(sched, "torch"), lower(sched, "torch", overlap_f_b=True)
    for prog in (plain, fb):
        for row in prog.ranks:
            sends = [i.comm for i in row if isinstance(i, Post) and i.comm.is_send]
            tail = row[len(row) - len(sends):]
            assert tail == [Wait((c,)) for c in reversed(sends)]
    assert not any(isinstance(i, Compute) and i.op.kind == "FB"
                   for row in plain.ranks for i in row)
    assert sum(isinstance(i, Compute) and i.op.kind == "FB"
               for row in fb.ranks for i in row) == n_fb == 25
    pl = fb.placement
    for r, row in enumerate(fb.ranks):
        for i, ins in enumerate(row):
            if isinstance(ins, Compute) and ins.op.kind == "FB":
                need = [[c] for part in ins.op.parts for c in op_recvs(part, r, pl)]
                assert [list(w.comms) for w in row[i - len(need):i]] == need
    # defer_pp_recv only exists on torch's multi-stage runtime
    with pytest.raises(ScheduleError, match="Schedule1F1B, which has none"):
        lower(generate("1f1b", 4, 8), "torch", defer_pp_recv=True)


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
        prog = lower(sched, "torch")
        tl = simulate(prog, CostModel(), LinkModel(latency=0.25),
                      CommModel(semantics=semantics, comm_stream=stream))
        assert tl.deadlock is None and len(tl.spans) == prog.schedule().num_ops()


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
    torch's runtime comms instead of deepseek's commit batches. With a custom OVERLAP_F_B
    function the compute is the same op for op; by default torch runs each pair as its
    forward then its backward, so under ``data`` each half starts as soon as its own input
    is there (54.5 < 58.5); waits make both 58.5 under eager."""
    deepseek = generate("dualpipev", 4, 8)
    split = lower(deepseek.schedule(), "torch")
    fused = lower(deepseek.schedule(), "torch", overlap_f_b=True)
    assert fused.schedule().ranks == deepseek.schedule().ranks
    assert [[a for op in row for a in op.atoms()] for row in split.schedule().ranks] == \
        [[a for op in row for a in op.atoms()] for row in deepseek.schedule().ranks]
    assert any(isinstance(i, Commit) for row in deepseek.ranks for i in row)
    assert not any(isinstance(i, Commit) for row in split.ranks for i in row)
    costs = CostModel(F=1, B=1, W=1, BW=2, FB=3)
    link = LinkModel(latency=0.25)
    got = {sem: tuple(simulate(prog, costs, link, CommModel(semantics=sem)).makespan
                      for prog in (deepseek, split, fused))
           for sem in ("data", "eager", "rendezvous")}
    assert got == {"data": (58.5, 54.5, 58.5), "eager": (59.5, 58.5, 58.5),
                   "rendezvous": (60.75, 58.75, 58.75)}

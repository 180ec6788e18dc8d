"""Messages with identity (tags and bytes per post), group semantics (independent /
atomic), sub-launches and stage graphs beyond a chain: docs/messages.md and the shipped
scenarios of the public cases (PiPPy#969, nccl#2130, Megatron-LM #750)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SCHEDULES
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, build_program, simulate
from schedsim.analysis.lint import lint
from schedsim.analysis.stalls import attribute_stalls
from schedsim.cli import app
from schedsim.errors import ParseError, ProgramError
from schedsim.program.ir import Placement, Program, Schedule
from schedsim.program.lower import lower
from schedsim.program.sublaunch import split_batches
from schedsim.program.tokens import format_instr, parse_instr, parse_program_text
from schedsim.scenario import load_scenario
from schedsim.sim.groups import atomic_groups
from schedsim.sim.simulate import simulate_run

runner = CliRunner()
DOCS = SCHEDULES.parent / "docs" / "examples"


def _prog(text: str, stages: int, mbs: int, ranks: int = 2, skips=()) -> Program:
    pl = Placement(kind="loop", ranks=ranks, stages=stages, skips=skips)
    return Program(placement=pl, microbatches=mbs, ranks=parse_program_text(text))


# -- program text --------------------------------------------------------------------
@pytest.mark.parametrize("tok", ["0SEND_F1", "0SEND_F1:gradient@4MiB", "2RECV_F0<0",
                                 "0SEND_F0>2:shape@1536", "BATCH[0SEND_F1@2MiB+0RECV_B0]",
                                 "WAIT[2RECV_F0<0+0SEND_F1]"])
def test_tokens_round_trip(tok: str) -> None:
    assert format_instr(parse_instr(tok)) == tok


def test_identity_suffix_values_and_errors() -> None:
    c = parse_instr("1RECV_F0:other@2.5MB").comm
    assert (c.tag, c.nbytes, c.peer) == ("other", 2.5e6, None)
    assert parse_instr("0SEND_F0>2").comm.message_key() == ("F", 0, 0, 2)
    assert parse_instr("0SEND_F0>1").comm.message_key() == ("F", 0, 0)   # the chain edge
    for bad, what in (("0SEND_F1:grad", "unknown tag"), ("0SEND_F1@3XB", "unknown bytes"),
                      ("WAIT[0SEND_F1@4MiB]", "put them on the post"),
                      ("0SEND_F0<2", "with '>'"), ("0SEND_F1@1e999", "finite")):
        with pytest.raises(ParseError, match=what):
            parse_instr(bad)


# -- identity: sizes and tags of the k-th send and k-th recv of a link ----------------
def test_size_mismatch_names_both_sides() -> None:
    prog = _prog("0F0 0SEND_F0@4MiB\n1RECV_F0@2MiB COMMIT 1F0", 2, 1)
    with pytest.raises(ProgramError) as e:
        simulate(prog, CostModel(F=1), comm=CommModel(semantics="rendezvous"))
    msg = str(e.value)
    assert "the 1st send on link 0->1 is 0SEND_F0@4MiB (rank 0, instr 1)" in msg
    assert "the 1st recv is 1RECV_F0@2MiB (rank 1, instr 0)" in msg
    assert "0SEND_F0 (activation, 4MiB) against 1RECV_F0 (activation, 2MiB)" in msg
    for sem in ("eager", "rendezvous"):          # refused before running: never a hang
        r = runner.invoke(app, ["simulate", str(SCHEDULES / "size-mismatch.toml"),
                                "--semantics", sem])
        assert r.exit_code == 2 and "size mismatch: the 1st send on link 0->1" in r.output
        assert "0SEND_F0@4MiB (rank 0" in r.output and "1RECV_F0@2MiB (rank 1" in r.output


def test_megatron_750_silent_swap() -> None:
    sc = load_scenario(SCHEDULES / "megatron-750-swap.toml")
    prog = sc.build_program()
    tl = simulate(prog, sc.costs, sc.link, sc.comm)
    assert [(r, i) for r, i, _ in tl.findings] == [(0, 14), (0, 14)]
    first = tl.findings[0][2]
    assert "2SEND_B0 (gradient, 4MiB)" in first and "3RECV_F1 (activation, 4MiB)" in first
    assert "the gradient lands in the activation buffer of 3RECV_F1" in first
    # paired as NCCL pairs them: 3RECV_F1 completes with 2SEND_B0's transfer
    sw = [m for m in tl.messages if m.key == ("B", 2, 0)][0]
    assert (sw.dst, sw.recv_index) == (1, 13)
    rules = {f.rule for f in lint(prog, tl)}
    assert {"silent-swap", "crossed-order"} <= rules
    r = runner.invoke(app, ["simulate", str(SCHEDULES / "megatron-750-swap.toml"), "-q"])
    assert r.exit_code == 0 and r.output.count("silent swap") == 2
    r = runner.invoke(app, ["simulate", str(SCHEDULES / "megatron-750-sizes.toml"), "-q"])
    assert r.exit_code == 2, r.output
    assert "2SEND_B0 (gradient, 2MiB)" in r.output and "3RECV_F1 (activation, 4MiB)" in r.output


def test_same_tag_other_microbatch_stays_an_error() -> None:
    prog = _prog("0F0 0SEND_F0 0F1 0SEND_F1\n1RECV_F1 1RECV_F0 WAIT[1RECV_F0] 1F0 "
                 "WAIT[1RECV_F1] 1F1", 2, 2)
    with pytest.raises(ProgramError, match="both must name the same message"):
        simulate(prog, comm=CommModel(semantics="eager"))


# -- group semantics -----------------------------------------------------------------
def test_nccl_2130_unmatched_op_and_atomic_groups() -> None:
    f = str(SCHEDULES / "nccl-2130.toml")
    r = runner.invoke(app, ["simulate", f])
    assert r.exit_code == 2
    assert "0RECV_B0 (rank 0, instr 1, in BATCH[0SEND_F0+0RECV_B0]): unmatched recv" in r.output
    assert "rank 1 finishes" in r.output                     # gloo: the pair is delivered
    r = runner.invoke(app, ["simulate", f, "--group-semantics", "atomic"])
    assert r.exit_code == 2 and "unmatched recv" in r.output
    assert "rank 1 blocks at instr 1 (WAIT[1RECV_F0])" in r.output    # NCCL: nothing moves
    assert "held by that op's atomic batch (rank 0, instr 1) with 0RECV_B0" in r.output


def test_pippy_969_independent_and_atomic() -> None:
    sc = load_scenario(SCHEDULES / "pippy-969.toml")
    prog = sc.build_program()
    ind = simulate(prog, sc.costs, sc.link, sc.comm)
    at = simulate(prog, sc.costs, sc.link, sc.comm.model_copy(
        update={"group_semantics": "atomic"}))
    assert (ind.makespan, at.makespan) == (7.0, 8.5)
    # independent: rank 2 reaches 2F0 only after rank 1's F (ends 2.5) and its transfer
    s2 = [s for s in attribute_stalls(ind, prog) if s.rank == 2][0]
    assert (s2.start, s2.end) == (0.0, 3.0) and "made by 1F0 on rank 1, ended 2.5" in s2.detail
    # atomic: the skip transfer 0 -> 2 waits until rank 1's send is posted (2.5) and
    # rank 0's batch completes with it; mb 1's activation to rank 1 waits for rank 2
    skip0 = [m for m in at.messages if m.key == ("F", 0, 0, 2)][0]
    assert skip0.start == 2.5 and skip0.send_done == 3.0
    held = [s for s in attribute_stalls(at, prog) if s.cause == "atomic-batch" and s.rank == 1]
    assert held and "0SEND_F1>2, matched only at 4, when rank 2 posted 2RECV_F1<0" in \
        held[0].detail and held[0].peer == 2
    found = [f for f in lint(prog, ind) if f.rule == "unsafe-grouping"]
    assert [(f.rank, f.index) for f in found] == [(2, 0), (2, 4)]
    assert "2RECV_F0<0 from rank 0 is batched with 2RECV_F0" in found[0].message


GENERATED = [("1f1b", 4, 6, "commit", {}), ("gpipe", 3, 4, "commit", {}),
             ("1f1b", 4, 6, "megatron", {}), ("interleaved-1f1b", 4, 8, "megatron", {"chunks": 2}),
             ("dualpipe", 4, 8, None, {})]


@pytest.mark.parametrize("name,p,m,policy,kw", GENERATED)
def test_atomic_groups_hold_and_complete_together(name, p, m, policy, kw) -> None:
    prog = build_program(name, p, m, policy, **kw)
    costs = CostModel(F=1, B=1, W=1, BW=2, FB=3)
    base = CommModel(semantics="rendezvous")
    tl_i, _, st_i = simulate_run(prog, costs, comm=base, raise_on_deadlock=False)
    tl_a, cp, st_a = simulate_run(prog, costs, comm=base.model_copy(
        update={"group_semantics": "atomic"}), raise_on_deadlock=False)
    hgroup, gptr, gh, _ = atomic_groups(cp)
    assert len(gptr) > 1                                     # the programs batch
    for g in range(len(gptr) - 1):
        done = st_a.hdone[gh[gptr[g]:gptr[g + 1]]]
        if (done >= 0).all():                                # a group completes together
            assert np.all(done == done[0])
    if tl_a.deadlock is None and tl_i.deadlock is None:
        # holding ops back never makes anything earlier (infinite bandwidth)
        assert np.all(st_a.mstart >= st_i.mstart - 1e-9)
        assert tl_a.makespan >= tl_i.makespan - 1e-9


# -- stage graphs --------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["async", "commit"])
def test_generators_accept_a_stage_graph(policy) -> None:
    sched = build_program("1f1b", 4, 4).schedule()
    pl = Placement(kind="loop", ranks=4, stages=4, skips=((0, 2),))
    prog = lower(Schedule(name="1f1b", placement=pl, microbatches=4, ranks=sched.ranks),
                 policy)
    toks = " ".join(" ".join(r) for r in prog.tokens())
    assert "0SEND_F0>2" in toks and "2RECV_F0<0" in toks and "2SEND_B0>0" in toks
    for sem in ("data", "rendezvous"):
        tl = simulate(prog, CostModel(F=1, BW=2), comm=CommModel(semantics=sem))
        skip = [x for x in tl.messages if x.to_stage is not None]
        assert sorted({x.key[:2] + (x.key[3],) for x in skip}) == [("B", 2, 0), ("F", 0, 2)]
        assert len(skip) == 8                                # F and B, per microbatch
    again = _prog(prog.to_text(), 4, 4, 4, ((0, 2),))
    assert again.tokens() == prog.tokens()


def test_stage_graph_errors() -> None:
    with pytest.raises(ProgramError, match=r"never posts 2RECV_F0<0"):
        simulate(_prog("0F0 0SEND_F0\n1RECV_F0 WAIT[1RECV_F0] 1F0 1SEND_F0\n"
                       "2RECV_F0 WAIT[2RECV_F0] 2F0", 3, 1, 3, ((0, 2),)),
                 comm=CommModel(semantics="rendezvous"))
    with pytest.raises(ProgramError, match=r"no such message \(stages 0->2"):
        simulate(_prog("0F0 0SEND_F0>2\n1F0\n2F0", 3, 1, 3), comm=CommModel(
            semantics="rendezvous"))
    sc = load_scenario(SCHEDULES / "pippy-969.toml")
    sc.schedule.program, sc.schedule.name = None, "1f1b"
    sc.schedule.placement = sc.schedule.stages = None
    sc.schedule.ranks, sc.schedule.comm_policy = 4, "torch"
    with pytest.raises(Exception, match="posts a chain's messages only"):
        sc.build_program()


# -- sub-launches --------------------------------------------------------------------
def test_split_batches_and_split_exchange() -> None:
    prog = _prog("0F0 BATCH[0SEND_F0+0RECV_B0] COMMIT\n1RECV_F0 COMMIT 1F0 1SEND_B0", 2, 1)
    assert split_batches(prog, 1).tokens()[0] == ["0F0", "BATCH[0SEND_F0]", "BATCH[0RECV_B0]",
                                                  "COMMIT"]
    assert split_batches(prog, 2) is prog
    f = str(DOCS / "split-exchange.toml")
    assert runner.invoke(app, ["simulate", f, "-q"]).exit_code == 0
    r = runner.invoke(app, ["simulate", f, "-q", "--param", "max_batch_ops=2"])
    assert r.exit_code == 3 and "wait-for cycle" in r.output
    r = runner.invoke(app, ["lint", f, "--param", "max_batch_ops=2", "--all"])
    assert "split-exchange" in r.output

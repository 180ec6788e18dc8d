"""Answers and explanations that read wrong (issue 27), one regression test each."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from schedsim import CommModel, CostModel, build_program, simulate
from schedsim.cli import app
from schedsim.cli.common import build_scenario

T10 = "schedules/dualpipe-issue-t10-t12.toml"


def _run(args: list[str], code: int = 0):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == code, r.output
    return r


def test_query_headline_says_how_the_effect_moved_against_data() -> None:
    out = _run(["query", T10, "--semantics", "all", "--effect", "rank=5 W mb=0",
                "--cause", "rank=5 SEND_B mb=0"]).stdout.splitlines()
    assert out[0].endswith("it starts at 11 slots either way; the makespan does not move.")
    assert out[1] == ("eager: rank 5 5SEND_B0 (instr 27) does not delay rank 5 5W0 (instr "
                      "29): it starts at 12 slots either way (1 slot later than under data "
                      "semantics, 11 slots), held by 5RECV_F3 on COMMIT (instr 28); the cause "
                      "alone is not why it moved; the makespan does not move.")
    assert ("which starts at 12 slots either way (1 slot later than under data semantics, "
            "11 slots):") in out[2]


def test_replay_semantics_line_counts_both_kinds_of_send() -> None:
    from schedsim.cli.check import semantics_line

    assert semantics_line(2, 5, "gloo").endswith(
        "(gloo behaved like neither semantics throughout: 2 sends like rendezvous, 3 like "
        "eager here)")
    assert semantics_line(5, 5, "gloo").endswith("(gloo behaved like rendezvous here)")


def test_comm_init_stall_tells_init_cost_from_a_late_peer() -> None:
    r = _run(["stalls", "-s", "1f1b", "-p", "2", "-m", "2", "--cost", "F=1,BW=2",
              "--semantics", "rendezvous", "--comm-policy", "torch", "--lazy-init",
              "--init-cost", "5", "--json", "-"])
    st = {(s["rank"], s["start"]): s for s in json.loads(r.stdout)}
    # rank 1 posted its recv at 0, rank 0 its send at 1: the 5 is the creation alone
    assert st[(0, 1.0)]["cause"] == "comm-init"
    assert st[(0, 1.0)]["detail"].endswith(
        "rank 1 was already at 1RECV_F0 (instr 0) since 0, so the wait is the creation "
        "itself: 5 (the init cost)")
    assert st[(1, 0.0)]["detail"].endswith(
        "rank 0 reached its own first bare P2P with rank 1, 0SEND_F0 (instr 1), only at "
        "1, then creating it took 5")


def test_import_trace_notes_work_ranges_and_kernels_outside_calls(tmp_path) -> None:
    from schedsim.interop.kineto import import_traces

    def ev(name, ts, dur, **args):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
                **({"args": args} if args else {})}

    def write(path, rank, events):
        path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {
            "rank": rank, "world_size": 2, "backend": "nccl"}}))
        return path

    r0 = [ev("PP:0F0", 0, 100), ev("PP:0SEND_F0", 100, 20), ev("c10d::send", 105, 10),
          ev("nccl:send", 114, 100), ev("PP:0RECV_B0", 120, 10), ev("c10d::recv_", 122, 6),
          ev("nccl:recv", 127, 223), ev("PP:0B0", 350, 200),
          ev("nccl:all_reduce", 600, 10), ev("nccl:send", 610, 5),
          ev("ncclDevKernel_SendRecv", 620, 5, correlation=7)]
    r1 = [ev("PP:1RECV_F0", 0, 10), ev("c10d::recv_", 2, 6), ev("nccl:recv", 7, 207),
          ev("PP:1F0", 250, 50), ev("PP:1B0", 300, 30), ev("PP:1SEND_B0", 330, 10),
          ev("c10d::send", 332, 6), ev("nccl:send", 337, 13)]
    tl = import_traces([write(tmp_path / "a.json", 0, r0), write(tmp_path / "b.json", 1, r1)])
    assert ("1 gloo:/nccl: work range and 1 NCCL P2P kernel inside no c10d::send/recv_ "
            "call: left out (a collective's, or a call the trace did not record)"
            in tl.import_notes)


def test_torch_1f1b_with_fewer_microbatches_than_stages_is_said() -> None:
    r = _run(["simulate", "-s", "1f1b", "-p", "4", "-m", "2", "--comm-policy", "torch",
              "-q"])
    assert "torch's Schedule1F1B refuses 2 microbatches on 4 stages" in r.stderr
    r = _run(["simulate", "-s", "1f1b", "-p", "4", "-m", "4", "--comm-policy", "torch",
              "-q"])
    assert "Schedule1F1B" not in r.stderr


def test_diff_of_equal_orders_says_no_op_moved() -> None:
    out = _run(["diff", "schedules/1f1b.toml", "schedules/1f1b.toml"]).stdout
    assert "no op changes position; 0 ops start at another time" in out
    assert "B: )" not in out


def test_defer_pp_recv_deadlock_gets_its_fix() -> None:
    from schedsim.report.advice import deadlock_fixes

    sc = build_scenario(schedule="interleaved-1f1b", ranks=4, microbatches=8,
                        comm_policy="torch", param=["defer_pp_recv=true"],
                        semantics="rendezvous", comm_stream="per-peer")
    assert simulate(sc.build_program(), sc.costs, sc.link, sc.comm,
                    raise_on_deadlock=False).deadlock is not None
    fix = deadlock_fixes(sc)[0]
    assert (fix.flags, fix.makespan) == ("--param defer_pp_recv=false", 57.0)


def test_ring_deadlock_names_one_hop_per_line() -> None:
    prog = build_program("interleaved-1f1b", 8, 16)
    tl = simulate(prog, CostModel(), comm=CommModel(semantics="rendezvous",
                                                    comm_stream="per-rank"),
                  raise_on_deadlock=False)
    from schedsim.report.advice import format_deadlock

    lines = [ln for ln in format_deadlock(tl.deadlock).splitlines() if ln.startswith("  ")]
    assert len(lines) == 8
    for ln, c in zip(lines, tl.deadlock.cycle):
        assert ln.count("queued on") == 1 and ln.count("needs its partner") == 1
        assert f"queued on rank {c.peer}'s comm stream" in ln
        assert ln.endswith(f"rank {c.peer} is blocked at instr "
                           f"{next(b.index for b in tl.deadlock.blocked if b.rank == c.peer)}"
                           f" ({next(b.instruction for b in tl.deadlock.blocked if b.rank == c.peer)})")


def test_link_order_mismatch_names_the_two_ops_not_the_batches(tmp_path) -> None:
    p = tmp_path / "b.txt"
    p.write_text("0F0 0F1 BATCH[0SEND_F0+0SEND_F1]\n"
                 "BATCH[1RECV_F1+1RECV_F0] WAIT[1RECV_F0] 1F0 WAIT[1RECV_F1] 1F1\n")
    r = _run(["simulate", "--program", str(p), "--stages", "2", "-m", "2", "--semantics",
              "rendezvous"], 2)
    assert ("the 1st send on link 0->1 is 0SEND_F0 (rank 0, instr 2, in "
            "BATCH[0SEND_F0+0SEND_F1]) but the 1st recv is 1RECV_F1 (rank 1, instr 0, in "
            "BATCH[1RECV_F1+1RECV_F0])") in r.stderr


def test_ordinals() -> None:
    from schedsim.util.text import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 7, 11, 12, 13, 21, 22, 103, 111)] == [
        "1st", "2nd", "3rd", "4th", "7th", "11th", "12th", "13th", "21st", "22nd", "103rd",
        "111th"]


def test_lint_says_launches_for_bare_posts_and_names_the_peer(tmp_path) -> None:
    p = tmp_path / "l.txt"
    p.write_text("0F0 0F1 0SEND_F0 0RECV_B1 0SEND_F1 WAIT[0SEND_F0] WAIT[0SEND_F1] "
                 "WAIT[0RECV_B1] 0BW1 0RECV_B0 WAIT[0RECV_B0] 0BW0\n"
                 "1RECV_F0 1RECV_F1 WAIT[1RECV_F0] WAIT[1RECV_F1] 1F0 1F1 1BW1 1SEND_B1 1BW0 "
                 "1SEND_B0 WAIT[1SEND_B1] WAIT[1SEND_B0]\n")
    recs = json.loads(_run(["lint", "--program", str(p), "--stages", "2", "-m", "2",
                            "--json", "-"]).stdout)
    (risk,) = [f for f in recs if f["severity"] == "stream-risk"]
    assert "each side in two launches" in risk["message"] and "batch" not in risk["message"]
    assert "rank 0's to rank 1 and rank 1's to rank 0" in risk["message"]


def test_lazy_init_on_an_all_batch_program_is_said() -> None:
    r = _run(["simulate", "-s", "dualpipe", "-p", "4", "-m", "8", "--lazy-init",
              "--semantics", "rendezvous", "-q"])
    assert "--lazy-init changes nothing here: every send and recv of this program is in a " \
           "BATCH" in r.stderr
    r = _run(["simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--lazy-init", "--semantics",
              "rendezvous", "--comm-policy", "torch", "-q"])
    assert "changes nothing" not in r.stderr

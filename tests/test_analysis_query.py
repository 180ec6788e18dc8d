"""Counterfactual queries and the selector grammar.

The DualPipe T10/T12 question (README): rank 5 sends the input gradient of mb 0 at the end
of T10, rank 4 receives it at T12; is rank 5's W of mb 0 delayed by that send?
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIGURE_COSTS, SCHEDULES
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, LinkModel, build_program, load_scenario, simulate
from schedsim.analysis.query import answer, simulate_free
from schedsim.analysis.select import parse_selector, select
from schedsim.cli import app
from schedsim.errors import ScenarioError

FIG = CostModel(**FIGURE_COSTS)
DP = build_program("dualpipe", 8, 20)
W0 = select(DP, "rank=5 W mb=0")
SEND = select(DP, "rank=5 SEND_B mb=0")
RECV_F3 = select(DP, "rank=5 RECV_F mb=3")


def _ask(sem: str, *causes):
    return answer(DP, W0, list(causes), FIG, LinkModel(), CommModel(semantics=sem))


def test_selectors_name_the_instructions() -> None:
    assert (W0.rank, W0.index, W0.token) == (5, 29, "5W0")
    assert (SEND.rank, SEND.index, SEND.token) == (5, 27, "5SEND_B0")
    assert select(DP, "5SEND_B0") == SEND
    assert select(DP, "rank = 5, send_b, mb = 0") == SEND
    assert select(DP, "rank=4 RECV_B mb=0").token == "4RECV_B0"
    fb = select(DP, "rank=5 F mb=15")
    assert fb.token == "(2F15;5BW1)" and fb.index == 33
    assert select(DP, "rank=5 FB mb=1 stage=5") == fb
    assert select(DP, "rank=5 index=29") == W0
    assert parse_selector("rank=5 W mb=0 chunk=1").chunk == 1


@pytest.mark.parametrize("text,msg", [
    ("W mb=0", "matches 3 instructions"),
    ("rank=5 W mb=99", "matches no instruction"),
    ("rank=5 X mb=0", "cannot read 'X'"),
    ("rank=5 W F mb=0", "two kinds"),
    ("rank=5 rank=4 W", "rank given twice"),
    ("", "empty selector"),
])
def test_bad_selectors(text: str, msg: str) -> None:
    with pytest.raises(ScenarioError, match=msg):
        select(DP, text)


def test_t10_t12_data_semantics() -> None:
    a = _ask("data", SEND)
    assert (a.effect_start, a.counterfactual_start, a.delay, a.makespan,
            a.makespan_delta) == (11, 11, 0, 66, 0)
    assert a.binding_wait is None and a.chain == []


def test_t10_t12_eager_send_is_not_the_cause() -> None:
    a = _ask("eager", SEND)
    assert (a.effect_start, a.counterfactual_start, a.delay, a.makespan_delta) == \
        (12, 12, 0, 0)
    bw = a.binding_wait
    assert (bw["kind"], bw["index"], bw["reached"], bw["released"]) == ("COMMIT", 28, 11, 12)
    got = {c["comm"]: (c["done"], c["partner"], c["partner_posted"], c["binding"])
           for c in bw["comms"]}
    assert got == {"5SEND_B0": (11, "4RECV_B0", 12, False),
                   "5RECV_F3": (12, "4SEND_F3", 12, True)}
    assert a.chain == []
    # the activation recv in the same batch is: freeing it moves W back to 11
    b = _ask("eager", RECV_F3)
    assert (b.delay, b.makespan_delta) == (1, 0)
    assert [s["kind"] for s in b.chain] == ["message", "wait", "op"]


def test_t10_t12_rendezvous_both_members_bind() -> None:
    a = _ask("rendezvous", SEND)
    assert (a.effect_start, a.delay, a.makespan_delta) == (12, 0, 0)
    assert all(c["binding"] for c in a.binding_wait["comms"])
    # the send does bind (a chain links it) but the recv binds too: freeing it alone
    # moves nothing, freeing both moves W by 1 and the makespan by 0
    assert [(s["kind"], s["what"]) for s in a.chain] == [
        ("message", "B mb0 5->4"), ("wait", "COMMIT"), ("op", "5W0")]
    assert _ask("rendezvous", RECV_F3).delay == 0
    both = _ask("rendezvous", SEND, RECV_F3)
    assert (both.effect_start, both.counterfactual_start, both.delay,
            both.makespan_delta) == (12, 11, 1, 0)
    # the answer finds the co-cause itself: the other binding member of the COMMIT
    assert a.co_causes == ["rank 5 5RECV_F3 (instr 27)"]
    assert (a.joint_start, a.joint_delay, a.joint_makespan_delta) == (11, 1, 0)
    assert both.co_causes == [] and both.joint_delay is None


def test_co_causes_only_when_the_cause_binds() -> None:
    """Eager: the send completed at 11, before the COMMIT released at 12; it does not
    bind, so no co-cause is named (freeing both would credit the recv's delay to it);
    the headline says what held the wait instead."""
    from schedsim.analysis.query_text import headline

    a = _ask("eager", SEND)
    assert a.chain == [] and a.co_causes == [] and a.joint_delay is None
    assert headline(a) == [
        "eager: rank 5 5SEND_B0 (instr 27) does not delay rank 5 5W0 (instr 29): it "
        "starts at 12 slots either way, held by 5RECV_F3 on COMMIT (instr 28); the "
        "makespan does not move."]
    # a cause that delays the effect gets no co-cause either
    b = _ask("eager", RECV_F3)
    assert b.delays and b.co_causes == []


def test_headline_names_both_causes_and_the_joint_delay() -> None:
    from schedsim.analysis.query_text import explain, headline

    a = _ask("rendezvous", SEND)
    assert headline(a) == [
        "rendezvous: rank 5 5SEND_B0 (instr 27) alone does not delay rank 5 5W0 (instr "
        "29), which starts at 12 slots either way: rank 5 5RECV_F3 (instr 27) binds the "
        "same COMMIT (instr 28) too.",
        "  freeing both: delay 1 slot (it starts at 11 slots instead of 12 slots); the "
        "makespan does not move."]
    text = explain(a)
    assert text[:2] == headline(a)
    assert text[2].startswith("  blocked on COMMIT at instr 28 from 11 to 12 slots")
    assert text[3] == ("  chain (slots): msg B mb0 5->4 (12) -> r5 COMMIT#28 (12) -> "
                       "5W0@r5 [12,13]")


def test_long_chains_are_elided_in_the_middle() -> None:
    from schedsim.analysis.query_text import CHAIN_LIMIT, chain_text

    chain = [{"kind": "op", "what": f"0F{i}", "rank": 0, "start": i, "end": i + 1,
              "index": i} for i in range(100)]
    text = chain_text(chain)
    assert text.count("->") == CHAIN_LIMIT
    assert "0F0@r0 [0,1]" in text and "0F99@r0 [99,100]" in text
    assert f"... {100 - CHAIN_LIMIT} more steps ..." in text
    assert chain_text(chain[:CHAIN_LIMIT]).count("->") == CHAIN_LIMIT - 1


def test_op_cause_costs_zero_and_indirect_effects_count() -> None:
    prog = build_program("1f1b", 4, 8)
    c = CostModel(F=1, BW=2)
    eff, cause = select(prog, "rank=0 BW mb=7"), select(prog, "rank=3 BW mb=7")
    a = answer(prog, eff, [cause], c, LinkModel(), CommModel())
    # 3BW7 [25, 27) is on the chain to 0BW7 [31, 33). Free, 2BW7 could start at 25 but
    # rank 2 runs 2BW6 until 26: the chain gains 1, not 2 (the re-simulation sees it)
    assert (a.effect_start, a.counterfactual_start, a.delay, a.makespan,
            a.makespan_delta) == (31, 30, 1, 33, 1)
    assert [s["what"] for s in a.chain if s["kind"] == "op"] == ["3BW7", "2BW7", "1BW7",
                                                                 "0BW7"]


@pytest.mark.parametrize("stream", ["none", "per-peer", "per-rank"])
def test_free_message_completes_at_post(stream: str) -> None:
    comm = CommModel(semantics="rendezvous", comm_stream=stream)
    prog = build_program("dualpipev", 4, 10)
    tl = simulate(prog, FIG, comm=comm)
    t = select(prog, "rank=3 SEND_F mb=2")
    cf = simulate_free(prog, FIG, LinkModel(), comm, [t])
    assert cf.deadlock is None and len(cf.spans) == len(tl.spans)
    assert cf.makespan <= tl.makespan
    # nothing else changed: freeing nothing reproduces the run exactly
    same = simulate_free(prog, FIG, LinkModel(), comm, [])
    assert [(s.start, s.end) for s in same.spans] == [(s.start, s.end) for s in tl.spans]


def test_query_cli_all_semantics(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    r = CliRunner().invoke(app, ["query", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                                 "--semantics", "all", "--effect", "rank=5 W mb=0",
                                 "--cause", "rank=5 SEND_B mb=0", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert [x["semantics"] for x in d] == ["data", "eager", "rendezvous"]
    for x in d:
        assert {"semantics", "effect_start", "counterfactual_start", "delay", "makespan",
                "makespan_delta", "binding_wait", "chain"} <= set(x)
    assert [(x["effect_start"], x["delay"], x["makespan_delta"]) for x in d] == \
        [(11, 0, 0), (12, 0, 0), (12, 0, 0)]
    out_lines = r.stdout.splitlines()
    # the headlines come first, one per semantics, before the table
    assert out_lines[0].startswith("data: rank 5 5SEND_B0 (instr 27) does not delay")
    assert out_lines[1].startswith("eager: rank 5 5SEND_B0 (instr 27) does not delay")
    assert out_lines[2].startswith("rendezvous: rank 5 5SEND_B0 (instr 27) alone does "
                                   "not delay")


def test_query_cli_rendezvous_headline_names_both_causes(tmp_path: Path) -> None:
    """Issue 15: the T10/T12 query under rendezvous headlines both causes and the delay
    with both freed, in its first two lines."""
    out = tmp_path / "q.json"
    r = CliRunner().invoke(app, ["query", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                                 "--semantics", "rendezvous", "--effect", "rank=5 W mb=0",
                                 "--cause", "rank=5 SEND_B mb=0", "--json", str(out)])
    assert r.exit_code == 0, r.output
    first, second = r.stdout.splitlines()[:2]
    assert "rank 5 5SEND_B0 (instr 27) alone does not delay rank 5 5W0" in first
    assert "rank 5 5RECV_F3 (instr 27) binds the same COMMIT (instr 28)" in first
    assert "freeing both: delay 1" in second
    d = json.loads(out.read_text())[0]
    assert (d["delay"], d["co_causes"], d["joint_delay"]) == \
        (0, ["rank 5 5RECV_F3 (instr 27)"], 1)


def test_query_cli_errors_leave_no_file(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    r = CliRunner().invoke(app, ["query", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                                 "--effect", "W mb=0", "--cause", "rank=5 SEND_B mb=0",
                                 "--json", str(out)])
    assert r.exit_code == 2 and "matches 3 instructions" in r.output
    assert "Traceback" not in r.output and not out.exists()
    r = CliRunner().invoke(app, ["query", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                                 "--effect", "rank=5 W mb=0"])
    assert r.exit_code == 2 and "--cause" in r.output


def test_scenario_file_is_the_dualpipe_figure() -> None:
    sc = load_scenario(SCHEDULES / "dualpipe-issue-t10-t12.toml")
    tl = simulate(sc.build_program(), sc.costs, sc.link, sc.comm)
    assert tl.makespan == 66 and all(r.idle == 6 for r in tl.per_rank)
    b0 = tl.find_span(5, "B", 0)
    assert (b0.start, b0.end) == (10, 11)      # T10
    assert tl.find_span(4, "BW", 0).start == 12   # T12


@pytest.mark.parametrize("effect,cause", [
    ("rank=5 W mb=0", "rank=5 W mb=0"),          # the same selector
    ("rank=5 W mb=0", "5W0"),                    # the same instruction, as a token
    ("rank=5 F mb=15", "rank=5 BW mb=1"),        # both parts of one FB pair
    ("rank=4 RECV_B mb=0", "rank=4 RECV_B mb=0"),  # a comm op
    ("rank=4 RECV_B mb=0", "rank=5 SEND_B mb=0"),  # its partner: frees the same message
])
def test_cause_that_is_the_effect_is_an_error(effect: str, cause: str,
                                              tmp_path: Path) -> None:
    """Freeing the effect itself answered "does not delay it"; it is a rule violation."""
    eff, c = select(DP, effect), select(DP, cause)
    with pytest.raises(ScenarioError, match="the effect itself: a cause must be another "
                                            "instruction than the effect"):
        answer(DP, eff, [select(DP, "rank=5 SEND_B mb=0"), c], FIG, LinkModel(),
               CommModel(semantics="eager"))
    out = tmp_path / "q.json"
    r = CliRunner().invoke(app, ["query", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                                 "--semantics", "all", "--effect", effect, "--cause", cause,
                                 "--json", str(out)])
    assert r.exit_code == 2 and "a cause must be another instruction" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_comm_effect_is_its_completion() -> None:
    """For a comm op effect the time is its completion, and the answer says so: 4RECV_B0
    completes at 12 (eager); 4F3 delays it by 1 (through 3F14, after which rank 4 posts
    its recv), the makespan does not move."""
    from schedsim.analysis.query_text import explain

    eff = select(DP, "rank=4 RECV_B mb=0")
    a = answer(DP, eff, [select(DP, "rank=4 F mb=3")], FIG, LinkModel(),
               CommModel(semantics="eager"))
    assert (a.effect_event, a.effect_start, a.counterfactual_start, a.delay,
            a.makespan_delta) == ("completion", 12, 11, 1, 0)
    text = "\n".join(explain(a))
    assert ("delays rank 4 4RECV_B0 (instr 25) by 1 slot: it completes at 12 slots, at 11 "
            "slots with the cause free") in text
    assert "starts at" not in text and "not blocked" not in text
    a = _ask("eager", SEND)
    assert a.effect_event == "start" and "5W0 (instr 29): it starts at 12" in explain(a)[0]

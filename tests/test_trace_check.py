"""The engine checked against measured runs, without launching ranks: the Timeline
builder, calibration from a timeline (medians, link, launch cost; --exact), the engine's
measured host times and message times, the two errors, check-trace, and the analyses
(stalls, align, critical-path, memory) on a Timeline JSON."""
from __future__ import annotations

import json
import math

import pytest
from test_trace_import import gpipe_traces, runtime_traces
from typer.testing import CliRunner

from schedsim import build_program
from schedsim.analysis.accuracy import prediction_error
from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.interop.kineto import import_traces
from schedsim.program.ir import Op, Placement, Program
from schedsim.replay.check import send_waits_before_recv, two_errors
from schedsim.replay.fit import fit_timeline, host_times, wait_matched_latency
from schedsim.sim.costs import CommModel, CostModel, HostTime, LinkModel, MessageTime
from schedsim.sim.simulate import simulate
from schedsim.timeline import Message, Timeline
from schedsim.timeline_build import SpanColumns, TimelineHeader, timeline_from_columns

runner = CliRunner()


def dressed(tl: Timeline, **extra) -> Timeline:
    """A simulated timeline presented as a measured one (the builder's transfer rule
    applied, as a replay's would be)."""
    data = {**tl.model_dump(), "source": "measured", "semantics": "gloo", **extra}
    for m in data["messages"]:
        m["start"] = m["arrival"] = None
    out = Timeline.model_validate(data)
    from schedsim.timeline import infer_transfers

    infer_transfers(out.messages)
    return out


# -- the builder --------------------------------------------------------------------------
def test_timeline_from_columns():
    pl = Placement(kind="v", ranks=2, stages=4)
    fb = Op.fb(Op("F", 3, 1), Op("BW", 0, 0))
    tl = timeline_from_columns(TimelineHeader(pl, "x", 2, "eager", "ms"),
                               SpanColumns([1, 0], [Op("F", 3, 0), fb], [2.0, 0.0],
                                           [3.0, 1.5], [4, 7]),
                               order="rank-start", extra_field=1)
    assert [(s.rank, s.kind, s.chunk, s.index) for s in tl.spans] == [(0, "FB", 1, 7),
                                                                      (1, "F", 1, 4)]
    assert [(p.kind, p.chunk) for p in tl.spans[0].parts] == [("F", 1), ("BW", 0)]
    assert tl.makespan == 3.0 and tl.per_rank[1].busy == 1.0 and tl.extra_field == 1
    with pytest.raises(ValueError, match="differ in length"):
        timeline_from_columns(TimelineHeader(pl, "x", 1, "eager", "ms"),
                              SpanColumns([0], [], [], [], []))


def test_measured_builder_splits_waiting_and_transferring():
    """Measured messages get start = later post, arrival = receiver done (or nothing)."""
    pl = Placement(kind="loop", ranks=2, stages=2)
    msgs = [Message("F", 0, 1, 0, 0, send_posted=1.0, recv_posted=3.0, recv_done=3.5),
            Message("F", 0, 1, 1, 0, send_posted=4.0, recv_posted=2.0, recv_done=4.25),
            Message("F", 0, 1, 2, 0, send_posted=4.0)]
    tl = timeline_from_columns(TimelineHeader(pl, "x", 3, "gloo", "ms", "measured"),
                               SpanColumns([], [], [], [], []), msgs)
    assert [(m.start, m.arrival) for m in tl.messages] == [(3.0, 3.5), (4.0, 4.25),
                                                           (None, None)]


# -- engine: measured host times and message times ------------------------------------------
def test_host_times_and_sender_completion_closed_form():
    """1F1B, 2 ranks, 1 microbatch, unit costs, eager: rank 1 starts 0.5 late, its
    RECV launch takes 0.25, the message takes 2 to arrive and its sender completes 3 after
    the transfer starts; the run is hand-computed."""
    prog = build_program("1f1b", 2, 1)
    host = [HostTime(rank=1, index=0, before=0.5, launch=0.25)]
    link = LinkModel(messages=[MessageTime(kind="F", stage=0, mb=0, time=2.0, send=3.0)])
    tl = simulate(prog, CostModel(F=1, B=1, W=1), link,
                  CommModel(semantics="eager", host=host))
    # rank 0: F [0,1], post SEND_F0 at 1; the transfer starts at 1, arrives at 3; the
    # sender completes at 1 + 3 = 4; rank 1 posts its recv at 0.75, runs F at 3
    m = next(x for x in tl.messages if x.kind == "F")
    assert (m.recv_posted, m.start, m.arrival, m.send_done) == (0.75, 1.0, 3.0, 4.0)
    assert tl.find_span(1, "F", 0).start == 3.0
    # the same under finite bandwidth (events in time order): the same times, but for
    # the 8 ns the unmeasured B message now occupies its link
    tl2 = simulate(prog, CostModel(F=1, B=1, W=1, message_bytes=8),
                   link.model_copy(update={"bandwidth": 1e9}),
                   CommModel(semantics="eager", host=host))
    assert [(s.rank, s.start, s.end) for s in tl2.spans] == [
        (s.rank, pytest.approx(s.start, abs=1e-8), pytest.approx(s.end, abs=1e-8))
        for s in tl.spans]


# -- fit and exact calibration --------------------------------------------------------------
def test_fit_medians_link_and_launch():
    """Op costs: per stage and kind the median over microbatches (stage 0's F: 1, 1, 7;
    the durations kept); the link: the wait-matched latency of the messages; the launch
    cost: the mean launch."""
    prog = build_program("gpipe", 2, 3)
    costs = CostModel(F=1, B=1, W=1, BW=2, unit="ms",
                      overrides=[dict(stage=0, mb=2, kind="F", cost=7)])
    sim = simulate(prog, costs, LinkModel(latency=0.5), CommModel(semantics="rendezvous"))
    posts = [{"rank": 0, "index": 0, "last_index": 0, "start": 0.0, "end": 1.0},
             {"rank": 1, "index": 0, "last_index": 0, "start": 0.0, "end": 3.0}]
    fit = fit_timeline(dressed(sim, posts=posts))
    assert fit.stages == {0: {"F": 1.0, "BW": 2.0}, 1: {"F": 1.0, "BW": 2.0}}
    assert sorted(fit.durations[(0, "F")]) == [1.0, 1.0, 7.0]
    assert fit.link() == (pytest.approx(0.5), math.inf)
    assert fit.launch_cost() == 2.0
    assert "F = 1.0\n" in fit.to_toml() and "[[costs.overrides]]" not in fit.to_toml()


def test_wait_matched_latency_closed_form():
    """A 0.5 ms transfer whose receivers began waiting 0, 0.25 and 1.0 ms into it (the
    waits: 0.5, 0.25, 0): the latency giving the same summed waits is 0.5 (the mean of
    the waits, the old rule, 0.25); sum(max(L - d, 0)) = W solved on each segment."""
    assert wait_matched_latency([0.0, 0.25, 1.0], 0.75) == pytest.approx(0.5)
    assert wait_matched_latency([1.0, 0.25, 0.0], 0.75) == pytest.approx(0.5)  # any order
    assert wait_matched_latency([0.0, 0.0], 3.0) == pytest.approx(1.5)
    assert wait_matched_latency([2.0, 4.0], 5.0) == pytest.approx(5.5)       # (5+2+4)/2
    assert wait_matched_latency([], 1.0) == 0.0 == wait_matched_latency([0.5], 0.0)


def test_fit_steps_latency_reproduces_the_steps_makespan():
    """The contended merge: each op cost the median over the steps of the step's mean,
    and the link latency fitted so that the simulated program takes the steps' median
    makespan. Simulated steps (latency 0.5 ms) whose stage 1 F takes 1, 3, 1, 3 ms
    (mean 2) in two steps and 5 ms throughout in a third (a step-long pause): F is 2,
    not the mean of every duration (3); the makespans are 26, 26 and 37 ms; a constant F
    of 2 loses less at the cross-rank waits than the scattered one, so the fitted
    latency (0.75) is above the waits' 0.5 and gives the median step's 26 ms; the spread
    line says so, and the cost file holds it."""
    from schedsim.replay.contended import fit_steps

    prog = build_program("1f1b", 2, 4)
    steps = []
    for f1 in ([1.0, 3.0, 1.0, 3.0], [1.0, 3.0, 1.0, 3.0], [5.0] * 4):
        over = [dict(stage=1, mb=i, kind="F", cost=c) for i, c in enumerate(f1)]
        sim = simulate(prog, CostModel(F=1, B=2, W=1, unit="ms", overrides=over),
                       LinkModel(latency=0.5), CommModel(semantics="rendezvous"))
        steps.append(json.loads(dressed(sim).to_json()))
    sf = fit_steps(steps, prog)
    assert sf.fit.stages[1]["F"] == pytest.approx(2.0)
    assert sorted(s["makespan"] for s in steps) == pytest.approx([26.0, 26.0, 37.0])
    lat = sf.fit.link()[0]
    pred = simulate(prog, sf.fit.cost_model(), sf.fit.link_model(),
                    sf.fit.comm_model("rendezvous"))
    assert sf.fitted and pred.makespan == pytest.approx(26.0, rel=1e-5)
    assert sf.waits_latency == pytest.approx(0.5) and lat == pytest.approx(0.75, rel=1e-4)
    assert "fitted to the steps' median makespan 26 ms" in sf.spread_lines()[-1]
    assert f"latency = {lat!r}" in sf.to_toml()


def test_merge_fits_takes_the_median_step_mean_of_launch_and_host_costs():
    """Launch and host cost of the merge: the median over the steps of each step's own
    mean (a step with a long pause does not move them); every launch is kept."""
    from dataclasses import replace

    from schedsim.replay.contended import merge_fits
    from schedsim.replay.fit import TimelineFit

    base = TimelineFit(unit="ms", stages={}, message_bytes=0.0, samples=[], launches=[])
    fits = [replace(base, launches=ls, host_cost=h) for ls, h in
            (([0.1, 0.3], 0.02), ([0.2, 0.2], 0.03), ([5.0, 7.0], 9.0))]
    m = merge_fits(fits)
    assert m.launch_cost() == pytest.approx(0.2) and m.host_cost == pytest.approx(0.03)
    assert sorted(m.launches) == [0.1, 0.2, 0.2, 0.3, 5.0, 7.0]
    assert "launch_cost = 0.2   # ms per launch (median of the steps' means; 6 launches)" \
        in m.to_toml()


def test_exact_calibration_reproduces_a_run():
    """calibrate --exact of a run with a launch cost, a latency, varied op costs and a
    late rank: simulating with it gives the run back (zero semantics error), and a
    cost-model prediction with the true costs is exact too."""
    prog = build_program("1f1b", 2, 4)
    costs = CostModel(F=1.5, B=1, W=1, BW=2.25, unit="ms",
                      overrides=[dict(stage=1, mb=2, kind="BW", cost=4)])
    comm = CommModel(semantics="rendezvous", launch_cost=0.25)
    sim = simulate(prog, costs, LinkModel(latency=0.125), comm)
    meas = dressed(sim)
    fit = fit_timeline(meas, prog, exact=True)
    assert len(fit.overrides) == len(meas.spans) and len(fit.transfers) == len(meas.messages)
    errs = two_errors(meas, prog, model=(costs, LinkModel(latency=0.125), comm))
    d = errs.to_dict()
    assert d["semantics_error"] == {"makespan": 0.0, "mean_start": 0.0, "max_start": 0.0}
    assert d["cost_model_error"]["mean_start"] == pytest.approx(0, abs=1e-12)
    # a wrong cost model shows up as the cost-model error only
    errs = two_errors(meas, prog, model=(CostModel(F=1, B=1, W=1, BW=2, unit="ms"),
                                         LinkModel(), comm))
    assert errs.to_dict()["semantics_error"]["makespan"] == 0.0
    assert errs.to_dict()["cost_model_error"]["makespan"] < -0.05


def test_host_times_hand_computed(tmp_path):
    """Per instruction: the host time since the previous one let go, and a launch's
    time up to its post (the c10d call's start)."""
    tl = import_traces(list(runtime_traces(tmp_path)))
    prog = Program.model_validate(tl.program)
    got = {(h.rank, h.index): (round(h.before, 6), None if h.launch is None
                               else round(h.launch, 6)) for h in host_times(tl, prog)}
    assert got == {(0, 0): (0.0, None), (0, 1): (0.0, 0.005), (0, 2): (0.015, 0.002),
                   (0, 3): (0.178, None), (0, 4): (0.0, None), (0, 5): (0.0, None),
                   (1, 0): (0.0, 0.002), (1, 1): (0.048, None), (1, 2): (0.0, None),
                   (1, 3): (0.0, None), (1, 4): (0.0, 0.002), (1, 5): (0.008, None)}


def test_semantics_error_sees_wrong_semantics(tmp_path):
    """The exact prediction of an imported GPipe trace is the run itself under
    rendezvous; under eager the sends that waited for a later recv complete too early,
    and the error says so."""
    tl = import_traces(list(gpipe_traces(tmp_path)))
    prog = Program.model_validate(tl.program)
    assert send_waits_before_recv(tl) == (1, 1)     # rank 1 waits its B1 send at 330 µs,
    # rank 0 posts the recv at 415 µs, the send completes at 430 µs
    rdv = two_errors(tl, prog, semantics="rendezvous").semantics
    eag = two_errors(tl, prog, semantics="eager").semantics
    assert rdv.mean_start_error == 0.0 and rdv.makespan_error == 0.0
    assert eag.mean_start_error > 0.01 * tl.makespan


# -- CLI -----------------------------------------------------------------------------------
def test_check_trace_cli(tmp_path):
    a, b = runtime_traces(tmp_path)
    out = tmp_path / "new" / "dir"
    r = runner.invoke(app, ["check-trace", str(a), str(b), "--json", str(tmp_path / "e.json"),
                            "--out-dir", str(out), "--name", "pp"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "2 of 2 messages paired" in text
    assert "semantics error : makespan +0.0%, op start mean 0.0% / max 0.0%" in text
    e = json.loads((tmp_path / "e.json").read_text())
    assert set(e) >= {"semantics_error", "cost_model_error"}
    assert set(e["semantics_error"]) == {"makespan", "mean_start", "max_start"}
    assert sorted(p.name for p in out.iterdir()) == [
        "pp-errors.json", "pp-exact.json", "pp-measured.json", "pp-overlay.png",
        "pp-predicted.json", "pp-program.txt"]
    # the program file simulates (its header says how)
    r = runner.invoke(app, ["simulate", "--program", str(out / "pp-program.txt"),
                            "--placement", "loop", "--stages", "2", "-q"])
    assert r.exit_code == 0, r.output
    # partial input: a one-line error naming the missing rank
    r = runner.invoke(app, ["check-trace", str(a)])
    assert r.exit_code == 2 and "every rank (missing: rank(s) 1)" in r.output


def test_calibrate_from_timeline_cli(tmp_path):
    """--from-timeline [--exact]: a cost file simulate reads; the exact one reproduces
    the run; the flags that run ranks are refused."""
    a, b = runtime_traces(tmp_path)
    tj, prog = tmp_path / "t.json", tmp_path / "p.txt"
    r = runner.invoke(app, ["import-trace", str(a), str(b), "--json", str(tj),
                            "--program-out", str(prog)])
    assert r.exit_code == 0, r.output
    assert "2 messages, 2 paired" in " ".join(r.output.split())
    r = runner.invoke(app, ["calibrate", "--from-timeline", str(tj), "--exact", "--out",
                            str(tmp_path / "x.toml")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["simulate", "--program", str(prog), "--placement", "loop",
                            "--stages", "2", "--semantics", "rendezvous", "--costs-file",
                            str(tmp_path / "x.toml"), "-q", "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    pe = prediction_error(Timeline.read_json(tmp_path / "s.json"), Timeline.read_json(tj))
    assert pe.mean_start_error == pytest.approx(0, abs=1e-9)
    assert pe.makespan_error == pytest.approx(0, abs=1e-9)
    for extra, msg in ((["--repeats", "3"], "--repeats cannot apply to --from-timeline"),
                       (["--schedule", "1f1b"], "--schedule cannot apply to"),
                       ([str(tmp_path / "s.toml")], "give a scenario or --from-timeline, "
                                                     "not both")):
        r = runner.invoke(app, ["calibrate", "--from-timeline", str(tj), *extra])
        assert r.exit_code == 2 and msg in r.output, r.output
    r = runner.invoke(app, ["calibrate", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "2", "--exact"])
    assert r.exit_code == 2 and "--exact goes with --from-timeline" in r.output


def test_analyses_take_a_timeline(tmp_path):
    """stalls, align, critical-path and memory on an imported trace: the stalls name the
    message a rank waited for, the critical path goes through it, at the measured
    times."""
    a, b = runtime_traces(tmp_path)
    tj = tmp_path / "t.json"
    import_traces([a, b]).write_json(tj)
    r = runner.invoke(app, ["stalls", str(tj), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    st = json.loads((tmp_path / "s.json").read_text())
    recv = [s for s in st if s["comms"] == ["1RECV_F0"]]
    assert recv and recv[0]["start"] == 0.05 and recv[0]["end"] == 0.15
    assert "waits for the activation of stage 0 mb 0 from rank 0" in recv[0]["detail"]
    r = runner.invoke(app, ["critical-path", str(tj), "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    path = json.loads((tmp_path / "c.json").read_text())["path"]
    assert [(s["kind"], s["what"]) for s in path if s["kind"] in ("op", "message")] == [
        ("op", "0F0"), ("message", "F mb0 0->1"), ("op", "1F0"), ("op", "1BW0"),
        ("message", "B mb0 1->0"), ("op", "0BW0")]
    assert path[-1]["end"] == 0.5
    for cmd in (["align"], ["memory"]):
        r = runner.invoke(app, [*cmd, str(tj)])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["stalls", str(tj), "--semantics", "eager"])
    assert r.exit_code == 2 and "--semantics cannot apply to" in r.output


def test_graph_reproduces_measured_times(tmp_path):
    """On a measured timeline the dependency graph's node times are the measured ones."""
    from schedsim.analysis.graph import build_graph

    tl = import_traces(list(gpipe_traces(tmp_path)))
    G = build_graph(tl, Program.model_validate(tl.program),
                    comm=CommModel(semantics="rendezvous"))
    for s in tl.spans:
        assert G.time[("S", s.rank, s.index)] == pytest.approx(s.start, abs=1e-12)
        assert G.time[("E", s.rank, s.index)] == pytest.approx(s.end, abs=1e-12)


def test_timeline_without_program(tmp_path):
    tl = simulate(build_program("1f1b", 2, 2))
    p = tmp_path / "sim.json"
    tl.write_json(p)
    r = runner.invoke(app, ["critical-path", str(p)])
    assert r.exit_code == 2 and "carries no program" in r.output
    r = runner.invoke(app, ["stalls", str(p)])
    assert r.exit_code == 0, r.output
    with pytest.raises(ScenarioError, match="--exact needs the program"):
        fit_timeline(dressed(tl), exact=True)

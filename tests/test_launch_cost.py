"""Launch cost from calibration to simulation (no processes started): the program's post
runs by composition, the calibrated statistic, the cost file's ``[comm]`` table (round
trip, rejection), the closed-form effect on a small program through ``simulate
--costs-file`` and through ``replay --compare``'s prediction; and the one error
convention (predicted - measured) / measured shared by the console line and the overlay."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from schedsim.analysis.accuracy import compare_metrics, prediction_error
from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.replay.calibrate import Calibration, post_runs
from schedsim.scenario import apply_costs_file, load_scenario, parse_scenario
from schedsim.sim.costs import CommModel, CostModel
from schedsim.sim.simulate import simulate
from schedsim.timeline import Timeline

runner = CliRunner()

# rank 0 launches [SEND_F0], then [SEND_F1 RECV_B0 RECV_B1]; rank 1 [RECV_F0],
# [SEND_B0 RECV_F1], [SEND_B1]
PROGRAM = """\
0F0 0SEND_F0 0F1 BATCH[0SEND_F1+0RECV_B0+0RECV_B1] WAIT[0RECV_B0] 0BW0 WAIT[0RECV_B1] 0BW1
1RECV_F0 WAIT[1RECV_F0] 1F0 1BW0 BATCH[1SEND_B0+1RECV_F1] WAIT[1RECV_F1] 1F1 1BW1 1SEND_B1
"""
STAGE = dict(F=1.0, B=1.0, W=1.0, BW=2.0, FB=3.0)


def _scenario(tmp_path, comm: str = 'semantics = "eager"\ncomm_stream = "per-rank"'):
    (tmp_path / "prog.txt").write_text(PROGRAM)
    path = tmp_path / "s.toml"
    path.write_text(f'[schedule]\nprogram = "prog.txt"\nplacement = "loop"\n'
                    f'[costs]\nF = 5\n[comm]\n{comm}\n')
    return path


def _cal(launch: dict[str, list[float]], runs: dict[str, int]) -> Calibration:
    return Calibration(stages={0: STAGE, 1: STAGE}, launch_samples=launch, post_runs=runs)


def test_post_runs_by_composition(tmp_path):
    prog = load_scenario(_scenario(tmp_path)).build_program()
    assert post_runs(prog) == {"1+0": 2, "1+2": 1, "0+1": 1, "1+1": 1}
    assert post_runs(load_scenario(_scenario(tmp_path)).build_program()
                     .model_copy(update={"ranks": [[], []]})) == {}


def test_launch_cost_is_the_program_weighted_mean():
    cal = _cal({"1+0": [0.1, 0.2, 0.6], "0+1": [0.3, 0.5, 1.0, 2.2], "1+1": [0.2]},
               {"1+0": 2, "0+1": 1, "1+1": 1})
    assert cal.launch_means() == {"1+0": pytest.approx(0.3), "0+1": pytest.approx(1.0),
                                  "1+1": pytest.approx(0.2)}
    # weighted by the program's batches: (2 x 0.3 + 1.0 + 0.2) / 4
    assert cal.launch_cost() == pytest.approx(1.8 / 4)
    # a composition not measured counts with the mean of all 8 samples (5.1 / 8)
    cal2 = cal.model_copy(update={"post_runs": {"1+0": 1, "2+2": 1}})
    assert cal2.launch_cost() == pytest.approx((0.3 + 5.1 / 8) / 2)
    assert _cal({}, {"1+0": 3}).launch_cost() == 0.0          # one rank: nothing measured
    assert _cal({"1+0": [0.2]}, {}).launch_cost() == 0.0      # the program posts nothing
    cm = cal.comm_model("rendezvous", comm_stream="per-peer")
    assert (cm.semantics, cm.comm_stream, cm.launch_cost) == \
        ("rendezvous", "per-peer", pytest.approx(1.8 / 4))


def test_cost_file_comm_round_trip_and_closed_form(tmp_path):
    """The cost file's launch_cost replaces the scenario's, semantics and streams stay;
    simulated makespan of PROGRAM with F=1, BW=2, free links: 9 + 3 L (three launches on
    the critical path: rank 0's first, rank 1's second and third)."""
    cal = _cal({"1+0": [0.25], "0+1": [0.25], "1+1": [0.25], "1+2": [0.25]},
               {"1+0": 2, "1+2": 1, "0+1": 1, "1+1": 1})
    text = cal.to_toml("t")
    assert "\n[comm]\nlaunch_cost = 0.25 " in text
    assert "# the program's batches (sends+recvs: count): 0+1: 1, 1+0: 2, 1+1: 1, 1+2: 1" \
        in text
    cf = tmp_path / "c.toml"
    cf.write_text(text)
    scen = _scenario(tmp_path, 'semantics = "eager"\nlaunch_cost = 7')
    sc = apply_costs_file(load_scenario(scen), cf)
    assert (sc.comm.semantics, sc.comm.launch_cost) == ("eager", 0.25)
    assert sc.costs.F == 1.0 and sc.costs.unit == "ms"
    tl = simulate(sc.build_program(), sc.costs, sc.link, sc.comm)
    assert tl.makespan == pytest.approx(9 + 3 * 0.25)
    # the same through the CLI; a file with only [comm] keeps the scenario's costs (F=5)
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["simulate", str(scen), "--costs-file", str(cf), "-q",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert Timeline.read_json(out).makespan == pytest.approx(9.75)
    only = tmp_path / "only.toml"
    only.write_text("[comm]\nlaunch_cost = 0.5\n")
    sc2 = apply_costs_file(load_scenario(_scenario(tmp_path)), only)
    assert (sc2.costs.F, sc2.comm.launch_cost, sc2.comm.comm_stream) == (5.0, 0.5, "per-rank")
    # data semantics ignore it
    sc3 = apply_costs_file(load_scenario(_scenario(tmp_path, 'semantics = "data"')), cf)
    assert simulate(sc3.build_program(), sc3.costs, sc3.link, sc3.comm).makespan == 9.0


@pytest.mark.parametrize("comm, match", [
    ('semantics = "eager"', "launch_cost, host_cost and host \\(got semantics;"),
    ("launch_cost = 0.1\nbandwidth = 3", "launch_cost, host_cost and host \\(got bandwidth;"),
    ("launch_cost = -1", "comm.launch_cost"),
    ('launch_cost = "fast"', "comm.launch_cost"),
])
def test_cost_file_comm_rejected(tmp_path, comm, match):
    cf = tmp_path / "c.toml"
    cf.write_text(f"[comm]\n{comm}\n")
    scen = _scenario(tmp_path)
    with pytest.raises(ScenarioError, match=match):
        apply_costs_file(load_scenario(scen), cf)
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["simulate", str(scen), "--costs-file", str(cf), "--json",
                            str(out)])
    assert r.exit_code == 2 and "Traceback" not in r.output and not out.exists()
    cf.write_text("comm = 3\n")
    with pytest.raises(ScenarioError, match="'comm' must be a table"):
        apply_costs_file(load_scenario(scen), cf)


def test_replay_compare_predicts_with_the_calibrated_launch_cost(tmp_path, capsys):
    """``replay --compare``'s prediction (no ranks started: a measurement stand-in) uses
    the calibration's launch cost, and the console line and the overlay title give the
    same errors."""
    from schedsim.cli.replay import _compare
    from schedsim.replay.config import spec_from_scenario

    sc = load_scenario(_scenario(tmp_path))
    spec = spec_from_scenario(sc)
    prog = sc.build_program()
    cal = _cal({"1+0": [0.5], "0+1": [0.5], "1+1": [0.5], "1+2": [0.5]},
               {"1+0": 2, "1+2": 1, "0+1": 1, "1+1": 1})
    meas = simulate(prog, CostModel(F=1.25, B=1, W=1, BW=2.5, unit="ms"),
                    comm=CommModel(semantics="eager", launch_cost=0.5))
    meas = Timeline.model_validate({**meas.model_dump(), "source": "measured",
                                    "semantics": "gloo"})
    out = tmp_path / "out"
    out.mkdir()
    _compare(sc, spec, {"calibration": cal.model_dump(mode="json")}, meas, out, "eager",
             calibrated=True)
    pred = Timeline.read_json(out / f"{prog.name}-predicted.json")
    assert pred.makespan == pytest.approx(9 + 3 * 0.5)
    assert "[comm]\nlaunch_cost = 0.5 " in (out / f"{prog.name}-costs.toml").read_text()
    text = " ".join(capsys.readouterr().out.split())
    m = compare_metrics(pred, meas)
    pct = 100 * (10.5 - meas.makespan) / meas.makespan
    assert m["makespan_error_pct"] == pytest.approx(pct)
    assert f"(error {pct:+.1f}%)" in text
    assert f"mean {m['mean_start_error_pct']:.1f}% of makespan" in text
    assert f"without it: makespan 9 ms (error {100 * (9 - meas.makespan) / meas.makespan:+.1f}" \
        in text
    from schedsim.plot import overlay

    title = overlay(pred, meas, names=("predicted", "measured")).axes[0].get_title()
    assert f"{pct:+.1f}% of measured" in title
    assert f"{m['mean_start_error_pct']:.1f}% of measured makespan" in title


def test_prediction_error_definition():
    """Hand-computed: predicted vs measured spans of 4 ops, one FB (two ops)."""
    def tl(rows, semantics="eager"):
        spans = [dict(rank=r, kind=k, mb=m, chunk=0, stage=r, start=a, end=b, index=i,
                      parts=p) for r, k, m, a, b, i, p in rows]
        mk = max(s["end"] for s in spans)
        return Timeline.model_validate(dict(
            schedule="x", ranks=2, stages=2, microbatches=2, semantics=semantics,
            makespan=mk, per_rank=Timeline.summarize(2, [])[1], spans=spans))
    fb = [dict(kind="F", mb=1, chunk=0, stage=1), dict(kind="BW", mb=0, chunk=0, stage=1)]
    pred = tl([(0, "F", 0, 0, 1, 0, None), (1, "FB", 1, 2, 5, 1, fb),
               (1, "F", 0, 1, 2, 0, None)])
    meas = tl([(0, "F", 0, 0, 1, 0, None), (1, "FB", 1, 3, 8, 1, fb),
               (1, "F", 0, 1.5, 3, 0, None)])
    pe = prediction_error(pred, meas)
    # ops: 0F0 (0), 1F1 and 1BW0 (both -1), 1F0 (-0.5): mean |error| 2.5 / 4
    assert (pe.ops, pe.moved) == (4, 3)
    assert pe.makespan_error_pct == pytest.approx(100 * (5 - 8) / 8)
    assert pe.mean_start_error == pytest.approx(0.625)
    assert pe.mean_start_error_pct == pytest.approx(100 * 0.625 / 8)
    assert (pe.max_start_error, pe.worst_op) == (-1.0, "1BW0 on rank 1")
    assert json.loads(json.dumps(compare_metrics(pred, meas))) == pe.to_dict()
    with pytest.raises(ScenarioError, match="different ops"):
        prediction_error(pred, tl([(0, "F", 0, 0, 1, 0, None)]))
    with pytest.raises(ScenarioError):
        parse_scenario({"comm": {"launch_cost": -1}})

"""``schedsim compare`` with a scenario argument, per-schedule parameters, the comm flags,
``--gantt`` (one chart per schedule on one time axis) and ``-q`` (issue 27)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.sweep import compare_schedules, parse_schedules

FIG = "schedules/dualpipe-figure.toml"
SPEC = "interleaved-1f1b:chunks=4,zbv,dualpipe"


def test_parse_schedules() -> None:
    assert parse_schedules(SPEC) == [("interleaved-1f1b:chunks=4", "interleaved-1f1b",
                                      {"chunks": 4}), ("zbv", "zbv", {}),
                                     ("dualpipe", "dualpipe", {})]
    assert parse_schedules("interleaved-1f1b:chunks=2,variant=megatron,1f1b") == [
        ("interleaved-1f1b:chunks=2,variant=megatron", "interleaved-1f1b",
         {"chunks": 2, "variant": "megatron"}), ("1f1b", "1f1b", {})]
    assert parse_schedules(["1f1b:comm_policy=megatron:batch_p2p_comm=false"]) == [
        ("1f1b:comm_policy=megatron:batch_p2p_comm=false", "1f1b",
         {"comm_policy": "megatron", "batch_p2p_comm": False})]
    for bad in ("chunks=4,1f1b", "interleaved-1f1b:chunks", "1f1b,1f1b"):
        with pytest.raises(ScenarioError):
            parse_schedules(bad)


def test_one_schedule_twice_with_different_chunks() -> None:
    """Interleaved 1F1B at v chunks per rank, costs per rank: each rank computes
    m (F + BW) and the bubble is (p - 1)(F + BW) / v (Narayanan et al. 2021, sec. 2.2)."""
    res = compare_schedules(4, 8, schedules=["interleaved-1f1b:chunks=2",
                                             "interleaved-1f1b:chunks=4"])
    assert [(r.schedule, r.stages, r.makespan) for r in res.rows] == [
        ("interleaved-1f1b:chunks=2", 8, 8 * 3 + 3 * 3 / 2),
        ("interleaved-1f1b:chunks=4", 16, 8 * 3 + 3 * 3 / 4)]


def test_compare_scenario_with_parameters_and_gantt(tmp_path) -> None:
    js, png = tmp_path / "c.json", tmp_path / "cmp.png"
    r = CliRunner().invoke(app, ["compare", FIG, "--schedules", SPEC, "--gantt", str(png),
                                 "--json", str(js)])
    assert r.exit_code == 0, r.output
    recs = {d["schedule"]: d for d in json.loads(js.read_text())}
    assert list(recs) == SPEC.split(",")
    # the figure's costs F=1, BW=2 (per rank), 8 ranks x 20 microbatches
    assert recs["interleaved-1f1b:chunks=4"]["makespan"] == 20 * 3 + 7 * 3 / 4
    assert recs["dualpipe"]["makespan"] == 66          # the DualPipe README figure
    assert [recs[k]["stages"] for k in recs] == [32, 16, 8]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_compare_figure_has_one_band_per_schedule_on_one_axis() -> None:
    from schedsim.plot import gantt_stack as draw

    res = compare_schedules(8, 20, schedules=SPEC, keep_timelines=True)
    tls = [r.timeline for r in res.rows]
    assert [t.schedule for t in tls] == SPEC.split(",")
    fig = draw(tls, memory=True)
    axes = fig.get_axes()
    assert len(axes) == 6                 # a chart and a memory panel per schedule
    span = max(t.makespan for t in tls)
    assert {ax.get_xlim() for ax in axes} == {(0.0, span)}


def test_global_flags_go_to_the_schedules_that_take_them() -> None:
    r = CliRunner().invoke(app, ["compare", "-p", "4", "-m", "8", "--cost", "F=1,BW=2",
                                 "--schedules", "1f1b,interleaved-1f1b", "--chunks", "2",
                                 "--comm-policy", "torch", "--semantics", "rendezvous",
                                 "-q"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == ["1f1b: makespan 33 slots, bubble ratio 0.273",
                                     "interleaved-1f1b: makespan 28.5 slots, bubble "
                                     "ratio 0.158"]


@pytest.mark.parametrize("args,says", [
    ([FIG, "--scenario", FIG], "give the scenario once"),
    ([FIG, "--memory"], "add --gantt"),
    ([FIG, "--gantt", "x.gif"], "unsupported figure format"),
    # per overlap mode there is no chart to draw (it was skipped silently, exit 0)
    (["schedules/dualpipe-moe-small.toml", "--model-overlap", "none,fb", "--gantt",
      "x.png"], "compare --model-overlap draws no chart: drop --gantt and --memory"),
])
def test_compare_refuses(args: list[str], says: str) -> None:
    r = CliRunner().invoke(app, ["compare", *args])
    assert r.exit_code == 2 and says in r.stderr, r.output


@pytest.mark.parametrize("ranks", [4, 8])
def test_table_footnote_counts_this_runs_chunks(ranks: int) -> None:
    # dualpipev on P ranks: 2P stages, the table's PP+1 = 2P+1 chunk activations, each
    # F x ranks/stages = 1/2 of a stage activation: the simulated peak
    cost = ["--cost", "F=1,B=1,W=1,BW=2,FB=3"]
    r = CliRunner().invoke(app, ["compare", "-p", ranks, "-m", 2 * ranks, *cost,
                                 "--schedules", "1f1b,dualpipev,dualpipe"],
                           terminal_width=400)
    assert r.exit_code == 0, r.output
    chunks = 2 * ranks + 1
    peak = max(compare_schedules(ranks, 2 * ranks, schedules=["dualpipev"]).rows[0]
               .peak_activation)
    assert peak == chunks / 2
    note = " ".join(x for x in r.output.splitlines() if x.startswith("table = "))
    assert note.endswith(f"for 2-chunk placements: dualpipev: PP+1 = {chunks} chunks = "
                         f"{chunks / 2:g} here)"), note
    # no 2-chunk row: no chunk count at all
    r = CliRunner().invoke(app, ["compare", "-p", ranks, "-m", 2 * ranks, *cost,
                                 "--schedules", "1f1b,zbv"], terminal_width=400)
    note = " ".join(x for x in r.output.splitlines() if x.startswith("table = "))
    assert r.exit_code == 0 and note and "chunks" not in note, r.output


@pytest.mark.parametrize("args, flag", [(["-p", "0", "-m", "8"], "'--ranks' / '-p'"),
                                        (["-p", "4", "-m", "-1"], "'--microbatches' / '-m'")])
def test_compare_refuses_a_size_below_one_naming_the_flag(args, flag):
    """``compare -p 0`` divided by zero in the sweep (a traceback, found by a new user):
    a size below 1 is one line naming the flag, exit 2."""
    r = CliRunner().invoke(app, ["compare", *args, "-q"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Invalid value for {flag}"), r.output
    assert "Traceback" not in r.output


def _refused(args: list[str]) -> str:
    """The one stderr line of a ``compare`` that exits 2 with nothing on stdout."""
    r = CliRunner().invoke(app, ["compare", *args])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    return r.stderr.strip()


def test_compare_where_no_schedule_ran_is_refused(tmp_path) -> None:
    """Every candidate skipped: exit 2 with the reason, no empty table, no output file
    (was: an empty table and exit 0)."""
    js, png = tmp_path / "c.json", tmp_path / "c.png"
    msg = _refused(["-p", "4", "-m", "2", "--schedules", "dualpipe", "--json", str(js),
                    "--gantt", str(png)])
    assert msg == ("error: no schedule ran at 4 ranks x 2 microbatches: dualpipe: dualpipe "
                   "needs an even number of microbatches >= 2 x ranks = 8 (got 2): half go "
                   "in each direction and each direction needs >= ranks to fill its "
                   "pipeline; give a size they accept or other --schedules")
    assert not js.exists() and not png.exists()
    for fmt in ("csv", "json"):
        assert _refused(["-p", "4", "-m", "2", "--schedules", "dualpipe", "--format",
                         fmt]).startswith("error: no schedule ran at 4 ranks")


def test_compare_of_many_skipped_schedules_names_them_and_the_first_reason() -> None:
    msg = _refused(["-p", "3", "-m", "2", "--schedules",
                    "dualpipe,dualpipev,gpipe:chunks=2,1f1b:chunks=2"])
    assert msg.startswith("error: no schedule ran at 3 ranks x 2 microbatches: all 4 were "
                          "skipped (dualpipe, dualpipev, gpipe:chunks=2, 1f1b:chunks=2); "
                          "the first, dualpipe: dualpipe needs an even number of ranks")


def test_compare_of_no_schedule_name_is_refused() -> None:
    assert _refused(["-p", "4", "-m", "2", "--schedules", ","]) == (
        "error: no schedule to compare: --schedules names none; give names from "
        "'schedsim list', e.g. --schedules 1f1b,zbv")


def test_compare_of_a_workload_or_overlap_modes_where_none_ran_is_refused() -> None:
    # (an unknown name is refused before anything runs, as plain compare refuses it)
    assert _refused(["schedules/llama3-70b-h100.toml", "--schedules", "nosuch"]).startswith(
        "error: unknown schedule 'nosuch': expected one of")
    assert _refused(["schedules/llama3-70b-h100.toml", "--schedules",
                     "interleaved-1f1b:chunks=3"]).startswith(
        "error: no schedule ran on this [workload]: interleaved-1f1b:chunks=3: ")
    assert _refused(["schedules/dualpipe-moe-small.toml", "--model-overlap", "none,fb",
                     "--schedules", "dualpipe", "-p", "3"]).startswith(
        "error: no schedule ran at 3 ranks x 8 microbatches: dualpipe: dualpipe needs an "
        "even number of ranks (got 3)")

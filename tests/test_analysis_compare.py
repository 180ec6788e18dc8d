"""`compare` reproduces DualPipe's README table by simulation, `diff` shows the Megatron
paper's 1F1B figure order against Megatron's code order."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIGURE_COSTS, SCHEDULES
from typer.testing import CliRunner

from schedsim import CostModel, build_program, simulate
from schedsim.analysis.diff import diff_timelines
from schedsim.cli import app
from schedsim.errors import ScheduleError
from schedsim.sweep import compare_schedules

FIG = CostModel(**FIGURE_COSTS)


def test_dualpipe_table_8_ranks_20_microbatches() -> None:
    want = ["1f1b", "zb-1p", "dualpipe", "dualpipev"]
    # the README table counts per op ("based on the same number of PP stages")
    res = compare_schedules(8, 20, FIG, schedules=want, per_rank_costs=False)
    assert not res.skipped
    rows = {r.schedule: r for r in res.rows}
    # idle per rank = the table's formulas, B meaning the full backward (our BW = 2):
    # 1F1B (PP-1)(F+B) = 21, ZB1P (PP-1)(F+B-2W) = 7, DualPipe (PP/2-1)(F&B+B-3W) = 6
    assert rows["1f1b"].idle == [21.0] * 8
    assert rows["zb-1p"].idle == [7.0] * 8
    assert rows["dualpipe"].idle == [6.0] * 8
    for n, v in (("1f1b", 21), ("zb-1p", 7), ("dualpipe", 6)):
        assert rows[n].formula["idle_value"] == v
    # activation PP, PP, PP+1 (busiest rank) and parameters 1x, 1x, 2x
    assert [max(rows[n].peak_activation) for n in ("1f1b", "zb-1p", "dualpipe")] == [8, 8, 9]
    assert [max(rows[n].param_memory) for n in ("1f1b", "zb-1p", "dualpipe")] == [1, 1, 2]
    # DualPipeV: 16 stages on 8 ranks; the simulator and the table (PP = 16) agree on 14
    v = rows["dualpipev"]
    assert v.stages == 16 and v.idle == [14.0] * 8 and v.formula["idle_value"] == 14
    assert v.formula["PP"] == 16 and v.formula["activation_value"] == 17
    assert max(v.peak_activation) == 8.5        # 17 chunk activations of half a stage


def test_compare_skips_what_the_constraints_reject() -> None:
    res = compare_schedules(3, 4, FIG, schedules=["1f1b", "dualpipe", "gpipe"])
    assert [r.schedule for r in res.rows] == ["1f1b", "gpipe"]
    assert "dualpipe" in res.skipped and "even" in res.skipped["dualpipe"]


def test_compare_cli(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["compare", "--ranks", "8", "--microbatches", "20",
                                 "--cost", "F=1,B=1,W=1,BW=2,FB=3", "--schedules",
                                 "1f1b,dualpipe,dualpipev", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert [x["schedule"] for x in d] == ["1f1b", "dualpipe", "dualpipev"]
    for x in d:
        assert {"schedule", "makespan", "idle", "bubble_ratio", "peak_activation",
                "param_memory"} <= set(x)
    assert d[1]["makespan"] == 66 and d[1]["idle"] == [6] * 8
    r = CliRunner().invoke(app, ["compare", "--ranks", "8", "--microbatches", "20",
                                 "--schedules", "nope", "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "unknown schedule 'nope'" in r.output
    assert not (tmp_path / "x.json").exists()


def test_per_rank_costs_scale_chunked_schedules() -> None:
    r = CliRunner().invoke(app, ["compare", "--ranks", "4", "--microbatches", "8",
                                 "--cost", "F=1,B=1,W=1", "--schedules", "dualpipev",
                                 "--per-rank-costs"])
    assert r.exit_code == 0, r.output
    res = compare_schedules(4, 8, CostModel(F=0.5, B=0.5, W=0.5), schedules=["dualpipev"],
                            per_rank_costs=False)
    assert f"{res.rows[0].makespan:g}" in r.stdout
    same = compare_schedules(4, 8, CostModel(F=1, B=1, W=1), schedules=["dualpipev"])
    assert same.rows[0].makespan == res.rows[0].makespan and same.rows[0].cost_scale == 0.5


@pytest.mark.parametrize("p,m", [(4, 8), (8, 20), (4, 4), (3, 10)])
def test_megatron_figure_vs_code_same_makespan(p: int, m: int) -> None:
    c = CostModel(F=1, BW=2)
    code = simulate(build_program("1f1b", p, m), c)
    fig = simulate(build_program("1f1b-megatron-figure", p, m), c)
    d = diff_timelines(code, fig)
    assert code.makespan == fig.makespan == (m + p - 1) * 3
    assert d.makespan_delta == 0
    # the forwards that move: on rank r every forward from F(p-r) on runs one position
    # earlier (before the backward it followed in the code's order)
    moved_f = sorted((o.rank, o.op) for o in d.moved() if "BW" not in o.op)
    want = sorted((r, f"{r}F{k}") for r in range(p) for k in range(p - r, m))
    assert moved_f == want
    assert all(o.pos_b == o.pos_a - 1 for o in d.moved() if "BW" not in o.op)


def test_diff_cli_megatron_figure(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    r = CliRunner().invoke(app, ["diff", str(SCHEDULES / "1f1b.toml"),
                                 str(SCHEDULES / "1f1b-megatron-figure.toml"),
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "delta 0" in r.stdout and "0F4@r0" in r.stdout
    d = json.loads(out.read_text())
    assert (d["makespan_a"], d["makespan_b"], d["makespan_delta"]) == (33, 33, 0)
    assert {(x["rank"], x["op"]) for x in d["moved"] if "BW" not in x["op"]} == \
        {(r, f"{r}F{k}") for r in range(4) for k in range(4 - r, 8)}


def test_diff_needs_the_same_ops() -> None:
    a = simulate(build_program("1f1b", 4, 8), CostModel(F=1, BW=2))
    b = simulate(build_program("1f1b", 4, 6), CostModel(F=1, BW=2))
    with pytest.raises(ScheduleError, match="cannot diff timelines of different ops: .*0F6 on rank 0"):
        diff_timelines(a, b)


def test_compare_notes_per_op_costs_when_stages_per_rank_differ(tmp_path: Path) -> None:
    """zbv (2 stages per rank) against dualpipe (1) under --per-op-costs: a V rank runs
    two full-cost ops per microbatch; the table says so and points to --per-rank-costs."""
    from schedsim.cli.compare import per_op_note

    out = tmp_path / "c.json"
    base = ["compare", "--ranks", "4", "--microbatches", "8", "--cost", "F=1,B=1,W=1",
            "--json", str(out)]
    r = CliRunner().invoke(app, base + ["--schedules", "1f1b,zbv,dualpipe",
                                        "--per-op-costs"])
    assert r.exit_code == 0, r.output
    note = per_op_note([("1f1b", 4), ("zbv", 8), ("dualpipe", 4)], 4)
    assert note == ("stages per rank differ (1 for 1f1b, dualpipe; 2 for zbv) and costs "
                    "are per op, so a rank runs each of its stages at the full op cost; "
                    "--per-rank-costs costs one rank's share of the model instead")
    flat = " ".join(r.stdout.split())
    assert "note: " + note in flat
    d = json.loads(out.read_text())
    assert [(x["schedule"], x["stages_per_rank"], x["per_rank_costs"], x["note"])
            for x in d] == [("1f1b", 1, False, note), ("zbv", 2, False, note),
                            ("dualpipe", 1, False, note)]
    r = CliRunner().invoke(app, base + ["--schedules", "1f1b,zbv,dualpipe",
                                        "--per-rank-costs"])
    assert r.exit_code == 0 and "note:" not in r.stdout
    assert {x["note"] for x in json.loads(out.read_text())} == {None}
    r = CliRunner().invoke(app, base + ["--schedules", "1f1b,dualpipe"])   # both 1
    assert r.exit_code == 0 and "note:" not in r.stdout
    assert per_op_note([("zbv", 8), ("dualpipev", 8)], 4) is None


def test_compare_defaults_to_equal_work_per_rank_and_says_so(tmp_path: Path) -> None:
    """Issue 15: by default a V schedule's ops cost half (two chunks per rank share one
    rank's model work), so zbv and dualpipev no longer look twice as slow as dualpipe;
    the header names the reading, --per-op-costs the other one."""
    out = tmp_path / "c.json"
    args = ["compare", "--ranks", "8", "--microbatches", "20", "--cost",
            "F=1,B=1,W=1,BW=2,FB=3", "--schedules", "dualpipe,dualpipev,zbv", "--json",
            str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    head = " ".join(r.stdout.split())
    assert head.startswith("costs F=1,B=1,W=1,BW=2,FB=3 read per rank: equal model work "
                           "per rank, so a schedule with S stages on P ranks runs each op "
                           "at P/S of them (--per-op-costs: every op at these costs) 8 "
                           "ranks x 20 microbatches, data semantics;")
    d = {x["schedule"]: x for x in json.loads(out.read_text())}
    assert {n: (x["cost_scale"], x["per_rank_costs"]) for n, x in d.items()} == {
        "dualpipe": (1, True), "dualpipev": (0.5, True), "zbv": (0.5, True)}
    # per rank: DualPipeV's table idle (PP/2-1)(F&B+B-3W) at half costs = 7, simulated 7
    assert d["dualpipe"]["makespan"] == 66 and d["dualpipev"]["idle"] == [7] * 8
    assert d["dualpipev"]["table_formula"]["idle_value"] == 7
    assert d["dualpipev"]["makespan"] < 2 * d["dualpipe"]["makespan"] / 1.5
    r = CliRunner().invoke(app, args + ["--per-op-costs"])
    assert r.exit_code == 0 and " ".join(r.stdout.split()).startswith(
        "costs F=1,B=1,W=1,BW=2,FB=3 read per op: every op at these costs")
    d2 = {x["schedule"]: x for x in json.loads(out.read_text())}
    assert d2["dualpipev"]["makespan"] == 2 * d["dualpipev"]["makespan"]
    assert d2["dualpipev"]["idle"] == [14] * 8 and d2["dualpipe"]["note"].startswith(
        "stages per rank differ (1 for dualpipe; 2 for dualpipev, zbv)")
    assert d2["dualpipe"] == {**d["dualpipe"], "per_rank_costs": False,
                              "note": d2["dualpipe"]["note"]}


def test_compare_in_worker_processes_gives_the_same_rows() -> None:
    want = ["1f1b", "dualpipe", "zbv", "interleaved-1f1b", "dualpipe-odd-size"]
    with pytest.raises(Exception, match="unknown schedule 'dualpipe-odd-size'"):
        compare_schedules(4, 8, FIG, schedules=want)
    one = compare_schedules(6, 8, FIG, schedules=want[:4])
    two = compare_schedules(6, 8, FIG, schedules=want[:4], jobs=2)
    assert one == two and [r.schedule for r in two.rows] == ["1f1b", "zbv",
                                                            "interleaved-1f1b"]
    assert "dualpipe" in two.skipped

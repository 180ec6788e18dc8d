"""``schedsim plan``: the planner's best is the exhaustive grid's best, its pruning is
sound (every bound holds on every simulated candidate), the ranking is the same on every
executor, sweeps resume, and bad input fails in one line.

The Llama 3.1 70B grid (64 H100, seq 8192, global batch 512) is kept small so that the
planner and the exhaustive run together take seconds: TP 4 and 8, PP 4 and 8, four
schedules (1f1b, interleaved-1f1b with 2 chunks, zbv, dualpipev), three recompute modes:
48 legal candidates.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.plan import PlanSpace
from schedsim.plan.candidates import enumerate_candidates
from schedsim.plan.driver import resolve, run_plan
from schedsim.plan.model import bounds_of, evaluate
from schedsim.plan.rows import GIB, rank, read_rows
from schedsim.util.units import fmt_rate

LLAMA70 = dict(model="llama3.1-70b", gpus=64, gpu="h100-sxm", seq=8192,
               global_batch_size=512, tp=[4, 8], pp=[4, 8],
               schedules=["1f1b", "interleaved-1f1b", "zbv", "dualpipev"],
               recompute=["none", "selective", "full"])
#: a small space for the executor and resume tests (seconds, not more)
SMALL = dict(model="llama3.1-8b", gpus=16, gpu="h100-sxm", seq=4096, global_batch_size=64,
             tp=[2, 4], pp=[2, 4], schedules=["1f1b", "zbv"], recompute=["none", "full"])


@pytest.fixture(scope="module")
def llama70():
    """(planner result, every legal candidate simulated without pruning, with bounds)."""
    space = PlanSpace(**LLAMA70)
    res = run_plan(space, top=3)
    r = resolve(space)
    exhaustive = []
    for lg in enumerate_candidates(r).legal:
        row = evaluate((lg.candidate, lg.workload, None, "data", {}, r.mem_limit_bytes))
        exhaustive.append((row, *bounds_of(lg, r), lg.cost_aware))
    return res, exhaustive


def test_planner_best_is_the_exhaustive_best(llama70):
    res, exhaustive = llama70
    best = rank([row for row, *_ in exhaustive])[0]
    assert res.ranking[0].to_dict() == best.to_dict()
    assert res.legal == len(exhaustive) == 48
    # the pruning removed at least 80% of the grid before any simulation
    assert res.pruned >= 0.8 * res.legal
    assert res.simulated == res.legal - res.pruned
    assert res.rejections.counts["memory"] + res.rejections.counts["bound"] == res.pruned


def test_bounds_hold_on_every_candidate(llama70):
    _, exhaustive = llama70
    aware = 0
    for row, peak_lb, ub, cost_aware in exhaustive:
        assert row.status == "ok"
        assert row.tokens_per_s_per_gpu <= ub
        assert all(lb / GIB <= p * (1 + 1e-12) for lb, p in zip(peak_lb, row.peak_gib))
        if not cost_aware:
            # exact: every op takes time, so the order alone fixes the peak
            assert [p / GIB for p in peak_lb] == pytest.approx(row.peak_gib, rel=1e-12)
        aware += cost_aware
    assert aware == 12          # zbv: its order depends on the costs, the bound is a floor


def test_rows_are_the_workload_figures(llama70):
    from schedsim.workload import simulate_workload

    res, _ = llama70
    top = res.ranking[0]
    c = top.candidate
    w = [lg.workload for lg in enumerate_candidates(res.resolved).legal
         if lg.candidate == c][0]
    ref = simulate_workload(w, c.schedule, semantics="data")
    assert top.step_ms == ref.step_ms
    assert top.tokens_per_s_per_gpu == ref.tokens_per_s_per_gpu
    assert top.peak_gib == [p / GIB for p in ref.peak_memory_bytes]


def _ranking(res):
    return [r.to_dict() for r in res.ranking]


def test_same_ranking_with_worker_processes():
    from schedsim.plan.executors import LocalExecutor

    one = run_plan(PlanSpace(**SMALL), top=3)
    with LocalExecutor(2) as ex:
        two = run_plan(PlanSpace(**SMALL), top=3, executor=ex)
    assert _ranking(one) == _ranking(two)
    assert one.rejections.counts == two.rejections.counts


def test_same_ranking_on_a_two_worker_dask_cluster():
    pytest.importorskip("distributed", reason="the 'cluster' extra (dask[distributed])")
    from schedsim.plan.executors import DaskExecutor

    local = run_plan(PlanSpace(**SMALL), top=3)
    with DaskExecutor(jobs=2) as ex:          # a local cluster, started and stopped here
        assert ex.workers == 2
        dask = run_plan(PlanSpace(**SMALL), top=3, executor=ex)
    assert _ranking(local) == _ranking(dask)
    assert local.rejections.counts == dask.rejections.counts
    assert ex._cluster is None and ex._client is None


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_resume_continues_an_interrupted_sweep(tmp_path, suffix):
    out = tmp_path / f"plan{suffix}"
    space = PlanSpace(**SMALL)
    full = run_plan(space, top=3, out=out)
    rows = read_rows(out, space.identity())
    assert len(rows) == full.simulated
    # cut the sweep after 3 rows, the third line half written (a kill)
    lines = out.read_text().splitlines(keepends=True)
    head = 1 if suffix == ".csv" else 0
    out.write_text("".join(lines[:head + 2]) + lines[head + 2][:20])
    again = run_plan(space, top=3, out=out, resume=True)
    assert again.resumed == 2 and again.simulated == full.simulated - 2
    assert _ranking(again) == _ranking(full)
    after = read_rows(out, space.identity())
    assert [r.to_dict() for r in after[:2]] == [r.to_dict() for r in rows[:2]]
    assert sorted(r.key for r in after) == sorted(r.key for r in rows)


def test_ctrl_c_keeps_what_is_done(tmp_path):
    out = tmp_path / "plan.jsonl"
    space = PlanSpace(**SMALL)
    seen = []

    def stop(done, total, phase):   # Ctrl-C after the first candidates finished
        if phase == "simulating":
            seen.append(done)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_plan(space, top=3, out=out, progress=stop)
    kept = read_rows(out, space.identity())
    assert len(kept) == seen[0] > 0
    again = run_plan(space, top=3, out=out, resume=True)
    assert again.resumed == seen[0]
    assert _ranking(again) == _ranking(run_plan(space, top=3))


def test_resume_refuses_another_sweep(tmp_path):
    out = tmp_path / "plan.jsonl"
    run_plan(PlanSpace(**SMALL), top=3, out=out)
    other = PlanSpace(**{**SMALL, "seq": 2048})
    with pytest.raises(Exception, match="another sweep .*seq"):
        run_plan(other, top=3, out=out, resume=True)


def test_cli_no_legal_layout_names_the_rule(tmp_path):
    out = tmp_path / "plan.jsonl"
    r = CliRunner().invoke(app, ["plan", "--model", "llama3.1-70b", "--gpus", "7", "--gpu",
                                 "h100-sxm", "--tp", "8", "--out", str(out)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "no legal layout" in lines[0]
    assert "'gpus % (tp x cp x pp)'" in lines[0]
    assert not out.exists()


def test_cli_nothing_fits_names_the_smallest_peak():
    args = ["plan", "--model", "llama3.1-405b", "--gpus", "8", "--gpu", "h100-sxm", "--seq",
            "4096", "--global-batch-size", "16", "--schedules", "1f1b", "-j", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    space = PlanSpace(model="llama3.1-405b", gpus=8, gpu="h100-sxm", seq=4096,
                      global_batch_size=16, schedules=["1f1b"])
    res = resolve(space)
    from schedsim.util.units import fmt_gib_pair

    peaks = [max(bounds_of(lg, res)[0]) for lg in enumerate_candidates(res).legal]
    peak, limit = fmt_gib_pair(min(peaks), res.mem_limit_bytes)
    assert (peak, limit) == ("853.2 GiB", "76 GiB")
    assert f"nothing fits in {limit}: the smallest peak found is {peak} (" \
        in " ".join(r.output.split())


def test_cli_prints_the_top_and_writes_the_figures(tmp_path):
    png, html = tmp_path / "pareto.png", tmp_path / "plan.html"
    r = CliRunner().invoke(app, [
        "plan", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq",
        "4096", "--global-batch-size", "64", "--tp", "2,4", "--pp", "2,4", "--schedules",
        "1f1b,zbv", "--recompute", "none,full", "--top", "2", "-j", "1", "--pareto",
        str(png), "--gantt", str(tmp_path / "best.png"), "--html", str(html)])
    assert r.exit_code == 0, r.output
    res = run_plan(PlanSpace(**SMALL), top=2)
    best = res.ranking[0]
    text = " ".join(r.output.split())
    from schedsim.util.units import with_unit

    assert f"microbatches: {fmt_rate(best.tokens_per_s_per_gpu)} tokens/s/GPU, step " \
           f"{with_unit(best.step_ms, 'ms')}," in text
    assert f"grid {res.grid} candidates: {res.legal} legal" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "best.png").exists()
    page = html.read_text()
    assert best.name in page and "throughput against peak memory" in page   # its human name


def test_api_returns_the_ranking():
    import schedsim

    rows = schedsim.plan(**SMALL, top=2)
    assert [r.to_dict() for r in rows] == _ranking(run_plan(PlanSpace(**SMALL), top=2))
    assert json.dumps(rows[0].to_dict())


@pytest.mark.parametrize("extra,message", [
    (["--tp", "4,x"], "bad --tp value 'x': expected a whole number"),
    (["--pp", "9..3"], "bad --pp range '9..3'"),
    (["--recompute", "some"], "unknown --recompute 'some'"),
    (["--schedules", "1f1c"], "unknown schedule '1f1c'"),
    (["--resume"], "--resume needs --out"),
    (["--out", "plan.txt"], "--out writes .jsonl (JSON lines) or .csv (CSV)"),
    (["--address", "tcp://h:8786"], "--address is for --executor dask"),
    (["--executor", "ray"], "unknown --executor 'ray'"),
])
def test_cli_bad_flags_fail_in_one_line(extra, message):
    r = CliRunner().invoke(app, ["plan", "--model", "llama3.1-8b", "--gpus", "8", "--gpu",
                                 "h100-sxm", *extra])
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and message in " ".join(r.output.split())


def test_dask_missing_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)      # import fails
    r = CliRunner().invoke(app, ["plan", "--model", "llama3.1-8b", "--gpus", "8", "--gpu",
                                 "h100-sxm", "--executor", "dask"])
    assert r.exit_code == 2
    line = " ".join(r.output.split())
    assert "--executor dask needs Dask distributed (the 'cluster' extra)" in line
    assert "[cluster]" in line


def test_cli_format_csv_and_json_write_the_top_table_to_stdout():
    """``--format csv|json`` (every command that prints a table): the top table and the
    removal counts as data on stdout, the summary lines on stderr."""
    import csv
    import io
    import json

    args = ["plan", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq",
            "4096", "--global-batch-size", "64", "--tp", "2,4", "--pp", "2,4", "--schedules",
            "1f1b,zbv", "--recompute", "none,full", "--top", "2", "-j", "1"]
    res = run_plan(PlanSpace(**SMALL), top=2)
    r = CliRunner().invoke(app, args + ["--format", "csv"])
    assert r.exit_code == 0, r.output
    first = r.stdout.split("\n\n")[0].splitlines()
    assert first[0] == "# table: candidates"
    rows = list(csv.reader(io.StringIO("\n".join(first[1:]))))
    assert rows[0][:3] == ["n", "layout", "schedule"] and len(rows) == 3
    assert float(rows[1][6]) == res.ranking[0].tokens_per_s_per_gpu      # exact, not as printed
    assert "best:" in r.stderr and "best:" not in r.stdout
    r = CliRunner().invoke(app, args + ["--format", "json"])
    assert r.exit_code == 0, r.output
    tables = json.loads(r.stdout)
    top = tables["candidates"]["rows"]
    assert tables["candidates"]["title"].startswith("top 2")
    assert [row["schedule"] for row in top] == [x.candidate.schedule for x in res.top(2)]
    assert [row["step_ms"] for row in top] == [x.step_ms for x in res.top(2)]


def test_cli_out_dash_streams_json_lines_to_stdout():
    """``--out -``: every simulated candidate a JSON line on stdout, the text on stderr;
    ``--resume`` with it is refused in one line (nothing to continue from)."""
    import json

    args = ["plan", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq",
            "4096", "--global-batch-size", "64", "--tp", "2,4", "--pp", "2,4", "--schedules",
            "1f1b,zbv", "--recompute", "none,full", "--top", "2", "-j", "1", "--out", "-"]
    res = run_plan(PlanSpace(**SMALL), top=2)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == res.simulated and all(x["sweep"]["model"] == "llama3.1-8b" for x in rows)
    assert max(x["tokens_per_s_per_gpu"] for x in rows if x["fits"]) == \
        res.ranking[0].tokens_per_s_per_gpu
    assert "best:" in r.stderr
    r = CliRunner().invoke(app, args + ["--resume"])
    assert r.exit_code == 2 and "--resume needs --out FILE" in r.output

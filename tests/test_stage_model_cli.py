"""The stage model through the command line and the pictures: simulate prints the derived
costs and the exposed collective time, the Gantt draws the pieces (--detail), the
Perfetto trace has a collective track, compare --model-overlap prints DualPipe's gain,
and none of it imports torch."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import ROOT, SCHEDULES
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.interop.perfetto import trace_events
from schedsim.plot import gantt
from schedsim.scenario import load_scenario
from schedsim.sim.pieces import attach_pieces, exposed_by_kind
from schedsim.sim.simulate import simulate
from schedsim.util.units import fmt_time

runner = CliRunner()
MOE = SCHEDULES / "dualpipe-moe.toml"


def test_simulate_prints_derived_costs_and_exposed_time():
    r = runner.invoke(app, ["simulate", str(MOE)], terminal_width=200)
    assert r.exit_code == 0, r.output
    sc = load_scenario(MOE)
    d = sc.stage_costs()
    assert "stage model: 4 layers/stage, tp 1, MoE ep 16 top-4" in r.output
    row = re.search(r"│ all\s+│ FB\s+│\s+(\S+) │\s+(\S+) │\s+(\S+) │\s+(\S+) │", r.output)
    assert row and row[1] == fmt_time(d.fb().cost) and row[4] == "0"
    m = re.search(r"per kind: .*FB 0 of (\S+) ms \(82 ops\)", r.output)
    assert m and m[1] == fmt_time(82 * d.fb().collective)


def test_typed_cost_shown_as_typed():
    r = runner.invoke(app, ["simulate", str(MOE), "--cost", "FB=30"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert re.search(r"│ FB\s+│.*│ typed: 30\s+│", r.output)
    assert re.search(r"│ F\s+│.*│ derived\s+│", r.output)


def test_timeline_pieces_lie_inside_their_spans():
    sc = load_scenario(MOE)
    tl = attach_pieces(simulate(sc.build_program(), sc.costs, sc.link, sc.comm),
                       sc.stage_costs())
    spans = {(s.rank, s.index): s for s in tl.spans}
    assert len({(p["rank"], p["index"]) for p in tl.pieces}) == len(tl.spans)
    for p in tl.pieces:
        s = spans[(p["rank"], p["index"])]
        assert s.start - 1e-9 <= p["start"] <= p["end"] <= s.end + 1e-9
    # FB spans: all of an overlapped pair's all-to-alls are hidden
    rows = exposed_by_kind(tl, sc.stage_costs())
    assert rows["FB"]["exposed"] == 0 and rows["FB"]["hidden"] > 0
    assert rows["F"]["exposed"] == rows["F"]["collective"] > 0
    trace = trace_events([tl])
    coll = [e for e in trace["traceEvents"] if e.get("cat") == "collective"]
    assert len(coll) == sum(p["stream"] == "collective" for p in tl.pieces)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"
             and e.get("tid") == 3}
    assert names == {"collectives"}


def test_gantt_detail_draws_the_pieces(tmp_path):
    sc = load_scenario(MOE)
    tl = attach_pieces(simulate(sc.build_program(), sc.costs, sc.link, sc.comm),
                       sc.stage_costs())
    fig = gantt(tl, detail=True)
    ax = fig.axes[0]
    gids = {c.get_gid(): c for c in ax.collections}
    n_coll = sum(p["stream"] == "collective" for p in tl.pieces)
    assert len(gids["detail-collectives"].get_paths()) == n_coll
    assert len(gids["detail-lane"].get_paths()) == len(tl.spans)
    assert "detail-exposed" in gids        # F and B wait for their all-to-alls
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "all-to-all" in labels and "compute waits for a collective (exposed)" in labels
    out = tmp_path / "g.png"
    r = runner.invoke(app, ["simulate", str(MOE), "-q", "--gantt", str(out), "--detail",
                            "--json", str(tmp_path / "t.json")])
    assert r.exit_code == 0 and out.stat().st_size > 10_000
    r = runner.invoke(app, ["render", str(tmp_path / "t.json"), "--detail", "-o",
                            str(tmp_path / "r.png")])
    assert r.exit_code == 0 and (tmp_path / "r.png").exists()


def test_detail_needs_a_model(tmp_path):
    r = runner.invoke(app, ["simulate", str(SCHEDULES / "1f1b.toml"), "--gantt",
                            str(tmp_path / "g.png"), "--detail"])
    assert r.exit_code == 2 and "add a [model] table" in r.output
    assert not (tmp_path / "g.png").exists()


def test_compare_model_overlap_prints_dualpipe_gain(tmp_path):
    """DualPipe 8x20 with the MoE stage model: FB with fb overlap < F + BW, and the
    makespan gain over overlap = none is printed."""
    out = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", "--scenario", str(MOE), "--ranks", "8",
                            "--microbatches", "20", "--schedules", "dualpipe,1f1b",
                            "--model-overlap", "none,fb", "--json", str(out)],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    recs = {(x["schedule"], x["overlap"]): x for x in json.loads(out.read_text())}
    fb, none = recs[("dualpipe", "fb")], recs[("dualpipe", "none")]
    assert fb["FB"] < fb["F"] + fb["BW"] == none["FB"]
    gain = none["makespan"] - fb["makespan"]
    assert gain > 0 and fb["gain_over_none"] == gain
    m = re.search(r"dualpipe: makespan (\S+) ms \(none\) -> (\S+) ms \(fb\): gain (\S+) "
                  r"ms \((\S+)%\)", r.output)
    assert m and m[3] == fmt_time(gain)
    assert recs[("1f1b", "fb")]["gain_over_none"] == 0     # 1F1B has no FB pairs
    r = runner.invoke(app, ["compare", "--ranks", "8", "--microbatches", "20",
                            "--model-overlap", "none,fb"])
    assert r.exit_code == 2 and "needs a scenario with a [model]" in r.output


def test_core_stays_torch_free():
    """Importing schedsim and simulating a scenario with a [model] (the CLI included)
    never imports torch."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from schedsim.cli import app\n"
        "import schedsim.sim.stage_model, schedsim.plot.detail, schedsim.sim.pieces\n"
        f"r = CliRunner().invoke(app, ['simulate', {str(MOE)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr

"""Memory and bubble metrics: DualPipe PP+1, 1F1B rank 0 holds p, and every zero-bubble
reference's peak memory, makespan and bubble rates under their model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIGURE_COSTS, REFS, SCHEDULES
from typer.testing import CliRunner

from schedsim import (
    CostModel,
    Op,
    Placement,
    Schedule,
    build_program,
    lower,
    simulate,
    validate_schedule,
)
from schedsim.analysis.memory import MemoryModel, param_memory, peak_activation
from schedsim.analysis.metrics import bubble_metrics
from schedsim.cli import app
from schedsim.errors import ScenarioError

FIG = CostModel(**FIGURE_COSTS)
INFLIGHT = MemoryModel.preset("inflight")


def test_dualpipe_peaks_at_pp_plus_one() -> None:
    tl = simulate(build_program("dualpipe", 8, 20), FIG)
    assert peak_activation(tl, INFLIGHT) == [9.0] * 8          # PP + 1, alloc-then-free
    assert peak_activation(tl) == [9.0] * 8                    # zb model too
    fta = MemoryModel.preset("inflight", fb_order="free-then-alloc")
    assert peak_activation(tl, fta) == [8, 8, 8, 9, 9, 8, 8, 8]
    assert param_memory(build_program("dualpipe", 8, 20).placement) == [2.0] * 8


@pytest.mark.parametrize("p", [4, 8])
def test_1f1b_rank0_holds_p(p: int) -> None:
    tl = simulate(build_program("1f1b", p, 2 * p + 3), CostModel(F=1, BW=2))
    assert peak_activation(tl) == [float(p - r) for r in range(p)]


def _ref_schedule(d: dict) -> Schedule:
    p, m = d["p"], d["m"]
    if d["chunks"] == 1:
        pl, st = Placement(kind="loop", ranks=p, stages=p), (lambda r, c: r)
    elif d["vshape"]:
        pl = Placement(kind="v", ranks=p, stages=2 * p)
        st = lambda r, c: r if c == 0 else 2 * p - 1 - r  # noqa: E731
    else:
        pl, st = Placement(kind="loop", ranks=p, stages=2 * p), (lambda r, c: c * p + r)
    rows = [[Op(o[0], st(r, o[2]), o[1]) for o in row] for r, row in enumerate(d["ranks"])]
    s = Schedule(name=d["scheduler"], placement=pl, microbatches=m, ranks=rows)
    validate_schedule(s)
    return s


def _zero_comm_ok(path: Path) -> bool:
    """A reference that ran and has no comm cost (the comparison below has none)."""
    d = json.loads(path.read_text())
    return d["status"] == "ok" and not d["costs"].get("comm", 0)


ZB_REFS = sorted(p for p in (REFS / "zb").glob("*.json") if _zero_comm_ok(p)) \
    if (REFS / "zb").exists() else []


@pytest.mark.parametrize("path", ZB_REFS, ids=[p.stem for p in ZB_REFS])
def test_zb_reference_memory_and_bubbles(path: Path) -> None:
    d = json.loads(path.read_text())
    c = d["costs"]
    tl = simulate(lower(_ref_schedule(d)), CostModel(F=c["F"], B=c["B"], W=c["W"]))
    mt = d["metrics"]
    assert peak_activation(tl) == mt["peak_activation_MB"]
    assert peak_activation(tl, INFLIGHT) == mt["peak_inflight_MB"]
    bm = bubble_metrics(tl)
    assert bm["makespan"] == mt["makespan"] and bm["span"] == mt["max_stage_span"]
    assert bm["span_bubble_rate"] == pytest.approx(mt["bubble_rate_paper"], abs=1e-8)
    assert bm["bubble_ratio"] == pytest.approx(mt["bubble_rate_makespan"], abs=1e-8)
    assert bm["idle"] == pytest.approx(mt["idle_in_makespan"])


def test_memory_model_from_spec() -> None:
    assert MemoryModel.from_spec(None) == MemoryModel()
    assert MemoryModel.from_spec("inflight") == INFLIGHT
    m = MemoryModel.from_spec({"model": "inflight", "fb_order": "free-then-alloc"})
    assert (m.W, m.B, m.fb_order) == (-1.0, 0.0, "free-then-alloc")
    assert MemoryModel.from_spec({"F": 2, "B": -1, "W": -1, "BW": -2}).F == 2
    with pytest.raises(ScenarioError, match="unknown key 'Q'"):
        MemoryModel.from_spec({"Q": 1})
    with pytest.raises(ScenarioError, match="fb_order"):
        MemoryModel.from_spec({"fb_order": "sideways"})
    with pytest.raises(ScenarioError, match="unknown memory model"):
        MemoryModel.from_spec("huge")


def test_memory_cli_reads_the_scenario_section(tmp_path: Path) -> None:
    sc = tmp_path / "s.toml"
    sc.write_text((SCHEDULES / "dualpipe-figure.toml").read_text()
                  + '\n[memory]\nmodel = "inflight"\nfb_order = "free-then-alloc"\n')
    out = tmp_path / "m.json"
    r = CliRunner().invoke(app, ["memory", str(sc), "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["peak_activation"] == [8, 8, 8, 9, 9, 8, 8, 8] and d["param_memory"] == [2] * 8
    c0 = d["curves"][0]
    assert c0[0] == [0, 0] and c0[-1][1] == 0 and max(v for _, v in c0) == 8
    assert all(a[0] <= b[0] for a, b in zip(c0, c0[1:]))
    r = CliRunner().invoke(app, ["memory", str(sc), "--fb-order", "alloc-then-free",
                                 "--json", str(out)])
    assert json.loads(out.read_text())["peak_activation"] == [9] * 8
    bad = tmp_path / "bad.toml"
    bad.write_text((SCHEDULES / "1f1b.toml").read_text() + "\n[memory]\nmodle = 'zb'\n")
    r = CliRunner().invoke(app, ["memory", str(bad)])
    assert r.exit_code == 2 and "unknown key 'modle'" in r.output


def test_simulate_summary_prints_both_bubble_metrics() -> None:
    r = CliRunner().invoke(app, ["simulate", "--schedule", "zb-h2", "-p", "4", "-m", "8",
                                 "--cost", "F=1,B=1,W=1"])
    assert r.exit_code == 0, r.output
    assert "bubble ratio 0.111" in r.stdout          # 12 idle of 4 x 27
    assert "span-based bubble rate 0.000" in r.stdout and "span 24" in r.stdout

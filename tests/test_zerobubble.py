"""Zero-bubble family (zb-h1, zb-h2, zb-1p, zb-2p, zbv, v-half, v-min) against the
references recorded from sail-sg/zero-bubble-pipeline-parallelism (../shared/refs/zb), the
paper's closed forms on (p, m) outside the refs, and the CLI rules."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import REFS
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, LinkModel, ScheduleError, generate, lower, simulate
from schedsim.analysis.memory import MemoryModel, peak_activation
from schedsim.analysis.metrics import bubble_rate_paper, stage_spans
from schedsim.cli import app
from schedsim.generators import get
from schedsim.generators.torch_family import zbv_torch
from schedsim.program.validate import validate_schedule
from schedsim.scenario import parse_scenario

ZB_REFS = REFS / "zb"
REF_FILES = sorted(p for p in ZB_REFS.rglob("*.json")
                   if json.loads(p.read_text()).get("schema") == "zb-ref/1") \
    if ZB_REFS.exists() else []

#: reference scheduler -> (our generator, fixed parameters)
GENERATOR_OF = {
    "1f1b": ("1f1b", {}),
    "1f1b-interleaved-v2": ("interleaved-1f1b", {"chunks": 2, "variant": "megatron"}),
    "zb-h1": ("zb-h1", {}), "zb-h2": ("zb-h2", {}),
    "zb-1p": ("zb-1p", {}), "zb-2p": ("zb-2p", {}), "zb-auto-nolimit": ("zb-2p", {}),
    "zbv": ("zbv", {}), "v-half": ("v-half", {}), "v-min": ("v-min", {}),
}
#: the references a schedsim generator reproduces (their ILP solutions have none)
REF_FILES = [p for p in REF_FILES
             if json.loads(p.read_text())["scheduler"].lower() in GENERATOR_OF]
DATA = CommModel(semantics="data")


def _ref_params(d: dict) -> tuple[str, dict, CostModel, LinkModel]:
    """Generator name, parameters and the cost/link models of a reference record."""
    sched = d["scheduler"].lower()
    name, params = GENERATOR_OF[sched]
    params = dict(params)
    c = d["costs"]
    costs, link = CostModel(F=c["F"], B=c["B"], W=c["W"]), LinkModel(latency=c["comm"])
    takes = get(name).accepted()
    if "costs" in takes:
        params.update(costs=costs, link=link)
    mm = d.get("memory_model") or {}
    if "mem_limit" in takes and mm.get("mem_f"):
        params["mem_deltas"] = (mm["mem_f"], mm["mem_b"], mm["mem_w"])
        units = (d.get("their") or {}).get("mem_limit_units")
        if sched == "zb-auto-nolimit":
            params["mem_limit"] = 3 * d["m"]     # their default: 3m microbatches, never binding
        elif units is not None:
            # their limit is in units of the F delta; for zbv of a chunk pass (M_B / 2)
            params["mem_limit"] = units / mm["mem_f"] / d.get("chunks", 1)
    return name, params, costs, link


def _order_strings(sched) -> list[str]:
    """Our order in the refs' compact notation (``F3`` / ``F3.1`` = mb 3, chunk 1)."""
    pl = sched.placement
    two = pl.stages > pl.ranks
    return [" ".join(f"{o.kind}{o.mb}" + (f".{pl.chunk_of(o.stage)}" if two else "")
                     for o in row) for row in sched.ranks]


@pytest.mark.skipif(not REF_FILES, reason="tests/data/refs/zb not found")
@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: p.stem)
def test_against_reference(path: Path) -> None:
    """Order equal to theirs, op by op; then under data semantics with the same costs
    every op's start/end, makespan, per-rank span, paper bubble rate and both peak
    memories equal the reference."""
    d = json.loads(path.read_text())
    name, params, costs, link = _ref_params(d)
    if d["status"] != "ok":
        with pytest.raises(ScheduleError):
            generate(name, d["p"], d["m"], **params)
        return
    sched = generate(name, d["p"], d["m"], **params)
    validate_schedule(sched)
    assert _order_strings(sched) == d["order_strings"]

    tl = simulate(lower(sched), costs, link, DATA)
    got = [[(s.kind, s.mb, s.chunk, s.start, s.end) for s in tl.spans_of(r)]
           for r in range(d["p"])]
    for g_row, w_row in zip(got, d["ranks"]):
        assert [x[:3] for x in g_row] == [tuple(x[:3]) for x in w_row]
        assert [t for x in g_row for t in x[3:]] == pytest.approx(
            [t for x in w_row for t in x[3:]], abs=1e-6)
    mt = d["metrics"]
    assert tl.makespan == pytest.approx(mt["makespan"], abs=1e-6)
    assert stage_spans(tl) == pytest.approx(mt["stage_span"], abs=1e-6)
    assert max(stage_spans(tl)) == pytest.approx(mt["max_stage_span"], abs=1e-6)
    assert bubble_rate_paper(tl) == pytest.approx(mt["bubble_rate_paper"], abs=1e-8)
    assert peak_activation(tl, MemoryModel.preset("zb")) == pytest.approx(
        mt["peak_activation_MB"])
    assert peak_activation(tl, MemoryModel.preset("inflight")) == pytest.approx(
        mt["peak_inflight_MB"])


# -- closed forms on (p, m) outside the refs ------------------------------------------
GRID = [(p, m) for p in (2, 3, 4, 6, 8) for m in sorted({p, p + 1, 2 * p, 2 * p + 1, 3 * p})]


def _span_bubble(name: str, p: int, m: int, F: float, B: float, W: float) -> float:
    costs = CostModel(F=F, B=B, W=W)
    tl = simulate(lower(generate(name, p, m)), costs, comm=DATA)
    return max(stage_spans(tl)) - m * (F + B + W)


@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("F,B,W", [(1, 1, 1), (1, 2, 1), (2, 3, 1)])
def test_zb_h1_closed_form(p: int, m: int, F: float, B: float, W: float) -> None:
    """ZB-H1 bubble (longest span - m(F+B+W)) = (p-1)(F+B-W) (paper Section 3)."""
    assert _span_bubble("zb-h1", p, m, F, B, W) == (p - 1) * (F + B - W)


@pytest.mark.parametrize("p,m", [(p, m) for p, m in GRID if m >= 2 * p])
@pytest.mark.parametrize("F,B,W", [(1, 1, 1), (2, 2, 2), (1, 2, 1), (2, 3, 1)])
def test_zb_h2_closed_form(p: int, m: int, F: float, B: float, W: float) -> None:
    """ZB-H2 bubble = (p-1)(F+B-2W); zero when F = B = W (paper Section 3)."""
    assert _span_bubble("zb-h2", p, m, F, B, W) == (p - 1) * (F + B - 2 * W)


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_zb_2p_zero_bubble_at_unit_costs(p: int) -> None:
    """ZB-2p reaches zero bubble with unit costs once m >= 2p; below that it cannot
    (there is not enough W to fill the warm-up), and ZB-1p keeps a bubble."""
    for m in range(2 * p, 3 * p + 1):
        tl = simulate(lower(generate("zb-2p", p, m)), comm=DATA)
        assert bubble_rate_paper(tl) == 0.0
        assert max(stage_spans(tl)) == 3 * m
    tl = simulate(lower(generate("zb-2p", p, p)), comm=DATA)
    assert bubble_rate_paper(tl) > 0
    tl = simulate(lower(generate("zb-1p", p, 3 * p)), comm=DATA)
    assert max(stage_spans(tl)) - 9 * p == p - 1     # = ZB-H1's (p-1)(F+B-W)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 7, 8, 9])
def test_v_schedules_memory(p: int) -> None:
    """Peak activation in microbatches (inflight model: F +1, W -1, a chunk pass counts
    1/2) equals the authors' table (Controllable Memory paper, Section 4; sail's project
    page): 1F1B and ZB-V p, V-Half (p+2)//2, V-Min (p+4)//3; under the zb model the
    order V-Min <= V-Half <= ZB-V holds."""
    inflight, zb = MemoryModel.preset("inflight"), MemoryModel.preset("zb")
    want = {"1f1b": p, "zbv": p, "v-half": (p + 2) // 2, "v-min": (p + 4) // 3}
    for m in (2 * p, 3 * p):
        tls = {n: simulate(lower(generate(n, p, m)), comm=DATA) for n in want}
        assert {n: max(peak_activation(tl, inflight)) for n, tl in tls.items()} == want
        peak = {n: max(peak_activation(tl, zb)) for n, tl in tls.items()}
        assert peak["v-min"] <= peak["v-half"] <= peak["zbv"] <= p


def test_heuristic_plans_what_the_engine_runs() -> None:
    """The planned longest span (their timing model) equals the simulated one, for costs
    and comm that are not in the refs."""
    for p, m, (F, B, W, c) in [(5, 13, (1.3, 2.1, 0.7, 0.3)), (6, 9, (2, 3, 1, 0.5)),
                               (3, 10, (1, 1, 1, 0.1))]:
        costs, link = CostModel(F=F, B=B, W=W), LinkModel(latency=c)
        for name in ("zb-1p", "zb-2p"):
            s = generate(name, p, m, costs=costs, link=link)
            tl = simulate(lower(s), costs, link, DATA)
            assert max(stage_spans(tl)) == pytest.approx(s.params["planned_span"], abs=1e-9)


def test_costs_change_the_order_and_scenarios_pass_them() -> None:
    """zb-2p plans with the scenario's costs: B=2 gives another order than unit costs,
    and a scenario (TOML or CLI flags) hands its [costs]/[link] to the generator."""
    unit = generate("zb-2p", 4, 8)
    slow_b = generate("zb-2p", 4, 8, costs=CostModel(F=1, B=2, W=1))
    assert _order_strings(unit) != _order_strings(slow_b)
    sc = parse_scenario({"schedule": {"name": "zb-2p", "ranks": 4, "microbatches": 8},
                         "costs": {"F": 1, "B": 2, "W": 1}})
    assert sc.build_program().schedule().ranks == slow_b.ranks
    sc = parse_scenario({"schedule": {"name": "zb-1p", "ranks": 4, "microbatches": 8,
                                      "mem_limit": 6}, "link": {"latency": 0.5}})
    assert sc.build_program().schedule().ranks == generate(
        "zb-1p", 4, 8, mem_limit=6, link=LinkModel(latency=0.5)).ranks


def test_mem_deltas_change_the_plan() -> None:
    """The paper's profiled memory model (mem_f = 34h+5as, mem_w = -32h; h=2304, a=24,
    s=1024) with its Table 9 costs gives ZB-2p another order than the 2,-1,-1 model, and
    the paper's Table 5 bubble rate 0.0433 (p=8, m=24)."""
    h, a, s = 2304, 24, 1024
    mf, mw = 34 * h + 5 * a * s, -32 * h
    costs, link = CostModel(F=18522, B=18086, W=9337), LinkModel(latency=601)
    paper = generate("zb-2p", 8, 24, costs=costs, link=link,
                     mem_deltas=f"{mf},{-mw - mf},{mw}")
    plain = generate("zb-2p", 8, 24, costs=costs, link=link)
    assert paper.ranks != plain.ranks
    tl = simulate(lower(paper), costs, link, DATA)
    assert round(bubble_rate_paper(tl), 4) == 0.0433


def test_zbv_torch_variant() -> None:
    """--variant torch is torch's ScheduleZBVZeroBubble order (part A's zbv_torch)."""
    s = generate("zbv", 4, 8, variant="torch")
    assert s.ranks == zbv_torch(4, 8).ranks
    assert s.placement.kind == "v"
    assert s.ranks != generate("zbv", 4, 8).ranks       # their cooldowns differ


# -- rules and the CLI ----------------------------------------------------------------
@pytest.mark.parametrize("name,p,m,params,needle", [
    ("zb-h1", 4, 3, {}, "zb-h1 needs microbatches >= ranks"),
    ("zb-h2", 4, 7, {}, "zb-h2 needs microbatches >= 2 x ranks"),
    ("zb-1p", 4, 8, {"mem_limit": 0.5}, "--mem-limit must be a finite number >= 1"),
    ("zb-2p", 4, 8, {"mem_limit": math.inf}, "--mem-limit must be a finite number >= 1"),
    ("zb-2p", 4, 8, {"mem_deltas": "2,-1"}, "mem_deltas must be three numbers"),
    ("zb-2p", 4, 8, {"mem_deltas": (2, -1, 0)}, "F + B + W = 0"),
    ("zb-1p", 4, 8, {"costs": "fast"}, "bad costs parameter"),
    ("zbv", 4, 8, {"mem_limit": 2}, "raise --mem-limit"),
    ("zbv", 4, 8, {"variant": "megatron"}, "unknown variant 'megatron'"),
    ("zbv", 4, 8, {"variant": "torch", "mem_limit": 4}, "apply only to the default"),
    ("v-half", 4, 8, {"chunks": 2}, "takes no parameter 'chunks'"),
])
def test_rules(name: str, p: int, m: int, params: dict, needle: str) -> None:
    with pytest.raises(ScheduleError, match=None) as e:
        generate(name, p, m, **params)
    assert needle in str(e.value)


runner = CliRunner()


def test_cli_list_shows_family_with_constraints() -> None:
    r = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert r.exit_code == 0
    # one table row (a block of lines) per schedule; the name is in its first line
    rows = {b.split("│")[1].strip(): b for b in r.stdout.split("├") if b.count("│") > 2}
    for name, rule, placement in [
            ("zb-h1", "microbatches >= ranks", "loop"), ("zb-h2", "microbatches >= 2 x ranks",
                                                         "loop"),
            ("zb-1p", "mem_limit >= 1", "loop"), ("zb-2p", "mem_limit >= 1", "loop"),
            ("zbv", "variant sail", "v (stages r and 2p-1-r)"),
            ("v-half", "ranks >= 1", "v (stages r and 2p-1-r)"),
            ("v-min", "ranks >= 1", "v (stages r and 2p-1-r)")]:
        assert rule in rows[name] and placement in rows[name], name


@pytest.mark.parametrize("args,needle", [
    (["-s", "zb-h2", "-p", "4", "-m", "6"], "zb-h2 needs microbatches >= 2 x ranks"),
    (["-s", "zb-1p", "-p", "4", "-m", "8", "--mem-limit", "0"], "--mem-limit must be"),
    (["-s", "zbv", "-p", "4", "-m", "8", "--variant", "x"], "unknown variant 'x'"),
])
def test_cli_errors_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["simulate", *args, "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error:") and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_cli_simulate_uses_costs_and_mem_limit(tmp_path: Path) -> None:
    """--cost reaches the planner; --mem-limit bounds the peak activation."""
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["simulate", "-s", "zb-1p", "-p", "4", "-m", "12", "--cost",
                            "F=1,B=2,W=1", "--mem-limit", "3", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    from schedsim.timeline import Timeline
    tl = Timeline.read_json(out)
    assert max(peak_activation(tl)) <= 3
    want = simulate(lower(generate("zb-1p", 4, 12, mem_limit=3,
                                   costs=CostModel(F=1, B=2, W=1))),
                    CostModel(F=1, B=2, W=1), comm=DATA)
    assert tl.makespan == want.makespan

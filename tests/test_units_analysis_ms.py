"""Every analysis line a person reads states its time unit on a workload (ms) scenario
(stalls, critical-path, query, lint, align, diff, simulate's extras, compare): the
numbers alone (``makespan 79639 = 79637 compute + 2.607 waiting``) do not say whether
they are slots, ms or us. A table states the unit once, in its title or a column header.

Each command runs once on a small [workload] scenario (llama3.1-8b, 4 stages, 16
microbatches); the expected figures are the run's own (its --json), printed by the rule
of ``schedsim/util/units.py``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner
from workload_scenarios import SMALL

from schedsim.cli import app
from schedsim.util.units import fmt_bubble, fmt_mfu, fmt_rate, with_unit

runner = CliRunner()


#: a time followed by its unit (``1170 ms``, ``0.3096 ms``)
MS = r"-?[\d.]+ ms"


def run(*args: object) -> str:
    r = runner.invoke(app, [str(a) for a in args], terminal_width=250)
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def scen(tmp_path_factory) -> tuple[Path, dict]:
    """The scenario and its Timeline JSON (``simulate --json``)."""
    d = tmp_path_factory.mktemp("ms")
    sc = d / "w.toml"
    sc.write_text(SMALL)
    run("simulate", sc, "-q", "--json", d / "t.json")
    return sc, json.loads((d / "t.json").read_text())


def _bubble(tl: dict) -> float:
    """idle / (ranks x makespan) of a Timeline JSON."""
    return sum(r["idle"] for r in tl["per_rank"]) / (tl["ranks"] * tl["makespan"])


def _line(out: str, start: str) -> str:
    return next(x for x in out.splitlines() if x.lstrip().startswith(start))


def test_stalls_headline_and_table_state_ms(scen) -> None:
    sc, tl = scen
    out = run("stalls", sc, "--limit", "2")
    head = out.splitlines()[0]
    total = with_unit(tl["ranks"] * tl["makespan"], "ms")
    assert re.fullmatch(rf"idle by cause \(all ranks\): wait-recv {MS}, cooldown {MS}, "
                        rf"warmup {MS} = {MS} of {total} \([\d.]+%\) in \d+ stalls; "
                        rf"longest: rank \d [\d.]+-{MS} wait-recv", head), head
    assert "stalls of 1f1b: 4 ranks x 16 microbatches, data semantics (ms)" in out


def test_critical_path_states_ms(scen) -> None:
    sc, tl = scen
    out = run("critical-path", sc, "--slack")
    head, route = out.splitlines()[:2]
    assert head.startswith("critical path of 1f1b: 4 ranks x 16 microbatches, data "
                           f"semantics: makespan {with_unit(tl['makespan'], 'ms')} = ")
    assert re.search(rf"= {MS} compute \+ {MS} waiting along \d+ ops", head), head
    assert route.startswith("route (ms): 0F0@r0 -> ")
    assert "critical path by runs of ops on one rank (ms; --all: every step)" in out
    assert "slack per op (ms)" in out


def test_query_states_ms(scen) -> None:
    sc, _ = scen
    out = run("query", sc, "--effect", "rank=0 BW mb=7", "--cause", "rank=3 F mb=7")
    head = out.splitlines()[0]
    assert re.fullmatch(rf"data: rank 3 3F7 \(instr \d+\) delays rank 0 0BW7 \(instr \d+\) "
                        rf"by {MS}: it starts at {MS}, at {MS} with the cause free; the "
                        rf"makespan moves by {MS} \([\d.]+ instead of {MS}\)\.", head), head
    assert "does rank 3 3F7" in out and "delay rank 0 0BW7" in out and "? (ms)" in out
    assert re.search(rf"  blocked on its inputs from [\d.]+ to {MS}: ", out)
    assert "  chain (ms): 3F7@r3 [" in out


def test_lint_align_diff_state_ms(scen) -> None:
    sc, tl = scen
    assert "lint of 1f1b (eager run; times in ms)" in run("lint", sc)
    assert ("send/recv alignment of 1f1b: 4 ranks x 16 microbatches, data semantics (ms)"
            in run("align", sc, "--limit", "1"))
    out = run("diff", sc, sc)
    mk = with_unit(tl["makespan"], "ms")
    assert "1f1b (B) against 1f1b (A) (ms)" in out
    assert _line(out, "makespan A") == f"makespan A {mk}, B {mk}, delta 0 ms"


def test_simulate_extras_state_ms_and_read_by_the_rules(scen) -> None:
    sc, tl = scen
    out = run("simulate", sc)
    w = tl["workload"]
    assert "1f1b: 4 ranks x 16 microbatches, data semantics (ms)" in out
    assert _line(out, "makespan ") == (f"makespan {with_unit(tl['makespan'], 'ms')}   bubble "
                                       f"ratio {fmt_bubble(_bubble(tl))} (idle / "
                                       f"(ranks x makespan))")
    span = _line(out, "span-based bubble rate")
    assert re.fullmatch(rf"span-based bubble rate 0\.\d{{3}} \(zero-bubble paper: \(span - "
                        rf"busy\) / span, span {MS}\)", span), span
    exposed = _line(out, "exposed collective time")
    assert re.fullmatch(rf"exposed collective time over the run, per kind: BW [\d.]+ of {MS} "
                        rf"\(\d+ ops\); F [\d.]+ of {MS} \(\d+ ops\)", exposed), exposed
    step = _line(out, "step ")
    assert step.startswith(f"step {with_unit(w['step_ms'], 'ms')}, "
                           f"{fmt_rate(w['tokens_per_s_per_gpu'])} tokens/s/GPU, MFU "
                           f"{fmt_mfu(w['mfu'])}, peak ")
    assert "," in fmt_rate(w["tokens_per_s_per_gpu"])      # 6,874: a thousands separator


def test_compare_reads_rate_mfu_bubble_as_simulate(scen) -> None:
    """compare (a workload) prints tokens/s, MFU and the bubble as simulate does."""
    sc, tl = scen
    out = run("compare", sc, "--schedules", "1f1b")
    w = tl["workload"]
    row = _line(out, "│ 1f1b")
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[3:6] == [fmt_rate(w["tokens_per_s_per_gpu"]), fmt_mfu(w["mfu"]),
                          fmt_bubble(_bubble(tl))]


def test_plan_rule_examples_read_correctly() -> None:
    """The torchtitan split rule says how many layers there are and how many stages fit
    (was: "leaves 0 effective layers a stage, fewer than those; use fewer stages")."""
    from schedsim.workload.layout import WorkloadError, torchtitan_llm_split

    with pytest.raises(WorkloadError) as e:
        torchtitan_llm_split(80, 128)
    assert str(e.value).endswith(
        "128 stages for 80 layers: torchtitan's split counts the embedding and the norm + "
        "head as 1 + 1 more layers, 82 in all: fewer than one a stage; use at most 82 "
        "stages (pp x chunks)")
    with pytest.raises(WorkloadError) as e:
        torchtitan_llm_split(4, 4, 3, 1)
    assert str(e.value).endswith(
        "8 in all: 2 a stage, fewer than the 3 the embedding or the norm + head takes; use "
        "at most 2 stages (pp x chunks)")
    assert torchtitan_llm_split(80, 82)[0] == 0 and len(torchtitan_llm_split(80, 82)) == 82

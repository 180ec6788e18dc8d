"""One name for a plan candidate in every human output (schedsim/plan/names.py): the
table's layout + schedule + recompute, the ``best:`` line, the ``--html`` page, the
Pareto labels and the rule examples; ``--out`` keeps the full key and carries the name."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.plan.names import candidate_name, layout_name
from schedsim.plan.pareto import _short
from schedsim.plan.space import Candidate

ARGS = ["plan", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq",
        "4096", "--global-batch-size", "64", "--tp", "2,4", "--pp", "2,4", "--schedules",
        "1f1b,zbv", "--recompute", "none,full", "--top", "3", "-j", "1"]


def test_names() -> None:
    c = Candidate(tp=8, pp=2, dp=4, ep=1, cp=1, micro_batch_size=1, schedule="zbv",
                  chunks=None, recompute="none", zero=1)
    assert c.key == "tp8 pp2 dp4 ep1 cp1 mbs1 zbv recompute=none zero1"
    assert layout_name(c, 4) == "tp8 pp2x2 dp4 z1"
    assert candidate_name(c, 4) == "tp8 pp2x2 dp4 z1 zbv recompute none"
    assert layout_name(c) == "tp8 pp2 dp4 z1"       # stages not known, no chunks asked


def test_every_human_output_names_the_best_alike(tmp_path: Path) -> None:
    out, html = tmp_path / "o.jsonl", tmp_path / "p.html"
    r = CliRunner().invoke(app, [*ARGS, "--out", str(out), "--html", str(html)])
    assert r.exit_code == 0, r.output
    doc = json.loads(CliRunner().invoke(app, [*ARGS, "--format", "json"]).stdout)
    top = doc["candidates"]["rows"][0]
    name = f"{top['layout']} {top['schedule']} recompute {top['recompute']}"
    assert name == "tp2 pp2x2 dp4 z1 zbv recompute none"
    best = next(ln for ln in r.stdout.splitlines() if ln.startswith("best:"))
    assert best.startswith(f"best: {name}, ")
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    mine = next(x for x in rows if x["name"] == name)
    assert mine["key"] == "tp2 pp2 dp4 ep1 cp1 mbs1 zbv recompute=none zero1"   # kept
    assert all(x["key"] != x["name"] for x in rows)
    import html as _html

    page = _html.unescape(html.read_text())     # (bokeh embeds the text escaped)
    assert f"best: {name}</h2>" in page and f"<td>{name}</td>" in page
    assert "recompute=none zero1" not in page
    ex = doc["removed"]["rows"][0]["example"]       # a rule's example: the name too
    assert ex.split(":")[0] in {x["name"] for x in rows} or "recompute " in ex
    assert "zero1" not in ex


def test_pareto_labels_are_the_name() -> None:
    from schedsim.plan.rows import PlanRow

    c = Candidate(tp=8, pp=2, dp=4, ep=1, cp=1, micro_batch_size=1, schedule="zbv",
                  chunks=None, recompute="none", zero=1)
    assert _short(PlanRow(candidate=c, stages=4)) == "tp8 pp2x2 dp4 z1 zbv recompute none"

"""The HTML report (``schedsim report --html``): what the page carries, that it is
self-contained, its size, and the command's errors."""
from __future__ import annotations

import importlib.util
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import SCHEDULES
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis.stalls import attribute_stalls
from schedsim.cli import app

runner = CliRunner()
FIG = CostModel(F=1, B=1, W=1, BW=2, FB=3)


class _Resources(HTMLParser):
    """Every src/href attribute of a real tag (not text inside inline scripts)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]


def external_refs(page: str) -> list[str]:
    p = _Resources()
    p.feed(page)
    return [r for r in p.refs if r.startswith(("http:", "https:", "//"))]


def dualpipe(semantics="rendezvous"):
    prog = build_program("dualpipe", 8, 20)
    return prog, simulate(prog, FIG, LinkModel(), CommModel(semantics=semantics))


def test_layout_carries_every_op_with_its_hover_fields():
    from bokeh.models import DataTable, HoverTool

    from schedsim.report.html import build_layout

    prog, tl = dualpipe()
    stalls = attribute_stalls(tl, prog)
    layout = build_layout(tl, stalls=stalls)
    doc_models = list(layout.references())
    hovers = [m for m in doc_models if isinstance(m, HoverTool)]
    fields = {name for h in hovers for name, _ in h.tooltips}
    assert {"rank", "op", "microbatch", "stage", "start", "end", "stall before it"} <= fields
    # the ops source: one box per span, FB spans as two halves
    src = [h.renderers[0].data_source for h in hovers
           if any(n == "op" for n, _ in h.tooltips)][0]
    n_fb = sum(1 for s in tl.spans if s.parts)
    assert len(src.data["op"]) == len(tl.spans) + n_fb
    # rank 5's W of mb 0 starts at 12 after a 1-slot wait-batch (the T10/T12 case)
    i = next(k for k, (r, op) in enumerate(zip(src.data["rank"], src.data["op"]))
             if r == 5 and op == "5W0")
    assert src.data["start"][i] == 12
    assert src.data["stall"][i].startswith("wait-batch for 1:")
    # the stalls table holds every stall
    table = [m for m in doc_models if isinstance(m, DataTable)][0]
    assert len(table.source.data["cause"]) == sum(1 for s in stalls if s.end > s.start)


def test_dualpipe_report_is_self_contained_and_small(tmp_path):
    out = tmp_path / "dp.html"
    r = runner.invoke(app, ["report", str(SCHEDULES / "dualpipe-figure.toml"), "--html",
                            str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert out.stat().st_size < 5_000_000
    assert external_refs(page) == []
    assert "<script" in page and "Bokeh" in page
    assert "makespan 66 slots" in page
    assert f"wrote {out}" in " ".join(r.output.split())


def test_report_errors_exit_2_and_write_nothing(tmp_path, monkeypatch):
    r = runner.invoke(app, ["report", "-s", "1f1b", "-p", "4", "-m", "8", "--html",
                            str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "use a .html name" in r.output
    # bokeh missing: the install hint, no file
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bokeh" else real(name, *a))
    r = runner.invoke(app, ["report", "-s", "1f1b", "-p", "4", "-m", "8", "--html",
                            str(tmp_path / "x.html")])
    assert r.exit_code == 2 and "needs bokeh" in r.output
    assert "pip install -e" in r.output and "pip install bokeh" in r.output
    assert list(tmp_path.iterdir()) == []


def test_deadlocked_report_is_written_and_exits_3(tmp_path):
    out = tmp_path / "d.html"
    r = runner.invoke(app, ["report", "-s", "1f1b", "-p", "4", "-m", "8", "--comm-stream",
                            "per-peer", "--semantics", "rendezvous", "--html", str(out)])
    assert r.exit_code == 3
    assert "fix: --comm-policy torch completes" in r.output
    assert out.exists() and "deadlock" in out.read_text()


@pytest.mark.parametrize("ranks,mb", [(4, 8), (32, 64)])
def test_report_at_several_sizes(tmp_path, ranks, mb):
    from schedsim.report.html import report_html

    prog = build_program("interleaved-1f1b", ranks, mb, chunks=2)
    tl = simulate(prog, CostModel(F=1, BW=2), LinkModel(), CommModel(semantics="rendezvous"))
    page = report_html(tl, stalls=attribute_stalls(tl, prog))
    assert external_refs(page) == [] and len(page) < 8_000_000
    Path(tmp_path / "r.html").write_text(page)


def test_report_of_a_timeline_json_equals_the_scenario_report(tmp_path, monkeypatch):
    """``report T.json``: the run as it is, with the same stalls (hence the same table
    and hover text) as the report of the scenario it came from; a flag that would
    change the run is refused (exit 2, no file)."""
    import schedsim.report.html as html

    seen: list[tuple] = []
    real = html.report_html

    def spy(tl, **kw):
        seen.append((tl, kw))
        return real(tl, **kw)

    monkeypatch.setattr(html, "report_html", spy)
    fig = str(SCHEDULES / "dualpipe-issue-t10-t12.toml")
    tl_json = tmp_path / "t.json"
    r = runner.invoke(app, ["simulate", fig, "--semantics", "rendezvous", "--json",
                            str(tl_json), "-q"])
    assert r.exit_code == 0, r.output
    for src, out in ((fig, "a.html"), (str(tl_json), "b.html")):
        args = [src, "--html", str(tmp_path / out)]
        if src == fig:
            args[1:1] = ["--semantics", "rendezvous"]
        r = runner.invoke(app, ["report", *args])
        assert r.exit_code == 0, r.output
        assert "makespan 66 slots" in (tmp_path / out).read_text()
    (ta, ka), (tb, kb) = seen
    assert (ta.makespan, ta.semantics) == (tb.makespan, tb.semantics) == (66, "rendezvous")
    assert ka["stalls"] == kb["stalls"] and len(ka["stalls"]) > 0
    w = [s for s in kb["stalls"] if s.rank == 5 and s.end == 12]
    assert w and w[0].cause == "wait-batch"          # the T10/T12 wait, named the same
    bad = tmp_path / "c.html"
    r = runner.invoke(app, ["report", str(tl_json), "--cost", "F=2", "--html", str(bad)])
    assert r.exit_code == 2 and "--cost cannot apply" in r.output
    assert not bad.exists()

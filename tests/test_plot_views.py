"""Pictures (issue 27): chunks keep their kind's hue (3+ chunks hatched, a legend entry
per kind and chunk), FB half-rows of an overlay keep their microbatch numbers, a
deadlocked chart marks where each rank is stuck, time windows and rank subsets (also on
the command line), and the HTML report takes the window's width."""
from __future__ import annotations

import colorsys

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, build_program, load_scenario, simulate
from schedsim.cli import app
from schedsim.plot import gantt, overlay
from schedsim.plot.boxes import span_boxes
from schedsim.plot.style import KIND_COLORS, shade


def _hue(rgb) -> float:
    return colorsys.rgb_to_hls(*rgb)[0]


def _gids(fig, prefix: str) -> dict:
    return {c.get_gid(): c for ax in fig.axes for c in ax.collections
            if (c.get_gid() or "").startswith(prefix)}


def test_chunks_keep_their_kinds_hue_and_are_hatched() -> None:
    tl = simulate(build_program("interleaved-1f1b", 4, 8, chunks=4), CostModel(F=1, BW=2))
    for c in range(4):      # every chunk of a kind keeps the kind's hue
        for k in ("F", "BW"):
            assert abs(_hue(shade(KIND_COLORS[k], c, 4)) - _hue(to_rgb(KIND_COLORS[k]))) < 1e-9
    # the lightest F and the lightest BW stay apart in hue (they were both lavender)
    assert abs(_hue(shade(KIND_COLORS["F"], 3, 4)) - _hue(shade(KIND_COLORS["BW"], 3, 4))) \
        > 0.05
    fig = gantt(tl)
    hatched = _gids(fig, "chunk-")
    bx = span_boxes(tl)
    assert sorted(hatched) == ["chunk-1", "chunk-2", "chunk-3"]
    for c in (1, 2, 3):
        assert len(hatched[f"chunk-{c}"].get_paths()) == int((bx.chunk == c).sum())
    assert len({hatched[g].get_hatch() for g in hatched}) == 3
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "F (forward), chunk 0" in labels and "BW chunk 3" in labels
    assert "F (forward)" not in labels          # the per-chunk entries replace it


def test_two_chunks_are_unchanged() -> None:
    tl = simulate(build_program("interleaved-1f1b", 4, 8, chunks=2), CostModel(F=1, BW=2))
    fig = gantt(tl)
    assert _gids(fig, "chunk-") == {}
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "chunk 0" in labels and "chunk 1" in labels and "F (forward)" in labels


def test_overlay_fb_half_rows_keep_their_microbatch_numbers() -> None:
    sc = load_scenario("schedules/dualpipe-figure.toml")
    a = simulate(sc.build_program(), sc.costs, sc.link, sc.comm)
    b = simulate(sc.build_program(), sc.costs, sc.link,
                 sc.comm.model_copy(update={"semantics": "rendezvous"}))
    fig = overlay(a, b)
    got = sorted(t.get_text() for ax in fig.axes for t in ax.texts
                 if t.get_gid() == "fb-label")
    want = sorted(f"{s.parts[0].mb}/{s.parts[1].mb}" for tl in (a, b) for s in tl.spans
                  if s.parts)
    assert got == want and len(got) == 2 * sum(1 for s in a.spans if s.parts)


def test_deadlocked_chart_marks_where_each_rank_is_stuck() -> None:
    prog = build_program("1f1b", 4, 8)
    tl = simulate(prog, CostModel(F=1, BW=2), comm=CommModel(semantics="rendezvous",
                                                             comm_stream="per-peer"),
                  raise_on_deadlock=False)
    fig = gantt(tl)
    ax = fig.axes[0]
    bars = [ln for ln in ax.lines if ln.get_gid() == "deadlock"]
    texts = sorted(t.get_text().strip() for t in ax.texts if t.get_gid() == "deadlock-label")
    assert sorted(float(ln.get_xdata()[0]) for ln in bars) == sorted(
        b.since for b in tl.deadlock.blocked)
    assert texts == sorted(f"stuck at {b.instruction} (instr {b.index})"
                           for b in tl.deadlock.blocked)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "deadlock: where the rank is stuck" in labels
    # the chart runs on past the stuck ranks, so each label sits right of its bar, off
    # the ops (the bar at the rank's last op end)
    stuck = [t for t in ax.texts if t.get_gid() == "deadlock-label"]
    assert ax.get_xlim()[1] > tl.makespan
    assert all(t.get_horizontalalignment() == "left" for t in stuck)
    fig.canvas.draw()
    right = ax.transData.transform((ax.get_xlim()[1], 0))[0]
    assert all(t.get_window_extent().x1 <= right + 1 for t in stuck)


def test_time_window_and_rank_subset() -> None:
    tl = simulate(build_program("zb-h1", 64, 128), CostModel(F=1, B=1, W=1))
    shown = [0, 1, 62, 63]
    fig = gantt(tl, window=(50, 120), ranks=shown)
    ax = fig.axes[0]
    assert ax.get_xlim() == (50.0, 120.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in shown]
    bx = span_boxes(tl)
    want = np.isin(bx.rank, shown) & (bx.x1 >= 50) & (bx.x0 <= 120)
    ops = _gids(fig, "ops")["ops"]
    assert len(ops.get_paths()) == int(want.sum())
    assert "time 50 to 120 — ranks 0, 1, 62, 63" in ax.get_title().replace("\n", " ")
    from schedsim.errors import ScenarioError

    for kw in ({"ranks": [64]}, {"ranks": [1, 1]}, {"window": (30, 20)},
               {"ranks": [0], "arrows": True}):
        with pytest.raises(ScenarioError):
            gantt(tl, **kw)


@pytest.mark.parametrize("flags,says", [
    (["--window", "10:30"], "add --gantt"),
    (["--gantt", "g.png", "--window", "ten"], "bad --window"),
    (["--gantt", "g.png", "--show-ranks", "0-x"], "bad --show-ranks"),
    (["--gantt", "g.png", "--highlight", "B:5:4"], "bad --highlight"),
    (["--gantt", "g.png", "--show-ranks", "9"], "ranks [9]"),
    # a reversed range was empty: "ranks []: give distinct ranks"
    (["--gantt", "g.png", "--show-ranks", "0,3-1"],
     "error: bad --show-ranks '0,3-1': the range 3-1 is reversed (a range goes from low "
     "to high): write 1-3"),
])
def test_view_flags_are_checked(flags, says, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "4", "-m", "8", *flags])
    assert r.exit_code == 2 and says in r.stderr, r.output
    assert not (tmp_path / "g.png").exists()


def test_highlight_of_a_message_the_timeline_lacks_is_refused(tmp_path,
                                                               monkeypatch) -> None:
    """1F1B on 4 ranks x 8 microbatches has mb 0..7: B:3:2:9 would draw nothing; one
    line naming it and the nearest messages, exit 2, no file written (was: a chart with
    no highlight, exit 0)."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--gantt",
                                 "g.png", "--json", "t.json", "--highlight", "B:3:2:7",
                                 "--highlight", "b:3:2:9", "-q"])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.strip() == (
        "error: highlight B:3:2:9: the timeline has no B message of mb 9 from rank 3 to 2 "
        "(KIND:SRC:DST:MB); the nearest it has: B:3:2:7, B:3:2:6, B:2:1:7")
    assert not (tmp_path / "g.png").exists() and not (tmp_path / "t.json").exists()
    from schedsim.errors import ScenarioError

    tl = simulate(build_program("1f1b", 2, 2), CostModel(F=1, B=2))
    with pytest.raises(ScenarioError, match=r"highlight F:1:0:0: .* the nearest it has: "
                                            r"B:1:0:0, B:1:0:1, F:0:1:0$"):
        gantt(tl, highlight=[("F", 1, 0, 0)])
    tl.messages = []
    with pytest.raises(ScenarioError, match="the timeline has no messages"):
        gantt(tl, highlight=[("F", 0, 1, 0)])


def test_view_flags_draw(tmp_path) -> None:
    out = tmp_path / "g.png"
    r = CliRunner().invoke(app, ["simulate", "schedules/dualpipe-figure.toml", "--gantt",
                                 str(out), "--window", "10:30", "--show-ranks", "4-5",
                                 "-q"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_report_takes_the_window_width_and_wraps_stall_details() -> None:
    pytest.importorskip("bokeh")
    from bokeh.models import DataTable

    from schedsim.analysis import attribute_stalls
    from schedsim.report.html import build_layout

    prog = build_program("1f1b", 4, 8)
    tl = simulate(prog, CostModel(F=1, BW=2), comm=CommModel(semantics="eager"))
    lay = build_layout(tl, stalls=attribute_stalls(tl, prog))
    assert lay.sizing_mode == "stretch_width"
    assert all(c.sizing_mode == "stretch_width" for c in lay.children
               if hasattr(c, "sizing_mode") and c.sizing_mode is not None)
    (table,) = [c for c in lay.children if isinstance(c, DataTable)]
    assert any("white-space: normal" in s.css for s in table.stylesheets)
    fixed = build_layout(tl, width=900)
    assert fixed.children[0].width == 900

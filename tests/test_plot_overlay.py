"""Overlay, compare and memory figures, and the `render` command / simulate's figure flags."""
from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import SCHEDULES
from PIL import Image
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis.memory import peak_activation
from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.plot import compare, gantt_stack, memory_plot, op_start_errors, overlay
from schedsim.timeline import Timeline

FIG = CostModel(F=1, B=1, W=1, BW=2, FB=3)
runner = CliRunner()


def sim(name, ranks=4, mb=8, costs=FIG, semantics="data", **params):
    return simulate(build_program(name, ranks, mb, **params), costs, LinkModel(),
                    CommModel(semantics=semantics))


def png(fig, drawn: float = 0.1) -> np.ndarray:
    """Render without warnings; at least ``drawn`` of the pixels are not white (line
    plots are sparse: pass less)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.savefig(buf, format="png")
    px = np.asarray(Image.open(buf))[..., :3].astype(float)
    assert px.std() > 20 and drawn < (px.min(axis=2) < 235).mean() < 0.97
    return px


def shifted(tl: Timeline, rank: int, index: int, by: float) -> Timeline:
    """A copy of ``tl`` whose ``index``-th span of ``rank`` starts ``by`` later."""
    d = tl.model_dump()
    spans = [s for s in d["spans"] if s["rank"] == rank]
    spans.sort(key=lambda s: s["start"])
    spans[index]["start"] += by
    spans[index]["end"] += by
    d["makespan"] = max(s["end"] for s in d["spans"])
    return Timeline.model_validate(d)


def test_op_start_errors_exact():
    a = sim("1f1b", 4, 8, CostModel(F=1, BW=2))
    b = shifted(a, 0, 15, 2.0)          # the last op of rank 0, 2 slots later
    errs = op_start_errors(a, b)
    assert len(errs) == len(a.spans)
    moved = [e for e in errs if e.delta != 0]
    assert [(e.rank, e.kind, e.mb, e.delta) for e in moved] == [(0, "BW", 7, 2.0)]
    fig = overlay(a, b, names=["predicted", "measured"])
    title = fig.axes[0].get_title()
    # error of the first (predicted) against the second (measured): (33 - 35) / 35
    assert "makespan predicted 33 vs measured 35 slots: error -2 slots, -5.7% of measured" \
        in title
    # mean |error| = 2 / 64 ops (4 significant digits, fmt_time), as % of the measured
    # makespan: 100 * 2 / 64 / 35
    assert "mean |predicted - measured| 0.03125 slots, 0.1% of measured makespan" in title
    assert "max -2 (0BW7 on rank 0); 1/64 ops moved" in title
    png(fig)
    # the moved op is outlined in red in both half-rows, every other one is not
    for gid, tl in (("ops-upper", a), ("ops", b)):
        ops = [c for c in fig.axes[0].collections if c.get_gid() == gid][0]
        red = [e for e in ops.get_edgecolors() if np.allclose(e[:3], (214 / 255, 39 / 255,
                                                                       40 / 255))]
        assert len(red) == 1
        assert len(ops.get_paths()) == len(tl.spans)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "upper half-row: predicted" in legend and "lower half-row: measured" in legend
    assert "start moved (by any amount): 1 ops" in legend


def test_overlay_threshold_is_stated_and_applied():
    """Ops whose start moved by at most the threshold are not outlined; the legend gives
    the threshold in the unit and as % of the reference makespan."""
    a = sim("1f1b", 4, 8, CostModel(F=1, BW=2))
    b = shifted(shifted(a, 0, 15, 2.0), 1, 15, 0.5)
    fig = overlay(a, b, names=["predicted", "measured"], threshold=1.0)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "start moved > 1 slot = 2.86% of measured makespan: 1 ops" in legend
    ops = [c for c in fig.axes[0].collections if c.get_gid() == "ops"][0]
    assert sum(np.allclose(e[:3], (214 / 255, 39 / 255, 40 / 255))
               for e in ops.get_edgecolors()) == 1
    # measured timelines default to 5% of the measured makespan
    m = Timeline.model_validate({**b.model_dump(), "source": "measured"})
    legend = [t.get_text() for t in overlay(a, m).legends[0].get_texts()]
    assert any("moved > 1.75 slots = 5% of measured makespan" in x for x in legend)


def test_overlay_title_is_never_clipped_and_half_rows_are_named():
    """The title (with the two error lines) lies inside the figure at every size, and
    up to 16 ranks each half-row is named on the right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for ranks, mb in ((2, 4), (8, 16), (32, 64)):
        a = sim("1f1b", ranks, mb, CostModel(F=1, BW=2))
        b = shifted(a, 0, 1, 1.0)
        fig = overlay(a, b, names=["predicted", "measured"])
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        title = fig.axes[0].title.get_window_extent(canvas.get_renderer())
        w, h = fig.get_size_inches() * fig.dpi
        assert 0 <= title.x0 and title.x1 <= w and title.y1 <= h, (ranks, title)
        assert w <= 2000
        right = [t.get_text() for ax in fig.axes for c in ax.child_axes
                 for t in c.get_yticklabels()]
        if ranks <= 16:
            assert right.count("predicted") == ranks and right.count("measured") == ranks


def test_overlay_dualpipe_data_vs_rendezvous_counts_fb_parts():
    a = sim("dualpipe", 4, 8)
    b = sim("dualpipe", 4, 8, semantics="rendezvous")
    errs = op_start_errors(a, b)
    n_atoms = sum(len(s.parts or [s]) for s in a.spans)
    assert len(errs) == n_atoms
    # every start error is the difference of the two spans holding the op
    for e in errs[:20]:
        assert e.start_a == a.find_span(e.rank, e.kind, e.mb, e.stage).start
        assert e.start_b == b.find_span(e.rank, e.kind, e.mb, e.stage).start
    png(overlay(a, b))


def test_overlay_refuses_different_ops():
    with pytest.raises(ScenarioError, match="different ops.*only in the first"):
        overlay(sim("1f1b"), sim("zb-h1"))
    with pytest.raises(ScenarioError, match="4 and 2 ranks"):
        overlay(sim("1f1b"), sim("1f1b", 2, 8))


def test_compare_stacks_one_gantt_per_timeline():
    tls = [sim("1f1b", 4, 8), sim("zb-h1", 4, 8), sim("zbv", 4, 8)]
    assert compare is gantt_stack        # the earlier name, kept
    fig = gantt_stack(tls)
    assert len(fig.axes) == 3
    for ax, tl in zip(fig.axes, tls):
        ops = [c for c in ax.collections if c.get_gid() == "ops"][0]
        assert len(ops.get_paths()) == len(tl.spans)
        assert ax.get_xlim()[1] == max(t.makespan for t in tls)   # one time scale
    png(fig)


def test_compare_stack_has_one_kind_of_time_axis_and_one_entry_per_shade():
    """Slot labels (T0, T1, ...) on every chart or on none (zbv's half slots make them all
    plain), and a chunk and a direction of the same shade are one legend entry."""
    half = CostModel(F=1, B=1, W=0.5, BW=1.5, FB=2.5)
    tls = [sim("1f1b", 4, 8), sim("zbv", 4, 8, half), sim("dualpipe", 4, 8)]
    from schedsim.plot.gantt import boxes_integral, span_boxes

    assert not boxes_integral(span_boxes(tls[1])) and boxes_integral(span_boxes(tls[0]))
    fig = gantt_stack(tls)
    labels = [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes[:3]]
    assert not any(x.startswith("T") for row in labels for x in row)
    assert {ax.get_xlabel() for ax in fig.axes[:3]} == {"time (slot)"}
    fig = gantt_stack([sim("1f1b", 4, 8), sim("zb-h1", 4, 8)])
    assert all(ax.get_xticklabels()[0].get_text() == "T0" for ax in fig.axes[:2])
    legend = [t.get_text() for t in gantt_stack(tls).legends[0].get_texts()]
    assert "chunk 0 / direction 0" in legend and "chunk 1 / direction 1" in legend
    assert not any(x.startswith("direction") for x in legend)
    assert len(legend) == len(set(legend))


def test_memory_plot_peaks_match_the_memory_model():
    tls = [sim("1f1b", 4, 8, CostModel(F=1, BW=2)), sim("zbv", 4, 8)]
    fig = memory_plot(tls)
    for ax, tl in zip(fig.axes, tls):
        peaks = peak_activation(tl)
        assert len(ax.lines) == tl.ranks
        assert [max(line.get_ydata()) for line in ax.lines] == pytest.approx(peaks)
    # 1F1B: rank r holds p - r microbatches at its peak
    assert peak_activation(tls[0]) == [4, 3, 2, 1]
    assert "1f1b: peak 4 on rank 0" in fig.axes[0].get_title()
    png(fig, drawn=0.04)


def test_memory_band_covers_every_rank():
    """20 ranks: the shaded min-max band holds every rank's level at every time."""
    from schedsim.plot.memory import envelope, memory_curves_of

    tl = sim("1f1b", 20, 24, CostModel(F=1, BW=2))
    curves = memory_curves_of(tl)
    times, lo, hi = envelope(curves, tl.makespan)
    assert hi.max() == max(peak_activation(tl)) and lo.min() == 0
    for ts, vs in curves:
        pos = np.searchsorted(ts, times, side="right") - 1
        lvl = np.where(pos >= 0, vs[np.clip(pos, 0, None)], 0)
        assert np.all(lo <= lvl) and np.all(lvl <= hi)
    fig = memory_plot(tl)
    assert "microbatches' worth" in fig.axes[0].get_ylabel()
    assert len(fig.axes[0].lines) == 3 and fig.get_size_inches()[0] * fig.dpi <= 2000
    png(fig)


# -- CLI ---------------------------------------------------------------------------------

def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def timelines(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tl")
    a, b = d / "data.json", d / "rdv.json"
    for path, sem in ((a, "data"), (b, "rendezvous")):
        r = run("simulate", "--schedule", "dualpipe", "-p", "4", "-m", "8", "--cost",
                "F=1,B=1,W=1,BW=2,FB=3", "--semantics", sem, "--json", path, "-q")
        assert r.exit_code == 0, r.output
    return a, b


def test_render_gantt_and_overlay(tmp_path, timelines):
    a, b = timelines
    out = tmp_path / "g.png"
    r = run("render", a, "--out", out, "--arrows", "--memory", "--stalls")
    assert r.exit_code == 0, r.output
    assert Image.open(out).size[0] > 800
    out2 = tmp_path / "o.svg"
    r = run("render", a, "--overlay", b, "--out", out2, "--names", "data,rendezvous")
    assert r.exit_code == 0, r.output
    assert "data (upper half-rows) vs rendezvous" in out2.read_text()


@pytest.mark.parametrize("args,msg", [
    (["--out", "x.jpg"], "unsupported figure format"),
    (["--out", "x.png", "--names", "a,b"], "--names needs --overlay"),
    (["--out", "x.png", "--overlay", "OTHER", "--memory"], "single timeline"),
    (["--out", "x.png", "--overlay", "OTHER", "--names", "a"], "bad --names"),
])
def test_render_errors_exit_2_without_output(tmp_path, timelines, args, msg):
    a, b = timelines
    args = [str(b) if x == "OTHER" else (str(tmp_path / x) if x.startswith("x.") else x)
            for x in args]
    r = run("render", a, *args)
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []


def test_render_bad_json_and_different_ops(tmp_path, timelines):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = run("render", bad, "--out", tmp_path / "x.png")
    assert r.exit_code == 2 and "not a schedsim timeline" in r.output
    other = tmp_path / "other.json"
    r = run("simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--json", other, "-q")
    r = run("render", timelines[0], "--overlay", other, "--out", tmp_path / "x.png")
    assert r.exit_code == 2 and "different ops" in r.output
    assert not (tmp_path / "x.png").exists()


def test_simulate_figure_flags(tmp_path):
    out, trace = tmp_path / "g.png", tmp_path / "t.json"
    r = run("simulate", SCHEDULES / "dualpipe-figure.toml", "--gantt", out, "--arrows",
            "--memory", "--stalls", "--trace", trace, "-q")
    assert r.exit_code == 0, r.output
    assert Image.open(out).size[1] > 500
    assert json.loads(trace.read_text())["traceEvents"]
    r = run("simulate", SCHEDULES / "dualpipe-figure.toml", "--arrows", "-q")
    assert r.exit_code == 2 and "add --gantt" in r.output
    r = run("simulate", SCHEDULES / "dualpipe-figure.toml", "--gantt", tmp_path / "g.json",
            "-q")
    assert r.exit_code == 2 and "unsupported figure format" in r.output
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("ranks", [8, 32, 64])
def test_every_figure_fits_2000_px_at_8_32_64_ranks(ranks):
    """Gantt (with memory panel), overlay and memory plot of 1F1B at 8, 32 and 64 ranks:
    at most 2000 px wide; the memory panel states its unit."""
    from schedsim.plot import gantt

    a = sim("1f1b", ranks, 2 * ranks, CostModel(F=1, BW=2))
    b = sim("1f1b", ranks, 2 * ranks, CostModel(F=1, BW=2), semantics="rendezvous")
    for fig in (gantt(a, memory=True, arrows=True), overlay(a, b), memory_plot([a, b])):
        w, h = fig.get_size_inches() * fig.dpi
        assert w <= 2000 and h <= 2600, (w, h)
    assert "microbatches' worth" in gantt(a, memory=True).axes[1].get_ylabel()

"""Gantt charts: every family and option combination renders, without warnings, sized for a
page (at most 2000 px wide), not blank, with exactly one box per compute span, readable
labels that never overlap, legible or thinned arrows, and long timelines wrapped into
bands."""
from __future__ import annotations

import io
import itertools
import warnings

import numpy as np
import pytest
from PIL import Image

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis.memory import peak_activation
from schedsim.errors import ScenarioError
from schedsim.generators import names
from schedsim.plot import gantt, receiver_waited, save_figure
from schedsim.plot.arrows import MAX_ARROWS
from schedsim.plot.gantt import get_stalls
from schedsim.plot.layout import MAX_WIDTH_PX, plan
from schedsim.util.units import fmt_bubble

FIG = CostModel(F=1, B=1, W=1, BW=2, FB=3)
#: small, valid parameters per family (4 ranks)
FAMILY_ARGS = {"interleaved-1f1b": dict(chunks=2), "looped-bfs": dict(chunks=2),
               "interleaved-zb": dict(chunks=2)}
RED = (214 / 255, 39 / 255, 40 / 255)


def sim(name, ranks=4, mb=8, costs=FIG, semantics="data", **params):
    prog = build_program(name, ranks, mb, **params)
    return simulate(prog, costs, LinkModel(), CommModel(semantics=semantics))


def render(fig) -> np.ndarray:
    """Render to PNG in memory (no warnings allowed) and return the RGBA pixels."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.savefig(buf, format="png")
    return np.asarray(Image.open(buf))


def collections(fig, gid, ax=None):
    axes = fig.axes if ax is None else [fig.axes[ax]]
    return [c for a in axes for c in a.collections if c.get_gid() == gid]


def boxes(fig, ax_index=0) -> tuple[int, set[tuple[float, float, float]]]:
    """(number of drawn rectangles, distinct (row, start, end) boxes) of the ops."""
    ops = collections(fig, "ops", ax_index)[0]
    out = set()
    for p in ops.get_paths():
        v = p.vertices
        out.add((float(np.floor(v[:, 1].min())), round(float(v[:, 0].min()), 9),
                 round(float(v[:, 0].max()), 9)))
    return len(ops.get_paths()), out


def arrow_count(fig, ax=0) -> int:
    return sum(q.N for q in collections(fig, "arrows", ax))


def assert_not_blank(px: np.ndarray) -> None:
    rgb = px[..., :3].astype(float)
    assert rgb.std() > 20                                   # real contrast
    nonwhite = (rgb.min(axis=2) < 235).mean()
    assert 0.15 < nonwhite < 0.97                           # drawn, but not a solid block


def width_px(fig) -> float:
    return fig.get_size_inches()[0] * fig.dpi


@pytest.mark.parametrize("family", sorted(set(names())))
def test_every_family_renders_one_box_per_span(family):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tl = sim(family, **FAMILY_ARGS.get(family, {}))
        fig = gantt(tl, arrows=True, memory=True, stalls=True, dpi=60)
    px = render(fig)
    w, h = fig.get_size_inches() * fig.dpi
    assert px.shape[:2] == (round(h), round(w))
    assert_not_blank(px)
    n_fb = sum(1 for s in tl.spans if s.parts)
    drawn, distinct = boxes(fig)
    assert drawn == len(tl.spans) + n_fb                   # FB: two halves
    assert len(distinct) == len(tl.spans)                   # one box per compute span
    outline = collections(fig, "fb-outline", 0)
    assert (len(outline[0].get_paths()) if outline else 0) == n_fb
    assert f"makespan {tl.makespan:g} slots" in fig.axes[0].get_title()
    assert f"bubble {fmt_bubble(tl.bubble_ratio())}" in fig.axes[0].get_title()   # a ratio


@pytest.mark.parametrize("arrows,memory,stalls,label_mb",
                         list(itertools.product([False, True], repeat=4)))
def test_all_option_combinations(arrows, memory, stalls, label_mb):
    tl = sim("dualpipe", 4, 8, semantics="rendezvous")
    fig = gantt(tl, arrows=arrows, memory=memory, stalls=stalls, label_mb=label_mb, dpi=60)
    px = render(fig)
    assert_not_blank(px)
    assert len(fig.axes) == (2 if memory else 1)
    assert arrow_count(fig, 0) == (len(tl.messages) if arrows else 0)
    hatched = [c for c in fig.axes[0].collections if (c.get_gid() or "").startswith("stall-")]
    n_stalls = sum(1 for s in get_stalls(tl, True) if s.end > s.start)
    assert sum(len(c.get_paths()) for c in hatched) == (n_stalls if stalls else 0)
    texts = [t for t in fig.axes[0].texts if t.get_text().isdigit()]
    assert (len(texts) > 0) == label_mb
    if memory:      # 4 ranks: one line per rank, the unit on the axis
        assert len(fig.axes[1].lines) == tl.ranks
        assert "microbatches' worth" in fig.axes[1].get_ylabel()


def test_arrow_colour_is_whether_the_receiver_waited():
    # GPipe 2x3, F=BW=1, data semantics: rank 1 waits for F mb0 (t 0..1), rank 0 waits for
    # B mb0 (t 3..5); every other message arrives exactly when its consumer is ready.
    tl = sim("gpipe", 2, 3, CostModel(F=1, BW=1))
    waited = {(m.kind, m.mb) for m, w in zip(tl.messages, receiver_waited(tl)) if w}
    assert waited == {("F", 0), ("B", 0)}
    fig = gantt(tl, arrows=True)
    qs = collections(fig, "arrows", 0)
    by_color = {tuple(np.round(q.get_facecolor()[0][:3], 3)): q.N for q in qs}
    assert by_color[tuple(np.round(RED, 3))] == 2 and sum(by_color.values()) == 6
    # the arrows end where the consuming op starts: rank 1's F mb 0 starts at 1
    red = [q for q in qs if np.allclose(q.get_facecolor()[0][:3], RED)][0]
    ends = sorted(zip(red.X + red.U, red.Y + red.V))
    assert ends[0][0] == pytest.approx(1.0)


def test_arrows_are_thinned_with_a_note():
    """More messages than MAX_ARROWS in a band: only those a receiver waited for are
    drawn (or every k-th of those), and the legend says so."""
    tl = sim("1f1b", 16, 64, CostModel(F=1, BW=2), semantics="rendezvous")
    assert len(tl.messages) > MAX_ARROWS
    fig = gantt(tl, arrows=True, wrap=False)
    waited = sum(receiver_waited(tl))
    drawn = arrow_count(fig, 0)
    assert 0 < drawn <= MAX_ARROWS and drawn <= waited
    note = fig.legends[0].get_title().get_text()
    assert note.startswith("arrows:") and f"{len(tl.messages)}" in note


def test_highlight_marks_the_dualpipe_T10_T12_message():
    tl = sim("dualpipe", 8, 20)
    fig = gantt(tl, highlight=[("B", 5, 4, 0)])
    ax = fig.axes[0]
    boxes_ = [p for p in ax.patches if p.get_gid() == "highlight-box"]
    # producer: rank 5 B mb0 in T10; consumer: rank 4 BW mb0 over T12..T13
    got = sorted((round(p.get_x()), round(p.get_width()), round(p.get_y())) for p in boxes_)
    assert got == [(10, 1, 2), (12, 2, 3)]
    label = [t.get_text() for t in ax.texts if "rank 5 → rank 4" in t.get_text()]
    assert label and "end of T10, used at T12" in label[0]


def test_slot_ticks_and_unit_axis():
    tl = sim("1f1b", 4, 8, CostModel(F=1, BW=2))
    ax = gantt(tl).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "T0" and all(x.startswith("T") for x in labels)
    tl2 = sim("1f1b", 4, 8, CostModel(F=1.5, BW=2.25))
    ax2 = gantt(tl2).axes[0]
    assert ax2.get_xlabel() == "time (slot)"
    assert not any(t.get_text().startswith("T") for t in ax2.get_xticklabels())


def test_labels_never_overlap_and_fit_their_boxes():
    """DualPipe 8x20 (two-digit microbatches in one-slot boxes): every number drawn lies
    inside its box and no two numbers touch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    tl = sim("dualpipe", 8, 20)
    fig = gantt(tl)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax = fig.axes[0]
    r = canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text().isdigit()]
    assert len(labels) >= len(tl.spans)          # every box (FB: both halves) labelled
    ext = [t.get_window_extent(r) for t in labels]
    ops = collections(fig, "ops", 0)[0]
    rects = [ax.transData.transform(p.vertices) for p in ops.get_paths()]
    for t, e in zip(labels, ext):
        cx, cy = ax.transData.transform(t.get_position())
        box = [v for v in rects if v[:, 0].min() <= cx <= v[:, 0].max()
               and v[:, 1].min() <= cy <= v[:, 1].max()]
        assert len(box) == 1
        assert box[0][:, 0].min() <= e.x0 and e.x1 <= box[0][:, 0].max()
    by_row: dict[int, list] = {}
    for t, e in zip(labels, ext):
        by_row.setdefault(round(e.y0 / 3), []).append(e)
    for row in by_row.values():
        row.sort(key=lambda e: e.x0)
        for a, b in zip(row, row[1:]):
            assert b.x0 - a.x1 >= 2.0, (a, b)


@pytest.mark.parametrize("ranks,mb", [(2, 4), (4, 8), (8, 16), (32, 64), (64, 128)])
def test_width_capped_and_rank_labels_readable(ranks, mb):
    tl = sim("1f1b", ranks, mb, CostModel(F=1, BW=2))
    fig = gantt(tl, memory=True)
    assert width_px(fig) <= MAX_WIDTH_PX
    ax = fig.axes[0]
    sizes = {t.get_fontsize() for t in ax.get_yticklabels()}
    assert min(sizes) >= 5.5
    drawn = set()
    for a in fig.axes[::2]:
        drawn |= {t.get_text() for t in a.get_yticklabels()}
    assert "rank 0" in drawn and len(drawn) >= min(ranks, 32)


def test_long_timeline_wraps_into_bands():
    """1F1B 8 ranks x 64 microbatches: too long for its numbers in 2000 px, so it wraps;
    the bands tile the time axis and together draw every span."""
    tl = sim("1f1b", 8, 64, CostModel(F=1, BW=2))
    fig = gantt(tl)
    assert width_px(fig) <= MAX_WIDTH_PX
    bands = fig.axes
    assert len(bands) >= 2 and "wrapped into" in bands[0].get_title()
    lims = [a.get_xlim() for a in bands]
    assert lims[0][0] == 0 and lims[-1][1] == tl.makespan
    assert all(x[1] == y[0] for x, y in zip(lims, lims[1:]))
    seen = set()
    for i in range(len(bands)):
        seen |= boxes(fig, i)[1]
    assert len(seen) == len(tl.spans)
    assert len([t for a in bands for t in a.texts if t.get_text().isdigit()]) == len(tl.spans)
    # no wrapping asked: one band, scaled
    assert len(gantt(tl, wrap=False).axes) == 1


def test_64_ranks_thousands_of_ops_drop_labels_but_keep_boxes():
    tl = sim("1f1b", 64, 48, CostModel(F=1, BW=2))
    assert len(tl.spans) == 2 * 64 * 48
    fig = gantt(tl, dpi=50)
    px = render(fig)
    assert_not_blank(px)
    drawn, distinct = boxes(fig)
    assert drawn == len(distinct) == len(tl.spans)
    labels = [t for t in fig.axes[0].texts if t.get_text().isdigit()]
    assert len(labels) < len(tl.spans)     # dropped where they do not fit


def test_memory_panel_band_and_selected_ranks():
    """More than 4 ranks: the min-max band over all ranks plus rank 0, the highest-peak
    rank, the middle and the last rank, each with its peak in the legend."""
    tl = sim("1f1b", 8, 16, CostModel(F=1, BW=2))
    fig = gantt(tl, memory=True)
    axm = fig.axes[1]
    peaks = peak_activation(tl)
    lines = {ln.get_label(): ln for ln in axm.lines}
    assert set(lines) == {f"rank {r} (peak {peaks[r]:g})" for r in (0, 4, 7)}
    for r in (0, 4, 7):
        assert max(lines[f"rank {r} (peak {peaks[r]:g})"].get_ydata()) == peaks[r]
    band = [c for c in axm.collections if "min-max" in str(c.get_label())]
    assert len(band) == 1 and "all 8 ranks" in band[0].get_label()


def test_plan_bands_and_scaling():
    d = np.ones(100)
    one = plan(40, 8, d, 2, integral=True)
    assert one.bands == 1 and one.width * one.dpi <= MAX_WIDTH_PX
    many = plan(400, 8, d, 2, integral=True)
    assert many.bands > 1 and many.edges[-1] == 400 and many.width * many.dpi <= 2000
    # 64 ranks are too tall to wrap 4000 slots into readable bands: one scaled band
    big = plan(4000, 64, d, 4, integral=True)
    assert big.bands == 1 and big.width * big.dpi <= MAX_WIDTH_PX


def test_stalls_list_and_chunk_shading():
    tl = sim("interleaved-1f1b", 4, 8, CostModel(F=1, BW=2), chunks=2)
    fake = [type("S", (), dict(rank=0, start=0.0, end=1.0, cause="warmup", detail=""))()]
    fig = gantt(tl, stalls=fake)
    hatched = [c for c in fig.axes[0].collections if c.get_gid() == "stall-warmup"]
    assert len(hatched) == 1 and len(hatched[0].get_paths()) == 1
    ops = collections(fig, "ops", 0)[0]
    # two chunks -> two shades of the forward colour
    fwd = {tuple(np.round(c[:3], 3)) for c, s in zip(ops.get_facecolors(), tl.spans)
           if s.kind == "F"}
    assert len(fwd) == 2
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "chunk 0" in legend and "chunk 1" in legend and "stall: warmup" in legend


@pytest.mark.parametrize("ext", [".png", ".svg", ".pdf"])
def test_save_figure_formats(tmp_path, ext):
    tl = sim("1f1b", 2, 2, CostModel(F=1, BW=2))
    path = tmp_path / f"g{ext}"
    save_figure(gantt(tl), path)
    head = path.read_bytes()[:5]
    assert head == {".png": b"\x89PNG\r", ".svg": b"<?xml", ".pdf": b"%PDF-"}[ext]


def test_save_figure_rejects_other_formats(tmp_path):
    tl = sim("1f1b", 2, 2, CostModel(F=1, BW=2))
    with pytest.raises(ScenarioError, match="unsupported figure format"):
        save_figure(gantt(tl), tmp_path / "g.jpg")
    assert list(tmp_path.iterdir()) == []

"""Gantt charts: every family and option combination renders, without warnings, with the
expected size, not blank, and with exactly one box per compute span."""
from __future__ import annotations

import io
import itertools
import warnings

import numpy as np
import pytest
from matplotlib.collections import PatchCollection
from PIL import Image

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.errors import ScenarioError
from schedsim.generators import names
from schedsim.plot import gantt, receiver_waited, save_figure
from schedsim.plot.gantt import get_stalls

FIG = CostModel(F=1, B=1, W=1, BW=2, FB=3)
#: small, valid parameters per family (4 ranks)
FAMILY_ARGS = {"interleaved-1f1b": dict(chunks=2), "looped-bfs": dict(chunks=2),
               "interleaved-zb": dict(chunks=2)}


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


def collection(fig, gid, ax_index=0) -> PatchCollection | None:
    for c in fig.axes[ax_index].collections:
        if c.get_gid() == gid:
            return c
    return None


def boxes(fig, ax_index=0) -> tuple[int, set[tuple[float, float, float]]]:
    """(number of drawn rectangles, distinct (row, start, end) boxes) of the ops."""
    ops = collection(fig, "ops", ax_index)
    out = set()
    for p in ops.get_paths():
        v = p.vertices
        out.add((float(np.floor(v[:, 1].min())), round(float(v[:, 0].min()), 9),
                 round(float(v[:, 0].max()), 9)))
    return len(ops.get_paths()), out


def assert_not_blank(px: np.ndarray) -> None:
    rgb = px[..., :3].astype(float)
    assert rgb.std() > 20                                   # real contrast
    nonwhite = (rgb.min(axis=2) < 235).mean()
    assert 0.15 < nonwhite < 0.97                           # drawn, but not a solid block


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
    outline = collection(fig, "fb-outline")
    assert (len(outline.get_paths()) if outline else 0) == n_fb
    assert f"makespan {tl.makespan:g} slots" in fig.axes[0].get_title()
    assert f"bubble {tl.bubble_ratio():.1%}" in fig.axes[0].get_title()


@pytest.mark.parametrize("arrows,memory,stalls,label_mb",
                         list(itertools.product([False, True], repeat=4)))
def test_all_option_combinations(arrows, memory, stalls, label_mb):
    tl = sim("dualpipe", 4, 8, semantics="rendezvous")
    fig = gantt(tl, arrows=arrows, memory=memory, stalls=stalls, label_mb=label_mb, dpi=60)
    px = render(fig)
    assert_not_blank(px)
    assert len(fig.axes) == (2 if memory else 1)
    arrows_drawn = [p for p in fig.axes[0].patches if p.get_gid() == "arrow"]
    assert len(arrows_drawn) == (len(tl.messages) if arrows else 0)
    hatched = [c for c in fig.axes[0].collections if (c.get_gid() or "").startswith("stall-")]
    n_stalls = sum(1 for s in get_stalls(tl, True) if s.end > s.start)
    assert sum(len(c.get_paths()) for c in hatched) == (n_stalls if stalls else 0)
    texts = [t for t in fig.axes[0].texts if t.get_text().isdigit()]
    assert (len(texts) > 0) == label_mb
    if memory:
        assert len(fig.axes[1].lines) == tl.ranks


def test_arrow_colour_is_whether_the_receiver_waited():
    # GPipe 2x3, F=BW=1, data semantics: rank 1 waits for F mb0 (t 0..1), rank 0 waits for
    # B mb0 (t 3..5); every other message arrives exactly when its consumer is ready.
    tl = sim("gpipe", 2, 3, CostModel(F=1, BW=1))
    waited = {(m.kind, m.mb) for m, w in zip(tl.messages, receiver_waited(tl)) if w}
    assert waited == {("F", 0), ("B", 0)}
    fig = gantt(tl, arrows=True)
    colors = sorted(p.get_facecolor()[:3] for p in fig.axes[0].patches
                    if p.get_gid() == "arrow")
    red = (214 / 255, 39 / 255, 40 / 255)
    assert sum(np.allclose(c, red) for c in colors) == 2 and len(colors) == 6


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


def test_64_ranks_thousands_of_ops_drop_labels_but_keep_boxes():
    tl = sim("1f1b", 64, 48, CostModel(F=1, BW=2))
    assert len(tl.spans) == 2 * 64 * 48
    fig = gantt(tl, dpi=50)
    px = render(fig)
    assert_not_blank(px)
    drawn, distinct = boxes(fig)
    assert drawn == len(distinct) == len(tl.spans)
    w, h = fig.get_size_inches()
    assert 8 <= w <= 28 and h <= 26
    labels = [t for t in fig.axes[0].texts if t.get_text().isdigit()]
    assert len(labels) < len(tl.spans)     # dropped where they do not fit


def test_stalls_list_and_chunk_shading():
    tl = sim("interleaved-1f1b", 4, 8, CostModel(F=1, BW=2), chunks=2)
    fake = [type("S", (), dict(rank=0, start=0.0, end=1.0, cause="warmup", detail=""))()]
    fig = gantt(tl, stalls=fake)
    hatched = [c for c in fig.axes[0].collections if c.get_gid() == "stall-warmup"]
    assert len(hatched) == 1 and len(hatched[0].get_paths()) == 1
    ops = collection(fig, "ops")
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

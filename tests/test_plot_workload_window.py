"""Gantt of a workload scenario (llama3.1-70b, 4 stages, 256 microbatches) through a
short time window: the highlight label stays inside the figure and the layout holds
(the label used to sit 4% of the makespan past the consumer in data coordinates, far off
a 2000 ms window, and constrained layout collapsed the axes); ``--detail`` pieces of
about a pixel get no white separators."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from matplotlib.text import Text
from workload_scenarios import my70

from schedsim.cli.common import build_scenario
from schedsim.plot.detail import SPLIT_MIN_PX, split_lines_shown
from schedsim.plot.gantt import gantt
from schedsim.sim.pieces import attach_pieces
from schedsim.sim.simulate import simulate



@pytest.fixture(scope="module")
def tl70(tmp_path_factory):
    p = tmp_path_factory.mktemp("wl") / "my70.toml"
    p.write_text(my70())
    sc = build_scenario(Path(p))
    return attach_pieces(simulate(sc.build_program(), sc.costs, sc.link, sc.comm),
                         sc.stage_costs())


def _draw(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)            # drawn as saved: layout and renderer
    canvas.draw()
    return canvas.get_renderer()


def test_highlight_in_short_window_keeps_layout(tl70):
    assert tl70.makespan > 50_000          # ms: the window is a few % of the run
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # "constrained_layout not applied" fails
        fig = gantt(tl70, highlight=[("B", 3, 2, 0)], window=(0, 2000))
        r = _draw(fig)
    ax = fig.axes[0]
    assert ax.get_title().startswith("1f1b: 4 ranks, 256 microbatches")
    assert "time 0 to 2000" in ax.get_title().replace("\n", " ")
    fb = fig.bbox
    ab = ax.get_window_extent(r)
    assert ab.width > 0.5 * fb.width and ab.height > 0.3 * fb.height   # not collapsed
    title = ax.title.get_window_extent(r)
    assert fb.x0 <= title.x0 and title.x1 <= fb.x1 and title.y1 <= fb.y1
    (ann,) = [t for t in ax.texts if t.get_text().startswith("input grad of mb 0")]
    lb = Text.get_window_extent(ann, r)        # the label, not its leader line
    assert ab.x0 - 1 <= lb.x0 and lb.x1 <= ab.x1 + 1         # inside the axes' width
    assert ab.y1 < lb.y0 and lb.y1 < title.y0 and lb.y1 <= fb.y1   # above the chart
    leg = fig.legends[0].get_window_extent(r)
    tick_bottom = min(t.get_window_extent(r).y0 for t in ax.get_xticklabels()
                      if t.get_text())
    xlabel = ax.xaxis.label.get_window_extent(r)
    assert leg.y1 < tick_bottom and leg.y1 < xlabel.y0       # below the axes' labels
    assert fb.x0 <= leg.x0 and leg.x1 <= fb.x1 and fb.y0 <= leg.y0


def test_highlight_outside_window_label_inside(tl70):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = gantt(tl70, highlight=[("B", 3, 2, 0)], window=(5000, 7000))
        r = _draw(fig)
    ax = fig.axes[0]
    (ann,) = [t for t in ax.texts if t.get_text().startswith("input grad of mb 0")]
    lb, ab = Text.get_window_extent(ann, r), ax.get_window_extent(r)
    assert ab.x0 - 1 <= lb.x0 and lb.x1 <= ab.x1 + 1
    assert ann.xy[0] == 5000                 # the leader ends at the window's edge


def test_split_rule():
    assert split_lines_shown([1.0, 2.0], None)
    assert split_lines_shown([SPLIT_MIN_PX / 2, 5.0], 2.0)
    assert not split_lines_shown([SPLIT_MIN_PX / 2 - 0.01, 5.0], 2.0)


def test_detail_thin_pieces_no_white_lines(tl70):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wide = gantt(tl70, detail=True, memory=True, window=(0, 3000))
        _draw(wide)
    got = {c.get_gid(): c for c in wide.axes[0].collections}
    assert "detail-splits" not in got                 # every piece ~1 px at 3000 ms
    assert np.all(np.asarray(got["detail-collectives"].get_linewidths()) == 0.0)
    narrow = gantt(tl70, detail=True, window=(0, 10))
    got = {c.get_gid(): c for c in narrow.axes[0].collections}
    assert len(got["detail-splits"].get_segments()) > 0   # 10 ms: pieces are wide
    assert np.any(np.asarray(got["detail-collectives"].get_linewidths()) == 0.3)

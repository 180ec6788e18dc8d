"""The HTML report in a real browser: Debian's Chromium, headless, with every host name
unresolvable. The page loads with no console error or warning, requests no resource at
all (everything is inline), bokeh renders its document, and the screenshot shows the
chart. Skips, saying why, where Chromium is not installed (.ci/run installs it)."""
from __future__ import annotations

import numpy as np
import pytest
from browser_probe import chromium, probe
from conftest import SCHEDULES
from PIL import Image
from typer.testing import CliRunner

from schedsim.cli import app

pytestmark = pytest.mark.skipif(
    chromium() is None, reason="Chromium is not installed (apt-get install -y chromium; "
    ".ci/run installs it): the HTML report is checked in a real browser only there")


def test_dualpipe_report_renders_in_headless_chromium(tmp_path):
    out = tmp_path / "dualpipe.html"
    r = CliRunner().invoke(app, ["report", str(SCHEDULES / "dualpipe-figure.toml"),
                                 "--semantics", "rendezvous", "--html", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size < 5_000_000
    shot = tmp_path / "dualpipe.png"
    got = probe(out, shot, size=(1400, 1000))
    assert got["errors"] == [], got["errors"]
    assert got["failed"] == [] and got["resources"] == []     # nothing fetched at all
    assert got["documents"] == 1 and got["roots"] == 1
    # the Gantt and the memory plot each draw on canvases (plus their toolbars' icons)
    assert got["canvases"] >= 2
    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert px.shape[:2] == (1000, 1400)
    # the Gantt's colours are on screen: the forward blue and the full-backward purple
    # (#4C72B0, #8172B3) each cover a real area of the screenshot
    for rgb in ((0x4C, 0x72, 0xB0), (0x81, 0x72, 0xB3)):
        near = (np.abs(px - np.array(rgb)).sum(axis=2) < 30).mean()
        assert near > 0.005, (rgb, near)

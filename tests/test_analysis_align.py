"""Send/recv alignment: the life of each message, in slots for whole-number costs."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import FIGURE_COSTS, SCHEDULES
from typer.testing import CliRunner

from schedsim import CommModel, CostModel, build_program, simulate
from schedsim.analysis.align import alignment, is_slotted, row_cells, slot_at, slot_end
from schedsim.cli import app

FIG = CostModel(**FIGURE_COSTS)
DP = build_program("dualpipe", 8, 20)


def _row(rows, kind, mb, src, dst):
    return next(r for r in rows if (r.kind, r.mb, r.src, r.dst) == (kind, mb, src, dst))


def test_gradient_sent_end_of_t10_received_t12() -> None:
    tl = simulate(DP, FIG, comm=CommModel(semantics="rendezvous"))
    rows = alignment(tl)
    g = _row(rows, "B", 0, 5, 4)
    assert (g.producer, g.ready, g.send_posted, g.recv_posted, g.start, g.arrival,
            g.recv_done, g.consumer, g.consumer_start) == ("5B0", 11, 11, 12, 12, 12, 12,
                                                           "4BW0", 12)
    assert g.flags == ["late-recv"]
    assert row_cells(g, is_slotted(tl))[2] == "11 (end T10)"
    assert row_cells(g, True)[7] == "4BW0 12 (T12)"
    a = _row(rows, "F", 3, 4, 5)
    assert (a.producer, a.ready, a.send_posted, a.recv_posted, a.consumer,
            a.consumer_start) == ("4F3", 11, 12, 11, "5F3", 13)
    assert a.flags == ["late-send"] and a.send_delay == 1


def test_data_semantics_has_no_late_posts() -> None:
    rows = alignment(simulate(DP, FIG))
    assert len(rows) == 280 and not any(r.flags for r in rows)
    g = _row(rows, "B", 0, 5, 4)
    assert (g.ready, g.send_posted, g.recv_posted, g.arrival, g.consumer_start) == \
        (11, 11, None, 11, 12)


def test_threshold_and_slot_names() -> None:
    tl = simulate(DP, FIG, comm=CommModel(semantics="eager"))
    late = sorted(r.send_delay for r in alignment(tl) if "late-send" in r.flags)
    assert late == [1.0] * 14 + [2.0] * 2
    assert len([r for r in alignment(tl, late_threshold=1) if "late-send" in r.flags]) == 2
    assert (slot_end(11), slot_end(0), slot_at(12)) == ("end T10", "start", "T12")


def test_align_cli_json(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    r = CliRunner().invoke(app, ["align", str(SCHEDULES / "dualpipe-issue-t10-t12.toml"),
                                 "--semantics", "rendezvous", "--rank", "5", "--flagged",
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert len(d) == 280
    g = next(x for x in d if (x["kind"], x["mb"], x["src"]) == ("B", 0, 5))
    assert g["flags"] == ["late-recv"] and g["consumer_start"] == 12
    assert "54 of 280 messages flagged" in r.stdout


def _table_rows(out: str) -> list[str]:
    """The message cells of the table rows printed (first column, e.g. ``F mb0 0->1``)."""
    return [ln.split("│")[1].strip() for ln in out.splitlines()
            if ln.startswith("│") and "->" in ln.split("│")[1]]


def test_align_table_is_bounded(tmp_path: Path, monkeypatch) -> None:
    """A big run prints --limit rows (data-ready order) and says how many it left out;
    --all prints every row; --json writes every message either way."""
    from schedsim.cli import common

    monkeypatch.setattr(common.console, "_width", 400)      # one line per row
    p, m = 8, 32
    n = 2 * (p - 1) * m                                      # F and B on each of p-1 links
    tl = simulate(build_program("1f1b", p, m), CostModel(F=1, BW=2))
    want = [r.label for r in alignment(tl)]
    assert len(want) == n == 448
    out = tmp_path / "a.json"
    args = ["align", "-s", "1f1b", "-p", str(p), "-m", str(m), "--cost", "F=1,BW=2"]
    r = CliRunner().invoke(app, args + ["--json", str(out)])
    assert r.exit_code == 0, r.output
    assert _table_rows(r.stdout) == want[:40]
    assert f"first 40 of {n} rows shown (--all prints every row" in r.stdout
    assert len(json.loads(out.read_text())) == n
    r = CliRunner().invoke(app, args + ["--limit", "5"])
    assert _table_rows(r.stdout) == want[:5] and f"first 5 of {n} rows" in r.stdout
    r = CliRunner().invoke(app, args + ["--all"])
    assert _table_rows(r.stdout) == want and "rows shown" not in r.stdout
    r = CliRunner().invoke(app, args + ["--rank", "0"])      # 2m messages touch rank 0
    assert len(_table_rows(r.stdout)) == 40 and f"first 40 of {2 * m} rows" in r.stdout
    r = CliRunner().invoke(app, args + ["--limit", "0"])
    assert r.exit_code == 2


def test_align_row_dict_is_every_field() -> None:
    from dataclasses import asdict

    rows = alignment(simulate(DP, FIG, comm=CommModel(semantics="rendezvous")))
    assert all(r.to_dict() == asdict(r) for r in rows)

"""The analysis commands as users run them: JSON contracts, exit codes, no partial files."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import SCHEDULES
from typer.testing import CliRunner

from schedsim.cli import app

runner = CliRunner()
DP = str(SCHEDULES / "dualpipe-issue-t10-t12.toml")


def test_stalls_json(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["stalls", DP, "--semantics", "eager", "--rank", "5", "--json",
                            str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert {"rank", "start", "end", "cause", "detail"} <= set(d[0])
    assert len({x["rank"] for x in d}) == 8         # --rank filters the table, not the JSON
    s = next(x for x in d if x["rank"] == 5 and x["start"] == 11)
    assert (s["end"], s["cause"], s["comms"]) == (12, "wait-batch", ["5RECV_F3"])
    assert sum(x["end"] - x["start"] for x in d) == 8 * 6     # 6 idle per rank
    assert "idle by cause" in r.stdout


def test_stalls_on_a_deadlock_exits_3_with_json(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["stalls", str(SCHEDULES / "crossed-sends.toml"), "--json",
                            str(out)])
    assert r.exit_code == 3 and "deadlock" in r.output
    assert isinstance(json.loads(out.read_text()), list)


def test_critical_path_json(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    r = runner.invoke(app, ["critical-path", str(SCHEDULES / "1f1b.toml"), "--slack",
                            "--json", str(out)], terminal_width=200)
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    ops = [s for s in d["path"] if s["kind"] == "op"]
    assert d["makespan"] == 33 and len(ops) == 22
    assert ops[0]["what"] == "0F0" and ops[-1]["what"] == "0BW7"
    assert len(d["slack"]) == 32 * 2 and min(s["slack"] for s in d["slack"]) == 0
    first = r.stdout.splitlines()[0]
    assert first.startswith("critical path of 1f1b: 4 ranks x 8 microbatches, data "
                            "semantics: makespan 33 slots = 33 slots compute + 0 slots "
                            "waiting along 22 ops "
                            "on the path over 4 ranks")
    r = runner.invoke(app, ["critical-path", str(SCHEDULES / "crossed-sends.toml")])
    assert r.exit_code == 3


def test_bad_input_exit_2_no_file(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    for args in (["stalls", str(tmp_path / "missing.toml"), "--json", str(out)],
                 ["align", DP, "--semantics", "psychic", "--json", str(out)],
                 ["critical-path", "--json", str(out)],
                 ["lint", DP, "--cost", "F=-1", "--json", str(out)],
                 ["diff", "nope", DP, "--json", str(out)],
                 ["memory", DP, "--fb-order", "sideways", "--json", str(out)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output and "error:" in r.output
        assert not out.exists()


def _loses_text(text: str) -> bool:
    """True if rich markup would drop part of ``text`` (an unescaped ``[word]`` is read
    as a style tag and vanishes; ``\\[word]`` prints as ``[word]``)."""
    from rich.markup import render

    return render(text).plain != text.replace("\\[", "[")


def test_help_text_keeps_bracketed_words(monkeypatch) -> None:
    """Every command's docstring and option help survive typer's rich markup: the user saw
    "model from the scenario's , default zb" where the source said [memory]."""
    import typer.main

    from schedsim.cli import common

    assert _loses_text("model from the scenario's [memory], default zb")
    assert not _loses_text("model from the scenario's \\[memory], default zb")
    cmd = typer.main.get_command(app)
    lost = [(name, who) for name, c in cmd.commands.items()
            for who, text in [("doc", c.help or "")] + [
                (p.name, getattr(p, "help", None) or "") for p in c.params]
            if _loses_text(text)]
    assert lost == []
    monkeypatch.setattr(common.console, "_width", 400)
    for args, words in ((["memory", "--help"], ["[memory]", "[time, level after]"]),
                        (["compare", "--help"], ["[memory]", "[schedule]"])):
        r = runner.invoke(app, args, env={"COLUMNS": "400"})
        assert r.exit_code == 0
        for w in words:
            assert w in r.stdout, (args, w)

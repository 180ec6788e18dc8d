"""docs/explaining.md stays true: every command in it runs and prints the lines shown
after it (a ``text`` block after a ``bash`` block; ``...`` in a shown line skips text)."""
from __future__ import annotations

import re
import shlex

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from schedsim.cli import app

DOC = ROOT / "docs" / "explaining.md"
runner = CliRunner()


def _blocks() -> list[tuple[list[str], list[str]]]:
    parts = re.findall(r"```(\w*)\n(.*?)```", DOC.read_text(), flags=re.S)
    out = []
    for i, (lang, body) in enumerate(parts):
        if lang != "bash":
            continue
        cmds = [ln for ln in body.splitlines() if ln.startswith("schedsim ")]
        shown = (parts[i + 1][1].splitlines() if i + 1 < len(parts)
                 and parts[i + 1][0] == "text" else [])
        out.append((cmds, shown))
    return out


BLOCKS = _blocks()


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_page_has_commands() -> None:
    assert len(BLOCKS) >= 5 and all(cmds for cmds, _ in BLOCKS)


@pytest.mark.parametrize("cmds,shown", BLOCKS, ids=[b[0][0][9:50] for b in BLOCKS])
def test_commands_print_what_the_doc_shows(cmds, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "schedules").symlink_to(ROOT / "schedules")
    output = ""
    for cmd in cmds:
        r = runner.invoke(app, shlex.split(cmd)[1:], terminal_width=200)
        assert r.exit_code == 0, f"{cmd}: {r.output}"
        output += r.output
    for line in shown:
        for frag in line.split("..."):
            assert _norm(frag).strip() in _norm(output), f"{frag!r} not printed by {cmds}"

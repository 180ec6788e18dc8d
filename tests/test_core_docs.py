"""docs/comm-semantics.md and docs/speed.md stay true: their schedsim commands run (from
the project root) and print the lines shown after them; a command marked ``# exit N``
exits with N."""
from __future__ import annotations

import shlex

import pytest
from conftest import ROOT
from doc_examples import examples, norm
from typer.testing import CliRunner

from schedsim.cli import app

DOCS = [ROOT / "docs" / "comm-semantics.md", ROOT / "docs" / "speed.md"]
runner = CliRunner()


BLOCKS = examples(*DOCS)


def test_the_page_has_commands():
    assert len(BLOCKS) >= 7 and all(shown for _, shown in BLOCKS)


@pytest.mark.parametrize("cmds,shown", BLOCKS, ids=[b[0][0][9:70] for b in BLOCKS])
def test_commands_print_what_the_doc_shows(cmds, shown, monkeypatch):
    from schedsim.cli import common

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(common.console, "_width", 600)    # no folding inside table cells
    output = ""
    for cmd in cmds:
        line, _, note = cmd.partition("#")
        code = int(note.split("exit")[1]) if "exit" in note else 0
        r = runner.invoke(app, shlex.split(line)[1:], terminal_width=250)
        assert r.exit_code == code, f"{cmd}: {r.output}"
        output += r.output
    for text in shown:
        assert norm(text).strip() in norm(output), f"{text!r} not printed by {cmds}"

"""docs/search.md stays true: its schedsim commands run (in a temporary folder) and print
the lines shown after them."""
from __future__ import annotations

import shlex

import pytest
from conftest import ROOT
from doc_examples import examples, norm
from typer.testing import CliRunner

pytest.importorskip("ortools")

from schedsim.cli import app  # noqa: E402

DOC = ROOT / "docs" / "search.md"
runner = CliRunner()


BLOCKS = examples(DOC)


def test_the_page_has_commands():
    assert len(BLOCKS) >= 3 and all(shown for _, shown in BLOCKS)


@pytest.mark.parametrize("cmds,shown", BLOCKS, ids=[b[0][0][9:60] for b in BLOCKS])
def test_commands_print_what_the_doc_shows(cmds, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output = ""
    for cmd in cmds:
        r = runner.invoke(app, shlex.split(cmd)[1:], terminal_width=200)
        assert r.exit_code == 0, f"{cmd}: {r.output}"
        output += r.output
    for line in shown:
        for frag in line.split("..."):
            assert norm(frag).strip() in norm(output), f"{frag!r} not printed by {cmds}"

"""docs/search.md stays true: its schedsim commands run (in a temporary folder) and print
the lines shown after them."""
from __future__ import annotations

import pytest
from conftest import ROOT
from doc_examples import check_prints, examples

pytest.importorskip("ortools")

DOC = ROOT / "docs" / "search.md"
BLOCKS = examples(DOC)


def test_the_page_has_commands():
    assert len(BLOCKS) >= 3 and all(shown for _, shown in BLOCKS)


@pytest.mark.parametrize("cmds,shown", BLOCKS, ids=[b[0][0][9:60] for b in BLOCKS])
def test_commands_print_what_the_doc_shows(cmds, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_prints(cmds, shown)

"""docs/stage-model.md stays true: its simulate / compare / render commands run and print
the lines shown after them; its replay and check-collectives commands are the ones
tests/test_collectives.py runs (multi-process, so not run twice here); the Domino example
and the `[model]` table in the page are the ones the code computes and accepts."""
from __future__ import annotations

import re

import pytest
import tomllib
from conftest import ROOT
from doc_examples import check_prints, examples, norm

from schedsim.sim.stage_model import StageModel

DOC = ROOT / "docs" / "stage-model.md"
#: multi-process commands: tests/test_collectives.py runs the same flags
MULTIPROCESS = ("schedsim replay ", "schedsim check-collectives ")
BLOCKS = [b for b in examples(DOC) if not b[0][0].startswith(MULTIPROCESS)]


@pytest.mark.parametrize("cmds,shown", BLOCKS, ids=[b[0][0][9:50] for b in BLOCKS])
def test_commands_print_what_the_doc_shows(cmds, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "schedules").symlink_to(ROOT / "schedules")
    check_prints(cmds, shown)


def test_the_multiprocess_commands_are_the_tested_ones():
    text = (ROOT / "tests" / "test_collectives.py").read_text()
    slow = [c for b in examples(DOC) for c in b[0] if c.startswith(MULTIPROCESS)]
    assert len(slow) == 5
    assert all(f in text for f in ('"check-collectives", "--tp"', '"--set", "tp=2"',
                                   'f"tp_comm={comm}"', '"--check-grads"'))
    user = (ROOT / "tests" / "test_user_collectives.py").read_text()
    assert '"check-collectives", "--function"' in user and "f=CopyToModelParallel" in user


def test_the_model_table_in_the_doc_is_valid():
    toml = re.search(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)[1]
    m = StageModel.model_validate(tomllib.loads(toml)["model"])
    assert (m.layers, m.ep, m.topk, m.overlap, m.stage[0].layers) == (4, 16, 4, "fb", 3)
    assert "F = 7, between the compute-only 4 and the no-overlap 2+3+2+3 = 10" in \
        norm(DOC.read_text())

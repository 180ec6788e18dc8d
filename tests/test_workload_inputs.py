"""Defects a new user found in the workload path (a ``[workload]`` table: model config +
GPU -> costs in ms, bytes per rank), each with its reproducer: suggestions, GPU figures
in their units, ``[schedule]`` keys, the flags that disagree with the workload,
``--mem-limit`` as a size, per-op overheads."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.util.suggest import closest, did_you_mean

runner = CliRunner()

SMALL = """
[schedule]
name = "1f1b"
[workload]
model = "llama3.1-8b"
gpu = "h100-sxm"
seq = 4096
global_batch_size = 16
tp = 2
pp = 4
"""


def run(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args], terminal_width=200)


def write(tmp_path: Path, text: str, name: str = "w.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def one_error(r: object) -> str:
    """The one error line of a refused run (exit 2, no traceback), whitespace collapsed."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.count("error:") == 1, r.output
    return " ".join(r.output.split())


# -- did-you-mean: a prefix first ------------------------------------------------------
def test_suggestion_prefers_a_prefix_match(tmp_path: Path) -> None:
    """``gpu = "h100"`` suggested 'h800' (difflib's ratio); the user meant h100-sxm."""
    from schedsim.workload.hardware import GPUS

    assert closest("h100", GPUS) == "h100-sxm" and closest("H100", GPUS) == "h100-sxm"
    assert closest("a100", GPUS) == "a100-80gb" and closest("mi300", GPUS) == "mi300x"
    # the shortest of several prefixed names; no prefix: difflib as before
    assert closest("dualpip", ["dualpipev", "dualpipe"]) == "dualpipe"
    assert closest("h80", GPUS) == "h800" and closest("1fb1", ["1f1b", "gpipe"]) == "1f1b"
    assert closest("h", GPUS) is None and did_you_mean("zzz", GPUS) == ""
    r = run("simulate", write(tmp_path, SMALL.replace('"h100-sxm"', '"h100"')), "-q")
    assert "unknown gpu 'h100' (did you mean 'h100-sxm'?)" in one_error(r)

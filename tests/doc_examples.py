"""The worked examples of a docs page: each ```bash block of ``schedsim`` commands with
the ```text block right after it (the lines those commands print). The per-page doc
tests (test_core_docs, test_search_doc, test_stage_model_doc, test_frameworks_doc) read
their pages with it; tests/test_docs.py runs every command of every page."""
from __future__ import annotations

import re
import shlex
from pathlib import Path


def examples(*docs: Path) -> list[tuple[list[str], list[str]]]:
    """``(commands, shown lines)`` of every bash block holding ``schedsim`` commands, in
    page order; ``shown`` is empty when no text block follows."""
    parts = [p for doc in docs
             for p in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(), flags=re.S)]
    out = []
    for i, (lang, body) in enumerate(parts):
        cmds = [ln for ln in body.splitlines() if ln.startswith("schedsim ")]
        if lang != "bash" or not cmds:
            continue
        shown = (parts[i + 1][1].splitlines() if i + 1 < len(parts)
                 and parts[i + 1][0] == "text" else [])
        out.append((cmds, shown))
    return out


def norm(text: str) -> str:
    """Whitespace runs collapsed to one space (tables and wrapping differ by width)."""
    return re.sub(r"\s+", " ", text)


def check_prints(cmds: list[str], shown: list[str]) -> None:
    """Run ``cmds`` in-process (from the current folder, 200 columns): each exits 0 and
    together they print every shown line; ``...`` in a line stands for text left out, so
    each of its pieces must be printed."""
    from typer.testing import CliRunner

    from schedsim.cli import app

    output = ""
    for cmd in cmds:
        r = CliRunner().invoke(app, shlex.split(cmd)[1:], terminal_width=200)
        assert r.exit_code == 0, f"{cmd}: {r.output}"
        output += r.output
    for line in shown:
        for frag in line.split("..."):
            assert norm(frag).strip() in norm(output), f"{frag!r} not printed by {cmds}"

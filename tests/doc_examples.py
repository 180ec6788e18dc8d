"""The worked examples of a docs page: each ```bash block of ``schedsim`` commands with
the ```text block right after it (the lines those commands print). The per-page doc
tests (test_core_docs, test_search_doc, test_stage_model_doc, test_frameworks_doc) read
their pages with it; tests/test_docs.py runs every command of every page."""
from __future__ import annotations

import re
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

"""Every command in the README and in docs/*.md runs, as the page says it does.

Pages are found by globbing, so a new page under docs/ is tested without touching this
file. What runs:

- each line of a ```bash block that starts with ``schedsim`` or ``python`` (a ``\\`` at the
  end of a line continues it; ``#`` starts a comment). It must exit 0, or the code a
  trailing ``# exit N`` names;
- each ```python block, as a script (it must exit 0; write checks as ``assert``);
- a fenced block (any language) whose first line is ``$ schedsim ...``: the command runs
  and every further line of the block must appear in its output (whitespace collapsed;
  lines of table borders and lines holding ``...`` are skipped). Output starting with
  ``error:`` means a non-zero exit (or the ``# exit N`` given).

The commands of one page run in order in one scratch folder that holds links to the
project's ``schedules/``, ``docs/``, ``benchmarks/`` and ``notebooks/``, so a page's later
commands may read what its earlier ones wrote and nothing lands in the checkout. A bash
block right after a ``<!-- not run: REASON -->`` comment is not run; the test reports it
as skipped with the reason (keep those few: long benchmarks, multi-node launches).
``schedsim`` commands run in-process (typer's test runner; wildcards expanded as bash
would), each bounded by a timeout; ``python`` ones in a subprocess with a timeout.

Also checked: every relative link in the pages resolves, and every docs page is linked
from the README.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT
from typer.testing import CliRunner

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")])
#: most seconds one documented command may take
TIMEOUT = 180
LINKED = ("schedules", "docs", "benchmarks", "notebooks")
BORDER = re.compile(r"^[\s┏┓┗┛┡┩┃━╇┳┻╋┣┫─│┌┐└┘├┤┬┴┼╭╮╰╯═║╔╗╚╝]*$")


@dataclass
class Command:
    """One documented command: ``line`` as written, the exit code it should have and
    the output lines it should print."""

    line: str
    where: str
    code: int | None = 0           # None: any non-zero
    expect: list[str] = field(default_factory=list)
    python_block: str | None = None
    skip: str | None = None


def _blocks(text: str):
    """``(language, body, line number, note before it)`` of every fenced block."""
    pat = re.compile(r"(?ms)^(?P<note><!--[^\n]*-->\s*\n)?```(?P<lang>[\w-]*)[^\n]*\n"
                     r"(?P<body>.*?)^```\s*$")
    for m in pat.finditer(text):
        yield (m.group("lang"), m.group("body"), text[:m.start()].count("\n") + 1,
               m.group("note") or "")


def _code(line: str) -> tuple[str, int | None]:
    """Strip a trailing comment; ``# exit N`` gives the expected exit code."""
    m = re.search(r"\s#\s*exit\s+(\d+)", line)
    code = int(m.group(1)) if m else 0
    try:
        toks = shlex.split(line, comments=True)
    except ValueError:
        toks = line.split()
    return shlex.join(toks) if toks else "", code


def commands(page: Path) -> list[Command]:
    text = page.read_text()
    out: list[Command] = []
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    for lang, body, lineno, note in _blocks(text):
        where = f"{name}:{lineno}"
        m = re.match(r"<!--\s*not run:\s*(.*?)\s*-->", note.strip())
        skip = m.group(1) if m else None
        lines = body.rstrip("\n").split("\n")
        if lines and lines[0].startswith("$ schedsim"):
            line, code = _code(lines[0][2:])
            expect = [x for x in lines[1:] if x.strip()]
            if expect and expect[0].startswith("error:") and code == 0:
                code = None
            out.append(Command(line, where, code, expect, skip=skip))
        elif lang == "python":
            out.append(Command("python <block>", where, 0, python_block=body, skip=skip))
        elif lang in ("bash", "sh", "shell"):
            joined = re.sub(r"\\\n\s*", " ", body)
            for raw in joined.split("\n"):
                s = raw.strip()
                if s.startswith(("schedsim ", "python ")):
                    line, code = _code(s)
                    out.append(Command(line, where, code, skip=skip))
    return out


def _norm(s: str) -> str:
    return " ".join(s.split())


def _scratch(tmp: Path) -> Path:
    for name in LINKED:
        if (ROOT / name).exists():
            (tmp / name).symlink_to(ROOT / name)
    return tmp


class _Timeout(Exception):
    pass


def _globbed(args: list[str], cwd: Path) -> list[str]:
    """Expand shell wildcards as bash would (sorted; a pattern matching nothing stays)."""
    import glob

    out = []
    for a in args:
        hits = sorted(glob.glob(a, root_dir=cwd)) if any(c in a for c in "*?[") else []
        out += hits or [a]
    return out


def _run(cmd: Command, cwd: Path) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    if cmd.python_block is not None:
        r = subprocess.run([sys.executable, "-c", cmd.python_block], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT)
        return r.returncode, r.stdout + r.stderr
    args = _globbed(shlex.split(cmd.line), cwd)
    if args[0] == "python":
        r = subprocess.run([sys.executable, *args[1:]], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT)
        return r.returncode, r.stdout + r.stderr
    from schedsim.cli import app

    def on_alarm(*_):
        raise _Timeout(cmd.line)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIMEOUT)
    here = Path.cwd()
    try:
        os.chdir(cwd)
        r = CliRunner().invoke(app, args[1:], env={"COLUMNS": "250", "NO_COLOR": "1"})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(here)
    if isinstance(r.exception, _Timeout):
        pytest.fail(f"{cmd.where}: `{cmd.line}` took more than {TIMEOUT} s")
    return r.exit_code, r.output


def _pages_with_commands() -> list[Path]:
    """The pages that document a command (a page of prose only has nothing to run: it
    is not collected, rather than reported as a skip)."""
    return [p for p in PAGES if commands(p)]


@pytest.mark.parametrize("page", _pages_with_commands(),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_runs(page: Path, tmp_path: Path):
    cmds = commands(page)
    cwd = _scratch(tmp_path)
    skipped = []
    for cmd in cmds:
        if cmd.skip:
            skipped.append(f"{cmd.where} `{cmd.line}`: {cmd.skip}")
            continue
        code, output = _run(cmd, cwd)
        ok = code != 0 if cmd.code is None else code == cmd.code
        assert ok, (f"{cmd.where}: `{cmd.line}` exited {code}, the page says "
                    f"{'non-zero' if cmd.code is None else cmd.code}:\n{output[-3000:]}")
        flat = _norm(output)
        for want in cmd.expect:
            if "..." in want or "…" in want or BORDER.match(want):
                continue
            assert _norm(want) in flat, (f"{cmd.where}: `{cmd.line}` did not print "
                                         f"{want.strip()!r}; it printed:\n{output[-3000:]}")
    if skipped:
        print("not run (as the page says):\n" + "\n".join(skipped))


def test_parser_finds_commands_exit_codes_and_output(tmp_path: Path):
    """The page parser is not vacuous: bash lines, continuations, exit codes, output
    blocks, python blocks and not-run notes are all read."""
    page = tmp_path / "p.md"
    page.write_text(
        "```bash\nschedsim list\n# a comment\nschedsim simulate -s 1f1b \\\n  -p 4 -m 8  "
        "# exit 3\necho no\n```\n\n```\n$ schedsim simulate x.toml\nerror: bad\n```\n\n"
        "<!-- not run: slow -->\n```bash\npython benchmarks/x.py\n```\n\n"
        "```python\nassert 1 + 1 == 2\n```\n")
    got = commands(page)
    assert [(c.line, c.code, c.skip) for c in got] == [
        ("schedsim list", 0, None), ("schedsim simulate -s 1f1b -p 4 -m 8", 3, None),
        ("schedsim simulate x.toml", None, None), ("python benchmarks/x.py", 0, "slow"),
        ("python <block>", 0, None)]
    assert got[2].expect == ["error: bad"]


def _links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    bad = [u for u in _links(page) if not re.match(r"[a-z]+:", u)
           and not (page.parent / u).exists()]
    assert not bad, f"{page.relative_to(ROOT)}: broken links {bad}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / u).resolve() for u in _links(ROOT / "README.md")}
    pages = [p for p in (ROOT / "docs").glob("*.md")]
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md's guide list: {missing}"

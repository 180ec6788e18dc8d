"""The command line's shape: every command's ``--help`` keeps its example lines whole on
an 80-column terminal, and no command function of schedsim/cli is over 80 lines."""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from schedsim.cli import app

CLI = Path(__file__).resolve().parents[1] / "schedsim" / "cli"
COMMANDS = typer.main.get_command(app).commands      # name -> click command
#: the widest example line that an 80-column terminal shows whole (the help panel's
#: margin takes two columns)
WIDTH = 78


def example_lines(help_text: str) -> list[str]:
    """The lines of a command's help that schedsim's help renderer keeps as they are
    (schedsim.cli.helptext._tidy_help): indented, or starting with ``$``/``schedsim``/
    ``python``."""
    text = inspect.cleandoc(help_text or "").partition("\f")[0]
    return [ln for ln in text.splitlines()
            if ln.startswith((" ", "$ ", "schedsim ", "python "))]


def render_help(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80",
                                                         "TERMINAL_WIDTH": "80"})
    assert r.exit_code == 0, r.output
    return r.output


def test_every_command_has_examples_and_the_list_is_complete():
    """Not vacuous: the commands are all there, and most show an example."""
    assert {"simulate", "stalls", "align", "query", "compare", "replay", "calibrate",
            "import-trace", "report", "list", "critical-path"} <= set(COMMANDS)
    with_examples = [n for n, c in COMMANDS.items() if example_lines(c.help)]
    assert len(with_examples) >= len(COMMANDS) - 2, sorted(set(COMMANDS) - set(with_examples))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_examples_fit_80_columns(name):
    """Each example line is at most 78 characters and appears whole on one line of the
    ``--help`` output rendered at 80 columns (no wrapped command)."""
    examples = example_lines(COMMANDS[name].help)
    out = render_help(name)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, f"{name} --help is wider than 80 columns"
    for ex in examples:
        assert len(ex) <= WIDTH, f"{name}: example line of {len(ex)} chars: {ex!r}"
        shown = ex.replace("\\[", "[").rstrip()
        assert any(ln.rstrip().endswith(shown) and len(ln.rstrip()) - len(shown) <= 2
                   for ln in lines), f"{name}: example wraps at 80 columns: {ex!r}\n{out}"


def test_prose_never_starts_an_example():
    """``Example: schedsim ...`` on one prose line would be reflowed mid-command: examples
    go on their own indented lines."""
    bad = [(n, ln) for n, c in COMMANDS.items()
           for ln in inspect.cleandoc(c.help or "").splitlines()
           if ln.startswith(("Example:", "Examples:")) and ln.split(":", 1)[1].strip()]
    assert not bad, bad


def test_wrapping_is_detected():
    """The check above is not vacuous: a too-long example does wrap at 80 columns."""
    long = ("  schedsim simulate -s dualpipe -p 8 -m 20 --cost F=1,B=1,W=1,BW=2,FB=3 "
            "--json x.json")
    assert len(long) > WIDTH
    fn = next(c.callback for c in app.registered_commands
              if c.callback.__name__ == "simulate")
    old = fn.__doc__
    fn.__doc__ = f"Simulate.\n\nExamples:\n{long}\n"
    try:
        out = render_help("simulate")
    finally:
        fn.__doc__ = old
    assert "Simulate." in out and "x.json" in out
    assert not any(ln.rstrip().endswith(long.strip()) for ln in out.splitlines())


def _function_lengths(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(f"{path.name}:{n.name}", n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_cli_function_over_80_lines():
    sizes = [x for p in sorted(CLI.glob("*.py")) for x in _function_lengths(p)]
    assert len(sizes) > 50                      # the scan sees the commands
    assert not [x for x in sizes if x[1] > 80], [x for x in sizes if x[1] > 80]


def test_list_shows_policies_and_semantics():
    """``schedsim list`` names every comm policy with its summary and each ``--param``
    key, and every comm semantics the engine accepts."""
    import typing

    from schedsim.program.lower import POLICIES
    from schedsim.program.vocab import SEMANTICS_SUMMARY
    from schedsim.sim.costs import Semantics

    r = CliRunner().invoke(app, ["list"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert r.exit_code == 0, r.output
    out = r.output
    policies = out[out.index("comm policies"):out.index("comm semantics")]
    assert set(POLICIES) == {"async", "commit", "torch", "megatron"}
    rows = [ln.split("│")[1].strip() for ln in policies.splitlines()
            if ln.startswith("│") and ln.split("│")[1].strip()]
    assert rows == sorted(POLICIES)
    for pol in POLICIES.values():
        assert pol.summary[:40] in policies, pol.name
        for key in pol.params:
            assert f"--param {key}=true|false" in policies, key
    assert {"overlap_f_b", "defer_pp_recv", "batch_p2p_comm", "overlap_p2p_comm"} <= {
        k for p in POLICIES.values() for k in p.params}
    sems = out[out.index("comm semantics"):]
    assert list(SEMANTICS_SUMMARY) == list(typing.get_args(Semantics))
    assert [ln.split("│")[1].strip() for ln in sems.splitlines()
            if ln.startswith("│") and ln.split("│")[1].strip()] == list(SEMANTICS_SUMMARY)
    assert "both complete at arrival" in sems


# -- options records (schedsim.cli.records) ----------------------------------------------
_Ranks = Annotated[Optional[int], typer.Option("--ranks", "-p", help="Pipeline ranks.")]
_Name = Annotated[str, typer.Argument(help="Schedule name.")]
_Quiet = Annotated[bool, typer.Option("--quiet/--loud", help="Less output.")]


@dataclass(frozen=True)
class _Opts:
    name: _Name
    ranks: _Ranks = None
    quiet: _Quiet = True


def _record_apps():
    """The same two-option command written out and as an options record."""
    from schedsim.cli.records import options_record

    seen: list = []
    plain, rec = typer.Typer(), typer.Typer()

    @plain.command()
    def run(name: _Name, ranks: _Ranks = None, quiet: _Quiet = True, extra: int = 3) -> None:
        """Run it."""
        seen.append(("plain", name, ranks, quiet, extra))

    @rec.command("run")
    @options_record(_Opts)
    def run_rec(o: _Opts, extra: int = 3) -> None:
        """Run it."""
        seen.append(("rec", o.name, o.ranks, o.quiet, extra))

    @plain.command()
    def other() -> None:
        """Another."""

    @rec.command()
    def other_() -> None:       # two commands: typer then names them
        """Another."""

    return plain, rec, seen


def test_an_options_record_gives_the_same_command():
    """A command whose options are a record has the written-out command's --help, flags,
    defaults and values (a required argument, a short flag, a --x/--no-x pair, a
    parameter after the record)."""
    plain, rec, seen = _record_apps()
    r = CliRunner()
    env = {"COLUMNS": "100"}
    a, b = (r.invoke(x, ["run", "--help"], env=env) for x in (plain, rec))
    assert a.exit_code == b.exit_code == 0 and a.output == b.output
    for args in (["run", "1f1b"], ["run", "zbv", "-p", "4", "--loud", "--extra", "5"]):
        assert r.invoke(plain, args).exit_code == 0 and r.invoke(rec, args).exit_code == 0
    assert [s[1:] for s in seen] == [("1f1b", None, True, 3), ("1f1b", None, True, 3),
                                     ("zbv", 4, False, 5), ("zbv", 4, False, 5)]
    a, b = (r.invoke(x, ["run"]) for x in (plain, rec))     # the argument is required
    assert a.exit_code == b.exit_code == 2


def test_commands_with_options_records_keep_their_record():
    """The converted commands take one record (the <= 12-parameter rule): their
    typer signature lists every flag of the record, in field order."""
    import dataclasses

    from schedsim.cli.compare import CompareOptions, compare_command
    from schedsim.cli.plan import PlanOptions, plan
    from schedsim.cli.render import RenderOptions, render
    from schedsim.cli.search import SearchOptions, search
    from schedsim.cli.simulate import GenerateOptions, generate

    for rec, cmd in ((CompareOptions, compare_command), (PlanOptions, plan),
                     (RenderOptions, render), (SearchOptions, search),
                     (GenerateOptions, generate)):
        names = [f.name for f in dataclasses.fields(rec)]
        params = list(inspect.signature(cmd).parameters)
        assert params[:len(names)] == names, rec.__name__

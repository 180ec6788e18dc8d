"""The command line's start-up loads only what a command needs: ``schedsim --help`` imports
no numpy, pydantic, matplotlib, networkx, numba or torch (nor schedsim's core), a small
``simulate -q`` no plotting, graph, workload or rich help formatting; and the table that
picks a command's module (:data:`schedsim.cli.COMMAND_MODULE`) is what the modules
register. A set of modules, not a timing: the start-up figures are in benchmarks/NOTES.md."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: run the CLI's entry point, then write the imported module names to stderr (the CLI
#: ends with os._exit, so the names are written from there)
_PROBE = """
import os, sys
real_exit = os._exit
def _exit(code):
    sys.stdout.flush()
    sys.stderr.write("\\nMODULES " + " ".join(sorted(sys.modules)) + "\\n")
    sys.stderr.flush()
    real_exit(code)
os._exit = _exit
sys.argv = ["schedsim", *sys.argv[1:]]
from schedsim.__main__ import main
main()
"""

#: third-party packages that --help must not import
HEAVY = ("numpy", "pydantic", "pydantic_core", "matplotlib", "networkx", "numba", "torch",
         "bokeh", "scipy", "ortools")


def _modules(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stderr.splitlines() if x.startswith("MODULES "))
    return set(line.split()[1:])


def _loaded(mods: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of ``mods`` in the top-level packages ``names``."""
    return sorted(m for m in mods if m.split(".")[0] in names)


def _within(mods: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of ``mods`` that are one of ``names`` or inside one."""
    return sorted(m for m in mods if any(m == n or m.startswith(n + ".") for n in names))


def test_help_imports_no_heavy_module() -> None:
    mods = _modules("--help")
    assert "typer.rich_utils" in mods           # the help itself was formatted
    assert not _loaded(mods, HEAVY)
    # (schedsim.program.vocab, the names of the semantics and modes, is plain data)
    core = ("schedsim.timeline", "schedsim.scenario", "schedsim.program.ir",
            "schedsim.program.flat", "schedsim.program.lower", "schedsim.sim",
            "schedsim.analysis", "schedsim.workload", "schedsim.generators")
    assert not _within(mods, core)


def test_small_simulate_imports_what_it_uses() -> None:
    mods = _modules("simulate", "-s", "1f1b", "-p", "4", "-m", "8", "-q")
    assert {"numpy", "pydantic", "schedsim.sim.engine"} <= mods
    assert not _loaded(mods, ("matplotlib", "networkx", "numba", "torch", "bokeh"))
    assert not _within(mods, ("typer.rich_utils", "rich.markdown", "schedsim.workload",
                              "schedsim.plot", "schedsim.cli.replay", "schedsim.cli.compare",
                              "schedsim.cli.render", "schedsim.analysis.graph"))
    # the generator registry imports only the module of the schedule asked for
    gens = {m for m in mods if m.startswith("schedsim.generators.")}
    assert gens == {"schedsim.generators.basic"}


def test_generator_module_table_matches_the_registrations() -> None:
    """Importing a generator's module (``generators.MODULE_OF``, each alone in a fresh
    process) registers it, every registered generator has an entry, and the registry
    lists the generators in the modules' order whichever module was imported first."""
    import json

    from schedsim.generators import _MODULES, MODULE_OF

    probe = ("import importlib, json, sys\n"
             "from schedsim import generators as g\n"
             "importlib.import_module('schedsim.generators.' + sys.argv[1])\n"
             "first = list(g.GENERATORS)\n"
             "print(json.dumps([first, g.names()]))\n")
    orders = []
    for mod in _MODULES:
        out = subprocess.run([sys.executable, "-c", probe, mod], capture_output=True,
                             text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        first, order = json.loads(out.stdout)
        assert {n for n, m in MODULE_OF.items() if m == mod} <= set(first), mod
        orders.append(order)
    assert set(orders[0]) == set(MODULE_OF)
    assert all(o == orders[0] for o in orders)
    assert orders[0] == sorted(orders[0], key=lambda n: _MODULES.index(MODULE_OF[n]))
    assert orders[0][:2] == ["gpipe", "1f1b"]


def test_command_module_table_matches_the_registrations() -> None:
    """Each command's entry in COMMAND_MODULE is the module that registers it, and every
    registered command has one."""
    from schedsim.cli import COMMAND_MODULE, COMMAND_MODULES, app

    registered = {}
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        registered[name] = info.callback.__module__.rsplit(".", 1)[1]
    assert registered == COMMAND_MODULE
    assert set(COMMAND_MODULE.values()) == set(COMMAND_MODULES)


@pytest.mark.parametrize("name", ["simulate", "compare", "costs"])
def test_a_named_command_loads_only_its_module(name: str) -> None:
    from schedsim.cli import COMMAND_MODULE, COMMAND_MODULES

    mods = _modules(name, "--help")
    cli = {m.rsplit(".", 1)[1] for m in mods
           if m.startswith("schedsim.cli.") and m.rsplit(".", 1)[1] in COMMAND_MODULES}
    assert COMMAND_MODULE[name] in cli
    assert "replay" not in cli and "plan" not in cli


def test_models_build_their_schemas_on_first_use() -> None:
    """Every pydantic model of schedsim defers its schema (``defer_build``: a start-up
    builds only the models it validates), so importing the core builds none."""
    probe = ("import pkgutil, importlib, schedsim\n"
             "from pydantic import BaseModel\n"
             "names = [m.name for m in pkgutil.walk_packages(schedsim.__path__, 'schedsim.')\n"
             "         if m.name.split('.')[1] not in ('cli', 'api', 'replay', 'plot',\n"
             "                                         'report', 'interop', '__main__')]\n"
             "names += ['schedsim.replay.config', 'schedsim.replay.calibrate']\n"
             "for n in names: importlib.import_module(n)\n"
             "def subs(c):\n"
             "    for s in c.__subclasses__(): yield s; yield from subs(s)\n"
             "ms = {c for c in subs(BaseModel) if c.__module__.startswith('schedsim')}\n"
             "print(len(ms), sorted(c.__qualname__ for c in ms\n"
             "                      if c.__pydantic_complete__\n"
             "                      or not c.model_config.get('defer_build')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    count, built = out.stdout.split(" ", 1)
    assert int(count) >= 30 and built.strip() == "[]"


def test_top_level_help_lists_the_commands_as_the_full_build_does() -> None:
    """``schedsim --help`` lists each command by its name and docstring without building
    its parameters; the page is byte for byte the one of the full build (``--help
    simulate`` names a command, so every command is built, and prints the same page)."""
    def page(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "schedsim", *args], capture_output=True,
                             text=True, cwd=ROOT, timeout=120,
                             env={**os.environ, "COLUMNS": "100"})
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    light = page("--help")
    assert "│ critical-path " in light and "│ check-collectives " in light
    assert light == page("--help", "simulate")


@pytest.mark.parametrize("name", ["1f1b", "zb-2p", "dualpipe", "dualpipev"])
def test_span_kinds_of_a_deferred_run_are_those_of_its_spans(name: str) -> None:
    """``Timeline.span_kinds`` answered from the arrays (counted kind codes, no numpy.ma in
    a small run) is the set the span objects give, FB pairs included."""
    from schedsim import CostModel, build_program, simulate

    costs = CostModel(F=1, B=1, W=1, BW=2, FB=3)
    tl = simulate(build_program(name, 4, 8), costs)
    assert tl.is_deferred
    kinds = tl.span_kinds()
    assert kinds == {(s.kind, tuple(p.kind for p in s.parts) if s.parts else ())
                     for s in tl.spans}
    assert ("FB" in {k for k, _ in kinds}) == name.startswith("dualpipe")

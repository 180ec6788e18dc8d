"""The package layout stays true to docs/architecture.md: imports point down the layers,
no module imports from a layer above it, and there are no import cycles.

Every ``import``/``from ... import`` counts, including the lazy ones inside functions: a
lazy import still ties the two modules together. The rule table below is the one home of
the layering; docs/architecture.md explains it.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "schedsim"

#: bottom to top; a module may import from its own layer and from layers listed earlier
#: (lower), never from a later (higher) one
LAYERS: tuple[tuple[str, ...], ...] = (
    ("schedsim.errors",),
    ("schedsim.util",),
    ("schedsim.program",),
    ("schedsim.timeline", "schedsim.timeline_build", "schedsim.timeline_check",
     "schedsim.timeline_view"),
    ("schedsim.sim",),
    ("schedsim.generators",),
    ("schedsim.workload",),
    ("schedsim.analysis",),
    ("schedsim.interop",),
    ("schedsim.scenario", "schedsim.scenario_flags", "schedsim.scenario_keys",
     "schedsim.scenario_schedule"),
    ("schedsim.sweep", "schedsim.sweep_workload"),
    ("schedsim.plot",),
    ("schedsim.report",),
    ("schedsim.search",),
    ("schedsim.plan",),
    ("schedsim.replay",),
    ("schedsim.api",),
    ("schedsim.cli", "schedsim.__main__", "schedsim.replay.__main__"),
)
#: the package's own ``__init__`` re-exports the public API from every layer
TOP = "schedsim"


def _home(module: str) -> tuple[int, str]:
    """(layer index, owning package or module) of a schedsim module; the longest prefix
    listed in LAYERS wins."""
    best: tuple[int, str] | None = None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (
                    best is None or len(name) > len(best[1])):
                best = (i, name)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and to "
                             f"docs/architecture.md")
    return best


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, imported schedsim module) for every import in ``path``; ``from X import y``
    counts as importing ``X.y`` when that is a module, else ``X``."""
    tree = ast.parse(path.read_text(), str(path))
    me = _module_name(path, root)
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith(TOP)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not (mod == TOP or mod.startswith(TOP + ".")):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                sub_path = root / sub.replace(".", "/")
                if sub_path.with_suffix(".py").exists() or (sub_path / "__init__.py").exists():
                    out.append((node.lineno, sub))
                else:
                    out.append((node.lineno, mod))
    return out


def import_graph(package: Path = PACKAGE) -> tuple[nx.DiGraph, list[str]]:
    """The module import graph of ``package`` and the list of layering violations."""
    g = nx.DiGraph()
    bad = []
    root = package.parent
    for path in sorted(package.rglob("*.py")):
        me = _module_name(path, root)
        g.add_node(me)
        if me == TOP:
            continue
        mine = _home(me)
        for line, mod in imports_of(path, root):
            if mod == TOP:
                bad.append(f"{path.relative_to(root)}:{line}: imports the "
                           f"package root {TOP} (import the defining module)")
                continue
            g.add_edge(me, mod)
            theirs = _home(mod)
            if theirs[0] > mine[0]:
                bad.append(f"{path.relative_to(root)}:{line}: {mine[1]} "
                           f"imports {mod} ({theirs[1]} is not below it)")
    return g, bad


def test_imports_point_down_the_layers():
    _, bad = import_graph()
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    g, _ = import_graph()
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not cycles, "\n".join(" -> ".join(c + [c[0]]) for c in cycles[:20])


def test_check_catches_a_wrong_import(tmp_path):
    """The checker is not vacuous: a program module importing the engine (upward), and
    two modules importing each other, are both reported."""
    pkg = tmp_path / "schedsim"
    (pkg / "program").mkdir(parents=True)
    (pkg / "sim").mkdir()
    for d in (pkg, pkg / "program", pkg / "sim"):
        (d / "__init__.py").write_text("")
    (pkg / "program" / "ir.py").write_text("from schedsim.sim.engine import run\n")
    (pkg / "sim" / "engine.py").write_text("from schedsim.program import ir\n")
    g, bad = import_graph(pkg)
    assert bad == ["schedsim/program/ir.py:1: schedsim.program imports schedsim.sim.engine "
                   "(schedsim.sim is not below it)"]
    assert ["schedsim.program.ir", "schedsim.sim.engine"] in [sorted(c) for c in
                                                              nx.simple_cycles(g)]


@pytest.mark.parametrize("limit", [500])
def test_no_module_over_the_size_limit(limit):
    big = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > limit}
    assert not big, f"modules over {limit} lines: {big}"


#: functions allowed past :data:`FUNCTION_LIMIT` lines (docs/architecture.md, "Exceptions
#: to the 80-line rule"), as ``path::qualified name`` under the package's parent
LONG_FUNCTIONS_ALLOWED = {
    # numba kernels, one function on purpose: a helper call pays reference-count traffic
    # on ~20-40 array arguments (benchmarks/NOTES.md section 1 item 3: 165 -> 46 ns/step)
    "schedsim/sim/kernels.py::run_kernel",
    "schedsim/sim/compile_kernel.py::compile_comm_kernel",
    # generators that mirror a reference step for step: none is over the limit today
    # (the typer commands of cli/, which count their option declarations, were allowed
    # until they were split into option aliases and helpers)
}
FUNCTION_LIMIT = 80


def functions(package: Path = PACKAGE) -> Iterator[tuple[str, ast.AST]]:
    """``("path::Qual.name", node)`` of every function of ``package`` (methods and nested
    functions included), in file order."""
    def visit(node: ast.AST, prefix: str, rel: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    yield f"{rel}::{name}", child
                yield from visit(child, name + ".", rel)
            else:
                yield from visit(child, prefix, rel)

    for p in sorted(package.rglob("*.py")):
        yield from visit(ast.parse(p.read_text()), "", str(p.relative_to(package.parent)))


def long_functions(package: Path = PACKAGE, limit: int = FUNCTION_LIMIT) -> dict[str, int]:
    """``{"path::Qual.name": lines}`` of every function (methods and nested functions
    included) longer than ``limit`` lines, counted from its ``def`` line to its last line
    (decorators not counted, docstring counted)."""
    sizes = {k: f.end_lineno - f.lineno + 1 for k, f in functions(package)}  # type: ignore
    return {k: n for k, n in sizes.items() if n > limit}


def _allowed(key: str) -> bool:
    return key in LONG_FUNCTIONS_ALLOWED


def test_no_function_over_the_size_limit():
    found = long_functions()
    over = {k: n for k, n in found.items() if not _allowed(k)}
    assert not over, (f"functions over {FUNCTION_LIMIT} lines (split them, or list a "
                      f"reference-mirroring generator in LONG_FUNCTIONS_ALLOWED and in "
                      f"docs/architecture.md): {over}")
    stale = sorted(LONG_FUNCTIONS_ALLOWED - set(found))
    assert not stale, f"allowed but no longer over {FUNCTION_LIMIT} lines (remove): {stale}"


def test_function_size_check_catches_a_long_function(tmp_path):
    """The size check is not vacuous: a long method and a long nested function are
    reported by their qualified names, an 80-line one is not."""
    pkg = tmp_path / "schedsim"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (pkg / "m.py").write_text(
        "class A:\n    def long(self):\n" + body.replace("    ", "        ")
        + "def fits():\n" + body[: -len("    x79 = 79\n")]
        + "def outer():\n    def inner():\n" + body.replace("    ", "        "))
    assert long_functions(pkg) == {"schedsim/m.py::A.long": 81, "schedsim/m.py::outer": 82,
                                   "schedsim/m.py::outer.inner": 81}
    assert not _allowed("schedsim/m.py::A.long")
    assert _allowed("schedsim/sim/kernels.py::run_kernel")


#: most parameters a function may take (positional, keyword-only, ``*args`` and
#: ``**kwargs`` each count; ``self``/``cls`` too): past it, group them into a record
PARAMETER_LIMIT = 12
#: functions allowed past :data:`PARAMETER_LIMIT`, as ``path::qualified name``: none (issue
#: 26 emptied it; an entry needs a reason in docs/architecture.md)
MANY_PARAMETERS_ALLOWED: set[str] = set()


def parameter_counts(package: Path = PACKAGE, limit: int = PARAMETER_LIMIT) -> dict[str, int]:
    """``{"path::Qual.name": parameters}`` of every function (methods and nested
    functions included) taking more than ``limit`` parameters: positional-only,
    positional, keyword-only, ``*args`` and ``**kwargs``."""
    def count(a: ast.arguments) -> int:
        return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                + (a.vararg is not None) + (a.kwarg is not None))
    sizes = {k: count(f.args) for k, f in functions(package)}  # type: ignore[attr-defined]
    return {k: n for k, n in sizes.items() if n > limit}


def test_no_function_takes_too_many_parameters():
    found = parameter_counts()
    over = {k: n for k, n in found.items() if k not in MANY_PARAMETERS_ALLOWED}
    assert not over, (f"functions taking more than {PARAMETER_LIMIT} parameters (group "
                      f"related ones into a record; a typer command: an options record, "
                      f"schedsim.cli.records): {over}")
    stale = sorted(MANY_PARAMETERS_ALLOWED - set(found))
    assert not stale, f"allowed but no longer over {PARAMETER_LIMIT} parameters: {stale}"


def test_parameter_check_counts_every_kind(tmp_path):
    """Positional-only, positional, keyword-only, ``*args`` and ``**kwargs`` all count,
    in methods and nested functions; 12 is allowed, 13 is not."""
    pkg = tmp_path / "schedsim"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def ok(a, b, c, d, e, f, g, h, i, j, k, l): pass\n"
        "def mixed(a, /, b, c, *args, d, e, f, g, h, i, j, k, **kw): pass\n"
        "class A:\n    def meth(self, a, b, c, d, e, f, g, h, i, j, k, l): pass\n"
        "def outer():\n    def inner(*, a, b, c, d, e, f, g, h, i, j, k, l, m): pass\n")
    assert parameter_counts(pkg) == {"schedsim/m.py::mixed": 13, "schedsim/m.py::A.meth": 13,
                                     "schedsim/m.py::outer.inner": 13}

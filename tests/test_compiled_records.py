"""The compiled program is frozen: records built once, no field write after construction
(checked at run time on real compiled programs, and in the source by an AST scan that a
deliberately bad module fails), counterfactuals return a new one, the kernels take
records and are called by name, and a Timeline does not keep the compiled program
alive."""
from __future__ import annotations

import ast
import dataclasses
import gc
import inspect
import weakref
from pathlib import Path

import numpy as np
import pytest

from schedsim import CommModel, CostModel, LinkModel, build_program
from schedsim.sim import fast
from schedsim.sim.compile import compile_program
from schedsim.sim.compile_kernel import _units, compile_comm_kernel
from schedsim.sim.compiled import RECORDS, Code, Compiled, Host, Links, Messages, Units
from schedsim.sim.engine import build_timeline, run
from schedsim.sim.free import make_free
from schedsim.sim.kernels import run_kernel
from schedsim.sim.simulate import simulate

PACKAGE = Path(__file__).resolve().parents[1] / "schedsim"
RECORD_TYPES = (Code, Messages, Links, Units, Host)
#: every field name of the compiled program and its records
FIELDS = frozenset({f.name for f in dataclasses.fields(Compiled)}.union(
    *(r._fields for r in RECORD_TYPES)))


def _compiled() -> list[Compiled]:
    """Compiled programs that fill every record: comm streams, lazy init, atomic groups,
    host delays, measured messages, data semantics, swaps of nothing."""
    prog = build_program("1f1b", 4, 6, "commit")
    costs = CostModel(F=1, B=2)
    link = LinkModel(latency=0.5, bandwidth=10.0)
    out = []
    for comm in (CommModel(semantics="rendezvous", comm_stream="per-peer", lazy_init=True,
                           init_cost=1.0),
                 CommModel(semantics="eager", group_semantics="atomic", host_cost=0.25),
                 CommModel(semantics="data")):
        out.append(compile_program(prog, costs, link, comm))
    return out


def _arrays(cp: Compiled):
    for name in RECORDS:
        rec = getattr(cp, name)
        for field, v in zip(rec._fields, rec):
            if isinstance(v, np.ndarray):
                yield f"{name}.{field}", v
    yield "span_gi", cp.span_gi


def test_no_field_of_a_compiled_program_can_be_written() -> None:
    for cp in _compiled():
        for f in dataclasses.fields(cp):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(cp, f.name, getattr(cp, f.name))
        for name in RECORDS:
            rec = getattr(cp, name)
            assert isinstance(rec, RECORD_TYPES)
            for field in rec._fields:
                with pytest.raises(AttributeError):
                    setattr(rec, field, getattr(rec, field))
        seen = 0
        for where, a in _arrays(cp):
            assert not a.flags.writeable, where
            if a.size:
                seen += 1
                with pytest.raises(ValueError, match="read-only"):
                    a[0] = a[0]
        assert seen >= 15          # the records are really filled
        with pytest.raises(TypeError):
            cp.pair_first[0] = {}  # type: ignore[index]


def test_a_counterfactual_is_a_new_compiled_program() -> None:
    prog = build_program("1f1b", 4, 6, "commit")
    cp = compile_program(prog, CostModel(F=1, B=2), LinkModel(), CommModel(
        semantics="rendezvous", comm_stream="per-peer"))
    before = {w: a.copy() for w, a in _arrays(cp)}
    free = make_free(cp, [(0, 0)], [("F", 0, 0)])
    assert free is not cp and free.code is not cp.code
    for w, a in _arrays(cp):                        # the original is as it was
        assert np.array_equal(a, before[w]), w
    assert free.code.ccost[0] == 0.0 and cp.code.ccost[0] == 1.0
    m = cp.mkey.index(("F", 0, 0))                  # both its handles dropped everywhere
    gone = np.isin(cp.code.ch, (2 * m, 2 * m + 1))
    assert gone.sum() >= 2 and np.array_equal(free.code.ch, cp.code.ch[~gone])
    assert not np.isin(free.units.unit_h, (2 * m, 2 * m + 1)).any()
    assert all(not a.flags.writeable for _, a in _arrays(free))
    tl = simulate(prog, CostModel(F=1, B=2), comm=CommModel(semantics="rendezvous",
                                                             comm_stream="per-peer"),
                  free_ops=[(0, 0)], free_messages=[("F", 0, 0)])
    st = run(free)
    assert tl.makespan == float(st.times.max())


#: a module that names one of these handles compiled programs
HANDLES = ("Compiled", "compile_program", "simulate_run", "make_free")


def _writes(tree: ast.AST, handles: bool = True) -> list[tuple[int, str]]:
    """``(line, target)`` of every write to a compiled record's field in ``tree``: an
    assignment to ``x.<field>`` or ``x.<field>[...]`` (``self`` excepted: other classes'
    own attributes), and, in a module that ``handles`` compiled programs, any
    ``object.__setattr__`` and a ``setattr`` naming a field (other modules set their
    pydantic models' fields so, some of the same names)."""
    out = []

    def flat(t):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                yield from flat(e)
        elif isinstance(t, ast.Starred):
            yield from flat(t.value)
        else:
            yield t

    for n in ast.walk(tree):
        targets = (n.targets if isinstance(n, ast.Assign) else
                   [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            for x in flat(t):
                while isinstance(x, ast.Subscript):
                    x = x.value
                if (isinstance(x, ast.Attribute) and x.attr in FIELDS
                        and not (isinstance(x.value, ast.Name) and x.value.id == "self")):
                    out.append((n.lineno, ast.unparse(x)))
        if handles and isinstance(n, ast.Call) and len(n.args) >= 2:
            fn = ast.unparse(n.func)
            name = n.args[1]
            if (fn in ("setattr", "object.__setattr__") and isinstance(name, ast.Constant)
                    and name.value in FIELDS) or (fn == "object.__setattr__"):
                out.append((n.lineno, ast.unparse(n)))
    return out


def test_no_module_writes_a_field_of_a_compiled_program() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = path.read_text()
        for line, what in _writes(ast.parse(src), any(h in src for h in HANDLES)):
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    assert not bad, "\n".join(bad)


def test_the_field_write_scan_catches_a_bad_module() -> None:
    src = ("def f(cp, g):\n"
           "    cp.code = None\n"
           "    cp.code.ccost[g] = 0.0\n"
           "    cp.links.mlat[:], x = 0, 1\n"
           "    cp.host.launch_cost += 1\n"
           "    setattr(cp, 'units', None)\n"
           "    object.__setattr__(cp, 'swaps', ())\n"
           "    self_ok = cp.code.ccost.copy()\n"
           "    self_ok[g] = 0.0\n")
    assert [line for line, _ in _writes(ast.parse(src))] == [2, 3, 4, 5, 6, 7]


def test_kernels_take_records_and_are_called_by_name() -> None:
    assert list(inspect.signature(run_kernel).parameters) == [
        "code", "links", "units", "host", "groups", "out", "scratch"]
    assert list(inspect.signature(compile_comm_kernel).parameters) == [
        "inp", "tables", "code", "units", "scratch"]
    assert len(inspect.signature(_units).parameters) <= 12
    src = (PACKAGE / "sim" / "fast.py").read_text()
    assert "import_module" not in src and "importlib" not in src
    assert fast.executor(run_kernel, 0)[0] is run_kernel or fast.use_numba(0)


def test_a_timeline_does_not_keep_the_compiled_program_alive() -> None:
    prog = build_program("1f1b", 4, 6, "commit")
    comm = CommModel(semantics="rendezvous")
    cp = compile_program(prog, CostModel(F=1, B=2), LinkModel(), comm)
    st = run(cp)
    tl = build_timeline(cp, st, comm, "ms")
    ref = weakref.ref(cp)
    del cp
    gc.collect()
    assert ref() is None
    assert len(tl.spans) == 4 * 6 * 2 and len(tl.waits) > 0    # still builds its objects
    assert tl.makespan == float(st.times.max())


def test_one_index_type_rule_for_lowering_and_compiled_records():
    """int32 while every value stays below int32's maximum, int64 from there on (the
    lowering asks with 4 x its entries, whose derived values reach that)."""
    import numpy as np

    from schedsim.program.flat import index_dtype

    top = int(np.iinfo(np.int32).max)
    assert index_dtype(top - 1) is np.int32 and index_dtype(top) is np.int64
    assert index_dtype(4 * ((1 << 29) - 1)) is np.int32 and index_dtype(4 << 29) is np.int64

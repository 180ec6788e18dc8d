"""The command line's fast option coercion (:mod:`schedsim.cli.coercion`) gives what
typer's own pydantic coercion gives, for every option of every command: each value it
converts comes out equal, of the same type and with the same repr; the values it is unsure
of go to typer's (so a bad value's message stays typer's: tests/test_reliability_round2.py
checks those messages)."""
from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
from hypothesis import given, settings, strategies as st
from typer import _coercion, core

from schedsim.cli import app
from schedsim.cli.coercion import _Unsure, fast_value


def _params() -> list:
    """Every typer parameter of every command (one per distinct annotation + limits)."""
    seen: dict = {}
    for cmd in typer.main.get_command(app).commands.values():
        for p in cmd.params:
            info = p.type_descriptor.parameter_info
            key = (repr(p.type_descriptor.annotation), info.min, info.max, info.clamp,
                   info.parser is not None, type(p).__name__)
            seen.setdefault(key, p)
    return list(seen.values())


PARAMS = _params()


def _typer_value(p, value):
    """typer's own coercion of ``value`` for parameter ``p``: ('ok', v) or ('error', msg)."""
    rp = _coercion.build_runtime_param(p.type_descriptor)
    try:
        return "ok", rp._coerce_value(value, param=p, ctx=None)
    except Exception as e:      # noqa: BLE001 - the refusal, whatever typer raises
        return "error", str(e)


def _same(a, b) -> bool:
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b and repr(a) == repr(b)


def _check(value) -> int:
    """Compare the two coercions of ``value`` for every parameter; how many were fast."""
    fast = 0
    for p in PARAMS:
        desc = p.type_descriptor
        for v in (value, [value], (value, value)):
            try:
                got = fast_value(desc.annotation, v, desc.parameter_info, p, None)
            except _Unsure:
                continue
            fast += 1
            kind, want = _typer_value(p, v)
            assert kind == "ok", (desc.annotation, v, want)
            assert _same(got, want), (desc.annotation, v, got, want)
    return fast


def test_the_fast_coercion_is_installed() -> None:
    assert getattr(core.build_runtime_param, "_schedsim", False)
    kinds = {repr(p.type_descriptor.annotation) for p in PARAMS}
    assert {"<class 'int'>", "<class 'float'>", "<class 'str'>",
            "<class 'pathlib.Path'>", "list[str]"} <= kinds


@pytest.mark.parametrize("value", [
    "0", "7", "-3", "007", "-0", "00", "+3", " 3", "3 ", "1_000", "3.0", "1e3", "1.5", ".5",
    "5.", "-0.0", "1E+02", "inf", "nan", "", "abc", "x.toml", "a//b", "./x", "-", "~",
    "9" * 18, "9" * 19, "9" * 40, 0, 1, -1, 2, 17, 8, 1.0, 0.5, -0.0, True, False, None,
    "1" * 17 + "." + "5" * 15])
def test_edge_values_agree(value) -> None:
    _check(value)


def test_common_values_take_the_fast_path(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text("")
    assert _check("8") and _check("1.5") and _check("data")
    assert _check(str(tmp_path / "s.toml")) and _check(str(tmp_path / "new.json"))
    assert _check(str(tmp_path))        # a directory (typer's dir_okay rule decides)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789-+._eE ", max_size=12),
                 st.text(max_size=8), st.integers(), st.floats(allow_nan=False)))
def test_random_values_agree(value) -> None:
    _check(value)


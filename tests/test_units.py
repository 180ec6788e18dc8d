"""The one rule for times as text (:mod:`schedsim.util.units`) and the names' one home
(:mod:`schedsim.program.vocab`): exact strings, and the places that print through them."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings, strategies as st

from schedsim.errors import ScenarioError
from schedsim.program.vocab import MEASURED_SEMANTICS, SEMANTICS, check_semantics
from schedsim.util.units import (
    fmt_gib,
    fmt_gib_pair,
    fmt_time,
    parse_size,
    unit_text,
    with_unit,
)


@pytest.mark.parametrize("x,text", [
    (None, "-"), (66, "66"), (66.0, "66"), (-3.0, "-3"), (0.0, "0"), (1e-12, "0"),
    (1234.5678, "1235"), (240.3775, "240.4"), (12.5, "12.5"), (0.0123456, "0.01235"),
    (19882.2, "19882"), (9999.96, "10000"), (-0.25, "-0.25"), (0.1 + 0.2, "0.3"),
    (123456.7, "123457"), (math.inf, "inf")])
def test_fmt_time_rule(x, text):
    assert fmt_time(x) == text


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_fmt_time_keeps_four_significant_digits_and_every_integer_digit(x):
    """No exponent; a whole number exact; otherwise within half a unit of the 4th
    significant digit (of the last integer digit past 4 of them)."""
    text = fmt_time(x)
    assert "e" not in text
    got = float(text)
    if abs(x - round(x)) <= 1e-9 * max(1.0, abs(x)):
        assert got == round(x)
    else:
        step = max(10.0 ** (math.floor(math.log10(abs(x))) - 3), 1.0 if abs(x) >= 1 else 0)
        assert abs(got - x) <= step / 2 * (1 + 1e-9) + 1e-15


def test_units_read_as_written():
    assert [with_unit(66.0, "slot"), with_unit(1, "slot"), with_unit(12.5, "ms")] == [
        "66 slots", "1 slot", "12.5 ms"]
    assert (unit_text("slot"), unit_text("ms", 2)) == ("slots", "ms")


def test_semantics_names_have_one_home():
    assert SEMANTICS == ("data", "eager", "rendezvous")
    assert MEASURED_SEMANTICS == ("rendezvous", "eager")
    assert check_semantics("data") == "data"
    with pytest.raises(ScenarioError, match="expected data, eager or rendezvous"):
        check_semantics("lazy")
    with pytest.raises(ScenarioError, match="expected rendezvous or eager .a measured"):
        check_semantics("data", measured=True)


def test_fb_order_flag_is_the_memory_model_rule():
    from schedsim.analysis.memory import FB_ORDERS, MemoryModel

    assert FB_ORDERS == ("alloc-then-free", "free-then-alloc")
    mm = MemoryModel.with_flags({"model": "inflight", "F": 2.0}, None, "free-then-alloc")
    assert (mm.F, mm.W, mm.fb_order) == (2.0, -1.0, "free-then-alloc")
    assert MemoryModel.with_flags(None, "inflight").B == 0.0
    with pytest.raises(ScenarioError, match="bad --fb-order 'x': expected alloc-then-free "
                                            "or free-then-alloc"):
        MemoryModel.with_flags(None, None, "x")


def test_gib_one_precision_for_a_peak_and_its_capacity():
    """A peak and the HBM it is compared with print by one rule (4 significant digits, a
    whole number bare): 80e9 bytes is 74.51 GiB, never "75"; two different counts never
    print alike."""
    assert [fmt_gib(81530000000), fmt_gib(80 * 2 ** 30), fmt_gib(80e9)] == [
        "75.93 GiB", "80 GiB", "74.51 GiB"]
    assert fmt_gib_pair(27.52 * 2 ** 30, 80e9) == ("27.52 GiB", "74.51 GiB")
    assert fmt_gib_pair(80.004 * 2 ** 30, 80 * 2 ** 30) == ("80.004 GiB", "80 GiB")
    assert fmt_gib_pair(80 * 2 ** 30, 80 * 2 ** 30) == ("80 GiB", "80 GiB")


@pytest.mark.parametrize("text,value", [
    ("76GiB", (76 * 2 ** 30, True)), ("76 gib", (76 * 2 ** 30, True)),
    ("80GB", (80e9, True)), ("1.5e3 MiB", (1500 * 2 ** 20, True)), ("512B", (512, True)),
    ("2TiB", (2 * 2 ** 40, True)), ("4", (4.0, False)), (4.5, (4.5, False)),
    ("0", (0.0, False)),            # a bare number: the caller's meaning and bounds
])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_parse_size_bare_unit_and_refusals():
    assert parse_size("76", bare=2 ** 30) == (76 * 2 ** 30, True)
    for text, msg in (("76G", "unknown unit 'G' (did you mean 'GB'?)"),
                      ("30Gb", "Gb reads as bits (bytes are GB)"),
                      ("0GiB", "must be finite and > 0"), ("-1 GiB", "must be finite"),
                      ("abc", "give a number > 0 or a size such as 76GiB"),
                      ("inf GiB", "must be finite")):
        with pytest.raises(ScenarioError, match=re.escape(msg)):
            parse_size(text, "--mem-limit")

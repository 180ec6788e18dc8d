"""How a time and its unit read for humans: the one home of both rules (every table,
message, figure label and report page prints times through :func:`fmt_time` and names
their unit through :func:`unit_text` / :func:`with_unit`). Files keep every number exact
(Timeline JSON, cost files, ``--json``); this is only what a person reads.
"""
from __future__ import annotations

import math

#: significant digits a non-whole time keeps (integer digits are never dropped)
SIGNIFICANT = 4


def fmt_time(x: float | None) -> str:
    """A time (or a difference of times) as short text, in whatever unit it has.

    The rule: ``None`` is ``-``; a whole number (within 1e-9 relative) prints without
    decimals (``66``, ``-3``, ``19882``); any other value is rounded to
    :data:`SIGNIFICANT` (4) significant digits, without an exponent and without trailing
    zeros, but never loses an integer digit: ``1234.5678 -> 1235``, ``240.3775 -> 240.4``,
    ``12.5 -> 12.5``, ``0.0123456 -> 0.01235``, ``19882.2 -> 19882``. ``inf``/``nan``
    print as Python writes them. Raises nothing."""
    if x is None:
        return "-"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    r = round(x)
    if abs(x - r) <= 1e-9 * max(1.0, abs(x)):
        return str(int(r))
    digits = max(0, SIGNIFICANT - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def unit_text(unit: str, value: float | None = None) -> str:
    """The unit's name as printed: ``slot`` takes a plural (``slots``) except for a
    ``value`` of exactly 1; other units (``ms``, ``us``) print as given. Without a
    ``value`` (a column header: ``makespan (slots)``) the plural."""
    return unit + "s" if unit == "slot" and value != 1 else unit


def with_unit(value: float, unit: str) -> str:
    """``value`` with its unit: ``66 slots``, ``1 slot``, ``12.5 ms``
    (:func:`fmt_time`, :func:`unit_text`)."""
    return f"{fmt_time(value)} {unit_text(unit, value)}"

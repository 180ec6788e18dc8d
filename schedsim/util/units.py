"""How a time, a size and their units read for humans: the one home of these rules
(every table, message, figure label and report page prints times through
:func:`fmt_time` and names their unit through :func:`unit_text` / :func:`with_unit`; a
byte count prints through :func:`fmt_gib` / :func:`fmt_gib_pair` (a table cell under a
``GiB`` header: :func:`gib_number`; a message or a page: :func:`fmt_mib`)). A time or a
size is never printed by an f-string spec of its own (``{x:.1f} ms``):
``tests/test_units_one_home.py`` checks every source. A table of times names their unit
once, in its title (:func:`unit_title`). Three figures that are not times have one rule
here too: MFU (:func:`fmt_mfu`, a percent), tokens/s/GPU (:func:`fmt_rate`,
:func:`fmt_rate_pair`) and a bubble ratio (:func:`fmt_bubble`). Files keep every number
exact (Timeline JSON, cost files, ``--json``); this is only what a person reads.
"""
from __future__ import annotations

import math

#: significant digits a non-whole time keeps (integer digits are never dropped)
SIGNIFICANT = 4


#: bytes in a GiB (the one constant: ``workload.hardware.GiB`` is this)
GIB = 2 ** 30


def fmt_time(x: float | None, significant: int = SIGNIFICANT) -> str:
    """A time (or a difference of times) as short text, in whatever unit it has.

    The rule: ``None`` is ``-``; a whole number (within 1e-9 relative) prints without
    decimals (``66``, ``-3``, ``19882``); any other value is rounded to
    :data:`SIGNIFICANT` (4) significant digits, without an exponent and without trailing
    zeros, but never loses an integer digit: ``1234.5678 -> 1235``, ``240.3775 -> 240.4``,
    ``12.5 -> 12.5``, ``0.0123456 -> 0.01235``, ``19882.2 -> 19882``. ``inf``/``nan``
    print as Python writes them. ``significant``: another digit count (>= 1). Raises
    nothing."""
    if x is None:
        return "-"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    r = round(x)
    if abs(x - r) <= 1e-9 * max(1.0, abs(x)):
        return str(int(r))
    digits = max(0, significant - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def fmt_delta(x: float, significant: int = SIGNIFICANT) -> str:
    """A signed difference of times by the rule of :func:`fmt_time`, ``+`` before a
    value that is not negative: ``2.5 -> "+2.5"``, ``-0.031253 -> "-0.03125"``,
    ``0 -> "+0"`` (an error, a move: what ``{x:+.4g}`` printed)."""
    text = fmt_time(x, significant)
    return text if text.startswith("-") else "+" + text


def unit_text(unit: str, value: float | None = None) -> str:
    """The unit's name as printed: ``slot`` takes a plural (``slots``) except for a
    ``value`` of exactly 1; other units (``ms``, ``us``) print as given. Without a
    ``value`` (a column header: ``makespan (slots)``) the plural."""
    return unit + "s" if unit == "slot" and value != 1 else unit


def with_unit(value: float, unit: str) -> str:
    """``value`` with its unit: ``66 slots``, ``1 slot``, ``12.5 ms``
    (:func:`fmt_time`, :func:`unit_text`)."""
    return f"{fmt_time(value)} {unit_text(unit, value)}"


def unit_title(title: str, unit: str) -> str:
    """A table's title with the unit its time columns are in, stated once:
    ``stalls of 1f1b (ms)``, ``slack per op (slots)`` (:func:`unit_text`)."""
    return f"{title} ({unit_text(unit)})"


def fmt_mfu(mfu: float | None) -> str:
    """MFU (a fraction of peak FLOP/s) as a percent with one decimal: ``0.3904 -> "39.0%"``,
    ``None -> "-"``. A percent, not a fraction: MFU is quoted as a percent in papers and
    in every report a person compares against (Megatron's, torchtitan's), and a percent
    with one decimal keeps the 0.1-point differences that separate two layouts."""
    if mfu is None:
        return "-"
    return f"{100 * float(mfu):.1f}%"


def fmt_rate(x: float | None, significant: int = SIGNIFICANT) -> str:
    """A rate (tokens/s/GPU) by the rule of :func:`fmt_time` (4 significant digits, never
    an integer digit lost) with a thousands separator: ``859.44 -> "859.4"``,
    ``1273.4 -> "1,273"``, ``19882.2 -> "19,882"``, ``None -> "-"``. One rule for every
    table and line, so a rate read in ``plan`` and in ``simulate`` matches digit for
    digit."""
    text = fmt_time(x, significant)
    if x is None or not math.isfinite(float(x)):
        return text
    sign, body = ("-", text[1:]) if text.startswith("-") else ("", text)
    whole, dot, frac = body.partition(".")
    return f"{sign}{int(whole):,}{dot}{frac}"


def fmt_rate_pair(a: float, b: float) -> tuple[str, str]:
    """``(fmt_rate(a), fmt_rate(b))`` for two rates compared in one line (a bound against
    the bar it falls below): more significant digits (up to 7) while two different rates
    would print alike, so that ``863.47`` against ``863.52`` never reads ``863.5, below
    863.5``; rates within a relative 1e-6 of each other (a tie, up to float noise) print
    at 4 digits, alike: the caller then says "no better than", not "below"."""
    for significant in range(SIGNIFICANT, 8):
        ta, tb = fmt_rate(a, significant), fmt_rate(b, significant)
        if ta != tb or a == b:
            return ta, tb
    return fmt_rate(a), fmt_rate(b)


def fmt_bubble(ratio: float | None) -> str:
    """A bubble ratio (idle / (ranks x makespan), or the span-based rate) as a fraction
    with 3 decimals: ``0.04394 -> "0.044"``, ``None -> "-"``. A fraction, not a percent:
    every table column and the Timeline JSON call it a ratio (``bubble ratio``,
    ``bubble_ratio``) and the papers' bubble formulas ((p - 1) / m) are fractions, so the
    figure titles read as the tables do."""
    if ratio is None:
        return "-"
    return f"{float(ratio):.3f}"


#: bytes in a MiB (a message, a page: sizes well under a GiB)
MIB = 2 ** 20


def gib_number(nbytes: float, significant: int = SIGNIFICANT) -> str:
    """A byte count in GiB without its unit (a table cell under a ``GiB`` header), by the
    rule of :func:`fmt_time`: ``81530000000 -> "75.93"``, ``80 * 2**30 -> "80"``."""
    return fmt_time(nbytes / GIB, significant)


def fmt_gib(nbytes: float, significant: int = SIGNIFICANT) -> str:
    """A byte count in GiB with its unit, by the rule of :func:`fmt_time` (4 significant
    digits, a whole number without decimals): ``81530000000 -> "75.93 GiB"``,
    ``80 * 2**30 -> "80 GiB"``, ``80e9 -> "74.51 GiB"``. Every peak and every HBM
    capacity a person compares prints through it, so both read at one precision."""
    return f"{gib_number(nbytes, significant)} GiB"


def fmt_mib(nbytes: float, significant: int = SIGNIFICANT) -> str:
    """A byte count in MiB with its unit (a P2P message, a written page), by the rule of
    :func:`fmt_time`: ``16777216 -> "16 MiB"``, ``1234567 -> "1.177 MiB"``."""
    return f"{fmt_time(nbytes / MIB, significant)} MiB"


def fmt_gib_pair(a: float, b: float) -> tuple[str, str]:
    """``(fmt_gib(a), fmt_gib(b))`` for two byte counts compared in one line (a peak and
    the HBM it must fit in): 4 significant digits, more (up to 10) while two different
    counts would print alike, so that ``80.004 GiB`` against ``80 GiB`` never reads
    ``80 GiB of 80 GiB: does NOT fit``."""
    for significant in range(SIGNIFICANT, 11):
        ta, tb = fmt_gib(a, significant), fmt_gib(b, significant)
        if ta != tb or a == b:
            break
    return ta, tb


#: the units of a size (case-insensitive here): decimal (KB, MB, GB, TB) and binary (KiB,
#: MiB, GiB, TiB) multiples of a byte, exact; the one table of them (program text's
#: ``@bytes`` suffix takes a subset, :data:`schedsim.program.ops.BYTE_UNITS`)
SIZE_UNITS: dict[str, int] = {"B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9,
                              "TB": 10 ** 12, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": GIB,
                              "TiB": 1 << 40}


def parse_size(text: str | float, what: str = "size", bare: float | None = None
               ) -> tuple[float, bool]:
    """A size as the user types it: ``"76GiB"``, ``"80 GB"``, ``"1.5e3 MiB"`` (a number
    and a unit of :data:`SIZE_UNITS`, case-insensitive, a space allowed; ``Gb``, ``Mb``
    are bits and refused) -> ``(bytes,
    True)``; a bare number (``"4"``, ``4.0``) -> ``(number, False)``, the caller's own
    meaning, or ``(number x bare, True)`` when ``bare`` (bytes per unit, e.g. ``GIB``)
    is given (a bare number without ``bare`` is returned as typed, any value: its bounds
    are the caller's). Raises :class:`~schedsim.errors.ScenarioError` naming ``what``
    for anything else, or a size that is not finite and > 0 (the one parser of sizes:
    ``simulate --mem-limit``, reusable by any other size flag)."""
    import re

    from schedsim.errors import ScenarioError

    units = ", ".join(SIZE_UNITS)
    hint = f"give a number > 0 or a size such as 76GiB or 80GB (units {units})"
    if isinstance(text, bool):
        raise ScenarioError(f"{what} {text!r}: {hint}")
    if isinstance(text, (int, float)):
        number, unit = float(text), ""
    else:
        m = re.fullmatch(r"\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?|[-+]?inf|nan)\s*([A-Za-z]*)\s*",
                         str(text))
        if m is None:
            raise ScenarioError(f"{what} {str(text)[:40]!r}: {hint}")
        try:
            number = float(m.group(1))
        except ValueError:
            raise ScenarioError(f"{what} {str(text)[:40]!r}: {hint}") from None
        unit = m.group(2)
    if not unit and bare is None:
        return number, False            # the caller's own meaning: the caller's bounds
    if not (math.isfinite(number) and number > 0):
        raise ScenarioError(f"{what} {text!r}: must be finite and > 0; {hint}")
    if not unit:
        return number * bare, True
    bits = unit[-1] == "b" and unit[:-1] != unit[:-1].lower()     # Gb, Mb: bits
    scale = None if bits else {k.lower(): v for k, v in SIZE_UNITS.items()}.get(unit.lower())
    if bits:
        raise ScenarioError(f"{what} {text!r}: {unit} reads as bits (bytes are "
                            f"{unit[:-1]}B); {hint}")
    if scale is None:
        from schedsim.util.suggest import did_you_mean

        raise ScenarioError(f"{what} {text!r}: unknown unit {unit!r}"
                            f"{did_you_mean(unit, SIZE_UNITS)}; {hint}")
    return number * scale, True

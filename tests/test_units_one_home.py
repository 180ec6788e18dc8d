"""How a time and a size read for humans has one home, schedsim/util/units.py
(``fmt_time``, ``with_unit``, ``fmt_gib``, ``fmt_gib_pair``, ``gib_number``,
``fmt_mib``): no source prints one through an f-string format spec of its own.

Two scans of every ``schedsim/**/*.py`` (by the parsed f-strings, so a spec split over
implicitly joined literals is seen, and a slice such as ``{unit[:-1]}B`` is not a spec):

* a format spec immediately followed by a time or size unit (``{x:.1f} ms``,
  ``{b / 2 ** 20:.1f} MiB``, ``{t:g} s``): the text 1234.5678 ms read ``1234.6`` in one
  place and ``1235`` (fmt_time) in another;
* a format spec followed by a unit held in a variable (``{x:.4g} {tl.unit}``);
* a format spec on a value named as a time or a size (``{r.step_ms:.1f}``,
  ``{m.peak / GiB:.2f}``: a table cell whose unit is in its column's header).

A rate (``GB/s``, ``bytes/ms``, ``tokens/s``) is not a time or a size, nor is a ratio,
a percentage, MFU or TFLOP. Three of those have a rule of their own in units.py too
(``fmt_mfu``: a percent with one decimal; ``fmt_rate``: tokens/s by the significant-digit
rule with thousands separators; ``fmt_bubble``: a ratio with 3 decimals), and a third
scan flags a spec on a value named for one of them (``{r.mfu * 100:.1f}``,
``{r.tokens_per_s_per_gpu:,.0f}``, ``{tl.bubble_ratio():.1%}``): ``plan`` printed MFU
``0.390`` where ``simulate`` printed ``39.0%``. A count written out whole with separators only
(``{n:,} bytes``, ``{limit:,} {unit}``: an input's size against its cap) rounds nothing
and is not a unit of this rule.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from schedsim.util.units import (fmt_bubble, fmt_delta, fmt_mfu, fmt_mib, fmt_rate,
                                 fmt_rate_pair, fmt_time, gib_number)

SRC = Path(__file__).resolve().parent.parent / "schedsim"

#: the time and size units a spec may not stand before (a rate such as GB/s excluded
#: by the look-ahead: a unit followed by "/")
UNIT = re.compile(r"\s?(?:ms|us|µs|ns|s|sec|GiB|MiB|KiB|TiB|GB|MB|KB|TB|B)(?![\w/])")

#: names of values that hold a time or a size (``step_ms``, ``peak_at``, ``/ GiB``)
NAMED = re.compile(r"(?:_ms|_us|_ns|_gib|_bytes|peak_at)\b|\b(?:ms|gib|GiB|GIB|MIB)\b"
                   r"|2 ?\*\* ?20")

#: names of values that hold an MFU, a tokens/s rate or a bubble ratio (fmt_mfu,
#: fmt_rate, fmt_bubble)
RATE_NAMED = re.compile(r"mfu|tokens_per_s|bubble", re.IGNORECASE)

#: the one home of those rules (where their own specs live)
HOME = "schedsim/util/units.py"

#: file:line of a spec that must stay, each with why
ALLOWED: dict[str, str] = {
    # a cost file's line (machine-readable, read back by `--cost`), not text for a
    # person: whole bytes, as `calibrate` has always written them
    "schedsim/replay/fit.py:157": "message_bytes = {self.message_bytes:.0f}",
    # a GPU preset's figure in its own unit (bytes/s, FLOP/s, a count: never a time; a
    # size in bytes prints with fmt_gib just above): the rates' own `:g`
    "schedsim/workload/hardware.py:76": "{value:g} {unit}",
}


def _unit_after(parts: list[ast.expr], i: int) -> str:
    """The unit right after ``parts[i]``: a literal one, or a ``{...unit}`` value
    (``{x:.4g} {tl.unit}``), else ``""``."""
    nxt = parts[i + 1] if i + 1 < len(parts) else None
    if isinstance(nxt, ast.Constant) and isinstance(nxt.value, str):
        if UNIT.match(nxt.value):
            return nxt.value[:6]
        if nxt.value.strip() or i + 2 >= len(parts):
            return ""
        nxt = parts[i + 2]
    if isinstance(nxt, ast.FormattedValue) and (ast.unparse(nxt.value).endswith("unit")
                                                or ast.unparse(nxt.value) == "u"):
        return " {" + ast.unparse(nxt.value) + "}"
    return ""


def _offenders(root: Path = SRC) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            parts = node.values
            for i, part in enumerate(parts):
                if not isinstance(part, ast.FormattedValue) or part.format_spec is None:
                    continue
                spec = ast.unparse(part.format_spec)[2:-1]     # f'...' -> ...
                if spec in (",", "_"):      # a whole count with separators: rounds nothing
                    continue
                after = _unit_after(parts, i)
                expr = ast.unparse(part.value)
                if RATE_NAMED.search(expr) and rel != HOME:
                    out.append(f"{rel}:{part.value.lineno}: {{{expr}:{spec}}} (fmt_mfu, "
                               f"fmt_rate, fmt_bubble)")
                    continue
                if after or NAMED.search(expr):
                    where = f"{rel}:{part.value.lineno}"
                    if where not in ALLOWED:
                        out.append(f"{where}: {{{expr}:{spec}}}{after}")
    return out


def test_no_time_or_size_printed_by_its_own_spec():
    bad = _offenders()
    assert not bad, ("print these through schedsim/util/units.py (fmt_time, with_unit, "
                     "fmt_gib, gib_number, fmt_mib):\n" + "\n".join(bad))


def test_allow_list_is_tiny_and_current():
    assert len(ALLOWED) <= 3
    for where in ALLOWED:
        rel, line = where.rsplit(":", 1)
        assert (SRC.parent / rel).is_file() and int(line) > 0


def test_the_scan_sees_each_kind(tmp_path):
    """The scan flags what it is for and nothing else (a rate, a ratio, a slice)."""
    pkg = tmp_path / "schedsim"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        'x = y = 1\n'
        's = (f"step {x:.1f} ms, "\n'
        '     f"peak {y / 2 ** 30:.2f}" " GiB")\n'
        't = f"{x:g} s, {x:.3f}, {x:.1f}%, {x:.3g} GB/s, {x:,} bytes, {x[:-1]}B"\n'
        'u = f"{r.step_ms:.1f} | {m.peak / GiB:.2f} | {m.peak_at:.1f}"\n'
        'v = f"{x:.4g} {tl.unit}, {x:.4g}{unit}, {x:+.4g}{u}, {x:.3f} {n} ranks"\n'
        'w = f"{r.mfu * 100:.1f}%, {r.tokens_per_s_per_gpu:,.0f}, {tl.bubble_ratio():.1%}"\n',
        encoding="utf-8")
    got = _offenders(pkg)
    assert got == ["schedsim/a.py:2: {x:.1f} ms, p",
                   "schedsim/a.py:3: {y / 2 ** 30:.2f} GiB",
                   "schedsim/a.py:4: {x:g} s, ",
                   "schedsim/a.py:5: {r.step_ms:.1f}",
                   "schedsim/a.py:5: {m.peak / GiB:.2f}",
                   "schedsim/a.py:5: {m.peak_at:.1f}",
                   "schedsim/a.py:6: {x:.4g} {tl.unit}",
                   "schedsim/a.py:6: {x:.4g} {unit}",
                   "schedsim/a.py:6: {x:+.4g} {u}",
                   "schedsim/a.py:7: {r.mfu * 100:.1f} (fmt_mfu, fmt_rate, fmt_bubble)",
                   "schedsim/a.py:7: {r.tokens_per_s_per_gpu:,.0f} (fmt_mfu, fmt_rate, "
                   "fmt_bubble)",
                   "schedsim/a.py:7: {tl.bubble_ratio():.1%} (fmt_mfu, fmt_rate, "
                   "fmt_bubble)"]


def test_one_rule_reads_alike():
    """The value the old specs printed three ways reads one way."""
    assert fmt_time(1234.5678) == "1235"
    assert gib_number(81530000000) == "75.93"
    assert fmt_mib(16 * 2 ** 20) == "16 MiB"
    assert fmt_mib(1234567) == "1.177 MiB"
    assert [fmt_delta(x) for x in (2.5, -0.031253, 0, 1234.5678)] == [
        "+2.5", "-0.03125", "+0", "+1235"]



def test_mfu_rate_and_bubble_read_alike():
    """One rule per quantity: MFU a percent with one decimal, tokens/s by the
    significant-digit rule with thousands separators, a bubble a ratio with 3 decimals;
    two rates compared in one line differ in print when they differ (else a tie)."""
    assert [fmt_mfu(x) for x in (0.3904, 0.39, None)] == ["39.0%", "39.0%", "-"]
    assert [fmt_rate(x) for x in (859.44, 1273.4, 19882.2, 821.0, None)] == [
        "859.4", "1,273", "19,882", "821", "-"]
    assert [fmt_bubble(x) for x in (0.04394, 6 / 66, None)] == ["0.044", "0.091", "-"]
    assert fmt_rate_pair(863.47, 863.52) == ("863.47", "863.52")
    assert fmt_rate_pair(863.49242942847, 863.49242942848) == ("863.5", "863.5")

"""Tables as data: ``--format table|csv|json`` on every command that prints a table, and
stdout kept for data while an output is ``-`` (``--json -``): the command's human text
then goes to stderr (the console of :mod:`schedsim.cli.common` asks
:func:`stdout_is_data`)."""
from __future__ import annotations

import contextvars
import json
from contextlib import contextmanager
from typing import Any, Iterator

import sys

from rich.console import Console as _RichConsole
from rich.table import Table as _RichTable

from schedsim.errors import ScenarioError


# -- stdout as data: --format csv|json, an output given as '-' ---------------------------
#: the table formats of ``--format`` (every command that prints a table)
FORMATS = ("table", "csv", "json")


class _Data:
    """What stdout carries in one command: ``fmt`` (csv/json: the tables printed, kept
    here until the end) and whether stdout is data at all (then the text goes to stderr)."""

    def __init__(self, fmt: str, to_stdout: bool, quiet: bool = False) -> None:
        self.fmt = fmt
        self.to_stdout = to_stdout or fmt != "table"
        self.quiet = quiet and fmt == "table"
        self.rows_only = False      # (rows_only: the console prints tables alone)
        self.tables: list[Any] = []


_data: contextvars.ContextVar[_Data | None] = contextvars.ContextVar(
    "schedsim_stdout_data", default=None)


def stdout_is_data() -> bool:
    """Whether this command's stdout carries data (``--format csv|json``, ``--json -``):
    then its human text is printed on stderr (:class:`schedsim.cli.common.console`)."""
    d = _data.get()
    return d is not None and d.to_stdout


def data_format() -> bool:
    """Whether ``--format`` is csv or json (then a command prints every row: no
    ``--limit``)."""
    d = _data.get()
    return d is not None and d.fmt != "table"


@contextmanager
def rows_only(on: bool = True) -> Iterator[None]:
    """While it lasts (``on``), the stdout console prints tables only, its other lines are
    dropped: a command with its own ``-q`` prints its tables under ``--format csv|json``
    this way (an explicit data format asks for the rows; ``-q`` still silences the
    human-readable lines). Outside a command (no :func:`stdout_data`): nothing."""
    d = _data.get()
    old = d.rows_only if d is not None else False
    if d is not None and on:
        d.rows_only = True
    try:
        yield
    finally:
        if d is not None:
            d.rows_only = old


def capture_table(table: Any) -> bool:
    """Keep ``table`` (a rich Table) for the data output when ``--format`` is csv or json
    (True: kept, not printed)."""
    d = _data.get()
    if d is not None and d.quiet:          # -q: the summary lines only
        return True
    if d is None or d.fmt == "table":
        return False
    d.tables.append(table)
    return True


@contextmanager
def stdout_data(fmt: str, to_stdout: bool, quiet: bool = False) -> Iterator[None]:
    """A command's run with ``--format fmt`` (one of :data:`FORMATS`) and ``to_stdout``
    (an output file is ``-``): on success, the tables it printed are written to stdout,
    one document: JSON, an object keyed by each table's stable id (:func:`tables_data`:
    ``{"ranks": {"title", "columns", "rows": [{"busy": 75402.3, ...}]}}``), or CSV (a
    header row of the column keys, then the rows; several tables: each after a line
    ``# table: ID``, a blank line between); ``quiet`` (``-q``) prints no table. Raises
    :class:`ScenarioError` for an unknown format."""
    if fmt not in FORMATS:
        from schedsim.util.suggest import did_you_mean

        raise ScenarioError(f"unknown --format {fmt!r}{did_you_mean(fmt, FORMATS)}: "
                            f"expected one of {', '.join(FORMATS)}")
    d = _Data(fmt, to_stdout, quiet)
    token = _data.set(d)
    try:
        yield
        _write_tables(d)
    except BaseException as e:     # a deadlock's exit 3 still gives the tables printed
        if getattr(e, "exit_code", None) == 3:
            _write_tables(d)
        raise
    finally:
        _data.reset(token)


class Num(str):
    """A table cell: the text a person reads (``"6938.2"``, markup allowed) carrying the
    exact number it shows (``value``): ``--format csv|json`` writes ``value``, not the
    rounded text. Make one with :func:`num`."""

    value: float | int | None

    def __new__(cls, text: str, value: float | int | None) -> "Num":
        s = super().__new__(cls, text)
        s.value = value
        return s


def num(value: float | int | None, text: str | None = None) -> Num:
    """The cell ``text`` (default: ``str(value)``; ``None``: ``-``) showing the number
    ``value``: csv/json get ``value`` exact (an integral float as an int; ``None``, a
    non-finite value: null)."""
    import math

    if text is None:
        text = "-" if value is None else str(value)
    if isinstance(value, bool) or value is None:
        v: float | int | None = None if value is None else int(value)
    elif isinstance(value, int):
        v = value
    else:
        f = float(value)
        v = None if not math.isfinite(f) else int(f) if f.is_integer() and \
            abs(f) < 2 ** 53 else f
    return Num(text, v)


def num_time(x: float | None) -> Num:
    """A time cell: :func:`schedsim.util.units.fmt_time`'s text, the exact time."""
    from schedsim.util.units import fmt_time

    return num(x, fmt_time(x))


def num_gib(nbytes: float) -> Num:
    """A cell under a GiB header: :func:`schedsim.util.units.gib_number`'s text, the exact
    GiB (``nbytes / 2**30``)."""
    from schedsim.util.units import GIB, gib_number

    return num(nbytes / GIB, gib_number(nbytes))


class DataTable(_RichTable):
    """A rich Table with what ``--format csv|json`` needs to write it for a script: a
    stable ``id`` (the table's key: ``ranks``, ``workload``, ``candidates``; the title is
    for people and varies from run to run), a ``unit`` of its time columns when it has one
    (``ms``, ``slot``), and per column a ``key`` (``add_column(header, key=...)``; default
    :func:`column_key` of the header). Cells made with :func:`num` carry exact numbers."""

    def __init__(self, id: str, *headers: Any, unit: str | None = None,
                 **kwargs: Any) -> None:
        self.data_keys: list[str | None] = []
        super().__init__(*headers, **kwargs)
        self.data_keys += [None] * (len(self.columns) - len(self.data_keys))
        self.data_id = id
        self.data_unit = unit

    def add_column(self, header: Any = "", *args: Any, key: str | None = None,
                   **kwargs: Any) -> None:
        super().add_column(header, *args, **kwargs)
        self.data_keys.append(key)


def column_key(header: str) -> str:
    """A column's key in csv/json from its header: lower case, words joined by ``_``
    (``"step ms" -> "step_ms"``, ``"tokens/s/GPU" -> "tokens_s_gpu"``, ``"#" -> "n"``,
    ``"MFU %" -> "mfu_pct"``)."""
    import re

    h = header.replace("%", " pct ").replace("#", " n ").replace("+", " plus ")
    return re.sub(r"[^a-z0-9]+", "_", h.lower()).strip("_") or "value"


#: cell texts that mean "no value" (null in json, empty in csv)
_EMPTY = ("", "-", "—", "n/a")


def _cell_value(cell: Any, text: str) -> Any:
    """A cell's value for csv/json: a :class:`Num`'s exact number; else the text as a
    number when it is one (``"12"``, ``"0.273"``, ``"1,024"``), null when it is empty or a
    dash, the text otherwise."""
    import re

    if isinstance(cell, Num):
        return cell.value
    t = text.strip()
    if t in _EMPTY:
        return None
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", t):
        t = t.replace(",", "")
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if re.fullmatch(r"-?(\d+\.\d*|\.\d+)(e[-+]?\d+)?", t, re.IGNORECASE):
        return float(t)
    return text


def table_rows(table: Any) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a rich Table as plain text (markup removed, cells whole)."""
    from rich.text import Text

    def plain(cell: Any) -> str:
        return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain

    header = [plain(c.header) for c in table.columns]
    cols = [[plain(x) for x in c.cells] for c in table.columns]
    return header, [list(r) for r in zip(*cols)]


def table_data(table: Any) -> dict[str, Any]:
    """One table as data: ``{"title", "unit" (when it has one), "columns" (the keys, in
    order), "headers" (key -> header as printed), "rows" (one {key: value} per row)}``;
    values as :func:`_cell_value` gives them (exact numbers for :func:`num` cells)."""
    from rich.text import Text

    header, rows = table_rows(table)
    given = list(getattr(table, "data_keys", []))
    given += [None] * (len(header) - len(given))
    keys: list[str] = []
    for h, k in zip(header, given):         # two columns with one key: the second _2
        keys.append(_unique(k or column_key(h), keys))
    raw = [list(c.cells) for c in table.columns]
    out_rows = []
    for i, r in enumerate(rows):
        out_rows.append({k: _cell_value(raw[j][i] if not isinstance(raw[j][i], Text)
                                        else None, r[j]) for j, k in enumerate(keys)})
    d: dict[str, Any] = {"title": table_rows_title(table)}
    if getattr(table, "data_unit", None):
        d["unit"] = table.data_unit
    d.update(columns=keys, headers=dict(zip(keys, header)), rows=out_rows)
    return d


def tables_data(tables: list[Any]) -> dict[str, dict[str, Any]]:
    """The tables of one command keyed by their stable id (:class:`DataTable`; a plain
    rich Table: ``table``); the same id twice: ``ID``, ``ID_2``, ..."""
    out: dict[str, dict[str, Any]] = {}
    for t in tables:
        out[_unique(getattr(t, "data_id", None) or "table", out)] = table_data(t)
    return out


def _unique(key: str, taken: Any) -> str:
    """``key``, or ``key_2``, ``key_3``, ... the first not in ``taken``."""
    k, n = key, 2
    while k in taken:
        k, n = f"{key}_{n}", n + 1
    return k


def _csv_cell(v: Any) -> Any:
    return "" if v is None else repr(v) if isinstance(v, float) else v


def _write_tables(d: _Data) -> None:
    import csv
    import io
    import sys

    if d.fmt == "table" or not d.tables:
        return
    data = tables_data(d.tables)
    if d.fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for i, (tid, t) in enumerate(data.items()):
            if len(data) > 1:               # several tables: each after '# table: ID'
                if i:
                    buf.write("\n")
                buf.write(f"# table: {tid}\n")
            w.writerow(t["columns"])
            w.writerows([_csv_cell(r[k]) for k in t["columns"]] for r in t["rows"])
        text = buf.getvalue()
    else:
        text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()


def table_rows_title(table: Any) -> str:
    """A rich Table's title as plain text ('' when it has none)."""
    from rich.text import Text

    t = table.title
    return "" if t is None else t.plain if isinstance(t, Text) else \
        Text.from_markup(str(t)).plain


#: columns of text printed to a pipe or a file (no terminal to fit; ``COLUMNS`` wins)
PIPE_WIDTH = 10_000


class Console(_RichConsole):
    """rich's Console with two changes. Not a terminal (``| cat``, a CI log, ``!schedsim``
    in Jupyter): :data:`PIPE_WIDTH` columns unless ``COLUMNS`` is set, so a table row
    stays whole (rich would fold and cut it at 80). While stdout carries data
    (``--format csv|json``, an output ``-``): tables are kept
    for it and the text goes to stderr."""

    @property
    def file(self) -> Any:
        if self._file is None and not self.stderr and stdout_is_data():
            return sys.stderr
        return super().file

    @file.setter
    def file(self, new_file: Any) -> None:
        self._file = new_file

    @property
    def size(self) -> Any:
        from rich.console import ConsoleDimensions

        dims = super().size
        if self._width is None and not self.is_terminal and not self.is_jupyter \
                and not self._environ.get("COLUMNS", "").isdigit():
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: Any) -> None:
        self._width, self._height = new_size

    def print(self, *objects: Any, **kwargs: Any) -> None:
        from rich.table import Table

        tables = bool(objects) and all(isinstance(o, Table) for o in objects)
        d = _data.get()
        if d is not None and d.rows_only and not self.stderr and not tables:
            return                              # (rows_only: a line, not a table)
        if tables:
            objects = tuple(o for o in objects if not capture_table(o))
            if not objects:
                return
            if self.width == PIPE_WIDTH:        # no terminal to fill: natural widths
                for o in objects:
                    o.expand = False
        super().print(*objects, **kwargs)

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
    (an output file is ``-``): on success, the tables it printed are written to stdout
    as CSV (a header row, then one row per table row; several tables are separated by an
    empty line) or JSON (a list of {column: cell}, cells as printed; several tables: an
    object keyed by table title); ``quiet`` (``-q``) prints no table. Raises
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


def table_rows(table: Any) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a rich Table as plain text (markup removed, cells whole)."""
    from rich.text import Text

    def plain(cell: Any) -> str:
        return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain

    header = [plain(c.header) for c in table.columns]
    cols = [[plain(x) for x in c.cells] for c in table.columns]
    return header, [list(r) for r in zip(*cols)]


def _write_tables(d: _Data) -> None:
    import csv
    import io
    import sys

    if d.fmt == "table" or not d.tables:
        return
    if d.fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for i, t in enumerate(d.tables):
            header, rows = table_rows(t)
            if i:
                buf.write("\n")
            w.writerow(header)
            w.writerows(rows)
        text = buf.getvalue()
    else:
        recs = {}
        for i, t in enumerate(d.tables):
            header, rows = table_rows(t)
            title = table_rows_title(t) or f"table {i + 1}"
            recs[title] = [dict(zip(header, r)) for r in rows]
        text = json.dumps(next(iter(recs.values())) if len(recs) == 1 else recs,
                          indent=1) + "\n"
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

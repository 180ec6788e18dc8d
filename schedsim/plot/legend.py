"""The legend under a Gantt figure: its entries laid out row by row in as many columns
as fit the figure's width, and a row per kind with a column per chunk when the entries
are per kind and chunk (:func:`legend_grid`). Widths are in inches, at 8 pt text."""
from __future__ import annotations

from typing import Any, Sequence

from matplotlib.figure import Figure


def row_major(handles: list[Any], ncol: int) -> list[Any]:
    """Reorder legend entries so that matplotlib's column-first layout reads row by
    row."""
    rows = -(-len(handles) // ncol)
    grid = [handles[i:i + ncol] for i in range(0, len(handles), ncol)]
    return [grid[r][c] for c in range(ncol) for r in range(rows) if c < len(grid[r])]


def legend_columns(count: int, width: float) -> int:
    """Columns for a legend of ``count`` entries under a ``width``-inch figure, balanced
    so that every row holds about as many entries."""
    most = max(1, int(width / 2.0))
    rows = -(-count // most)
    return max(1, -(-count // rows))


def _entry_inches(h: Any) -> float:
    """About how wide a legend entry is at 8 pt: 0.062 in a character, plus the swatch
    (an empty filler: nothing)."""
    return 0.062 * len(h.get_label()) + 0.6 if h.get_label() else 0.0


def _fits(entries: list[Any], ncol: int, width: float) -> bool:
    """Whether ``entries`` laid row by row in ``ncol`` columns fit ``width`` inches."""
    sizes = [_entry_inches(h) for h in entries]
    return sum(max(sizes[c::ncol], default=0.0) for c in range(ncol)) <= width - 0.3


def legend_grid(handles: list[Any], width: float) -> tuple[list[Any], int]:
    """``(entries row by row, columns)`` of a legend of ``handles`` under a
    ``width``-inch figure. Per-kind chunk entries (``legend_row``:
    :func:`~schedsim.plot.style.chunk_handles`) make a grid: each kind starts a row and
    chunk ``c`` stands in column ``c`` (a kind's row continues on the next line when all
    chunks do not fit, empty fillers padding it), then the other entries row by row;
    else as many balanced columns as the longest entries allow."""
    groups: list[list[Any]] = []
    for h in handles:
        row = getattr(h, "legend_row", None)
        if row is not None and groups and getattr(groups[-1][0], "legend_row", None) == row:
            groups[-1].append(h)
        else:
            groups.append([h])
    rows = [g for g in groups if getattr(g[0], "legend_row", None) is not None]
    rest = [h for g in groups if getattr(g[0], "legend_row", None) is None for h in g]
    if rows:
        most = max(len(r) for r in rows)
        for ncol in range(most, 0, -1):
            entries: list[Any] = []
            for r in rows:
                entries += r + [_filler() for _ in range(-len(r) % ncol)]
            entries += rest
            if _fits(entries, ncol, width) or ncol == 1:
                return entries, ncol
    ncol = 1
    for k in range(min(legend_columns(len(handles), width), len(handles)), 0, -1):
        if _fits(handles, k, width):
            ncol = k
            break
    return handles, ncol


def _filler() -> Any:
    """An empty legend entry (no swatch, no text): pads a kind's row of chunks."""
    from matplotlib.patches import Patch

    return Patch(facecolor="none", edgecolor="none", linewidth=0, label="")


def add_legend(fig: Figure, handles: list[Any], width: float, notes: Sequence[str] = ()
               ) -> None:
    """The legend under the figure, row by row (:func:`legend_grid`: a row per kind and a
    column per chunk when the entries are per kind and chunk), with ``notes`` (e.g.
    thinned arrows) as a title line, in as many columns as fit within ``width`` inches."""
    entries, ncol = legend_grid(handles, width)
    leg = fig.legend(handles=row_major(entries, ncol), loc="outside lower center", ncol=ncol,
                     fontsize=8, frameon=False)
    if notes:
        leg.set_title("; ".join(notes), prop={"size": 7.5})
        leg._legend_box.align = "center"   # noqa: SLF001 - title above the entries

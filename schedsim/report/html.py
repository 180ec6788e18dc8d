"""``schedsim report --html``: one self-contained, offline HTML file of a run.

Built with bokeh (a NumFOCUS project, BSD licence, wheels only) with **inline**
resources: bokeh's JavaScript is embedded in the file, so it opens from a disk, a mail or
an air-gapped machine with no request to any server. bokeh was chosen over plotly
because its inline bundle is about 1-2 MB where plotly.js alone is 4.6 MB (the DualPipe
report must stay under 5 MB), and because its linked ranges, hatched quads, arrow
annotations, widgets and data tables cover the whole report without custom JavaScript.

The page holds: the summary (makespan, bubble ratios, per-rank table, warnings), an
interactive Gantt chart (wheel zoom and pan along time, box zoom, reset; hovering an op
shows rank, op, microbatch, stage, start, end and the stall before it; stalls hatched,
hovering one gives its cause), a toggle for the message arrows and one for the stalls,
the activation-memory plot on the same (linked) time axis, and the stalls table.

Raises :class:`~schedsim.errors.ScenarioError` with an install hint when bokeh is
missing.
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import numpy as np

from schedsim.errors import ScenarioError
from schedsim.plot.arrows import message_arrows
from schedsim.plot.boxes import KINDS, PAD, box_colors, box_geometry, span_boxes
from schedsim.plot.memory import UNIT, memory_curves_of, selected_ranks
from schedsim.plot.style import ARROW_READY, ARROW_WAITED, default_title, stall_style
from schedsim.timeline import Timeline
from schedsim.util.units import fmt_bubble, fmt_mfu, fmt_rate, fmt_time, unit_text, with_unit

#: above this many boxes the Gantt is drawn with WebGL and without microbatch numbers
MANY_BOXES = 20_000
#: pixels beside a chart's frame (rank labels, the legend on the right, the toolbar), so
#: that the Gantt and the memory plot share one time axis position
LEGEND_PX = 330
#: most arrows the page carries (the rest are left out, the page says so)
MAX_ARROWS = 20_000
#: bokeh hatch patterns for the stall causes (matplotlib's in plot.style)
HATCH = {"//": "right_diagonal_line", "\\\\": "left_diagonal_line", "xx": "diagonal_cross",
         "..": "dot", "++": "cross", "oo": "ring", "||": "vertical_line",
         "xxxx": "diagonal_cross", "--": "horizontal_line"}


#: the page's style; every Div carries it (bokeh renders each Div in its own shadow DOM)
STYLE = """<style>
 * { font-family: system-ui, sans-serif; color: #222; }
 table.ranks { border-collapse: collapse; font-size: 13px; }
 table.ranks td, table.ranks th { border: 1px solid #ccc; padding: 2px 8px;
   text-align: right; }
 .warn { color: #a15c00; } .note { color: #555; font-size: 13px; }
 .big { font-size: 18px; }
</style>"""


def require_bokeh() -> None:
    """Raise :class:`ScenarioError` with the install command when bokeh is missing."""
    import importlib.util

    if importlib.util.find_spec("bokeh") is None:
        from schedsim.util.install import install_hint

        raise ScenarioError("the HTML report needs bokeh, which is not installed: "
                            + install_hint("report", "bokeh"))


def _hex(rgba: np.ndarray) -> list[str]:
    c = np.clip(np.round(np.asarray(rgba)[:, :3] * 255), 0, 255).astype(int)
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in c]


def _op_names(tl: Timeline) -> list[str]:
    """Program token of every span (``5W0``, ``(2F15;5BW1)``)."""
    out = []
    for s in tl.spans:
        if s.parts:
            out.append("(" + ";".join(f"{p.stage}{p.kind}{p.mb}" for p in s.parts) + ")")
        else:
            out.append(f"{s.stage}{s.kind}{s.mb}")
    return out


def _stall_before(tl: Timeline, stalls: Sequence[Any]) -> list[str]:
    """Per span: the stall that ended where it starts on its rank (cause: detail), or
    ``none (started as soon as the previous op ended)``."""
    ends = {(st.rank, round(st.end, 9)): st for st in stalls if st.end > st.start}
    out = []
    for s in tl.spans:
        st = ends.get((s.rank, round(s.start, 9)))
        out.append(f"{st.cause} for {fmt_time(st.end - st.start)}: {st.detail}" if st else
                   "none (it started as soon as the previous op ended)")
    return out


def _size(width: int | None, height: int) -> dict[str, Any]:
    """A figure's size: ``width`` CSS pixels, or (None) the window's width."""
    if width is None:
        return {"sizing_mode": "stretch_width", "height": height + 110}
    return {"frame_width": width - LEGEND_PX, "frame_height": height}


def _gantt(tl: Timeline, stalls: Sequence[Any], width: int | None
           ) -> tuple[Any, dict[str, Any]]:
    """The Gantt figure and the renderers the toggles switch."""
    from bokeh.models import ColumnDataSource, FixedTicker, HoverTool, Range1d
    from bokeh.plotting import figure

    n = tl.ranks
    bx = span_boxes(tl)
    nch = int(bx.chunk.max()) + 1 if len(bx) else 1
    y0, h = box_geometry(bx, n)
    names = _op_names(tl)
    before = _stall_before(tl, stalls)
    kind_names = [*KINDS, "?"]
    src = ColumnDataSource(dict(
        left=bx.x0, right=bx.x1, bottom=y0, top=y0 + h, color=_hex(box_colors(bx, nch)),
        rank=bx.rank, op=[names[i] for i in bx.span], part=[kind_names[k] for k in bx.kind],
        mb=bx.mb, stage=bx.stage, start=bx.x0, end=bx.x1,
        stall=[before[i] for i in bx.span]))
    many = len(bx) > MANY_BOXES
    row_px = max(14, min(34, 900 // max(n, 1)))
    fig = figure(**_size(width, n * row_px),
                 x_range=Range1d(0, max(tl.makespan,
                 1e-9), bounds="auto"), y_range=Range1d(0, n),
                 tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom",
                 active_drag="xpan", output_backend="webgl" if many else "canvas",
                 title=default_title(tl), x_axis_label=f"time ({tl.unit})")
    fig.background_fill_color = "#f4f4f4"
    fig.grid.visible = False
    ops = fig.quad(left="left", right="right", bottom="bottom", top="top", source=src,
                   fill_color="color", line_color="white", line_width=0.5 if not many else 0)
    fig.add_tools(HoverTool(renderers=[ops], tooltips=[
        ("rank", "@rank"), ("op", "@op (@part)"), ("microbatch", "@mb"), ("stage", "@stage"),
        ("start", "@start"), ("end", "@end"), ("stall before it", "@stall")]))
    if not many:
        _mb_labels(fig, bx, y0, h, ((width or LABEL_WIDTH) - LEGEND_PX)
                   / max(tl.makespan, 1e-9), row_px, nch)
    step = max(1, n // 32)
    fig.yaxis.ticker = FixedTicker(ticks=[n - 1 - r + 0.5 for r in range(0, n, step)])
    fig.yaxis.major_label_overrides = {n - 1 - r + 0.5: f"rank {r}" for r in range(0, n, step)}
    toggles: dict[str, Any] = {}
    if stalls:
        toggles["stalls"] = _stall_layers(fig, stalls, n)
    if tl.messages:
        toggles["arrows"], toggles["arrows_left_out"] = _message_layer(fig, tl)
    return fig, toggles


def _mb_labels(fig: Any, bx: Any, y0: np.ndarray, h: np.ndarray, px: float, row_px: int,
               nch: int) -> None:
    """Microbatch numbers on the boxes, only where they fit in the full view (bokeh draws
    every text glyph at every zoom level): the shortest box (``px`` pixels per time
    unit, ``row_px`` per rank row) must hold the longest number."""
    from schedsim.plot.style import text_color

    digits = len(str(int(bx.mb.max()))) if len(bx) else 1
    fits = len(bx) and float(np.min(bx.x1 - bx.x0)) * px >= 4.6 * digits + 4 \
        and row_px * float(np.min(h)) >= 10
    if fits:
        fig.text(x=(bx.x0 + bx.x1) / 2, y=y0 + h / 2, text=[str(m) for m in bx.mb],
                 text_align="center", text_baseline="middle", text_font_size="7pt",
                 text_color=[text_color(c) for c in box_colors(bx, nch)])


def _stall_layers(fig: Any, stalls: Sequence[Any], n: int) -> list[Any]:
    """Hatched stall boxes on ``fig`` (``n`` rank rows), one renderer per cause (a legend
    entry that hides it), with their hover; returns the renderers."""
    from bokeh.models import HoverTool

    st = [s for s in stalls if s.end > s.start]
    sy = np.asarray([n - 1 - s.rank + PAD for s in st])
    by = {}
    for cause in dict.fromkeys(s.cause for s in st):
        sel = [i for i, s in enumerate(st) if s.cause == cause]
        hatch, color = stall_style(cause)
        by[cause] = fig.quad(
            left=[st[i].start for i in sel], right=[st[i].end for i in sel],
            bottom=sy[sel], top=sy[sel] + 1 - 2 * PAD, fill_alpha=0, line_alpha=0,
            hatch_pattern=HATCH.get(hatch, "horizontal_line"), hatch_color=color,
            hatch_alpha=0.7, hatch_scale=8, legend_label=f"stall: {cause}")
        by[cause].data_source.data["detail"] = [st[i].detail for i in sel]
        by[cause].data_source.data["rank"] = [st[i].rank for i in sel]
    fig.add_tools(HoverTool(renderers=list(by.values()), tooltips=[
        ("rank", "@rank"), ("stall", "@left to @right"), ("why", "@detail")]))
    fig.legend.click_policy = "hide"
    fig.legend.label_text_font_size = "8pt"
    fig.add_layout(fig.legend[0], "right")      # beside the chart, not over it
    return list(by.values())


def _message_layer(fig: Any, tl: Timeline) -> tuple[list[Any], int]:
    """Message arrows (the first :data:`MAX_ARROWS`; shown at first only up to 2000) on
    ``fig``: ``([the arrow layer], how many arrows were left out)``."""
    from bokeh.models import Arrow, ColumnDataSource, VeeHead

    ar = message_arrows(tl)
    keep = np.arange(len(ar.x0))[:MAX_ARROWS]
    asrc = ColumnDataSource(dict(x0=ar.x0[keep], y0=ar.y0[keep], x1=ar.x1[keep],
                                 y1=ar.y1[keep], color=[ARROW_WAITED if w else ARROW_READY
                                                        for w in ar.waited[keep]]))
    arrow = Arrow(end=VeeHead(size=6, fill_color="color", line_color="color"),
                  x_start="x0", y_start="y0", x_end="x1", y_end="y1", source=asrc,
                  line_color="color", line_width=1, line_alpha=0.8,
                  visible=len(ar.x0) <= 2000)
    fig.add_layout(arrow)
    return [arrow], max(0, len(ar.x0) - MAX_ARROWS)


def _memory(tl: Timeline, model: Any, x_range: Any, width: int | None) -> Any:
    from bokeh.plotting import figure

    from schedsim.plot.memory import in_gib

    curves = memory_curves_of(tl, model)
    peaks = [float(v.max()) for _, v in curves]
    gib = in_gib(tl)
    fig = figure(**_size(width, 200), x_range=x_range,
                 tools="xpan,xwheel_zoom,reset", active_scroll="xwheel_zoom",
                 title="memory per rank (GiB)" if gib else "activation memory per rank",
                 x_axis_label=f"time ({tl.unit})",
                 y_axis_label="GiB" if gib else f"activations ({UNIT})")
    show = selected_ranks(peaks)
    end = max(tl.makespan, 1e-9)
    if len(show) < len(curves):
        from schedsim.plot.memory import envelope

        t, lo, hi = envelope(curves, end)
        fig.varea_step(x=t, y1=lo, y2=hi, step_mode="after", fill_color="#9ecae1",
                       fill_alpha=0.6, legend_label=f"min-max over all {len(curves)} ranks")
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    dashes = ["solid", "dashed", "dashdot", "dotted"]
    for j, r in enumerate(show):
        ts, vs = curves[r]
        fig.step(x=np.append(ts, end), y=np.append(vs, vs[-1]), mode="after",
                 line_color=palette[j % 4], line_dash=dashes[j % 4], line_width=2,
                 legend_label=f"rank {r} (peak {fmt_time(peaks[r])})")
    if gib:
        from schedsim.util.units import fmt_gib

        hbm_bytes = float(tl.workload["hbm_bytes"])          # type: ignore[attr-defined]
        hbm = hbm_bytes / 2 ** 30
        fig.line(x=[0, end], y=[hbm, hbm], line_color="#c0392b", line_dash="dashed",
                 legend_label=f"HBM {fmt_gib(hbm_bytes)}")
    fig.legend.click_policy = "hide"
    fig.legend.label_text_font_size = "8pt"
    fig.add_layout(fig.legend[0], "right")
    return fig


def _workload_html(tl: Timeline) -> str:
    """The workload's step line (empty without one)."""
    w = getattr(tl, "workload", None)
    if not isinstance(w, dict):
        return ""
    from schedsim.util.units import fmt_gib, fmt_gib_pair

    peak = max(w["peak_memory_bytes"])
    rp = w.get("peak_reserved_bytes")
    top, hbm = fmt_gib_pair(max(rp) if rp else peak, float(w["hbm_bytes"]))
    reserved = f" allocated, <b>{top}</b> reserved," if rp else ""
    fit = "fits" if w["fits"] else "does NOT fit"
    return (f"<p class='big'><b>step {with_unit(w['step_ms'], 'ms')}</b> (makespan "
            f"{fmt_time(w['makespan_ms'])} + step boundary {fmt_time(w['step_boundary_ms'])})"
            f" &nbsp; "
            f"<b>{fmt_rate(w['tokens_per_s_per_gpu'])} tokens/s/GPU</b> &nbsp; <b>MFU "
            f"{fmt_mfu(w['mfu'])}</b> &nbsp; peak <b>{fmt_gib(peak) if rp else top}</b>"
            f"{reserved} of {hbm} ({fit}) &nbsp; {html.escape(w['model'])} on "
            f"{w['gpus']} x {html.escape(w['gpu'])}</p>")


def _summary_html(tl: Timeline, warnings: Sequence[str], notes: Sequence[str]) -> str:
    from schedsim.analysis.metrics import bubble_rate_paper

    e = html.escape
    unit = unit_text(tl.unit, tl.makespan)
    warn = "".join(f"<p class='warn'>warning: {e(w)}</p>" for w in warnings)
    dead = (f"<pre class='warn'>{e(tl.deadlock.message)}</pre>" if tl.deadlock else "")
    extra = "".join(f"<p class='note'>{e(x)}</p>" for x in notes)
    stream = "no comm stream" if tl.comm_stream == "none" else f"{tl.comm_stream} comm stream"
    return f"""{STYLE}
<h1>{e(tl.schedule)}: {tl.ranks} ranks, {tl.microbatches} microbatches</h1>
<p class='big'><b>makespan {fmt_time(tl.makespan)} {e(unit)}</b> &nbsp; bubble ratio
 {fmt_bubble(tl.bubble_ratio())} (idle / (ranks x makespan)) &nbsp; span-based bubble rate
 {fmt_bubble(bubble_rate_paper(tl))} (zero-bubble paper) &nbsp; {e(tl.semantics)} semantics,
 {e(stream)}, {e(tl.source)}</p>
{_workload_html(tl)}{warn}{dead}{extra}
<p class='note'>Gantt: scroll to zoom along time, drag to pan, box-zoom from the toolbar,
double-click or reset to go back; hover an op for its rank, microbatch, stage, times and
the stall before it; click a legend entry to hide it.</p>
"""


def _ranks_html(tl: Timeline) -> str:
    rows = "".join(
        f"<tr><td>{r.rank}</td><td>{fmt_time(r.busy)}</td><td>{fmt_time(r.idle)}</td>"
        f"<td>{fmt_bubble(r.bubble_ratio)}</td>"
        f"<td>{'' if r.first_start is None else fmt_time(r.first_start)}</td>"
        f"<td>{'' if r.last_end is None else fmt_time(r.last_end)}</td></tr>"
        for r in tl.per_rank)
    return (f"{STYLE}<h2>per rank</h2><table class='ranks'><tr><th>rank</th><th>busy</th>"
            "<th>idle</th><th>bubble ratio</th><th>first start</th><th>last end</th></tr>"
            f"{rows}</table>")


def _stalls_table(stalls: Sequence[Any], width: int | None) -> Any:
    """The stalls as a sortable table; the detail cell wraps (its row is 3 lines high)."""
    from bokeh.models import ColumnDataSource, DataTable, InlineStyleSheet, TableColumn

    st = [s for s in stalls if s.end > s.start]
    src = ColumnDataSource(dict(rank=[s.rank for s in st], start=[s.start for s in st],
                                end=[s.end for s in st], length=[s.end - s.start for s in st],
                                cause=[s.cause for s in st], detail=[s.detail for s in st]))
    cols = [TableColumn(field="rank", title="rank", width=45),
            TableColumn(field="start", title="start", width=60),
            TableColumn(field="end", title="end", width=60),
            TableColumn(field="length", title="length", width=60),
            TableColumn(field="cause", title="cause", width=100),
            TableColumn(field="detail", title="detail", width=(width or LABEL_WIDTH) - 340)]
    size = {"sizing_mode": "stretch_width"} if width is None else {"width": width}
    return DataTable(source=src, columns=cols, height=420, index_position=None,
                     sortable=True, reorderable=False, row_height=64,
                     stylesheets=[InlineStyleSheet(css=WRAP_CELLS)], **size)


def _legend_html(tl: Timeline) -> str:
    """Colour swatches of the kinds (and chunks) the Gantt shows."""
    from schedsim.plot.style import KIND_COLORS, KIND_NAMES

    kinds = {p.kind for s in tl.spans for p in (s.parts or [s])}
    sw = [f"<span style='display:inline-block;width:12px;height:12px;background:{c};"
          f"margin:0 4px 0 12px;vertical-align:middle'></span>{html.escape(KIND_NAMES[k])}"
          for k, c in KIND_COLORS.items() if k in kinds]
    if any(s.parts for s in tl.spans):
        sw.append("<span style='margin-left:12px'>FB pair: forward half on top, backward "
                  "half below</span>")
    if len({s.chunk for s in tl.spans}) > 1:
        word = "directions" if tl.placement == "dual" else "chunks"
        sw.append(f"<span style='margin-left:12px'>later {word} lighter</span>")
    sw.append("<span style='margin-left:12px'>arrows: red when the receiver waited</span>")
    return f"{STYLE}<p class='note'>{''.join(sw)}</p>"


#: CSS pixels assumed for deciding where microbatch numbers fit when the page takes the
#: window's width
LABEL_WIDTH = 1300
#: table cells whose text wraps within their row (the text stays bokeh's escaped string)
WRAP_CELLS = ".slick-cell { white-space: normal; line-height: 1.25; overflow: hidden; }"


def build_layout(tl: Timeline, *, stalls: Sequence[Any] = (), memory_model: Any = None,
                 warnings: Sequence[str] = (), width: int | None = None) -> Any:
    """The report as a bokeh layout (what :func:`report_html` writes); see there."""
    require_bokeh()
    from bokeh.layouts import column, row
    from bokeh.models import CustomJS, Div, Toggle

    from schedsim.plot.memory import resolve_model

    gantt, toggles = _gantt(tl, stalls, width)
    notes = []
    if toggles.get("arrows_left_out"):
        notes.append(f"message arrows: the first {MAX_ARROWS} of "
                     f"{MAX_ARROWS + toggles['arrows_left_out']} messages are carried")
    wide = {"sizing_mode": "stretch_width"} if width is None else {"width": width}
    items: list[Any] = [Div(text=_summary_html(tl, warnings, notes), **wide)]
    buttons = []
    for key, label in (("arrows", "message arrows"), ("stalls", "stall hatching")):
        rs = toggles.get(key)
        if not rs:
            continue
        t = Toggle(label=label, active=all(r.visible for r in rs), width=160)
        t.js_on_change("active", CustomJS(args=dict(rs=rs), code=(
            "for (const r of rs) { r.visible = cb_obj.active }")))
        buttons.append(t)
    if buttons:
        items.append(row(*buttons))
    items.append(Div(text=_legend_html(tl), **wide))
    items.append(gantt)
    if tl.spans:
        items.append(_memory(tl, resolve_model(memory_model), gantt.x_range, width))
    items.append(Div(text=_ranks_html(tl), **wide))
    if stalls:
        items.append(Div(text=STYLE + "<h2>stalls</h2><p class='note'>every idle interval of every "
                              "rank with its cause (click a header to sort)</p>", **wide))
        items.append(_stalls_table(stalls, width))
    return column(*items, **wide)


def report_html(tl: Timeline, *, stalls: Sequence[Any] = (), memory_model: Any = None,
                warnings: Sequence[str] = (), title: str | None = None,
                width: int | None = None) -> str:
    """The report page of ``tl`` as one self-contained HTML string (bokeh resources
    inline; no http(s) resource is loaded when it is viewed). ``stalls``: from
    :func:`schedsim.analysis.stalls.attribute_stalls`; ``memory_model``: as for
    :func:`schedsim.plot.memory.resolve_model`; ``warnings``: one line each, shown under
    the summary; ``width`` in CSS pixels (default: the window's width, the stall details
    wrapping in their cells). Raises :class:`ScenarioError` when bokeh is
    missing."""
    layout = build_layout(tl, stalls=stalls, memory_model=memory_model, warnings=warnings,
                          width=width)
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    return file_html(layout, resources=INLINE,
                     title=title or f"schedsim report: {default_title(tl)}")

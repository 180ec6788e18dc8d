"""The plan's HTML page (``schedsim plan --html``): the top candidates, the rejections
per rule, the Pareto plot (interactive: hover a point for its candidate) and the best
candidate's timeline report (:func:`schedsim.report.html.build_layout`). One
self-contained file, bokeh resources inline."""
from __future__ import annotations

import html as _html
from typing import Any

from schedsim.plan.pareto import pareto_front
from schedsim.util.units import fmt_bubble, fmt_mfu, fmt_rate, fmt_time


def _table(res: Any, top: int) -> str:
    cols = ("#", "candidate", "stages", "microbatches", "step ms", "tokens/s/GPU", "bubble",
            "MFU", "peak GiB per rank")
    rows = []
    for i, r in enumerate(res.top(top), 1):
        cells = (str(i), r.name, str(r.stages), str(r.microbatches), fmt_time(r.step_ms),
                 fmt_rate(r.tokens_per_s_per_gpu), fmt_bubble(r.bubble_ratio), fmt_mfu(r.mfu),
                 " ".join(fmt_time(g) for g in r.peak_gib))     # GiB (the header)
        rows.append("<tr>" + "".join(f"<td>{_html.escape(c)}</td>" for c in cells) + "</tr>")
    rej = "".join(f"<tr><td>{_html.escape(k)}</td><td>{n}</td></tr>"
                  for k, n in res.rejections.counts.items())
    head = "".join(f"<th>{c}</th>" for c in cols)
    return (f"<h2>top {min(top, len(res.ranking))} of {len(res.ranking)} that fit</h2>"
            f"<table border=1 cellpadding=3 style='border-collapse:collapse'>"
            f"<tr>{head}</tr>{''.join(rows)}</table>"
            f"<p>grid {res.grid} candidates: {res.legal} legal, {res.pruned} pruned before "
            f"simulation, {res.simulated} simulated, {res.resumed} resumed</p>"
            f"<h2>candidates removed, by rule</h2><table border=1 cellpadding=3 "
            f"style='border-collapse:collapse'><tr><th>rule</th><th>removed</th></tr>"
            f"{rej}</table>")


def _pareto(res: Any, width: int) -> Any:
    from bokeh.models import ColumnDataSource, HoverTool, Span
    from bokeh.plotting import figure

    ok = [r for r in res.rows if r.status == "ok"]
    fig = figure(width=width, height=420, title="throughput against peak memory",
                 x_axis_label="peak memory on the busiest rank (GiB)",
                 y_axis_label="tokens / s / GPU", tools="pan,wheel_zoom,box_zoom,reset")
    names = sorted({r.candidate.schedule for r in ok})
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
    for i, n in enumerate(names):
        mine = [r for r in ok if r.candidate.schedule == n]
        src = ColumnDataSource(dict(
            x=[r.peak_max_gib for r in mine], y=[r.tokens_per_s_per_gpu for r in mine],
            key=[r.name for r in mine], fits=["yes" if r.fits else "no" for r in mine],
            alpha=[0.85 if r.fits else 0.25 for r in mine]))
        fig.scatter("x", "y", source=src, size=7, color=palette[i % len(palette)],
                    fill_alpha="alpha", legend_label=n)
    front = pareto_front(ok)
    if front:
        fig.step([r.peak_max_gib for r in front], [r.tokens_per_s_per_gpu for r in front],
                 mode="after", color="#444444", legend_label="Pareto front")
    fig.add_layout(Span(location=res.resolved.mem_limit_bytes / 2**30, dimension="height",
                        line_color="red", line_dash="dashed"))
    fig.add_tools(HoverTool(tooltips=[("candidate", "@key"), ("GiB", "@x{0.0}"),
                                      ("tokens/s/GPU", "@y{0.0}"), ("fits", "@fits")]))
    fig.legend.location = "bottom_right"
    return fig


def plan_html(res: Any, best_timeline: Any, top: int = 5, title: str = "",
              width: int = 1300) -> str:
    """The page of :class:`~schedsim.plan.driver.PlanResult` ``res`` (module
    docstring); ``best_timeline``: the best candidate's Timeline. Raises
    :class:`ScenarioError` when bokeh is missing."""
    from schedsim.report.html import build_layout, require_bokeh

    require_bokeh()
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import Div
    from bokeh.resources import INLINE

    head = Div(text=f"<h1>{_html.escape(title or 'schedsim plan')}</h1>"
                    f"{_table(res, top)}", width=width)
    best = Div(text=f"<h2>best: {_html.escape(res.ranking[0].name)}</h2>", width=width)
    layout = column(head, _pareto(res, width), best, build_layout(best_timeline,
                                                                  width=width))
    return file_html(layout, resources=INLINE, title=f"schedsim plan: {title}")

"""``schedsim report``: one self-contained interactive HTML page of a run."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from schedsim.cli import app
from schedsim.cli.common import (
    Phases,
    console,
    fail_deadlock,
    handle_errors,
    scenario_command,
    warn,
    warn_costs,
)
from schedsim.errors import ScenarioError
from schedsim.util.units import fmt_mib

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario


@app.command()
@handle_errors
@scenario_command(timelines=True)
def report(
    sc: Scenario,
    html_out: Annotated[Path, typer.Option(
        "--html", help="Write the report here: one self-contained HTML file that opens "
        "offline (no network at view time).")],
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress and no 'wrote' line.")] = False,
) -> None:
    """Simulate a scenario (or read a Timeline JSON) and write an interactive HTML
    report of the run.

    The page: the summary (makespan, bubble ratios, per-rank table, cost warnings), a
    Gantt chart to zoom and pan (hover an op: rank, op, microbatch, stage, start, end
    and the stall before it), toggles for the message arrows and the stall hatching,
    the activation-memory plot on the same time axis, and the stalls table. Needs
    bokeh (the 'report' extra). A Timeline JSON (from 'simulate --json', a replay or
    'import-trace') is reported as it is: no cost flags apply to it.

    Examples:
      schedsim report schedules/dualpipe-figure.toml --html dualpipe.html
      schedsim report -s 1f1b -p 8 -m 32 --semantics rendezvous --html 1f1b.html
      schedsim report measured.json --html measured.html

    Exit codes: 0 ok, 2 bad input (bokeh missing included), 3 deadlock (the report of
    what ran before it is still written).
    """
    from schedsim.scenario import Scenario
    from schedsim.analysis.stalls import attribute_stalls
    from schedsim.cli.inputs import run_input
    from schedsim.plot.memory import resolve_model
    from schedsim.report.advice import cost_warnings, run_kinds
    from schedsim.report.html import report_html, require_bokeh
    from schedsim.util.files import atomic_write_text, check_output_path

    if html_out.suffix.lower() not in (".html", ".htm"):
        raise ScenarioError(f"{html_out}: the report is HTML: use a .html name")
    check_output_path(html_out)
    require_bokeh()
    simulated = isinstance(sc, Scenario)
    with Phases(quiet) as ph:
        ph.step("simulating" if simulated else f"reading {sc.path}")
        prog, tl = run_input(sc)
        ph.step("attributing the stalls")
        stalls = attribute_stalls(tl, prog)
        ph.step("building the page")
        warnings = cost_warnings(run_kinds(tl), sc.costs, tl.schedule) if simulated else []
        page = report_html(tl, stalls=stalls, memory_model=resolve_model(sc.memory or True),
                           warnings=warnings, title=(sc.title if simulated else None) or None)
        ph.step(f"writing {html_out}")
        atomic_write_text(html_out, page)
    if simulated:
        warn_costs(sc, tl)
    if tl.deadlock is not None:
        warn(f"the program deadlocks; {html_out} shows what ran before it")
        fail_deadlock(tl, sc)
    if not quiet:
        console.print(f"wrote {html_out} ({fmt_mib(len(page.encode()))})",
                      highlight=False, markup=False)

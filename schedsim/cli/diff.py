"""``schedsim diff``: two schedules' timelines op by op (per-op start deltas, the
makespan delta; :mod:`schedsim.analysis.diff`)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from schedsim.cli import app
from schedsim.cli.analysis import JsonOpt, write_json
from schedsim.cli.common import CostOpt, MbOpt, RanksOpt, SemanticsOpt, console, handle_errors
from schedsim.cli.tables import DataTable, num_time
from schedsim.errors import ScenarioError
from schedsim.util.text import rich_escape
from schedsim.util.units import unit_title, with_unit

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario


def _load_side(spec: str, ranks: int | None, microbatches: int | None) -> Scenario:
    """A scenario from a TOML file, a schedule file (.json/.csv), a program (.txt) or a
    schedule name."""
    from schedsim.scenario import load_scenario, parse_scenario

    p = Path(spec)
    suffix = p.suffix.lower()
    if suffix == ".toml":
        return load_scenario(p)
    if suffix in (".json", ".csv"):
        return parse_scenario({"schedule": {"schedule_file": str(p.resolve())}}, spec)
    if suffix == ".txt":
        return parse_scenario({"schedule": {"program": str(p.resolve())}}, spec)
    if ranks is None or microbatches is None:
        raise ScenarioError(f"{spec!r} is not a .toml/.json/.csv/.txt file; as a schedule "
                            f"name it needs --ranks and --microbatches")
    return parse_scenario({"schedule": {"name": spec, "ranks": ranks,
                                        "microbatches": microbatches}}, spec)


@app.command()
@handle_errors(tables=True)
def diff(
    a: Annotated[str, typer.Argument(help="Schedule A: scenario .toml, schedule .json/.csv, "
                                          "program .txt or a schedule name.")],
    b: Annotated[str, typer.Argument(help="Schedule B, same forms.")],
    ranks: RanksOpt = None,
    microbatches: MbOpt = None,
    cost: CostOpt = None,
    semantics: SemanticsOpt = None,
    show_all: Annotated[bool, typer.Option(
        "--all", help="List every op, not only those that moved or shifted.")] = False,
    json_out: JsonOpt = None,
) -> None:
    """Per-op start deltas and the makespan delta of B against A (same ops, matched by
    identity, not position). Costs, links and semantics come from A's scenario (if a
    .toml), then --cost/--semantics.

    Example:
      schedsim diff schedules/1f1b.toml schedules/1f1b-megatron-figure.toml
    """
    from schedsim.sim.costs import CommModel, parse_cost_string
    from schedsim.analysis.diff import diff_timelines, moved_line
    from schedsim.sim.simulate import simulate

    sa, sb = _load_side(a, ranks, microbatches), _load_side(b, ranks, microbatches)
    costs = parse_cost_string(cost, sa.costs) if cost is not None else sa.costs
    comm = sa.comm if semantics is None else sa.comm.model_copy(
        update={"semantics": CommModel(semantics=semantics).semantics})
    tla = simulate(sa.build_program(), costs, sa.link, comm)
    tlb = simulate(sb.build_program(), costs, sa.link, comm)
    d = diff_timelines(tla, tlb)
    write_json(json_out, d.to_dict())
    rows = d.ops if show_all else [o for o in d.ops if o.moved or abs(o.delta) > 1e-9]
    u = tla.unit
    t = DataTable("moves",
                  title=rich_escape(unit_title(f"{tlb.schedule} (B) against {tla.schedule} (A)",
                                               u)))
    for col in ("rank", "op", "position A", "position B", "start A", "start B", "delta",
                "moved"):
        t.add_column(col, justify="right")
    for o in rows:
        t.add_row(str(o.rank), escape(o.op), str(o.pos_a), str(o.pos_b), num_time(o.start_a),
                  num_time(o.start_b), num_time(o.delta), "moved" if o.moved else "")
    console.print(t)
    console.print(escape(moved_line(d)), highlight=False)
    console.print(f"makespan A {with_unit(d.makespan_a, u)}, B {with_unit(d.makespan_b, u)}, "
                  f"delta [bold]{with_unit(d.makespan_delta, u)}[/]", highlight=False)

"""``schedsim search``: the best order for your costs, links, semantics and memory."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from schedsim.cli import app
from schedsim.cli.tables import DataTable, num, num_time  # noqa: F401
from schedsim.cli.analysis import write_json
from schedsim.cli.common import (
    BandwidthOpt,
    BytesOpt,
    ChunksOpt,
    CostOpt,
    LatencyOpt,
    LaunchCostOpt,
    MbOpt,
    PolicyOpt,
    RanksOpt,
    ScenarioArg,
    SemanticsOpt,
    StreamOpt,
    ThresholdOpt,
    build_scenario,
    console,
    handle_errors,
)
from schedsim.cli.compare import FbOrderOpt, MemModelOpt, _mem_text
from schedsim.cli.records import options_record
from schedsim.errors import ScenarioError
from schedsim.util.units import fmt_bubble, fmt_time, unit_text, with_unit

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from rich.table import Table

OUT_FORMATS = {".json": "schedsim JSON schedule", ".csv": "torch compute-only CSV"}

SearchPlacementOpt = Annotated[str, typer.Option(
    "--placement", help="loop (stage s on rank s mod p) | v (rank r: stages r and "
    "2p-1-r).")]
BackwardOpt = Annotated[str, typer.Option(
    "--backward", help="split (order F, B, W: zero-bubble) | fused (order F, BW).")]
SearchMemLimitOpt = Annotated[Optional[str], typer.Option(
    "--mem-limit", help="Peak activation memory allowed per rank, in microbatches' worth "
    "(the unit of 'schedsim memory'): a number, one number per rank (comma-separated), or "
    "a schedule name for its per-rank peaks (e.g. 1f1b). Default: the peak of 1F1B.")]
TimeLimitOpt = Annotated[float, typer.Option(
    "--time-limit", help="Seconds for the whole search (built-ins, solver, refinement).")]
SeedOpt = Annotated[int, typer.Option(
    "--seed", help="Seed of the solver and the local search.")]
WorkersOpt = Annotated[int, typer.Option("--workers", help="CP-SAT worker threads.")]
SearchOutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Write the best schedule: .json (schedsim schedule) or .csv (torch "
    "compute-only CSV).")]
SearchJsonOpt = Annotated[Optional[Path], typer.Option(
    "--json", help="Write the whole result (solver, refinement, table) as JSON.")]
SearchQuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Only the summary lines; no table or order.")]


def parse_mem_limit(text: str | None) -> float | list[float] | str | None:
    """``--mem-limit``: a number (every rank), numbers separated by commas (one per rank)
    or a built-in schedule's name (its per-rank peaks). Raises :class:`ScenarioError`."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        if len(parts) == 1 and parts[0]:
            return parts[0]
        raise ScenarioError(f"bad --mem-limit {text!r}: expected a number, one number per "
                            f"rank separated by commas, or a schedule name such as 1f1b") \
            from None
    if any(not v > 0 or v == float("inf") for v in vals):
        raise ScenarioError(f"bad --mem-limit {text!r}: limits must be finite numbers > 0")
    return vals[0] if len(vals) == 1 else vals


def _check_out(out: Path | None) -> None:
    if out is None:
        return
    from schedsim.util.files import check_output_path

    if out.suffix.lower() not in OUT_FORMATS:
        raise ScenarioError(f"{out}: --out writes "
                            + " or ".join(f"{k} ({v})" for k, v in OUT_FORMATS.items())
                            + f", not {out.suffix or 'a file without suffix'!r}")
    check_output_path(out)


@dataclass(frozen=True)
class SearchOptions:
    """The options of ``schedsim search`` (each one its flag, in --help order)."""

    scenario: ScenarioArg = None
    ranks: RanksOpt = None
    microbatches: MbOpt = None
    placement: SearchPlacementOpt = "loop"
    chunks: ChunksOpt = None
    backward: BackwardOpt = "split"
    cost: CostOpt = None
    latency: LatencyOpt = None
    bandwidth: BandwidthOpt = None
    message_bytes: BytesOpt = None
    semantics: SemanticsOpt = None
    comm_stream: StreamOpt = None
    eager_threshold: ThresholdOpt = None
    launch_cost: LaunchCostOpt = None
    comm_policy: PolicyOpt = None
    mem_limit: SearchMemLimitOpt = None
    memory_model: MemModelOpt = None
    fb_order: FbOrderOpt = None
    time_limit: TimeLimitOpt = 30.0
    seed: SeedOpt = 0
    workers: WorkersOpt = 2
    out: SearchOutOpt = None
    json_out: SearchJsonOpt = None
    quiet: SearchQuietOpt = False


@app.command()
@handle_errors(tables=True)
@options_record(SearchOptions)
def search(o: SearchOptions) -> None:
    """Search the per-rank order of F, B, W (or F, BW) with the least makespan for these
    costs, links, comm semantics and memory limit.

    A CP-SAT model (OR-Tools, the 'search' extra) finds the best order under
    data dependencies and link costs and says whether it is proven optimal, warm-started
    from the best built-in that fits the memory limit; a local search then runs each
    candidate order through the engine under --semantics with --comm-policy for the rest
    of the time. Prints the solver's result and bound, a table against every built-in
    schedule of the placement at the same costs, and the order.

    Examples:
      schedsim search -p 4 -m 8 --cost F=1,B=2,W=1 --time-limit 10 --out best.json
      schedsim search -p 4 -m 8 --semantics rendezvous --latency 0.5 \\
        --mem-limit 1f1b
    """
    from schedsim.analysis.memory import MemoryModel
    from schedsim.search import search as run_search

    _check_flags(o.backward, o.out, o.json_out)
    limit = parse_mem_limit(o.mem_limit)
    sc = build_scenario(o.scenario, ranks=o.ranks, microbatches=o.microbatches,
                        cost=o.cost, semantics=o.semantics, comm_stream=o.comm_stream,
                        eager_threshold=o.eager_threshold, launch_cost=o.launch_cost,
                        message_bytes=o.message_bytes, latency=o.latency,
                        bandwidth=o.bandwidth, comm_policy=o.comm_policy)
    st = _settings(sc, o.placement, o.chunks, o.backward, limit,
                   MemoryModel.with_flags(sc.memory or None, o.memory_model, o.fb_order),
                   time_limit=o.time_limit, seed=o.seed, workers=o.workers)
    with _Progress() as prog:
        res = run_search(st, prog.update)
    _print(res, st, o.quiet)
    _write(res, o.out, o.json_out)


def _check_flags(backward: str, out: Path | None,
                 json_out: Path | None) -> None:
    """Refuse bad ``search`` flags and unwritable outputs before any work. Raises
    :class:`ScenarioError`."""
    if backward not in ("split", "fused"):
        raise ScenarioError(f"unknown --backward {backward!r}: expected split or fused")
    _check_out(out)
    if json_out is not None:
        from schedsim.util.files import check_output_path

        check_output_path(json_out)


def _settings(sc: Any, placement: str, chunks: int | None, backward: str, limit: Any,
              memory: Any, **solver: Any) -> Any:
    """The :class:`~schedsim.search.SearchSettings` of the scenario ``sc`` and the
    ``search`` flags (``solver``: time_limit, seed, workers). Raises
    :class:`ScenarioError` when the size is missing."""
    from schedsim.search import SearchSettings

    p, m = sc.schedule.ranks, sc.schedule.microbatches
    if p is None or m is None:
        raise ScenarioError("search needs --ranks and --microbatches (or a scenario "
                            "with them)")
    return SearchSettings(
        ranks=p, microbatches=m, placement=placement,
        chunks=(2 if placement == "v" else 1) if chunks is None else chunks,
        fused=backward == "fused",
        costs=sc.costs, link=sc.link, comm=sc.comm, policy=sc.schedule.comm_policy or "async",
        memory=memory, limit=limit, **solver)


class _Progress:
    """One live status line (best so far, bound) on a terminal; silent otherwise."""

    def __init__(self) -> None:
        self.status: Any = None
        self.best: dict[str, Any] = {}

    def __enter__(self) -> _Progress:
        if console.is_terminal:
            self.status = console.status("search: running the built-in schedules")
            self.status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def update(self, phase: str, info: dict[str, Any]) -> None:
        from rich.markup import escape

        if self.status is None:
            return
        self.best.update(info)
        b = self.best
        if phase == "solver":
            text = (f"solver: best {fmt_time(b.get('best', b.get('model_makespan')))}, "
                    f"bound {fmt_time(b.get('bound'))} "
                    f"({fmt_time(round(b.get('seconds', 0.0), 1))} s)")
        elif phase == "refine":
            text = (f"refinement: best {fmt_time(b.get('best'))} after "
                    f"{b.get('evals', 0)} simulations")
        else:
            text = "search: running the built-in schedules"
        self.status.update(escape(text))


def _print(res: Any, st: Any, quiet: bool) -> None:
    from rich.markup import escape

    s = res.solver
    u = res.timeline.unit

    def wu(x: float | None) -> str:         # a time with its unit ('-' for none)
        return fmt_time(x) if x is None else with_unit(x, u)

    pl = res.schedule.placement
    console.print(f"search: {pl.ranks} ranks x {res.schedule.microbatches} microbatches, "
                  f"{pl.kind} placement ({pl.stages} stages), "
                  f"{'F, BW' if st.fused else 'F, B, W'}; {st.comm.semantics} semantics, "
                  f"{st.policy} comm policy; memory limit per rank "
                  f"{_spread(res.limit)} ({_mem_text(st.memory)})", highlight=False,
                  soft_wrap=True)
    if s is not None and s.makespan is not None:
        gap = "" if s.optimal else (f", gap {100 * (s.makespan - s.bound) / s.makespan:.1f}%"
                                    if s.makespan > 0 else "")
        console.print(
            f"solver (data dependencies + link costs): makespan [bold]{with_unit(s.makespan, u)}"
            f"[/], lower bound {with_unit(s.bound, u)}, "
            + ("[bold green]proven optimal[/]" if s.optimal else f"not proven{gap}")
            + f" ({escape(s.status)}, {with_unit(s.wall, 's')}; warm start "
            f"{escape(res.warm_start)} "
            f"at {wu(res.warm_start_model_makespan)})", highlight=False,
            soft_wrap=True)
    else:
        console.print(f"solver: no solution in time ({escape(s.status)}, {with_unit(s.wall, 's')}; "
                      f"lower bound {with_unit(s.bound, u)}; warm start "
                      f"{escape(res.warm_start)} at "
                      f"{wu(res.warm_start_model_makespan)})", highlight=False,
                      soft_wrap=True)
    if res.refined:
        how = "converged" if res.converged else "stopped by the time limit"
        console.print(
            f"refinement under {st.comm.semantics} ({st.policy} policy) from "
            f"{escape(' and '.join(res.starts))}"
            + (f" (the solver's order simulates at {with_unit(res.solver_sim_makespan, u)})"
               if res.solver_sim_makespan is not None else "")
            + f": best from {escape(res.start_label)}; {res.evals} simulations, "
            f"{res.improvements} improvements, {how}", highlight=False, soft_wrap=True)
    else:
        console.print("refinement: not needed (data semantics without contention is the "
                      "solver's own model, and its order is proven optimal)",
                      highlight=False, soft_wrap=True)
    console.print(f"best: makespan [bold]{fmt_time(res.makespan)}[/] "
                  f"{unit_text(u, res.makespan)}, "
                  f"bubble ratio {fmt_bubble(res.bubble)}, peak activation {_spread(res.peak)}",
                  highlight=False)
    if quiet:
        return
    console.print(_table(res, st))
    for name, why in res.baselines.skipped.items():
        console.print(f"skipped {escape(name)}: {escape(why)}", highlight=False,
                      soft_wrap=True)
    _print_order(res.schedule.ranks)


#: ops per rank up to which the order is printed whole; past it, each rank's first and
#: last ops (the full order is in the --out file)
ORDER_OPS_SHOWN = 64


def _print_order(ranks: list) -> None:
    console.print("order:", highlight=False)
    for r, row in enumerate(ranks):
        ops = [str(op) for op in row]
        if len(ops) > ORDER_OPS_SHOWN:
            half = ORDER_OPS_SHOWN // 4
            ops = ops[:half] + [f"... ({len(ops) - 2 * half} more; all in --out)"] + ops[-half:]
        console.print(f"  rank {r}: " + " ".join(ops), highlight=False, soft_wrap=True)


def _spread(v: list[float]) -> str:
    lo, hi = min(v), max(v)     # (csv/json: the highest, exact)
    return num(hi, fmt_time(lo) if abs(hi - lo) < 1e-9 else f"{fmt_time(lo)}..{fmt_time(hi)}")


def _table(res: Any, st: Any) -> Table:
    from rich.markup import escape

    t = DataTable("builtins",
                  title=f"against the built-in schedules ({st.comm.semantics} semantics, "
                        f"{st.policy} policy; makespan in {unit_text(res.timeline.unit)})")
    for col in ("schedule", "makespan", "bubble", "peak act", "fits limit", "vs search"):
        t.add_column(col, justify="left" if col == "schedule" else "right")
    t.add_row("[bold]search[/]", num(res.makespan, f"[bold]{fmt_time(res.makespan)}[/]"),
              num(res.bubble, fmt_bubble(res.bubble)),
              _spread(res.peak), "yes", "")
    rows = sorted(res.baselines.rows, key=lambda b: (b.makespan is None, b.makespan or 0.0))
    for b in rows:
        if b.makespan is None:
            t.add_row(escape(b.label), "-", "-", "-", "-", escape(b.note))
            continue
        rel = (b.makespan - res.makespan) / res.makespan * 100 if res.makespan else 0.0
        t.add_row(escape(b.label), num_time(b.makespan),
                  num(b.bubble, fmt_bubble(b.bubble)), _spread(b.peak), "yes" if b.fits else "no",
                  num(rel / 100, f"{rel:+.1f}%"))
    return t


def _write(res: Any, out: Path | None, json_out: Path | None) -> None:
    from rich.markup import escape
    from schedsim.util.files import output_group

    with output_group() as outs:
        if out is not None:
            if out.suffix.lower() == ".csv":
                from schedsim.interop.torch_format import schedule_to_torch_csv

                text = schedule_to_torch_csv(res.schedule)
            else:
                text = res.schedule.model_dump_json(indent=1) + "\n"
            outs.path(out).write_text(text)
        if json_out is not None:
            write_json(outs.path(json_out), res.to_dict())
    if out is not None:
        console.print(f"wrote {escape(str(out))}", highlight=False)

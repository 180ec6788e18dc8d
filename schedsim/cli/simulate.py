"""``schedsim simulate``, ``schedsim list`` and ``schedsim generate``."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from schedsim.cli import app
from schedsim.cli.tables import DataTable, num, num_time  # noqa: F401
from schedsim.cli.common import (
    BandwidthOpt,
    BytesOpt,
    ChunksOpt,
    CostOpt,
    LatencyOpt,
    MbOpt,
    MemLimitOpt,
    ParamOpt,
    Phases,
    PolicyOpt,
    RanksOpt,
    ScheduleOpt,
    VariantOpt,
    build_scenario,
    console,
    fail,
    fail_deadlock,
    handle_errors,
    scenario_command,
    warn_costs,
    write_text_out,
)
from schedsim.cli.inputs import simulate_scenario
from schedsim.cli.options import (
    ArrowsOpt,
    DetailOpt,
    GanttOpt,
    HighlightOpt,
    MemoryOpt,
    ShowRanksOpt,
    StallsOpt,
    WindowOpt,
)
from schedsim.cli.records import options_record
from schedsim.cli.tables import data_format, rows_only
from schedsim.cli.workload import (
    GpuOpt,
    ModelOpt,
    print_workload,
    with_workload,
    workload_line,
)
from schedsim.errors import ScenarioError
from schedsim.util.text import rich_escape
from schedsim.util.units import fmt_bubble, fmt_time, unit_text, unit_title, with_unit

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from rich.table import Table
    from schedsim.scenario import Scenario
    from schedsim.timeline import Timeline

CostsFileOpt = Annotated[Optional[Path], typer.Option(
    "--costs-file", help="Cost file (TOML \\[costs]/\\[link], \\[comm] launch_cost, e.g. "
    "from 'schedsim calibrate'); its tables replace the scenario's (and these flags), its "
    "launch_cost the scenario's.")]
TimelineJsonOpt = Annotated[Optional[Path], typer.Option(
    "--json", help="Write the Timeline JSON (written even on deadlock).")]
TraceOpt = Annotated[Optional[Path], typer.Option(
    "--trace", help="Write a Perfetto / Chrome trace JSON ('-': stdout).")]
QuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Print only the one-line result (makespan, bubble ratio); no "
    "table (--format csv|json: the rows still), no progress.")]


def result_line(tl: Timeline) -> str:
    """The one-line result: makespan (in the unit) and bubble ratio."""
    unit = unit_text(tl.unit, tl.makespan)
    return (f"makespan {fmt_time(tl.makespan)} {rich_escape(unit)}   bubble ratio "
            f"{fmt_bubble(tl.bubble_ratio())} "
            f"(idle / (ranks x makespan))")


def print_summary(tl: Timeline) -> None:
    """Print the per-rank summary table and the makespan line."""
    how = (f"measured on {tl.semantics}" if tl.source == "measured"
           else f"{tl.semantics} semantics")
    t = DataTable("ranks",
                  title=rich_escape(unit_title(
                      f"{tl.schedule}: {tl.ranks} ranks x {tl.microbatches} microbatches, {how}"
                      + ("" if tl.comm_stream == "none" else f", {tl.comm_stream} stream"),
                      tl.unit)),
                  unit=tl.unit)
    for col in ("rank", "busy", "idle", "bubble ratio", "first start", "last end"):
        t.add_column(col, justify="right")
    for r in tl.per_rank:
        t.add_row(str(r.rank), num_time(r.busy), num_time(r.idle),
                  num(r.bubble_ratio, fmt_bubble(r.bubble_ratio)),
                  num_time(r.first_start),
                  num_time(r.last_end))
    console.print(t)
    console.print(result_line(tl), highlight=False)
    from schedsim.analysis.metrics import bubble_rate_paper, stage_spans

    console.print(f"span-based bubble rate {fmt_bubble(bubble_rate_paper(tl))} (zero-bubble "
                  f"paper: (span - busy) / span, span "
                  f"{with_unit(max(stage_spans(tl), default=0.0), tl.unit)})", highlight=False)


@dataclass(frozen=True)
class SimulateOptions:
    """The options of ``schedsim simulate`` after the shared scenario flags (each one its
    flag, in --help order)."""

    costs_file: CostsFileOpt = None
    gantt: GanttOpt = None
    json_out: TimelineJsonOpt = None
    trace: TraceOpt = None
    arrows: ArrowsOpt = False
    memory: MemoryOpt = False
    stalls: StallsOpt = False
    detail: DetailOpt = False
    highlight: HighlightOpt = None
    window: WindowOpt = None
    show_ranks: ShowRanksOpt = None
    quiet: QuietOpt = False
    model: ModelOpt = None
    gpu: GpuOpt = None


@app.command()
@handle_errors(tables=True)
@scenario_command
@options_record(SimulateOptions)
def simulate(sc: Scenario, o: SimulateOptions) -> None:
    """Simulate a schedule and print makespan, per-rank busy/idle and bubble ratio (with
    a \\[workload]: step ms, tokens/s/GPU, MFU and GiB per rank).

    Examples:
      schedsim simulate schedules/dualpipe-figure.toml --gantt dualpipe.png
      schedsim simulate -s 1f1b -p 4 -m 8 --cost F=1,BW=2 -q
      schedsim simulate -s dualpipe -p 8 -m 20 --cost F=1,B=1,W=1,BW=2,FB=3
      schedsim simulate --program prog.txt -p 2 --stages 4 --semantics rendezvous

    A warning (stderr) names costs that are probably not what you meant (e.g. B given
    but not BW for a schedule that runs full backwards). Exit codes: 0 ok, 2 bad input,
    3 deadlock (the wait-for cycle is printed with a fix when one is found; --json is
    still written).
    """
    sc = with_workload(sc, model=o.model, gpu=o.gpu)
    if o.costs_file is not None:
        from schedsim.scenario import apply_costs_file

        sc = apply_costs_file(sc, o.costs_file)
    from schedsim.cli.options import gantt_options

    view = gantt_options(False, False, False, o.highlight, o.window, o.show_ranks)
    _check_outputs(sc, o.gantt, o.json_out, o.trace,
                   o.arrows or o.memory or o.stalls or o.detail or len(view) > 3, o.detail)
    with Phases(o.quiet) as ph:
        ph.step("building the program")
        prog = sc.build_program()
        ph.step(f"simulating {prog.num_instructions():,} instructions")
        tl, wres = simulate_scenario(prog, sc)
        if sc.stage_costs() is not None and (o.json_out or o.trace or o.detail):
            from schedsim.sim.pieces import attach_pieces

            ph.step("attaching the compute and collective pieces")
            attach_pieces(tl, sc.stage_costs())     # only these outputs show them
        _write_outputs(ph, sc, tl, o.gantt, o.json_out, o.trace,
                       (o.arrows, o.memory, o.stalls, o.detail), view)
        if tl.deadlock is not None:
            ph.step("looking for a fix of the deadlock")
            warn_costs(sc, tl)
            fail_deadlock(tl, sc)
    warn_costs(sc, tl)
    if not o.quiet or data_format():        # -q --format csv|json: the rows alone
        with rows_only(o.quiet):
            print_summary(tl)
            if sc.stage_costs() is not None:
                from schedsim.cli.collectives import print_stage_costs

                print_stage_costs(sc, prog.placement.stages, tl)
            if wres is not None:
                print_workload(wres)
    if o.quiet:
        console.print(result_line(tl), highlight=False)
        if wres is not None:
            console.print(workload_line(wres), highlight=False)


def _check_outputs(sc: Scenario, gantt: Path | None, json_out: Path | None,
                   trace: Path | None, drawing: bool, detail: bool) -> None:
    """Refuse bad output flags of ``simulate`` before simulating (``drawing``: a Gantt
    option was given). Raises :class:`ScenarioError`."""
    from schedsim.util.files import check_output_path

    if gantt is not None:
        from schedsim.cli.options import check_figure_path

        check_figure_path(gantt)
    elif drawing:
        raise ScenarioError("--arrows, --memory, --stalls, --detail, --highlight, --window "
                            "and --show-ranks draw on the Gantt chart: add --gantt FILE.png")
    if detail and sc.stage_costs() is None:
        raise ScenarioError("--detail draws the pieces of the stage model: add a [model] "
                            "table to the scenario (docs/stage-model.md)")
    if trace is not None and trace.suffix.lower() != ".json" and str(trace) != "-":
        raise ScenarioError(f"{trace}: a Perfetto/Chrome trace is JSON: use a .json name "
                            f"(or - for stdout)")
    for out in (json_out, gantt, trace):
        if out is not None:
            check_output_path(out)       # fail before simulating, not after


def _write_outputs(ph: Phases, sc: Scenario, tl: Timeline, gantt: Path | None,
                   json_out: Path | None, trace: Path | None,
                   draw_flags: tuple[bool, bool, bool, bool], view: dict | None = None
                   ) -> None:
    """Write the outputs of ``simulate`` all together, or none (a trace: only of a run
    that completed). ``draw_flags``: arrows, memory, stalls, detail; ``view``: the
    highlight, window and ranks of :func:`~schedsim.cli.options.gantt_options`."""
    from schedsim.util.files import output_group

    with output_group() as outs:
        if json_out:
            ph.step(f"writing {json_out}")
            tl.write_json(outs.path(json_out))
        if gantt:
            ph.step(f"drawing {gantt}")
            _draw(sc, tl, outs.path(gantt), *draw_flags, view=view)
        if trace and tl.deadlock is None:
            from schedsim.interop.perfetto import write_trace

            ph.step(f"writing {trace}")
            write_trace(outs.path(trace, ".json"), [tl])     # ('-': stdout)


def _draw(sc: Scenario, tl: Timeline, path: Path, arrows: bool, memory: bool,
          stalls: bool, detail: bool = False, view: dict | None = None) -> None:
    """The Gantt chart of ``tl`` (a deadlocked run: what ran before it) to ``path``."""
    from schedsim.cli.options import gantt_options
    from schedsim.plot import gantt as draw, resolve_model, save_figure

    model = resolve_model(sc.memory or True) if memory else None
    opts = {**(view or {}), **gantt_options(arrows, model, stalls)}
    if detail:
        opts["detail"] = True
    save_figure(draw(tl, **opts), path)


def _flag(param: str) -> str:
    """How a generator parameter is given on the command line."""
    if param in ("chunks", "variant", "mem_limit"):
        return "--" + param.replace("_", "-")
    if param in ("costs", "link"):
        return f"plans with --{'cost' if param == 'costs' else 'latency/--bandwidth'}"
    return f"--param {param}=..."


@app.command("list")
@handle_errors(limits=False, tables=True)
def list_schedules() -> None:
    """List the schedules (placement, parameters, constraints, source), the comm
    policies with their --param keys, and the comm semantics."""
    from rich.markup import escape
    from schedsim.generators import GENERATORS, names

    t = DataTable("schedules",
                  title="schedules (schedsim simulate --schedule NAME ...)", show_lines=True,
                  expand=True)
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("what, placement, parameters, constraints, source", ratio=1)
    for n in names():
        g = GENERATORS[n]
        lines = [escape(g.summary), f"[dim]placement:[/] {escape(g.placement)}",
                 f"[dim]constraints:[/] {escape(g.constraints)}"]
        lines += [f"[dim]{_flag(k)}:[/] {escape(v)}" for k, v in g.params.items()]
        lines.append(f"[dim]source:[/] {escape(g.source)}")
        t.add_row(n, "\n".join(lines))
    console.print(t)
    console.print(_policies_table())
    console.print(_semantics_table())


def _policies_table() -> Table:
    """The comm policies (schedsim.program.lower.POLICIES): summary and --param keys."""
    from rich.markup import escape
    from schedsim.program.lower import POLICIES, policy_names

    t = DataTable("comm_policies",
                  title="comm policies (--comm-policy NAME; parameters: --param KEY=VALUE)",
                  show_lines=True, expand=True)
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("what it imitates, parameters", ratio=1)
    for n in policy_names():
        pol = POLICIES[n]
        lines = [escape(pol.summary)]
        kinds = inspect.signature(pol.fn).parameters
        lines += [f"[dim]--param {k}={_param_values(kinds[k].annotation)}:[/] {escape(v)}"
                  for k, v in pol.params.items()]
        t.add_row(n, "\n".join(lines))
    return t


def _param_values(annotation: object) -> str:
    """How a policy parameter's value is written (``true|false`` for a bool)."""
    return "true|false" if "bool" in str(annotation) else "VALUE"


def _semantics_table() -> Table:
    """The comm semantics (--semantics NAME) and what each means."""
    from rich.markup import escape
    from schedsim.program.vocab import SEMANTICS_SUMMARY

    t = DataTable("semantics",
                  title="comm semantics (--semantics NAME; docs/comm-semantics.md)",
                  show_lines=True, expand=True)
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("how P2P ops complete", ratio=1)
    for n, what in SEMANTICS_SUMMARY.items():
        t.add_row(n, escape(what))
    return t


GenerateNameArg = Annotated[Optional[str], typer.Argument(
    help="Schedule name (see 'schedsim list'); or -s NAME, as simulate takes it.",
    show_default=False)]
GenerateFormatOpt = Annotated[str, typer.Option(
    "--format", "-f", help="program (text, comm included) | json (schedsim schedule) | "
    "program-json | torch-csv | torch-csv-comms")]
GenerateOutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Output file (default: stdout).")]


@dataclass(frozen=True)
class GenerateOptions:
    """The options of ``schedsim generate`` (each one its flag, in --help order)."""

    name: GenerateNameArg = None
    schedule: ScheduleOpt = None
    ranks: RanksOpt = None
    microbatches: MbOpt = None
    chunks: ChunksOpt = None
    variant: VariantOpt = None
    mem_limit: MemLimitOpt = None
    param: ParamOpt = None
    comm_policy: PolicyOpt = None
    cost: CostOpt = None
    latency: LatencyOpt = None
    bandwidth: BandwidthOpt = None
    message_bytes: BytesOpt = None
    fmt: GenerateFormatOpt = "program"
    out: GenerateOutOpt = None


@app.command()
@handle_errors
@options_record(GenerateOptions)
def generate(o: GenerateOptions) -> None:
    """Generate a schedule and write it as a program, JSON schedule or torch CSV.

    The cost and link flags matter only for planners whose order depends on them
    (zb-1p, zb-2p, zbv).

    Examples:
      schedsim generate dualpipev -p 4 -m 8
      schedsim generate zb-h1 -p 4 -m 8 --format torch-csv --out zb-h1.csv
    """
    from schedsim.util.files import check_output_path

    if o.name is not None and o.schedule is not None and o.name != o.schedule:
        fail(f"two schedules named: {o.name!r} and -s {o.schedule!r}: give one")
    name = o.name if o.name is not None else o.schedule
    if name is None:
        fail("generate needs a schedule: schedsim generate NAME -p P -m M, or -s NAME "
             "(see 'schedsim list')")
    if o.ranks is None or o.microbatches is None:
        fail("generate needs --ranks and --microbatches")
    if o.fmt not in ("program", "program-json", "json", "torch-csv", "torch-csv-comms"):
        fail(f"unknown --format {o.fmt!r}: expected program, json, program-json, torch-csv or "
             f"torch-csv-comms")
    if o.out is not None and str(o.out) != "-":
        check_output_path(o.out)
    sc = build_scenario(None, schedule=name, ranks=o.ranks, microbatches=o.microbatches,
                        chunks=o.chunks, variant=o.variant, mem_limit=o.mem_limit,
                        param=o.param, comm_policy=o.comm_policy, cost=o.cost,
                        latency=o.latency, bandwidth=o.bandwidth,
                        message_bytes=o.message_bytes)
    prog = sc.build_program()
    if o.fmt == "program":
        text = prog.to_text()
    elif o.fmt == "program-json":
        text = prog.model_dump_json(indent=1) + "\n"
    elif o.fmt == "json":
        text = prog.schedule().model_dump_json(indent=1) + "\n"
    else:
        from schedsim.interop.torch_format import (
            program_to_torch_csv,
            schedule_to_torch_csv,
            torch_actions_to_csv,
        )

        actions = _torch_actions(sc) if o.fmt == "torch-csv-comms" else None
        text = (schedule_to_torch_csv(prog.schedule()) if o.fmt == "torch-csv"
                else program_to_torch_csv(prog) if actions is None
                else torch_actions_to_csv(actions))
    write_text_out(o.out, text)


def _torch_actions(sc: Scenario) -> list | None:
    """Under ``--comm-policy torch``: torch's own action list of the scenario's compute
    order (:func:`~schedsim.program.torch_runtime.torch_actions`, ``OVERLAP_F_B`` pairs
    kept), built from the order before lowering (the lowered program runs a pair as its
    two parts unless ``overlap_f_b``); None for another policy or a schedule torch runs
    as ``Schedule1F1B``/``ScheduleGPipe``."""
    from schedsim.program.lower import get_policy
    from schedsim.program.torch_runtime import torch_actions

    s = sc.schedule
    if s.comm_policy != "torch":
        return None
    names = get_policy("torch").params
    params = s.generator_params()
    bare = s.model_copy(update={"comm_policy": None})
    bare = type(s)(**{k: v for k, v in bare.model_dump().items() if k not in names})
    sched = sc.model_copy(update={"schedule": bare}).build_program().schedule()
    return torch_actions(sched, **{k: params[k] for k in names if k in params})

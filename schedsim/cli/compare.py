"""``schedsim compare``, ``schedsim diff`` and ``schedsim memory``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from schedsim.cli import app
from schedsim.cli.tables import DataTable, num, num_time  # noqa: F401
from schedsim.cli.analysis import JsonOpt, run_scenario, write_json
from schedsim.cli.common import (
    BandwidthOpt,
    BytesOpt,
    ChunksOpt,
    CostOpt,
    InitCostOpt,
    LatencyOpt,
    LaunchCostOpt,
    LazyInitOpt,
    MbOpt,
    ParamOpt,
    Phases,
    PolicyOpt,
    RanksOpt,
    SemanticsOpt,
    StreamOpt,
    ThresholdOpt,
    VariantOpt,
    console,
    fail,
    fail_deadlock,
    handle_errors,
    key_values,
    scenario_command,
)
from schedsim.cli.options import GanttOpt
from schedsim.cli.records import options_record
from schedsim.cli.outputs import check_outputs
from schedsim.cli.tables import data_format
from schedsim.util.text import rich_escape
from schedsim.util.units import fmt_bubble, fmt_time, unit_title, with_unit

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.analysis.memory import MemoryModel
    from schedsim.scenario import Scenario
    from schedsim.sim.costs import CostModel

MemModelOpt = Annotated[Optional[str], typer.Option(
    "--memory-model", help="Activation memory model: zb (default; F +1, B -1/2, W -1/2, "
    "BW -1) or inflight (F +1, W/BW -1).")]
FbOrderOpt = Annotated[Optional[str], typer.Option(
    "--fb-order", help="How an overlapped FB pair counts: alloc-then-free (default) or "
    "free-then-alloc.")]

SchedulesOpt = Annotated[Optional[str], typer.Option(
    "--schedules", help="Comma-separated schedule names, each with optional :KEY=VALUE "
    "parameters, e.g. interleaved-1f1b:chunks=4,zbv,dualpipe (default: every registered "
    "schedule that accepts the size).")]
PerRankCostsOpt = Annotated[bool, typer.Option(
    "--per-rank-costs/--per-op-costs", help="Per rank (default): the costs are one rank's "
    "share of the model, so every schedule does equal model work per rank and a schedule "
    "with S stages on P ranks runs each op at P/S of them. Per op: every op costs the "
    "given cost whatever the stages per rank (how DualPipe's table counts DualPipeV's 2P "
    "stages).")]
JobsOpt = Annotated[int, typer.Option(
    "--jobs", "-j", min=0, help="Worker processes (0: one per CPU when the sweep is large; "
    "1: none).")]
CompareScenarioOpt = Annotated[Optional[Path], typer.Option(
    "--scenario", help="The scenario file, as the argument (kept for old command lines).")]
ModelOverlapOpt = Annotated[Optional[str], typer.Option(
    "--model-overlap", help="With a --scenario that has a \\[model]: compare once per "
    "overlap mode (e.g. none,fb; costs derived by the stage model) and print each "
    "schedule's makespan gain over the first mode.")]


CompareArg = Annotated[Optional[Path], typer.Argument(
    help="Scenario TOML file: its ranks, microbatches, costs, link, comm and \\[memory] "
    "(its \\[schedule] name is compared only when --schedules names it).",
    show_default=False, metavar="SCENARIO")]
CompareMemoryOpt = Annotated[bool, typer.Option(
    "--memory", help="--gantt: an activation-memory panel under each schedule's chart "
    "(the memory model of --memory-model).")]
CompareQuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="One line per schedule (makespan, bubble ratio); no table "
    "(--format csv|json: the rows still), no progress.")]


@dataclass(frozen=True)
class CompareOptions:
    """The options of ``schedsim compare`` (each one its flag, in --help order)."""

    scenario_arg: CompareArg = None
    ranks: RanksOpt = None
    microbatches: MbOpt = None
    cost: CostOpt = None
    schedules: SchedulesOpt = None
    chunks: ChunksOpt = None
    variant: VariantOpt = None
    param: ParamOpt = None
    comm_policy: PolicyOpt = None
    semantics: SemanticsOpt = None
    comm_stream: StreamOpt = None
    eager_threshold: ThresholdOpt = None
    launch_cost: LaunchCostOpt = None
    lazy_init: LazyInitOpt = None
    init_cost: InitCostOpt = None
    message_bytes: BytesOpt = None
    latency: LatencyOpt = None
    bandwidth: BandwidthOpt = None
    memory_model: MemModelOpt = None
    fb_order: FbOrderOpt = None
    per_rank_costs: PerRankCostsOpt = True
    jobs: JobsOpt = 0
    scenario: CompareScenarioOpt = None
    model_overlap: ModelOverlapOpt = None
    json_out: JsonOpt = None
    gantt: GanttOpt = None
    memory: CompareMemoryOpt = False
    quiet: CompareQuietOpt = False


@app.command("compare")
@handle_errors(tables=True)
@options_record(CompareOptions)
def compare_command(o: CompareOptions) -> None:
    """Run every applicable schedule and print makespan, idle per rank, bubble ratios,
    peak activation and parameter memory side by side.

    Schedules whose constraints reject the size are listed as skipped with the reason
    (none ran: exit 2, the reasons on one line).
    For the schedules of DualPipe's README table the table's closed form is printed
    beside the simulated value. Activation: one microbatch's activations of 1/ranks of
    the model; parameters: 1/ranks of the model (DualPipe holds 2). The header says how
    the costs were read: per rank (default: equal model work per rank) or per op
    (--per-op-costs). --json: one record per schedule.

    --schedules takes parameters per schedule after a colon
    (interleaved-1f1b:chunks=4,zbv); --chunks, --variant and generator --param keys
    apply to the schedules that take them, --comm-policy and its keys to every one.
    --gantt draws one chart per schedule on one time axis (--memory: memory panels).

    Examples:
      schedsim compare -p 8 -m 20 --cost F=1,B=1,W=1,BW=2,FB=3
      schedsim compare schedules/dualpipe-figure.toml \\
        --schedules interleaved-1f1b:chunks=4,zbv,dualpipe --gantt cmp.png
    """
    from schedsim.analysis.memory import MemoryModel
    from schedsim.cli.common import build_scenario
    from schedsim.sweep import compare_schedules, none_ran, params_for_schedules

    _check_flags(o.scenario_arg, o.scenario, o.memory, o.gantt, o.json_out)
    comm_flags = dict(cost=o.cost, semantics=o.semantics, comm_stream=o.comm_stream,
                      eager_threshold=o.eager_threshold, launch_cost=o.launch_cost,
                      lazy_init=o.lazy_init, init_cost=o.init_cost,
                      message_bytes=o.message_bytes, latency=o.latency,
                      bandwidth=o.bandwidth)
    base = build_scenario(o.scenario_arg or o.scenario, **comm_flags)
    if base.workload is not None:       # each schedule as simulate runs it, same flags
        if o.ranks is not None or o.microbatches is not None:   # checked as simulate does
            base = build_scenario(o.scenario_arg or o.scenario, ranks=o.ranks,
                                  microbatches=o.microbatches, **comm_flags)
        return _compare_workload(base, o)
    ranks, microbatches = _size(base, o.ranks, o.microbatches)
    mm = MemoryModel.with_flags(base.memory or None, o.memory_model, o.fb_order)
    names = [o.schedules] if o.schedules else None
    if o.model_overlap is not None:
        return _compare_other(base, names, o.model_overlap, ranks, microbatches, mm,
                              o.json_out, o.gantt)
    shared = params_for_schedules(chunks=o.chunks, variant=o.variant,
                                  comm_policy=o.comm_policy, **key_values(o.param, "--param"))
    with Phases(o.quiet) as ph:
        ph.step(f"simulating {'the' if names else 'every'} schedule(s) at {ranks} ranks "
                f"x {microbatches} microbatches")
        res = compare_schedules(ranks, microbatches, base.costs, base.link, base.comm, names,
                                mm, shared, per_rank_costs=o.per_rank_costs, jobs=o.jobs,
                                keep_timelines=o.gantt is not None)
        none_ran(len(res.rows), res.skipped, f"at {ranks} ranks x {microbatches} "
                 f"microbatches")
        if o.gantt is not None:
            ph.step(f"drawing {o.gantt}")
            _draw_compare(res, o.gantt, mm if o.memory else None)
    _print_compare(res, base.costs, mm, ranks, microbatches, o.json_out, o.quiet)


def _compare_workload(base: Scenario, o: CompareOptions) -> None:
    """``compare`` of a scenario with a ``[workload]``: each schedule run as ``simulate
    -s NAME`` runs it with the same flags (:func:`schedsim.sweep_workload.compare_workload_schedules`);
    step ms, tokens/s/GPU, GiB. The flags it cannot honour are refused (exit 2)."""
    if o.model_overlap is not None:
        fail("--model-overlap compares the overlap modes of a [model] table, and this "
             "scenario has a [workload]: set [workload] overlap (none, domino, fb) and "
             "compare once per mode, or drop --model-overlap")
    if o.memory_model is not None or o.fb_order is not None:
        fail("--memory-model and --fb-order count activations in microbatches' worth, and "
             "compare of a [workload] reports its byte model in GiB: drop them (for "
             "that reading: schedsim memory SCENARIO -s NAME --memory-model ...)")
    from schedsim.analysis.memory import MemoryModel
    from schedsim.cli.workload import compare_workload

    shared = {"chunks": o.chunks, "variant": o.variant, "comm_policy": o.comm_policy,
              **key_values(o.param, "--param")}
    return compare_workload(base, o.schedules, o.json_out, o.gantt,
                            MemoryModel() if o.memory else None, shared=shared,
                            source=str(o.scenario_arg or o.scenario), quiet=o.quiet)


def _compare_other(base: Scenario, names: list[str] | None, model_overlap: str | None,
                   ranks: int, microbatches: int, mm: MemoryModel, json_out: Path | None,
                   gantt: Path | None = None) -> None:
    """``compare`` per ``--model-overlap`` mode (no --gantt)."""
    if gantt is not None:
        fail("compare --model-overlap draws no chart: drop --gantt and --memory")
    from schedsim.cli.collectives import print_overlap_comparison
    from schedsim.sweep import compare_overlap_modes, none_ran

    data = base.model_dump(exclude={"base_dir", "schedule"}, exclude_none=True,
                           exclude_unset=True)
    res = compare_overlap_modes(data, model_overlap or "", ranks, microbatches, names, mm)
    none_ran(len(res.records), res.skipped, f"at {ranks} ranks x {microbatches} microbatches")
    return print_overlap_comparison(res, json_out)


def _check_flags(scenario_arg: Path | None, scenario: Path | None, memory: bool,
                 gantt: Path | None, json_out: Path | None) -> None:
    """Refuse contradicting flags and unwritable outputs of ``compare`` (exit 2)."""
    if scenario_arg is not None and scenario is not None:
        fail("give the scenario once: as the argument or as --scenario, not both")
    if memory and gantt is None:
        fail("--memory draws a panel under each chart of --gantt: add --gantt FILE.png")
    check_outputs(json_out, figures=(gantt,))


def _size(base: Scenario, ranks: int | None, microbatches: int | None) -> tuple[int, int]:
    """``(ranks, microbatches)`` of ``compare``: the flags, else the scenario's."""
    ranks = base.schedule.ranks if ranks is None else ranks
    microbatches = base.schedule.microbatches if microbatches is None else microbatches
    if ranks is None or microbatches is None:
        fail("compare needs --ranks and --microbatches (or a scenario whose [schedule] "
             "sets them)")
    for flag, v in (("'--ranks' / '-p'", ranks), ("'--microbatches' / '-m'", microbatches)):
        if v < 1:
            fail(f"Invalid value for {flag}: {v} is not >= 1 (see 'schedsim compare --help')")
    return ranks, microbatches


def _draw_compare(res: Any, path: Path, memory: MemoryModel | None) -> None:
    """One Gantt chart per schedule of ``res`` (rows that kept their run) stacked on one
    time axis, to ``path``; ``memory``: with an activation-memory panel each."""
    from schedsim.plot import gantt_stack, save_figure

    tls = [r.timeline for r in res.rows if r.timeline is not None]   # (>= 1: none_ran)
    titles = [f"{r.schedule}: makespan {with_unit(r.makespan, res.unit)}, bubble "
              f"{fmt_bubble(r.bubble_ratio)}" for r in res.rows if r.timeline is not None]
    sup = (f"{res.ranks} ranks x {res.microbatches} microbatches, {res.semantics} "
           f"semantics, one time axis")
    save_figure(gantt_stack(tls, titles=titles, suptitle=sup, memory=memory), path)


def compare_records(res: Any, ranks: int, costs: CostModel) -> list[dict]:
    """The --json records of ``compare``: one per schedule that ran."""
    per_rank_costs = res.per_rank_costs
    note = None if per_rank_costs else per_op_note(
        [(r.schedule, r.stages) for r in res.rows], ranks, costs._derived is not None)
    return [{**{k: v for k, v in r.to_dict().items() if k != "formula"},
             "stages_per_rank": r.stages / ranks, "per_rank_costs": per_rank_costs,
             "note": note, "table_formula": r.formula} for r in res.rows]


def _print_compare(res: Any, costs: CostModel, mm: MemoryModel, ranks: int,
                   microbatches: int, json_out: Path | None, quiet: bool = False) -> None:
    """Print the result of ``compare`` (header, table, notes, skipped schedules; with
    ``quiet`` one line per schedule) and write its --json records."""
    if quiet:
        write_json(json_out, lambda: compare_records(res, ranks, costs))
        if data_format():               # --format csv|json asks for the rows even so
            console.print(_table(res, ranks))
        for r in res.rows:
            console.print(f"{escape(r.schedule)}: makespan "
                          f"{escape(with_unit(r.makespan, res.unit))}, bubble ratio "
                          f"{fmt_bubble(r.bubble_ratio)}",
                          highlight=False, soft_wrap=True)
        return
    per_rank_costs = res.per_rank_costs      # a stage model's costs are read per op
    model = costs._derived is not None       # its [model] layers are per stage
    note = None if per_rank_costs else per_op_note(
        [(r.schedule, r.stages) for r in res.rows], ranks, model)
    write_json(json_out, lambda: compare_records(res, ranks, costs))
    console.print(f"costs {_cost_text(costs)} {_reading(per_rank_costs, model)}",
                  highlight=False, soft_wrap=True)
    console.print(f"{ranks} ranks x {microbatches} microbatches, {res.semantics} semantics; "
                  f"memory: {_mem_text(mm)}", highlight=False, soft_wrap=True)
    console.print(_table(res, ranks))
    if any(r.formula for r in res.rows):
        console.print(escape(_table_footnote(res, mm, ranks)), highlight=False)
    if note is not None:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    for n, why in res.skipped.items():
        console.print(f"skipped {n}: {escape(why)}", highlight=False, soft_wrap=True)


def _table_footnote(res: Any, mm: MemoryModel, ranks: int) -> str:
    """The footnote under ``compare``'s table: where its "table" columns come from and,
    for each row whose closed form counts chunk activations (a 2-chunk placement: PP =
    stages != ranks), what that count is in this run's activation unit: count x the
    memory model's F x its factor for that row (``MemoryModel.factor``, ranks / stages
    by default), e.g. ``dualpipev: PP+1 = 9 chunks = 4.5 here``."""
    chunks = [f"{r.schedule}: {r.formula['activation']} = "
              f"{fmt_time(r.formula['activation_value'])} chunks = "
              f"{fmt_time(r.formula['activation_value'] * mm.F * mm.factor(ranks, r.stages))}"
              f" here" for r in res.rows
              if r.formula and r.formula["activation_unit"] == "chunk activations"]
    act = ("its activation counts stage activations, chunk activations for 2-chunk "
           "placements: " + "; ".join(chunks)) if chunks else \
        "its activation counts stage activations"
    return ("table = deepseek-ai/DualPipe README (PP = stages, B = full backward; F, B, W, "
            f"F&B at the op costs each schedule ran at; {act})")


def _reading(per_rank_costs: bool, model: bool = False) -> str:
    """How ``compare`` read the costs, for its header."""
    if model:       # --per-rank-costs does not apply: the layers fix each stage
        return ("read per op: the stage model's layers are per stage, so S stages on P "
                "ranks hold S/P times the layers per rank")
    if per_rank_costs:
        return ("read per rank: equal model work per rank, so a schedule with S stages on "
                "P ranks runs each op at P/S of them (--per-op-costs: every op at these "
                "costs)")
    return ("read per op: every op at these costs whatever the stages per rank "
            "(--per-rank-costs: equal model work per rank)")


def _table(res, ranks: int) -> Table:
    from schedsim.sweep import spread

    t = DataTable("schedules", title=unit_title("schedules", res.unit))
    for col in ("schedule", "stages", "op cost x", "makespan", "idle/rank", "bubble",
                "span bubble", "peak act", "params", "table idle", "table act, params"):
        t.add_column(col, justify="left" if col.startswith(("schedule", "table"))
                     else "right", overflow="fold")
    for r in res.rows:
        f = r.formula
        tidle = "-" if f is None else (f"{f['idle']} = {fmt_time(f['idle_value'])}"
                                       + (f" (PP={f['PP']})" if f["PP"] != ranks else ""))
        tact = "-" if f is None else (f"{f['activation']} = {fmt_time(f['activation_value'])}"
                                      f", {f['params']}")
        t.add_row(r.schedule, str(r.stages), num_time(r.cost_scale),
                  num_time(r.makespan), _spread(r.idle, spread),
                  num(r.bubble_ratio, fmt_bubble(r.bubble_ratio)),
                  num(r.span_bubble_rate, fmt_bubble(r.span_bubble_rate)),
                  _spread(r.peak_activation, spread), _spread(r.param_memory, spread),
                  tidle, tact)
    return t


def _spread(xs: list[float], spread: Any) -> Any:
    """A ``lo..hi`` cell (:func:`schedsim.sweep.spread`); csv/json: the highest, exact."""
    return num(max(xs) if xs else None, spread(xs))


def per_op_note(rows: list[tuple[str, int]], ranks: int, model: bool = False) -> str | None:
    """The note ``compare --per-op-costs`` prints under its table when the schedules
    ``rows`` (name, stages) run different numbers of stages per rank (a rank of a
    2-stage-per-rank schedule runs two full-cost ops per microbatch where a 1-stage one
    runs one); None when they all run the same number."""
    per: dict[float, list[str]] = {}
    for name, stages in rows:
        per.setdefault(stages / ranks, []).append(name)
    if len(per) < 2:
        return None
    parts = "; ".join(f"{fmt_time(k)} for {', '.join(v)}" for k, v in sorted(per.items()))
    fix = ("for the same model give the schedules with more stages per rank fewer [model] "
           "layers per stage (a scenario each)" if model else "--per-rank-costs costs one "
           "rank's share of the model instead")
    return (f"stages per rank differ ({parts}) and costs are per op, so a rank runs "
            f"each of its stages at the full op cost; {fix}")


def _cost_text(c: CostModel) -> str:
    if c._derived is not None:     # a [model]: the costs the simulation uses
        from schedsim.program.ir import Op

        kinds = [(k, c.cost(Op(k, 0, 0))) for k in ("F", "B", "W", "BW")]
        kinds.append(("FB", c.cost(Op.fb(Op("F", 0, 0), Op("BW", 0, 1)))))
        return ",".join(f"{k}={fmt_time(v)}" for k, v in kinds) + " (stage model)"
    parts = [f"F={fmt_time(c.F)}", f"B={fmt_time(c.B)}", f"W={fmt_time(c.W)}"]
    if c.BW is not None:
        parts.append(f"BW={fmt_time(c.BW)}")
    if c.FB is not None:
        parts.append(f"FB={fmt_time(c.FB)}")
    return ",".join(parts)


def _mem_text(m: MemoryModel) -> str:
    return (f"F {fmt_time(m.F)} B {fmt_time(m.B)} W {fmt_time(m.W)} BW {fmt_time(m.BW)}, FB "
            f"{m.fb_order}")


@app.command()
@handle_errors(tables=True)
@scenario_command(timelines=True)
def memory(
    sc: Scenario,
    memory_model: MemModelOpt = None,
    fb_order: FbOrderOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Peak activation memory and parameter memory per rank (--json adds the activation
    level over time per rank: a list of \\[time, level after] points); for a scenario
    with a \\[workload] (or its Timeline JSON), bytes per rank in GiB against the HBM.

    The model comes from the scenario's \\[memory] table (model = "zb" | "inflight", or
    deltas F, B, W, BW, fb_order, scale), then --memory-model/--fb-order. Units: one
    microbatch's activations of 1/ranks of the model; parameters in 1/ranks of the model.

    Example:
      schedsim memory -s zb-h1 -p 4 -m 8 --memory-model inflight
    """
    from schedsim.analysis.memory import MemoryModel
    from schedsim.analysis.memory import memory_curves, param_memory, peak_activation
    from schedsim.cli.inputs import placement_of

    prog, tl = run_scenario(sc)
    if tl.deadlock is not None:
        fail_deadlock(tl, sc)
    from schedsim.cli.workload import print_memory_gib

    if memory_model is None and fb_order is None:
        if print_memory_gib(tl, json_out):
            return      # a workload's timeline: bytes per rank in GiB
    elif getattr(tl, "workload", None):
        from schedsim.cli.common import warn

        flags = " and ".join(f for f, v in (("--memory-model", memory_model),
                                             ("--fb-order", fb_order)) if v is not None)
        warn(f"{flags} count{'s' if ' and ' not in flags else ''} activations in "
             f"microbatches' worth, so this table is in those units, without the "
             f"[workload]'s GiB per rank and HBM check (its byte model, the default: "
             f"drop {flags} for it)")
    mm = MemoryModel.with_flags(sc.memory or None, memory_model, fb_order)
    peaks = peak_activation(tl, mm)
    params = param_memory(prog.placement if prog is not None else placement_of(tl))
    write_json(json_out, {"model": mm.model_dump(), "peak_activation": peaks,
                          "param_memory": params,
                          "curves": [[list(p) for p in c] for c in memory_curves(tl, mm)]})
    t = DataTable("memory", title=rich_escape(f"memory of {tl.schedule} ({_mem_text(mm)})"))
    for col in ("rank", "peak activation", "parameters"):
        t.add_column(col, justify="right")
    for r in range(tl.ranks):
        t.add_row(str(r), num_time(peaks[r]), num_time(params[r]))
    console.print(t)
    console.print("units: activations in microbatches' worth (1 = the activations one "
                  "microbatch leaves on one rank's 1/ranks share of the model); parameters "
                  "in 1/ranks of the model", highlight=False)

"""``schedsim plan``: the best layout and schedule for a model on N GPUs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from schedsim.cli import app
from schedsim.cli.tables import DataTable, num, num_time  # noqa: F401
from schedsim.cli.common import (
    ParamOpt,
    PolicyOpt,
    SemanticsOpt,
    console,
    err_console,
    handle_errors,
    key_values,
)
from schedsim.cli.records import options_record
from schedsim.errors import ScenarioError, Stopped
from schedsim.util.text import rich_escape as escape
from schedsim.util.units import (GIB, fmt_bubble, fmt_gib, fmt_gib_pair, fmt_mfu, fmt_rate,
                                 fmt_time)

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from rich.table import Table

ModelOpt = Annotated[str, typer.Option(
    "--model", help="Model: a preset (llama3.1-8b, llama3.1-70b, llama3.1-405b, "
    "deepseek-v3, qwen3-30b-a3b, mixtral-8x7b) or a Hugging Face config.json.")]
GpusOpt = Annotated[int, typer.Option("--gpus", help="GPUs of the job.")]
GpuOpt = Annotated[str, typer.Option(
    "--gpu", help="GPU preset: a100-80gb, h100-sxm, h800, h200, b200, mi300x.")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq", help="Sequence length (default "
                                                "4096).")]
GbsOpt = Annotated[Optional[int], typer.Option(
    "--global-batch-size", help="Samples per step (default 256).")]


def _list_opt(flag: str, what: str) -> Any:
    return Annotated[Optional[str], typer.Option(flag, help=what)]


TpOpt = _list_opt("--tp", "TP degrees: 4,8 or 1..8 (default: powers of two up to a node).")
PpOpt = _list_opt("--pp", "PP degrees: 4,8 or 4..16 (default: divisors of the GPUs up to "
                  "the layers).")
ChunksListOpt = _list_opt("--chunks", "Model chunks per rank for the interleaved "
                          "schedules (default 2).")
EpOpt = _list_opt("--ep", "EP degrees (default 1, or powers of two dividing the experts).")
CpOpt = _list_opt("--cp", "CP degrees (default 1).")
MbsOpt = _list_opt("--micro-batch-size", "Micro-batch sizes (default 1).")
SchedulesOpt = _list_opt("--schedules", "Schedules (see 'schedsim list'; default "
                         "1f1b,interleaved-1f1b,zb-h1,zbv,dualpipev).")
RecomputeOpt = _list_opt("--recompute", "Recompute modes: none,selective,full (default "
                         "all).")
ZeroOpt = _list_opt("--zero", "ZeRO stages 0..3 (default 1: sharded optimizer).")
PlanMemOpt = Annotated[Optional[str], typer.Option(
    "--mem-limit", help="Memory per GPU: a size (70GiB, 75GB) or a bare number of GiB "
    "(default: the GPU's HBM minus a 4 GiB reserve).")]
TopOpt = Annotated[int, typer.Option("--top", help="How many of the best to print.")]
PlanOutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Stream every simulated candidate to this .jsonl or .csv file as "
    "it finishes (--resume continues from it; - streams JSON lines to stdout).")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="Keep the candidates already in --out; simulate only the others.")]
GanttOpt = Annotated[Optional[Path], typer.Option(
    "--gantt", help="Gantt chart of the best candidate (.png, .svg, .pdf).")]
ParetoOpt = Annotated[Optional[Path], typer.Option(
    "--pareto", help="Throughput against peak memory of every simulated candidate, with "
    "the Pareto front (.png, .svg, .pdf).")]
HtmlOpt = Annotated[Optional[Path], typer.Option(
    "--html", help="HTML report: the top candidates, the Pareto plot and the best one's "
    "timeline (needs bokeh: the 'report' extra).")]
ExecutorOpt = Annotated[str, typer.Option(
    "--executor", help="local (worker processes, -j) | dask (Dask distributed: "
    "--address, or a local cluster of -j workers; the 'cluster' extra).")]
AddressOpt = Annotated[Optional[str], typer.Option(
    "--address", help="Dask scheduler, tcp://HOST:8786 (with --executor dask).")]
JobsOpt = Annotated[Optional[int], typer.Option(
    "--jobs", "-j", help="Worker processes (default: the CPUs).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only the summary lines "
                                        "(--format csv|json: the rows still).")]


@dataclass(frozen=True)
class PlanOptions:
    """The options of ``schedsim plan`` (each one its flag, in --help order)."""

    model: ModelOpt
    gpus: GpusOpt
    gpu: GpuOpt
    seq: SeqOpt = None
    global_batch_size: GbsOpt = None
    tp: TpOpt = None
    pp: PpOpt = None
    chunks: ChunksListOpt = None
    ep: EpOpt = None
    cp: CpOpt = None
    micro_batch_size: MbsOpt = None
    schedules: SchedulesOpt = None
    recompute: RecomputeOpt = None
    zero: ZeroOpt = None
    mem_limit: PlanMemOpt = None
    comm_policy: PolicyOpt = None
    semantics: SemanticsOpt = None
    param: ParamOpt = None
    top: TopOpt = 5
    out: PlanOutOpt = None
    resume: ResumeOpt = False
    gantt: GanttOpt = None
    pareto: ParetoOpt = None
    html_out: HtmlOpt = None
    executor: ExecutorOpt = "local"
    address: AddressOpt = None
    jobs: JobsOpt = None
    quiet: QuietOpt = False


@app.command()
@handle_errors(tables=True)
@options_record(PlanOptions)
def plan(o: PlanOptions) -> None:
    """The best parallel layout and schedule for a model on N GPUs.

    Enumerates every legal combination of TP, PP, model chunks, EP, CP, DP (what the GPUs
    leave), micro-batch size, schedule, recompute and ZeRO; removes those that cannot fit
    in memory or cannot beat the best found (upper bounds, no simulation); simulates the
    rest exactly (generator, comm policy, engine) and ranks them by tokens/s/GPU. Prints
    the top candidates and how many candidates each rule removed. Bad input exits 2;
    nothing fitting in memory is a result (exit 0) naming the smallest peak found.

    Examples:
      schedsim plan --model llama3.1-70b --gpus 64 --gpu h100-sxm --seq 8192 \\
        --global-batch-size 512 --tp 4,8 --pp 4..16 --schedules 1f1b,zbv --top 5
      schedsim plan --model llama3.1-8b --gpus 16 --gpu h100-sxm \\
        --out plan.jsonl --resume
    """
    from schedsim.plan import PlanSpace
    from schedsim.plan.space import parse_values

    space = PlanSpace(
        model=o.model, gpus=o.gpus, gpu=o.gpu, seq=o.seq,
        global_batch_size=o.global_batch_size,
        tp=parse_values(o.tp, "--tp"), pp=parse_values(o.pp, "--pp"),
        chunks=parse_values(o.chunks, "--chunks"), ep=parse_values(o.ep, "--ep"),
        cp=parse_values(o.cp, "--cp"),
        micro_batch_size=parse_values(o.micro_batch_size, "--micro-batch-size"),
        schedules=parse_values(o.schedules, "--schedules", kind=str),
        recompute=parse_values(o.recompute, "--recompute", kind=str),
        zero=parse_values(o.zero, "--zero", minimum=0), mem_limit_gib=_mem_limit_gib(o.mem_limit),
        comm_policy=o.comm_policy, semantics=o.semantics or "data",
        params=key_values(o.param, "--param"))
    from schedsim.plan.driver import check_plan, run_plan
    from schedsim.plan.executors import make_executor

    # every name, value and the total work refused before any work (no worker started)
    ex = make_executor(o.executor, o.jobs, o.address)
    checked = check_plan(space, o.top)
    _check_outputs(o.out, o.resume, o.gantt, o.pareto, o.html_out)
    try:
        with ex, _Bar(o.quiet) as bar:
            res = run_plan(space, top=o.top, executor=ex, out=o.out, resume=o.resume,
                           progress=bar.update, checked=checked)
    except (KeyboardInterrupt, Stopped) as e:
        raise _stopped(e, o.out, space) from None
    _print(res, o.top, o.quiet, o.out)
    _figures(res, o.gantt, o.pareto, o.html_out, o.top)


def _mem_limit_gib(text: str | None) -> float | None:
    """``--mem-limit`` as GiB per GPU: a size (``70GiB``, ``75GB``) converted, a bare
    number taken as GiB (:func:`schedsim.util.units.parse_size`, the one parser of
    sizes, as ``simulate --mem-limit``); None when unset. Raises :class:`ScenarioError`
    naming the flag for anything else (not a size, bits, not finite and > 0)."""
    if text is None:
        return None
    from schedsim.util.units import GIB, parse_size

    nbytes, _ = parse_size(text, "--mem-limit", bare=GIB)
    return nbytes / GIB


def _stopped(e: BaseException, out: Path | None, space: Any) -> Stopped:
    """The one line of a sweep stopped by Ctrl-C or a signal: what was kept."""
    import signal

    signum = getattr(e, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    if out is None:
        return Stopped(signum, f"stopped by {name}: nothing kept (give --out FILE to keep "
                               f"each finished candidate, --resume to continue)")
    if not out.exists():        # stopped before any candidate finished: none left empty
        return Stopped(signum, f"stopped by {name}: no candidate finished, {out} not "
                               f"written; run the command again")
    from schedsim.plan.rows import read_rows

    try:
        n = len(read_rows(out, space.identity()))
    except ScenarioError:
        n = 0
    return Stopped(signum, f"stopped by {name}: {n} finished candidates kept in {out}; "
                           f"run the same command with --resume to continue")


def _check_outputs(out: Path | None, resume: bool, *figures: Path | None) -> None:
    """Refuse bad output paths before any work. Raises :class:`ScenarioError`."""
    from schedsim.cli.outputs import check_outputs
    from schedsim.plan.rows import check_out

    if resume and (out is None or str(out) == "-"):
        raise ScenarioError("--resume needs --out FILE (the file of the sweep to continue)")
    if out is not None:
        check_out(out)
    from schedsim.util.files import claim_output

    gantt, pareto, html = figures
    claim_output(pareto, "--pareto")        # the shared flags are claimed by handle_errors
    check_outputs(html, figures=(gantt, pareto))
    if html is not None:
        from schedsim.report.html import require_bokeh

        require_bokeh()


class _Bar:
    """A progress bar with ETA on stderr when it is a terminal (none otherwise)."""

    def __init__(self, quiet: bool) -> None:
        self.enabled = not quiet and err_console.is_terminal
        self._p: Any = None
        self._task: Any = None

    def __enter__(self) -> "_Bar":
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._p = Progress(TextColumn("plan: {task.description}"), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(),
                               TextColumn("ETA"), TimeRemainingColumn(),
                               console=err_console, transient=True)
            self._p.start()
            self._task = self._p.add_task("enumerating", total=None)
        return self

    def update(self, done: int, total: int, phase: str = "simulating") -> None:
        if self._p is not None:
            self._p.update(self._task, completed=done, total=total, description=phase)

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.stop()


def layout_text(r: Any) -> str:
    """``tp4 pp8 dp2`` plus what differs from the plain layout: ``x2`` model chunks per
    rank, ``ep8``, ``cp2``, ``mbs2``, the ZeRO stage ``z1``."""
    from schedsim.plan.names import layout_name

    return layout_name(r.candidate, r.stages)


def _table(t: Table) -> None:
    """Print a table whole (off a terminal the console prints whole rows), or keep it for
    ``--format csv|json`` (:mod:`schedsim.cli.tables`)."""
    console.print(t)


def _peaks(gib: list[float]) -> str:
    if len(gib) <= 4:
        return " ".join(fmt_time(g) for g in gib)        # GiB (the column's header)
    return f"{fmt_time(min(gib))}..{fmt_time(max(gib))}"


#: the top table's columns after ``#``: one per :func:`row_cells` entry
COLUMNS = ("layout", "schedule", "recompute", "microbatches", "step ms", "tokens/s/GPU",
           "bubble", "MFU", "peak GiB per rank")


def row_cells(r: Any) -> dict[str, str]:
    """The text of each of :data:`COLUMNS` for result row ``r``: the one formatter of a
    candidate's figures, for its row of the top table and for the ``best:`` line."""
    return {"layout": layout_text(r), "schedule": r.candidate.schedule,
            "recompute": r.candidate.recompute, "microbatches": str(r.microbatches),
            "step ms": num_time(r.step_ms),
            "tokens/s/GPU": num(r.tokens_per_s_per_gpu, fmt_rate(r.tokens_per_s_per_gpu)),
            "bubble": num(r.bubble_ratio, fmt_bubble(r.bubble_ratio)),
            "MFU": num(r.mfu, fmt_mfu(r.mfu)),   # (csv/json: the exact numbers)
            "peak GiB per rank": num(max(r.peak_gib, default=None), _peaks(r.peak_gib))}


def best_line(r: Any) -> str:
    """``best: ...``: every cell of ``r``'s top-table row (:func:`row_cells`), each
    named by its column."""
    c = row_cells(r)
    return (f"best: {r.name}, "        # (= the row's layout, schedule and recompute)
            f"{c['microbatches']} microbatches: {c['tokens/s/GPU']} tokens/s/GPU, step "
            f"{c['step ms']} ms, bubble {c['bubble']}, MFU {c['MFU']}, peak GiB per rank "
            f"{c['peak GiB per rank']}")


def _print(res: Any, top: int, quiet: bool, out: Path | None) -> None:
    """The top table, the rejection counts and the summary lines (``quiet``: the lines,
    and the tables only under --format csv|json, which asks for the rows)."""
    from schedsim.cli.tables import data_format

    tables = not quiet or data_format()

    sp = res.space
    head = (f"plan: {res.resolved.model.name} on {sp.gpus} x {res.resolved.gpu.name}, seq "
            f"{res.resolved.seq}, global batch {res.resolved.global_batch_size}, memory "
            f"limit {fmt_gib(res.resolved.mem_limit_bytes)}, {sp.semantics} semantics")
    console.print(escape(head), soft_wrap=True)
    if res.ranking and tables:
        t = DataTable("candidates",
                      title=f"top {min(top, len(res.ranking))} of {len(res.ranking)} that fit "
                      f"(by tokens/s/GPU)")
        for col in ("#", *COLUMNS):
            t.add_column(col, justify="left" if col in ("layout", "schedule", "recompute")
                         else "right")
        for i, r in enumerate(res.top(top), 1):
            t.add_row(str(i), *row_cells(r).values())
        _table(t)
    if tables and res.rejections.counts:
        t = DataTable("removed", title="candidates removed, by rule")
        t.add_column("rule")
        t.add_column("removed", justify="right")
        t.add_column("example")
        for rule, n in res.rejections.counts.items():
            t.add_row(escape(rule), str(n), escape(res.rejections.examples.get(rule, "")))
        _table(t)
    pruned = res.pruned
    pct = 100.0 * pruned / res.legal if res.legal else 0.0
    console.print(f"grid {res.grid} candidates: {res.legal} legal, {pruned} pruned before "
                  f"simulation ({pct:.1f}%), {res.simulated} simulated"
                  + (f", {res.resumed} resumed from {escape(str(out))}" if res.resumed else ""),
                  soft_wrap=True)
    if res.ranking:
        console.print(escape(best_line(res.ranking[0])), soft_wrap=True)
    elif res.smallest_peak is not None:
        gib, key = res.smallest_peak
        peak, limit = fmt_gib_pair(gib * GIB, res.resolved.mem_limit_bytes)
        console.print(escape(f"nothing fits in {limit}: the smallest peak found is {peak} "
                             f"({key}); raise "
                             f"--mem-limit, add GPUs or allow recompute/ZeRO"), soft_wrap=True)


def _figures(res: Any, gantt: Path | None, pareto: Path | None, html: Path | None,
             top: int) -> None:
    """Write the Gantt chart of the best, the Pareto plot and the HTML report."""
    from schedsim.util.text import mpl_escape

    if pareto is not None:
        from schedsim.plan.pareto import pareto_figure
        from schedsim.plot import save_figure

        save_figure(pareto_figure(res.rows, mem_limit_gib=res.resolved.mem_limit_bytes
                                  / 2**30, title=mpl_escape(_title(res))), pareto)
    if (gantt is None and html is None) or not res.ranking:
        return
    from schedsim.plan.model import best_timeline

    tl = best_timeline(res)
    if gantt is not None:
        from schedsim.plot import gantt as gantt_figure, save_figure

        save_figure(gantt_figure(tl, title=mpl_escape(f"best: {res.ranking[0].name}")), gantt)
    if html is not None:
        from schedsim.plan.report import plan_html
        from schedsim.util.files import atomic_write_text

        atomic_write_text(html, plan_html(res, tl, top, title=_title(res)))


def _title(res: Any) -> str:
    r = res.resolved
    return (f"{r.model.name} on {res.space.gpus} x {r.gpu.name}, seq {r.seq}, global batch "
            f"{r.global_batch_size}")

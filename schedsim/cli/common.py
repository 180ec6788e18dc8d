"""Options shared by the CLI commands and the error handling every command uses."""
from __future__ import annotations

import functools
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from schedsim.cli import helptext  # noqa: F401  (tidies typer's --help)
from schedsim.cli.console import (  # noqa: F401  (the CLI's consoles, re-exported)
    MAX_MESSAGE,
    console,
    err_console,
    fail,
    warn,
    with_suggestion,
)
from schedsim.cli.options import ConnectionsOpt
from schedsim.cli.records import param_hints
from schedsim.errors import FlagError, SchedsimError
from schedsim.program.vocab import COMM_STREAMS, GROUP_SEMANTICS, SEMANTICS
from schedsim.scenario_flags import key_values  # noqa: F401  (the commands' KEY=VALUE flags)

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario




def warn_costs(sc: Scenario, tl: Any) -> None:
    """A warning (stderr) for each cost of ``sc`` that is probably not what the user
    meant for the program ``tl`` ran (:func:`schedsim.report.advice.cost_warnings`)."""
    from schedsim.report.advice import cost_warnings, policy_warnings, run_kinds

    s = sc.schedule
    for w in (cost_warnings(run_kinds(tl), sc.costs, tl.schedule) + sc.comm.unused(tl.semantics)
              + policy_warnings(s.name or "", s.ranks, s.microbatches, s.comm_policy)
              + lazy_init_warnings(sc, tl.semantics)):
        warn(w)
    for _, _, w in getattr(tl, "findings", ()):   # silent swaps (schedsim.sim.identity)
        warn(w)


def lazy_init_warnings(sc: Scenario, semantics: str) -> list[str]:
    """``--lazy-init`` on a program without a bare P2P changes nothing: say so."""
    if not sc.comm.lazy_init or semantics == "data":
        return []
    from schedsim.sim.compile import first_touch_order

    if any(first_touch_order(sc.build_program())):
        return []
    return ["--lazy-init changes nothing here: every send and recv of this program is in a "
            "BATCH (batch_isend_irecv), and lazy communicator init happens only at a bare "
            "send/recv (NCCL creates a 2-rank communicator at the first one)"]


def fail_deadlock(tl: Any, sc: Scenario | None = None) -> None:
    """Exit 3 with the deadlock of ``tl``: the wait-for cycle one edge per line and, when
    ``sc`` is given, the fixes that make it complete (each verified by simulating it,
    within a bounded budget: :func:`schedsim.report.advice.deadlock_fixes`)."""
    from schedsim.report.advice import deadlock_fixes, format_deadlock
    from schedsim.scenario import Scenario

    fixes = deadlock_fixes(sc, tl) if isinstance(sc, Scenario) else []
    fail(format_deadlock(tl.deadlock, fixes, tl.unit), 3)


#: command parameters that name output files, with their flags (checked by handle_errors)
OUTPUT_PARAMS = {"json_out": "--json", "gantt": "--gantt", "trace": "--trace",
                 "out": "--out", "program_out": "--program-out", "html_out": "--html"}
#: command parameters that name input files
INPUT_PARAMS = ("scenario", "scenario_arg", "program", "schedule_file", "costs_file",
                "timeline", "overlay", "traces")

def _version_flag(value: bool) -> None:
    from schedsim.cli import _version

    _version(value)


VersionOpt = Annotated[bool, typer.Option(
    "--version", callback=_version_flag, is_eager=True, help="Print the version and exit.")]
TablesQuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Only the summary lines: no table (--format csv|json: the rows "
    "still), no progress.")]

FormatOpt = Annotated[str, typer.Option(
    "--format", metavar="table|csv|json", help="How tables are printed: table (for "
    "people), csv or json (every table row on stdout, exact numbers; json: one object "
    "keyed by table id; csv: '# table: ID' before each of several tables; the other "
    "lines go to stderr).")]

LimitOpt = Annotated[Optional[list[str]], typer.Option(
    "--max", metavar="KEY=N", show_default=False, help="Raise a work limit, KEY=N "
    "(repeatable): instructions (default 20000000), ranks (4096), procs (64, replay "
    "processes), file_mb (256, per input file). See docs/reliability.md.")]


def _claim_paths(kwargs: dict[str, Any], fmt: str = "table") -> None:
    """Register the command's input and output files: two outputs on one path, or an
    output that is an input, fail here, before any work (schedsim.util.files). An output
    given as ``-`` claims stdout, and so does ``--format csv|json`` (``fmt``, the tables
    as data): ``--json - --format csv`` is refused, both would write stdout."""
    from schedsim.util.files import claim_output, note_input

    if fmt != "table":
        claim_output("-", f"--format {fmt}")

    for name in INPUT_PARAMS:
        v = kwargs.get(name)
        for p in (v if isinstance(v, list) else [v]):
            if isinstance(p, Path):
                note_input(p)
    for name, flag in OUTPUT_PARAMS.items():
        if isinstance(kwargs.get(name), Path):
            claim_output(kwargs[name], flag)


def _exit_if_stopped() -> None:
    """If a stop signal arrived (:func:`schedsim.util.signals.stop_requested`), exit as
    :class:`~schedsim.errors.Stopped` does (one line, 128 + N): the exception at hand is
    the signal's, wrapped by the library it was raised in (pydantic's serialiser, a
    matplotlib callback). Else nothing."""
    from schedsim.util.signals import stop_message, stop_requested

    signum = stop_requested()
    if signum is not None:
        fail(stop_message(signum), 128 + signum)


def _fail_flag(e: FlagError) -> None:
    """Exit 2 with :func:`main`'s one usage line for a refused flag value (``Invalid value
    for '--ranks' / '-p': ...``), under any caller (a CliRunner, the API too); a flag
    without declarations: the error's own line."""
    import importlib

    decls = _flag_decls(e.flag)
    if not decls:
        fail(str(e), e.exit_code)
    # the click typer runs on (typer may vendor its own): its current context
    click = importlib.import_module(typer.BadParameter.__module__.rsplit(".", 1)[0]
                                    + ".globals")
    ctx = click.get_current_context(silent=True)
    bad = typer.BadParameter(e.reason, ctx=ctx, param_hint=decls)
    path = ctx.command_path if ctx is not None else "schedsim"
    fail(f"{' '.join(bad.format_message().split())} (see '{path} --help')", 2)


def handle_errors(fn: Callable | None = None, *, limits: bool = True,
                  tables: bool = False) -> Callable:
    """The top-level guard of every command: turn :class:`SchedsimError` and OS errors into
    a one-line message and exit code (2 bad input, 3 deadlock, 128 + N when stopped by
    SIGTERM/SIGHUP after removing temporary files); and a decoding, recursion, overflow or
    memory error that escaped a loader into exit 2 naming the command's input files (a
    deadlock: its wait-for cycle one edge per line, exit 3).

    Around the command: the ``--max KEY=N`` option it adds (``limits=False``: none; see
    :mod:`schedsim.util.limits`), one :func:`~schedsim.util.files.io_session` (outputs
    named by :data:`OUTPUT_PARAMS` claimed at once, so ``--json x --trace x`` or an output
    that is an input fails before any work) and :func:`~schedsim.util.signals.stop_signals`.
    With ``tables``, the ``--format table|csv|json`` option it adds (and ``-q``: only the
    summary lines, no table, unless the command has its own ``quiet``); with or without,
    an output given as ``-`` keeps stdout for that data (:mod:`schedsim.cli.tables`).
    Every command gets ``--version``.
    """
    if fn is None:
        return functools.partial(handle_errors, limits=limits, tables=tables)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from schedsim.util.gc import resume_startup

        resume_startup()    # the command runs: the collector paused for start-up resumes
        from schedsim.util.files import io_session
        from schedsim.util.inputs import decoding_reason
        from schedsim.util.limits import parse_limits, using
        from schedsim.util.signals import stop_signals

        from schedsim.cli.tables import stdout_data

        items = kwargs.pop("max_limits", None) if limits else None
        fmt = kwargs.pop("out_format", "table") if tables else "table"
        kwargs.pop("show_version", None)
        quiet_tables = kwargs.pop("quiet_tables", False)
        dash = any(str(kwargs.get(n)) == "-" for n in OUTPUT_PARAMS)
        try:
            with stop_signals(), io_session(), using(**parse_limits(items)), \
                    stdout_data(fmt, dash, quiet_tables):
                _claim_paths(kwargs, fmt)
                return fn(*args, **kwargs)
        except FlagError as e:      # a usage error, in typer's form: the flag's names
            _fail_flag(e)
        except SchedsimError as e:
            tl = getattr(e, "timeline", None)
            if e.exit_code == 3 and getattr(tl, "deadlock", None) is not None:
                fail_deadlock(tl)
            fail(str(e), e.exit_code)
        except OSError as e:
            fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), 2)
        except (RecursionError, OverflowError, MemoryError, UnicodeError) as e:
            _exit_if_stopped()  # a stop signal inside a loader, wrapped by it
            inputs = [str(v) for n in INPUT_PARAMS for v in
                      (kwargs.get(n) if isinstance(kwargs.get(n), list) else [kwargs.get(n)])
                      if v is not None]
            fail(f"cannot use the input{'s' if len(inputs) > 1 else ''} "
                 f"{', '.join(inputs) or 'given'}: {decoding_reason(e)}", 2)
        except Exception:
            _exit_if_stopped()  # a stop signal inside a library callback, wrapped by it
            raise

    sig = inspect.signature(fn)
    own_quiet = "quiet" in sig.parameters
    extra = ([("out_format", "table", FormatOpt)] if tables else []) + \
        ([("quiet_tables", False, TablesQuietOpt)] if tables and not own_quiet else []) + \
        ([("max_limits", None, LimitOpt)] if limits else []) + \
        [("show_version", False, VersionOpt)]
    if extra:
        hints = typing.get_type_hints(fn, include_extras=True)
        params = [p.replace(annotation=hints.get(n, p.annotation))
                  for n, p in sig.parameters.items()]
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d,
                                     annotation=a) for n, d, a in extra]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**hints, **{n: a for n, _, a in extra}}
        del wrapper.__wrapped__
    return wrapper


class Phases:
    """Progress on stderr for work that can take more than a couple of seconds: one
    transient line with a spinner, the running phase and the elapsed time (rich). Silent
    when stderr is not a terminal or ``quiet``. Use as ``with Phases(quiet) as ph:
    ph.step("simulating")``."""

    def __init__(self, quiet: bool = False, total: float | None = None) -> None:
        self.enabled = not quiet and err_console.is_terminal
        self._progress: Any = None
        self._task: Any = None
        self._total = total

    def __enter__(self) -> "Phases":
        if self.enabled:
            from rich.progress import (
                BarColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            cols = [SpinnerColumn(), TextColumn("{task.description}")]
            if self._total:
                cols.append(BarColumn())
            self._progress = Progress(*cols, TimeElapsedColumn(), console=err_console,
                                      transient=True)
            self._progress.start()
            self._task = self._progress.add_task("", total=self._total)
        return self

    def step(self, description: str, advance: float = 0) -> None:
        """Name the phase now running (and advance the bar by ``advance``)."""
        if self._progress is not None:
            self._progress.update(self._task, description=description, advance=advance)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


# -- shared options --------------------------------------------------------------------
ScenarioArg = Annotated[Optional[Path], typer.Argument(
    help="Scenario TOML file (see schedules/). Flags below override its values.",
    show_default=False)]
ScheduleOpt = Annotated[Optional[str], typer.Option(
    "--schedule", "-s", help="Schedule name (see 'schedsim list').")]
RanksOpt = Annotated[Optional[int], typer.Option("--ranks", "-p", help="Pipeline ranks.")]
MbOpt = Annotated[Optional[int], typer.Option("--microbatches", "-m", help="Microbatches.")]
ChunksOpt = Annotated[Optional[int], typer.Option(
    "--chunks", help="Stages (model chunks) per rank, for interleaved schedules.")]
VariantOpt = Annotated[Optional[str], typer.Option(
    "--variant", help="Schedule variant (e.g. megatron, torch), see 'schedsim list'.")]
MemLimitOpt = Annotated[Optional[str], typer.Option(
    "--mem-limit", help="Activation memory limit per rank for the memory-limited "
    "zero-bubble schedules (zb-1p, zb-2p, zbv): a number is microbatches' activations; a "
    "size (76GiB, 80GB) is bytes per GPU, converted with the scenario's \\[workload] "
    "(what the static bytes leave, in microbatches of the rank's activations).")]
ParamOpt = Annotated[Optional[list[str]], typer.Option(
    "--param", help="Extra generator or comm-policy parameter KEY=VALUE (repeatable), "
    "e.g. group_size=6, batch_p2p_comm=false.")]
CostOpt = Annotated[Optional[str], typer.Option(
    "--cost", help="Costs per kind, e.g. F=1,B=1,W=1,BW=2,FB=3 (BW defaults to B+W, FB to "
    "F+BW).")]
SemanticsOpt = Annotated[Optional[str], typer.Option(
    "--semantics", help=" | ".join(SEMANTICS) + ".")]
StreamOpt = Annotated[Optional[str], typer.Option(
    "--comm-stream", help=" | ".join(COMM_STREAMS) + ": P2P launches of a rank share a "
    "stream.")]
ThresholdOpt = Annotated[Optional[str], typer.Option(
    "--eager-threshold", help="Under rendezvous, messages of at most this many bytes are "
    "eager: a number of bytes or a size (64KiB, 1MB).")]
LaunchCostOpt = Annotated[Optional[float], typer.Option(
    "--launch-cost", help="Host time to launch one batch of sends/recvs, in the cost "
    "unit (default 0; 'schedsim calibrate' measures it).")]
LazyInitOpt = Annotated[Optional[bool], typer.Option("--lazy-init/--no-lazy-init", help="NCCL "
    "lazy communicator init: a first bare P2P blocks both ranks until both reach it.")]
InitCostOpt = Annotated[Optional[float], typer.Option("--init-cost", help="With --lazy-init: "
    "time to create a 2-rank communicator (default 0).")]
GroupSemanticsOpt = Annotated[Optional[str], typer.Option(
    "--group-semantics", help=" | ".join(GROUP_SEMANTICS) + ": the ops of one BATCH progress each "
    "on its own (gloo), or move no data until all are matched and complete together "
    "(NCCL groups).")]
BytesOpt = Annotated[Optional[str], typer.Option(
    "--message-bytes", help="Bytes per message (activation or gradient): a number of "
    "bytes or a size (1MiB, 4MB).")]
LatencyOpt = Annotated[Optional[float], typer.Option(
    "--latency", help="Link latency, in the cost unit.")]
BandwidthOpt = Annotated[Optional[float], typer.Option(
    "--bandwidth", help="Link bandwidth, bytes per cost unit (default infinite).")]
PolicyOpt = Annotated[Optional[str], typer.Option(
    "--comm-policy", help="How compute-only schedules get their sends/recvs: async "
    "(default), commit, torch, megatron (parameters via --param; docs/frameworks.md).")]
ProgramOpt = Annotated[Optional[Path], typer.Option(
    "--program", help="Hand-written program text file (one line per rank).")]
ScheduleFileOpt = Annotated[Optional[Path], typer.Option(
    "--schedule-file", help="Schedule file: schedsim JSON or torch CSV.")]
StagesOpt = Annotated[Optional[int], typer.Option(
    "--stages", help="Number of stages (with --program / --schedule-file).")]
PlacementOpt = Annotated[Optional[str], typer.Option(
    "--placement", help="loop | v | dual (with --program / --schedule-file; a program "
    "text's default: the one its ops run under).")]


def _flag_decls(flag: str) -> str | None:
    """``'--ranks' / '-p'``: the names of the shared scenario flag ``flag``
    (:data:`_SCENARIO_PARAMS`), as click names a parameter; None for another name."""
    ann = dict(_SCENARIO_PARAMS).get(flag)
    info = next((a for a in typing.get_args(ann)[1:] if hasattr(a, "param_decls")), None)
    if info is None:
        return None
    decls = [info.default] if isinstance(info.default, str) and info.default.startswith("-") \
        else []
    return " / ".join(f"'{d}'" for d in [*decls, *info.param_decls]) or None


def build_scenario(scenario: Path | None = None, **flags: Any) -> Scenario:
    """A :class:`Scenario` from a TOML file (optional) with the CLI flags applied on top
    (:func:`schedsim.scenario_flags.build_scenario`, the one home of that rule).

    Raises :class:`~schedsim.errors.ScenarioError` for bad values.
    """
    from schedsim.scenario_flags import build_scenario as build

    return build(scenario, **flags)


def write_text_out(path: Path | None, text: str) -> None:
    """Write ``text`` to ``path`` atomically, or to stdout when ``path`` is None or '-'."""
    if path is None or str(path) == "-":
        sys.stdout.write(text)
        return
    from schedsim.util.files import atomic_write_text

    atomic_write_text(path, text)


#: the scenario flags shared by simulate, the analysis commands, replay and calibrate
_SCENARIO_PARAMS: list[tuple[str, Any]] = [
    ("scenario", ScenarioArg), ("schedule", ScheduleOpt), ("ranks", RanksOpt),
    ("microbatches", MbOpt), ("chunks", ChunksOpt), ("variant", VariantOpt),
    ("mem_limit", MemLimitOpt), ("param", ParamOpt), ("cost", CostOpt),
    ("semantics", SemanticsOpt), ("comm_stream", StreamOpt),
    ("eager_threshold", ThresholdOpt), ("launch_cost", LaunchCostOpt),
    ("lazy_init", LazyInitOpt), ("init_cost", InitCostOpt), ("connections", ConnectionsOpt),
    ("group_semantics", GroupSemanticsOpt), ("message_bytes", BytesOpt),
    ("latency", LatencyOpt), ("bandwidth", BandwidthOpt), ("comm_policy", PolicyOpt),
    ("program", ProgramOpt), ("schedule_file", ScheduleFileOpt), ("stages", StagesOpt),
    ("placement", PlacementOpt),
]
#: the --help panel of each shared scenario flag (typer's rich_help_panel)
_PANELS = {"Schedule": ("schedule", "ranks", "microbatches", "chunks", "variant",
                        "mem_limit", "program", "schedule_file", "stages", "placement"),
           "Costs and links": ("cost", "message_bytes", "latency", "bandwidth",
                               "launch_cost"),
           "Comm": ("semantics", "comm_stream", "eager_threshold", "lazy_init", "init_cost",
                    "comm_policy", "param")}
for _panel, _names in _PANELS.items():
    for _n, _a in _SCENARIO_PARAMS:
        if _n in _names:
            _a.__metadata__[0].rich_help_panel = _panel
for _a, _panel in ((FormatOpt, "Outputs"), (LimitOpt, "Run"), (VersionOpt, "Run"),
                   (TablesQuietOpt, "Outputs")):
    _a.__metadata__[0].rich_help_panel = _panel

#: the flags that only say which program to run (no costs, links or semantics)
PROGRAM_FLAGS = ("scenario", "schedule", "ranks", "microbatches", "chunks", "variant",
                 "mem_limit", "param", "comm_policy", "program", "schedule_file", "stages",
                 "placement")


def scenario_command(fn: Callable | None = None, *,
                     flags: tuple[str, ...] | None = None, timelines: bool = False
                     ) -> Callable:
    """Give ``fn(sc: Scenario, **own)`` the shared scenario flags: the wrapper builds the
    :class:`Scenario` from them (a scenario file, then the flags on top) and passes it as
    ``sc``; the command's own parameters follow. ``flags`` limits the shared flags (e.g.
    :data:`PROGRAM_FLAGS`). A command with an ``all_semantics`` parameter also accepts
    ``--semantics all``. With ``timelines``, a Timeline JSON in place of the scenario (or
    in a ``from_timeline`` parameter) is passed as a
    :class:`~schedsim.cli.inputs.TimelineInput` (:mod:`schedsim.cli.inputs`).
    Use as ``@scenario_command`` or ``@scenario_command(flags=..., timelines=...)``."""
    if fn is None:
        return functools.partial(scenario_command, flags=flags, timelines=timelines)
    from schedsim.cli.inputs import InputArg

    shared_params = [(n, InputArg if timelines and n == "scenario" else a)
                     for n, a in _SCENARIO_PARAMS if flags is None or n in flags]
    names = [n for n, _ in shared_params]
    hints = param_hints(fn)
    own = [p.replace(annotation=hints.get(n, p.annotation))
           for n, p in inspect.signature(fn).parameters.items() if n != "sc"]
    takes_all = any(p.name == "all_semantics" for p in own)

    @functools.wraps(fn)
    def wrapper(**kw: Any) -> Any:
        shared = {n: kw.pop(n) for n in names}
        if timelines:
            from schedsim.cli.inputs import pick_timeline

            given = pick_timeline(shared, kw)
            if given is not None or kw.get("from_trace") and not any(shared.values()):
                return fn(given, **kw)      # (--from-trace: an input of its own)
        if not any(shared.get(n) is not None for n in
                   ("scenario", "schedule", "program", "schedule_file")):
            fail("give a scenario file, --schedule NAME, --program FILE or "
                 "--schedule-file FILE")
        if takes_all and shared.get("semantics") == "all":
            shared["semantics"] = None
            kw["all_semantics"] = True
        return fn(build_scenario(**shared), **kw)

    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None,
                                annotation=a) for n, a in shared_params]
    sig = inspect.Signature(
        params + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
    wrapper.__signature__ = sig
    wrapper.__annotations__ = {n: p.annotation for n, p in sig.parameters.items()}
    del wrapper.__wrapped__
    return wrapper

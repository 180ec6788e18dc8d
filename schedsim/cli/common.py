"""Options shared by the CLI commands and the error handling every command uses."""
from __future__ import annotations

import functools
import inspect
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from schedsim.errors import SchedsimError
from schedsim.scenario import Scenario, load_scenario, parse_scenario
from schedsim.sim.costs import parse_cost_string

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on stderr (one line, no traceback) and exit with ``code``."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True,
                      highlight=False)
    raise typer.Exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn :class:`SchedsimError` and OS errors into a one-line message and exit code."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SchedsimError as e:
            fail(str(e), e.exit_code)
        except OSError as e:
            fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), 2)
    return wrapper


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
MemLimitOpt = Annotated[Optional[float], typer.Option(
    "--mem-limit", help="Activation memory limit (in microbatches' activations) for the "
    "memory-limited zero-bubble schedules.")]
ParamOpt = Annotated[Optional[list[str]], typer.Option(
    "--param", help="Extra generator or comm-policy parameter KEY=VALUE (repeatable), "
    "e.g. group_size=6, batch_p2p_comm=false.")]
CostOpt = Annotated[Optional[str], typer.Option(
    "--cost", help="Costs per kind, e.g. F=1,B=1,W=1,BW=2,FB=3 (BW defaults to B+W, FB to "
    "F+BW).")]
SemanticsOpt = Annotated[Optional[str], typer.Option(
    "--semantics", help="data | eager | rendezvous.")]
StreamOpt = Annotated[Optional[str], typer.Option(
    "--comm-stream", help="none | per-peer | per-rank: P2P launches of a rank share a "
    "stream.")]
ThresholdOpt = Annotated[Optional[float], typer.Option(
    "--eager-threshold", help="Under rendezvous, messages of at most this many bytes are "
    "eager.")]
LaunchCostOpt = Annotated[Optional[float], typer.Option(
    "--launch-cost", help="Host time to launch one batch of sends/recvs, in the cost "
    "unit (default 0; 'schedsim calibrate' measures it).")]
BytesOpt = Annotated[Optional[float], typer.Option(
    "--message-bytes", help="Bytes per message (activation or gradient).")]
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
    "--placement", help="loop | v | dual (with --program / --schedule-file).")]


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def key_values(items: list[str] | None, flag: str, hint: str = "") -> dict[str, Any]:
    """``KEY=VALUE`` flag items as a dict: keys with ``-`` read as ``_``, values as bool,
    int, float or text. Exits 2 naming ``flag`` (and ``hint``) on an item without ``=``."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            fail(f"bad {flag} {item!r}: expected KEY=VALUE{hint}")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = _value(v.strip())
    return out


def build_scenario(scenario: Path | None = None, *, schedule: str | None = None,
                   ranks: int | None = None, microbatches: int | None = None,
                   chunks: int | None = None, variant: str | None = None,
                   mem_limit: float | None = None, param: list[str] | None = None,
                   cost: str | None = None, semantics: str | None = None,
                   comm_stream: str | None = None, eager_threshold: float | None = None,
                   launch_cost: float | None = None,
                   message_bytes: float | None = None, latency: float | None = None,
                   bandwidth: float | None = None, comm_policy: str | None = None,
                   program: Path | None = None, schedule_file: Path | None = None,
                   stages: int | None = None, placement: str | None = None) -> Scenario:
    """A :class:`Scenario` from a TOML file (optional) with the CLI flags applied on top.

    Raises :class:`~schedsim.errors.ScenarioError` for bad values.
    """
    if scenario is not None:
        sc = load_scenario(scenario)
        data = sc.model_dump(exclude={"base_dir"}, exclude_none=True, exclude_unset=True)
        base = sc.base_dir
    else:
        data, base = {}, "."
    sched = data.setdefault("schedule", {})
    if program is not None or schedule_file is not None:
        for k in ("name", "program", "schedule_file"):
            sched.pop(k, None)
    for k, v in (("name", schedule), ("ranks", ranks), ("microbatches", microbatches),
                 ("chunks", chunks), ("variant", variant), ("mem_limit", mem_limit),
                 ("comm_policy", comm_policy), ("stages", stages), ("placement", placement),
                 ("program", str(program.resolve()) if program else None),
                 ("schedule_file", str(schedule_file.resolve()) if schedule_file else None)):
        if v is not None:
            sched[k] = v
    sched.update(key_values(param, "--param"))
    if cost is not None:
        data["costs"] = parse_cost_string(cost, parse_scenario(data).costs).model_dump(
            exclude_unset=True)
    comm = data.setdefault("comm", {})
    for k, v in (("semantics", semantics), ("comm_stream", comm_stream),
                 ("eager_threshold_bytes", eager_threshold), ("launch_cost", launch_cost)):
        if v is not None:
            comm[k] = v
    if message_bytes is not None:
        data.setdefault("costs", {})["message_bytes"] = message_bytes
    link = data.setdefault("link", {})
    if latency is not None:
        link["latency"] = latency
    if bandwidth is not None:
        link["bandwidth"] = bandwidth
    return parse_scenario(data, str(scenario) if scenario else "command line", base)


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
    ("message_bytes", BytesOpt),
    ("latency", LatencyOpt), ("bandwidth", BandwidthOpt), ("comm_policy", PolicyOpt),
    ("program", ProgramOpt), ("schedule_file", ScheduleFileOpt), ("stages", StagesOpt),
    ("placement", PlacementOpt),
]
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
    hints = typing.get_type_hints(fn, include_extras=True)
    own = [p.replace(annotation=hints.get(n, p.annotation))
           for n, p in inspect.signature(fn).parameters.items() if n != "sc"]
    takes_all = any(p.name == "all_semantics" for p in own)

    @functools.wraps(fn)
    def wrapper(**kw: Any) -> Any:
        shared = {n: kw.pop(n) for n in names}
        if timelines:
            from schedsim.cli.inputs import pick_timeline

            given = pick_timeline(shared, kw)
            if given is not None:
                return fn(given, **kw)
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

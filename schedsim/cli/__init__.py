"""The ``schedsim`` command (typer). Each command module registers itself on :data:`app`.

Errors caused by input print one line (``error: ...``) and exit 2 (3 for a deadlock);
see :func:`schedsim.cli.common.handle_errors`.
"""
from __future__ import annotations

import importlib
from typing import Any

import typer


def _no_params() -> None:
    """The callback of a command listed by the top-level help (never run)."""


def _summary(info: typer.models.CommandInfo) -> typer.models.CommandInfo:
    """``info`` as the top-level help lists it: its name and help (the command function's
    docstring, as typer reads it), no parameters (typer would introspect every one)."""
    import copy
    import inspect

    out = copy.copy(info)
    out.name = info.name or typer.main.get_command_name(info.callback.__name__)
    out.help = inspect.getdoc(info.callback) if info.help is None else info.help
    out.callback = _no_params
    return out


class _Commands(typer.Typer):
    """The ``schedsim`` app. Its command list loads every command module the first time
    it is read (building the click command, a test's ``CliRunner``), unless
    :func:`load_commands` chose the modules for one command line first; a command line
    that names no command (``--help``, ``--version``, an unknown command) lists each
    command by its name and help only (:func:`_summary`)."""

    _chosen = False
    _summaries = False

    def command(self, name: str | None = None, **kwargs: Any) -> Any:
        """typer's ``command``, with the command's one-line summary in the command list
        (``short_help``) from :data:`SUMMARY` unless given."""
        register = super().command

        def decorator(f: Any) -> Any:
            cmd = name or typer.main.get_command_name(f.__name__)
            kwargs.setdefault("short_help", SUMMARY.get(cmd))
            return register(name, **kwargs)(f)
        return decorator

    @property
    def registered_commands(self) -> list:
        if not self._chosen:
            self._chosen = True
            for mod in COMMAND_MODULES:
                importlib.import_module(f"{__name__}.{mod}")
        if self._summaries:
            return [_summary(info) for info in self._registered]
        return self._registered

    @registered_commands.setter
    def registered_commands(self, value: list) -> None:
        self._registered = value


app = _Commands(
    name="schedsim",
    help="Pipeline-parallel schedule simulator: generate, simulate, explain, draw and "
         "replay PP schedules.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    """``--version``: print the version and exit (an eager option of every command)."""
    if value:
        from schedsim.util.version import __version__

        typer.echo(f"schedsim {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True,
        help="Print the version and exit.")) -> None:
    """Pipeline-parallel schedule simulator: generate, simulate, explain, draw and replay
    PP schedules."""

#: command modules, imported in this order (each adds its commands to ``app``)
COMMAND_MODULES = ("simulate", "render", "replay", "analysis", "compare", "diff",
                   "collectives", "check", "search", "report", "workload", "plan")
#: each command's module: a command line that names one loads only that module (the
#: start-up of a small ``simulate`` does not import the others); tests/test_cli_imports.py
#: checks it against what the modules register
COMMAND_MODULE = {
    **dict.fromkeys(("simulate", "list", "generate"), "simulate"),
    "render": "render",
    **dict.fromkeys(("replay", "calibrate", "import-trace"), "replay"),
    **dict.fromkeys(("stalls", "align", "critical-path", "query", "lint"), "analysis"),
    **dict.fromkeys(("compare", "memory"), "compare"), "diff": "diff",
    "check-collectives": "collectives", "check-trace": "check", "search": "search",
    "report": "report", "costs": "workload", "plan": "plan",
}


#: each command's summary in ``schedsim --help``'s list: one short sentence (typer would
#: list the docstring's first paragraph, line breaks and all)
SUMMARY = {
    "costs": "Print the costs a scenario's \\[workload] derives.",
    "simulate": "Simulate a schedule: makespan, idle time, bubble ratio.",
    "list": "List the schedules, comm policies and comm semantics.",
    "generate": "Write a schedule as program text, JSON or torch CSV.",
    "render": "Draw a Timeline JSON as a Gantt chart, or overlay two.",
    "replay": "Run a schedule for real on torch.distributed; measure it.",
    "calibrate": "Measure op and link costs on real ranks into a cost file.",
    "import-trace": "Read torch.profiler traces into a measured Timeline.",
    "stalls": "Classify every idle interval of every rank and say why.",
    "align": "Show when each message was ready, posted and received.",
    "critical-path": "Show the ops, messages and waits that set the makespan.",
    "query": "Tell whether CAUSE delays EFFECT, by how much and how.",
    "lint": "Find late sends, crossed posting orders and deadlocks.",
    "compare": "Run every applicable schedule and compare them.",
    "diff": "Show the per-op start and makespan deltas of two runs.",
    "memory": "Print the peak activation and parameter memory per rank.",
    "check-collectives": "Check tensor-parallel all-reduce gradients over gloo.",
    "check-trace": "Check the simulator against a real run's profiler traces.",
    "search": "Search the op order with the least makespan.",
    "report": "Write an interactive HTML report of a run.",
    "plan": "Find the best parallel layout and schedule for N GPUs.",
}


def load_commands(argv: list[str] | None = None) -> None:
    """Import the command modules ``argv`` (the arguments after the program name) needs:
    the named command's module when the first argument is a command, else all of them
    (``--help``, ``--version``, an unknown command: the full list)."""
    name = next(iter(argv or ()), None)
    mods = (COMMAND_MODULE[name],) if name in COMMAND_MODULE else COMMAND_MODULES
    app._chosen = True
    for mod in mods:
        importlib.import_module(f"{__name__}.{mod}")
    # (after the imports: they register the commands) no argument names a command, so
    # none can run: the command list is their summaries
    app._summaries = not any(a in COMMAND_MODULE for a in argv or ())


def __getattr__(name: str):
    """``schedsim.cli.<command module>`` for readers that reach for one as an attribute."""
    if name in COMMAND_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _usage_error_types() -> tuple[type, type]:
    """click's ``UsageError`` and ``Abort`` as typer raises them (typer may vendor its own
    click: found through the public ``typer.BadParameter`` and ``typer.Abort``)."""
    usage = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    return usage, typer.Abort


def main() -> None:
    """Console-script entry point. A usage error typer would print as a multi-line box
    (``-p abc``, an unknown or missing option) is one ``error:`` line naming what is wrong
    and the command's ``--help``, exit 2, like every other bad input; a bare command with
    no arguments still prints its help. A closed pipe on stdout or stderr (``| head -1``)
    sends the rest of that stream to /dev/null: the command finishes, writes its output
    files and exits with its own code (:func:`schedsim.cli.console.guard_closed_pipes`)."""
    import os
    import sys

    from schedsim.util.signals import stop_at_exit

    stop_at_exit()      # outside a command's work a stop signal is one line, 128 + N
    load_commands(sys.argv[1:])
    from schedsim.cli.console import guard_closed_pipes

    guard_closed_pipes()    # `... | head -1`: the rest of stdout to /dev/null, exit as usual
    usage, abort = _usage_error_types()
    try:
        code = app(standalone_mode=False)
    except usage as e:
        if type(e).__name__ == "NoArgsIsHelpError":     # `schedsim` alone: the help
            e.show()
            code = e.exit_code
        else:
            from schedsim.util.text import terminal_safe

            sub = e.ctx.command_path if e.ctx is not None else "schedsim"
            msg = terminal_safe(" ".join(e.format_message().split()))
            print(f"error: {msg} (see '{sub} --help')", file=sys.stderr)
            code = 2
    except abort:               # Ctrl-C at a prompt
        print("error: interrupted", file=sys.stderr)
        code = 130
    code = code if isinstance(code, int) else 0
    # the command is done (outputs whole, temp files removed): end here rather than in the
    # interpreter's shutdown, which resets the signal handlers to the defaults (a SIGTERM
    # there killed the process silently) and which a signal taken inside a C
    # extension's callback can crash
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

"""The ``schedsim`` command (typer). Each command module registers itself on :data:`app`.

Errors caused by input print one line (``error: ...``) and exit 2 (3 for a deadlock);
see :func:`schedsim.cli.common.handle_errors`.
"""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="schedsim",
    help="Pipeline-parallel schedule simulator: generate, simulate, explain, draw and "
         "replay PP schedules.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)

#: command modules, imported in this order (each adds its commands to ``app``)
COMMAND_MODULES = ("simulate", "render", "replay", "analysis", "compare", "collectives",
                   "check", "search", "report", "workload", "plan")

for _mod in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_mod}")


def main() -> None:
    """Console-script entry point."""
    app()

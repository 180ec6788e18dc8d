"""User-facing errors.

Every error a user can cause (bad scenario, impossible parameters, a schedule that misses
an op, a program that deadlocks) is a :class:`SchedsimError`. The CLI prints its message on
one line and exits with :attr:`SchedsimError.exit_code` (2, or 3 for a deadlock) without a
traceback; library users catch it like any exception.
"""
from __future__ import annotations

from typing import Any


class SchedsimError(Exception):
    """Base class of every error caused by user input. Exit code 2 from the CLI."""

    exit_code = 2


class ScenarioError(SchedsimError):
    """A scenario file or CLI option is malformed (bad TOML, unknown key, bad value)."""


class FlagError(ScenarioError):
    """A value a command-line flag set is refused: ``flag`` is the flag's field name
    (``ranks`` for ``--ranks``/``-p``, a :class:`schedsim.scenario_flags.ScenarioFlags`
    field), ``reason`` what is wrong with it. The CLI names the flag as a usage error
    (:func:`schedsim.cli.common.handle_errors`)."""

    def __init__(self, flag: str, reason: str) -> None:
        super().__init__(f"--{flag.replace('_', '-')}: {reason}")
        self.flag, self.reason = flag, reason


class ScheduleError(SchedsimError):
    """A schedule is invalid: impossible parameters, a missing/duplicate op, a wrong order."""


class ProgramError(SchedsimError):
    """A per-rank program is inconsistent (unmatched send/recv, a recv never waited, ...)."""


class ParseError(SchedsimError):
    """A token, program line or CSV cell could not be parsed."""


class InputError(ScenarioError):
    """An input file cannot be used: missing, not a regular file, too large, not UTF-8
    text, or not decodable (malformed, nested too deeply, a number too large). The
    message names the file and quotes at most a short excerpt of it."""


class LimitError(ScenarioError):
    """Work above a limit of :mod:`schedsim.util.limits` was refused before it started;
    the message gives the estimate and the ``--limit KEY=N`` that raises the limit."""


class Stopped(SchedsimError):
    """The command was stopped by SIGTERM or SIGHUP (its temporary files removed first).
    ``exit_code`` is the shell's convention for a death by that signal: 128 + its
    number (143 for SIGTERM, 129 for SIGHUP)."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        import signal

        name = signal.Signals(signum).name
        super().__init__(message or f"stopped by {name}: temporary files removed, no output "
                                    f"written")
        self.signum = signum
        self.exit_code = 128 + signum


class DeadlockError(SchedsimError):
    """The simulated program can never finish. Exit code 3 from the CLI.

    ``timeline`` is the partial :class:`~schedsim.timeline.Timeline` with its ``deadlock``
    field filled (blocked ranks and the wait-for cycle), so callers can still write it out.
    """

    exit_code = 3

    def __init__(self, message: str, timeline: Any = None) -> None:
        super().__init__(message)
        self.timeline = timeline


def file_message(source: str | None, text: str) -> str:
    """``text`` starting with ``source: `` (a scenario file's name, or what the scenario
    was read from), once: the one home of that prefix (None: ``text`` as it is)."""
    if not source or text.startswith(f"{source}:"):
        return text
    return f"{source}: {text}"


def in_file(e: SchedsimError, file: str | None) -> SchedsimError:
    """``e`` (the same exception, its type and fields kept) with its message starting with
    the scenario ``file``'s name (:func:`file_message`); a flag's error (it names the
    flag), an input file's (it names that file) and a work limit's stay as they are."""
    if file and not isinstance(e, (FlagError, InputError, LimitError)) and e.args:
        e.args = (file_message(file, str(e)), *e.args[1:])
    return e

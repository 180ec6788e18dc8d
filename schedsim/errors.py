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


class ScheduleError(SchedsimError):
    """A schedule is invalid: impossible parameters, a missing/duplicate op, a wrong order."""


class ProgramError(SchedsimError):
    """A per-rank program is inconsistent (unmatched send/recv, a recv never waited, ...)."""


class ParseError(SchedsimError):
    """A token, program line or CSV cell could not be parsed."""


class DeadlockError(SchedsimError):
    """The simulated program can never finish. Exit code 3 from the CLI.

    ``timeline`` is the partial :class:`~schedsim.timeline.Timeline` with its ``deadlock``
    field filled (blocked ranks and the wait-for cycle), so callers can still write it out.
    """

    exit_code = 3

    def __init__(self, message: str, timeline: Any = None) -> None:
        super().__init__(message)
        self.timeline = timeline

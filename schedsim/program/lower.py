"""Lowering: Schedule (compute order) -> Program, by a named comm policy.

The policies: ``async`` and ``commit`` (:mod:`schedsim.program.lowering`), ``torch``
(:mod:`schedsim.program.torch_runtime`). Each is a function ``Schedule -> Program``.
"""
from __future__ import annotations

from typing import Callable

from schedsim.errors import ScheduleError
from schedsim.program.ir import Program, Schedule
from schedsim.program.lowering import lower_async, lower_commit
from schedsim.program.torch_runtime import lower_torch

#: policy name -> function(schedule) -> Program
POLICIES: dict[str, Callable[[Schedule], Program]] = {
    "async": lower_async,
    "commit": lower_commit,
    "torch": lower_torch,
}


def lower(schedule: Schedule, policy: str = "async") -> Program:
    """Lower ``schedule`` to a :class:`Program` with the named comm ``policy``.

    Raises :class:`ScheduleError` for an unknown policy.
    """
    fn = POLICIES.get(policy)
    if fn is None:
        raise ScheduleError(f"unknown comm policy {policy!r}: expected one of "
                            f"{', '.join(sorted(POLICIES))}")
    return fn(schedule)

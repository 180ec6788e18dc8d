"""Up-front limits: refuse work that cannot fit before building any of it.

A generator, a program file, a schedule file, a timeline or a trace says how big the
work is (ranks, stages, microbatches, tokens) before anything is built; the entry points
estimate the instruction count from those numbers and refuse anything above
:class:`Limits` (defaults below) with exit 2, the estimate and the flag that raises the
limit (:class:`~schedsim.errors.LimitError`).
A refusal costs milliseconds and no memory, where building the work would take minutes
and gigabytes (``simulate -s 1f1b -p 1000000 -m 8``) or never end.

Limits (``--max KEY=N`` on every command, repeatable; :func:`using` in code):

- ``instructions`` (default 20,000,000): per-rank program instructions, estimated as
  :data:`INSTR_PER_CELL` x stages x microbatches for a generator (an upper bound of what
  any generator and comm policy emits per (stage, microbatch)), counted for a file; also bounds
  stages x microbatches of a file (every per-stage, per-microbatch table) and the spans,
  messages and waits of a timeline or trace. The simulator needs about 0.6 KB and 25 µs
  per instruction today (1F1B, 64 ranks x 4,096 microbatches: 1.9 M instructions,
  1.2 GB, 44 s on a shared 2-core machine).
- ``ranks`` (default 4,096): pipeline ranks of a program, a timeline or a trace.
- ``procs`` (default 64): local processes ``replay`` / ``calibrate`` start.
- ``file_mb`` (default 256): size of one input file (MiB).

Limits live in a :class:`contextvars.ContextVar`, so a library caller or a test sets them
for a block (:func:`using`) without touching other threads. No schedsim imports but
:mod:`schedsim.errors`.
"""
from __future__ import annotations

import contextvars
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Iterator

from schedsim.errors import LimitError, ScenarioError

#: instructions per (stage, microbatch) a generated program has at most: 3 compute ops
#: (F, B, W), 4 posts (the F and B messages it sends and receives), one wait each, and a
#: spare (module docstring; measured worst: 10.7, torch's runtime on interleaved-zb)
INSTR_PER_CELL = 12


@dataclass(frozen=True)
class Limits:
    """The limits in force (module docstring)."""

    instructions: int = 20_000_000
    ranks: int = 4_096
    procs: int = 64
    file_mb: int = 256

    @property
    def file_bytes(self) -> int:
        return self.file_mb * 1024 * 1024


KEYS = tuple(f.name for f in fields(Limits))
_current: contextvars.ContextVar[Limits] = contextvars.ContextVar(
    "schedsim_limits", default=Limits())


def current() -> Limits:
    """The limits in force in this context."""
    return _current.get()


@contextmanager
def using(**values: int) -> Iterator[Limits]:
    """Set limits (``instructions=..., ranks=...``) for the block; the others keep their
    current value. Raises :class:`ScenarioError` for an unknown key or a value < 1."""
    for k, v in values.items():
        if k not in KEYS:
            raise ScenarioError(f"unknown limit {k!r}: expected one of {', '.join(KEYS)}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScenarioError(f"limit {k} must be a whole number >= 1 (got {v!r})")
    token = _current.set(replace(current(), **values))
    try:
        yield current()
    finally:
        _current.reset(token)


def parse_limits(items: list[str] | None) -> dict[str, int]:
    """``--max KEY=N`` items as ``{key: n}`` (``N`` may be ``2e7`` or ``20_000_000``).
    Raises :class:`ScenarioError` naming a bad item and the keys."""
    out: dict[str, int] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in KEYS:
            raise ScenarioError(f"bad --max {item[:60]!r}: expected KEY=N with KEY one of "
                                f"{', '.join(KEYS)}, e.g. --max instructions=50000000")
        try:
            n = float(val.strip())
        except ValueError:
            n = math.nan
        if not (math.isfinite(n) and n >= 1 and n == int(n)) or n > 2 ** 62:
            raise ScenarioError(f"bad --max {item[:60]!r}: N must be a whole number >= 1")
        out[key] = int(n)
    return out


def check(key: str, value: int, what: str, shrink: str = "") -> None:
    """Raise :class:`LimitError` if ``value`` exceeds the limit ``key``: ``what`` says what
    was counted or estimated (e.g. ``"1f1b on 8 ranks x 10 microbatches: about 720
    instructions"``), ``shrink`` what to make smaller instead of raising the limit
    (``"fewer --schedules"``; the message then reads "(fewer --schedules, or raise it
    with --max ...)")."""
    limit = getattr(current(), key)
    if value > limit:
        unit = "MiB per input file" if key == "file_mb" else key
        how = f"{shrink}, or raise it" if shrink else "raise it"
        raise LimitError(f"refusing {what}: above the limit of {limit:,} {unit} ({how} "
                         f"with --max {key}={value})")


#: the most worker processes or threads a command starts (``plan -j``, ``compare -j``,
#: ``search --workers``): more is a typo that forks thousands of processes
MAX_WORKERS = 256


def check_workers(flag: str, n: int, minimum: int = 1) -> None:
    """Refuse (:class:`ScenarioError`) ``n`` workers outside ``minimum..``:data:`MAX_WORKERS`
    for the flag ``flag`` (``-j``, ``--workers``): the one home of that rule."""
    if isinstance(n, bool) or not isinstance(n, int) or not minimum <= n <= MAX_WORKERS:
        raise ScenarioError(f"{flag} must be in {minimum}..{MAX_WORKERS} (got {n!r}): the "
                            f"worker processes or threads to start")


def check_total_instructions(what: str, sizes: list[tuple[int, int]]) -> None:
    """Refuse (:class:`LimitError`) a sweep of several programs ``sizes`` ((stages,
    microbatches) each) whose estimated instructions together exceed the ``instructions``
    limit: ``what`` names the sweep (``"compare of 9 schedules"``)."""
    total = sum(estimate_instructions(st, mb) for st, mb in sizes)
    check("instructions", total, f"{what}: about {total:,} instructions in all")


def estimate_instructions(stages: int, microbatches: int) -> int:
    """Upper estimate of a generated program's instructions: :data:`INSTR_PER_CELL` x
    stages x microbatches."""
    return INSTR_PER_CELL * stages * microbatches


def check_program_size(what: str, *, ranks: int | None = None, stages: int | None = None,
                       microbatches: int | None = None,
                       instructions: int | None = None) -> None:
    """Refuse (:class:`LimitError`) a program of ``what`` (a generator name, a file) whose
    ranks, or stages x microbatches (every per-stage, per-microbatch table), or
    instructions (counted, or estimated from stages x microbatches when None) exceed the
    limits. Call it with whatever is known before anything is built."""
    if ranks is not None:
        check("ranks", ranks, f"{what} with {ranks:,} ranks")
    if stages is not None and microbatches is not None:
        cells = stages * microbatches
        if instructions is None:
            check("instructions", estimate_instructions(stages, microbatches),
                  f"{what} with {stages:,} stages x {microbatches:,} microbatches: about "
                  f"{estimate_instructions(stages, microbatches):,} instructions")
        else:
            check("instructions", cells, f"{what} with {stages:,} stages x {microbatches:,} "
                                         f"microbatches ({cells:,} per-stage, per-microbatch "
                                         f"entries)")
    if instructions is not None:
        check("instructions", instructions, f"{what} with {instructions:,} instructions")


#: digits a stage, microbatch or rank number may have in a text input (a billion - 1)
MAX_DIGITS = 9
_LONG_NUMBER = re.compile(r"\d{10,}")


def check_number_sizes(text: str, source: str | object) -> None:
    """Refuse a text input (program, CSV) with a number of more than :data:`MAX_DIGITS`
    digits, before a parser turns it into an index (a stage of 10^9 would size tables of
    that many entries, one of 5,000 digits exceeds Python's integer conversion limit).
    Raises :class:`~schedsim.errors.ParseError` naming ``source`` and the line."""
    from schedsim.errors import ParseError

    m = _LONG_NUMBER.search(text)
    if m is not None:
        line = text.count("\n", 0, m.start()) + 1
        raise ParseError(f"{source}: line {line}: a number of {len(m.group()):,} digits: "
                         f"stages, microbatches and ranks have at most {MAX_DIGITS}")

"""Reading and writing schedules and programs as files.

- ``.json``: schedsim's own format, the pydantic dump of :class:`~schedsim.program.ir.Schedule`
  (``{"name", "placement": {"kind", "ranks", "stages", ...}, "microbatches",
  "ranks": [["0F0", "0F1", ...], ...]}``); a dump of a :class:`~schedsim.program.ir.Program` (comm
  tokens included) loads as its compute schedule.
- ``.csv``: torch.distributed.pipelining's schedule CSV (see
  :mod:`schedsim.interop.torch_format`).
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from schedsim.errors import ParseError, ScenarioError, SchedsimError, Stopped
from schedsim.program.ir import Program, Schedule


def load_schedule_file(path: str | Path, *, placement: str | None = None,
                       stages: int | None = None, microbatches: int | None = None) -> Schedule:
    """Load a compute schedule from ``.json`` or torch ``.csv``.

    For CSV, ``placement`` (``loop``, ``v`` or ``dual``), ``stages`` and ``microbatches``
    say how to read it (defaults: loop, one stage per rank, two for v, the ranks for dual,
    the largest mb + 1).
    Every loaded schedule is validated (:func:`schedsim.program.validate.validate_schedule`).
    Raises :class:`ScenarioError` or :class:`ParseError` naming what is wrong, or
    :class:`~schedsim.errors.ScheduleError` naming the file and first offending action.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        from schedsim.util.inputs import loading

        with loading(path, "schedule JSON"):
            return _load_json(path)
    if suffix == ".csv":
        from schedsim.interop.torch_format import read_torch_csv

        return read_torch_csv(path, placement=placement or "loop", stages=stages,
                              microbatches=microbatches)
    raise ScenarioError(f"{path}: unknown schedule format {suffix!r} (expected .json or .csv)")


def _check_size(path: Path, data: dict) -> None:
    """Bounds of a schedule JSON before any model is built: token count, numbers of at
    most :data:`~schedsim.util.limits.MAX_DIGITS` digits, ranks and stages x
    microbatches within the limits (:mod:`schedsim.util.limits`)."""
    from schedsim.util.limits import check_number_sizes, check_program_size

    tokens = [t for row in data["ranks"] for t in row]
    check_program_size(str(path), instructions=len(tokens))
    check_number_sizes(" ".join(t for t in tokens if isinstance(t, str)), path)
    pl = data.get("placement")
    pl = pl if isinstance(pl, dict) else {}
    sizes = [pl.get("ranks"), pl.get("stages"), data.get("microbatches")]
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in sizes):
        return          # the model names the bad type
    ranks, stages, mb = (v if v is not None else 1 for v in sizes)
    check_program_size(str(path), ranks=max(ranks, len(data["ranks"])),
                       stages=max(stages, 1), microbatches=max(mb, 1),
                       instructions=len(tokens))


def _load_json(path: Path) -> Schedule:
    from schedsim.util.inputs import read_input_text
    from schedsim.util.text import clip, shorten_quotes

    try:
        data = json.loads(read_input_text(path, "schedule JSON"))
    except json.JSONDecodeError as e:
        raise ParseError(f"{path}: malformed JSON: {e}") from None
    if isinstance(data, dict) and "spans" in data:
        raise ParseError(f"{path}: this is a Timeline JSON (simulate --json), not a "
                         f"schedule; write a schedule with 'schedsim generate NAME "
                         f"--format json'")
    if not (isinstance(data, dict) and isinstance(data.get("ranks"), list)
            and all(isinstance(row, list) for row in data["ranks"])):
        raise ParseError(f"{path}: not a schedsim schedule JSON (expected an object with "
                         f"placement, microbatches and ranks: one list of tokens per "
                         f"rank)")
    _check_size(path, data)
    try:
        if isinstance(data, dict) and any(
                isinstance(t, str) and not _is_compute(t)
                for row in data.get("ranks", []) for t in row):
            sched = Program.model_validate(data, strict=True).schedule()
        else:
            sched = Schedule.model_validate(data, strict=True)
    except ValidationError as e:
        err = e.errors()[0]
        loc = clip(".".join(str(x) for x in err["loc"]))
        raise ParseError(f"{path}: '{loc}': {shorten_quotes(err['msg'])}") from None
    except Stopped:
        raise           # a stop signal is the user's, never the input's error
    except SchedsimError as e:
        raise ParseError(f"{path}: {shorten_quotes(str(e))}") from None
    from schedsim.program.tokens import format_op
    from schedsim.program.validate import validate_schedule

    validate_schedule(sched, locate=lambda r, i: (
        f"{path}: rank {r}, op {i} ({format_op(sched.ranks[r][i])})"))
    return sched


def _is_compute(tok: str) -> bool:
    from schedsim.program.tokens import parse_op

    try:
        parse_op(tok)
        return True
    except ParseError:
        return False

"""torch.distributed.pipelining action strings and schedule CSV, read and written.

Action grammar (torch 2.13 ``_Action.__repr__`` / ``_Action.from_str`` in
``torch/distributed/pipelining/schedules.py``), one action per CSV cell::

    compute      {stage}{F|I|W|B}{mb}               0F1  2I0  2W0  1B3
    overlap      ({stage}F{mb};{stage}{I|B}{mb})OVERLAP_F_B      (0F3;3B1)OVERLAP_F_B
    comm         {stage}{SEND_F|RECV_F|SEND_B|RECV_B}{mb}        3SEND_F1  4RECV_B0
    bookkeeping  {stage}{UNSHARD|RESHARD|REDUCE_GRAD}  (FSDP / grad reduction: read, dropped)

torch's ``I`` (backward for inputs) is schedsim's ``B``; torch's ``B`` (full backward) is
schedsim's ``BW``. A CSV has one row per rank (row 1 = rank 0) and one cell per action in
execution order; an empty cell is an idle step (torch's ``None``) and is skipped. A
*compute-only* CSV (torch's ``format="compute_only"``) holds compute actions; a
*compute+comms* CSV (``"compute_comms"``, what ``_PipelineScheduleRuntime._dump_csv``
writes) also holds SEND/RECV actions, and runs as torch's runtime runs it: each action is
posted where it stands, a compute waits the RECVs of its inputs right before it, sends are
waited at the end. Parsing is strict: a cell must be exactly one action (torch itself
accepts ``0F0junk`` as ``0F0``); errors name the cell.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from schedsim.errors import ParseError, ScenarioError, ScheduleError
from schedsim.program.ir import Comm, Compute, Op, Placement, Program, Schedule
from schedsim.program.ops import launched

_COMPUTE = re.compile(r"(\d+)(F|I|W|B)(\d+)")
_COMM = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)")
_BOOK = re.compile(r"(\d+)(UNSHARD|RESHARD|REDUCE_GRAD)")
_OVERLAP = re.compile(r"\((\d+)(F|I|B)(\d+);(\d+)(F|I|B)(\d+)\)OVERLAP_F_B")
_FROM_TORCH = {"F": "F", "I": "B", "W": "W", "B": "BW"}
_TO_TORCH = {"F": "F", "B": "I", "W": "W", "BW": "B"}

EXPECTED = ("expected one torch action: {stage}{F|I|W|B}{mb}, ({stage}F{mb};{stage}{I|B}{mb})"
            "OVERLAP_F_B, {stage}{SEND_F|RECV_F|SEND_B|RECV_B}{mb}, "
            "{stage}{UNSHARD|RESHARD|REDUCE_GRAD} or an empty cell")

Action = Op | Comm


def parse_torch_action(text: str) -> Action | None:
    """Parse one torch action string into an :class:`Op` (compute, torch kinds converted)
    or a :class:`Comm`; ``None`` for an empty cell or a bookkeeping action.

    Surrounding whitespace is ignored; anything else must match the grammar exactly.
    Raises :class:`ParseError` naming the text and the expected forms.
    """
    t = text.strip()
    if not t or _BOOK.fullmatch(t):
        return None
    m = _COMPUTE.fullmatch(t)
    if m:
        return Op(_FROM_TORCH[m.group(2)], int(m.group(1)), int(m.group(3)))
    m = _COMM.fullmatch(t)
    if m:
        return Comm(m.group(2), int(m.group(1)), int(m.group(3)))
    m = _OVERLAP.fullmatch(t)
    if m:
        a = Op(_FROM_TORCH[m.group(2)], int(m.group(1)), int(m.group(3)))
        b = Op(_FROM_TORCH[m.group(5)], int(m.group(4)), int(m.group(6)))
        if a.kind != "F":
            a, b = b, a
        if a.kind == "F" and b.kind in ("B", "BW"):
            return Op.fb(a, b)
        raise ParseError(f"bad action {text!r}: OVERLAP_F_B pairs one forward (F) with one "
                         f"backward (I or B)")
    raise ParseError(f"bad action {text!r}: {EXPECTED}")


def format_torch_action(x: Action) -> str:
    """torch's string for a compute op or comm op (inverse of :func:`parse_torch_action`).

    Raises :class:`ScheduleError` for an op kind torch cannot express."""
    if isinstance(x, Comm):
        if x.kind.endswith("S"):
            raise ScheduleError(f"comm op {x}: a shape message (Megatron's "
                                f"variable_seq_lengths) has no torch action; write the "
                                f"program without --param variable_seq_lengths=true")
        return f"{x.stage}{x.kind}{x.mb}"
    if x.kind == "FB":
        f, b = x.parts
        return f"({format_torch_action(f)};{format_torch_action(b)})OVERLAP_F_B"
    kind = _TO_TORCH.get(x.kind)
    if kind is None:
        raise ScheduleError(f"op {x}: kind {x.kind!r} has no torch action")
    return f"{x.stage}{kind}{x.mb}"


def parse_torch_csv(text: str, source: str = "CSV") -> tuple[list[list[Action]],
                                                               list[list[int]]]:
    """Parse torch CSV text: per rank, its actions (empty cells and bookkeeping dropped),
    and for each action its 1-based CSV column.

    Trailing empty rows are ignored. Raises :class:`ParseError` naming the cell
    (``row R (rank R-1), column C``), its text and what was expected.
    """
    raw = list(csv.reader(io.StringIO(text)))
    while raw and not any(c.strip() for c in raw[-1]):
        raw.pop()
    if not raw:
        raise ParseError(f"{source}: no rows (expected one row of actions per rank)")
    rows: list[list[Action]] = []
    cols: list[list[int]] = []
    for r, cells in enumerate(raw):
        row, col = [], []
        for c, cell in enumerate(cells, 1):
            try:
                a = parse_torch_action(cell)
            except ParseError as e:
                raise ParseError(f"{source}: row {r + 1} (rank {r}), column {c}: {e}") from None
            if a is not None:
                row.append(a)
                col.append(c)
        rows.append(row)
        cols.append(col)
    return rows, cols


def _write_rows(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def schedule_to_torch_csv(schedule: Schedule) -> str:
    """A compute-only torch CSV of ``schedule`` (one row per rank, no idle cells), loadable
    with torch's ``_load_csv(..., format="compute_only")``."""
    return _write_rows([[format_torch_action(op) for op in row] for row in schedule.ranks])


def program_to_torch_csv(program: Program) -> str:
    """A compute+comms torch CSV of ``program``: its compute ops and posted SEND/RECV in
    program order (``_load_csv(..., format="compute_comms")``).

    Waits, commits and batches are not part of torch's format (a ``BATCH[...]`` is written
    as its ops, each of which torch launches on its own): torch's runtime waits each RECV right
    before its consumer and the sends at the end, so reading the file back gives the
    ``torch`` runtime's waits, not the program's batches."""
    rows = []
    for row in program.ranks:
        out = []
        for ins in row:
            if isinstance(ins, Compute):
                out.append(format_torch_action(ins.op))
            else:        # torch runs each SEND/RECV action as its own launch
                out.extend(format_torch_action(c) for c in launched(ins))
        rows.append(out)
    return _write_rows(rows)


def torch_actions_to_csv(rows: list[list[Action]]) -> str:
    """A compute+comms torch CSV of torch's own action rows
    (:func:`schedsim.program.torch_runtime.torch_actions`): an ``FB`` op is written as
    ``(a;b)OVERLAP_F_B``, as torch's ``_dump_csv`` writes it."""
    return _write_rows([[format_torch_action(a) for a in row] for row in rows])


def _read(path: str | Path) -> tuple[Path, str]:
    """The text of a torch CSV file through the bounded reader
    (:mod:`schedsim.util.inputs`), refused before parsing when a number has more than
    :data:`~schedsim.util.limits.MAX_DIGITS` digits, a cell is over 4,096 characters, the
    cells exceed the ``instructions`` limit, or the first cell is no torch action (the
    file is then not quoted)."""
    from schedsim.util.inputs import read_input_text
    from schedsim.util.limits import check, check_number_sizes
    from schedsim.util.text import looks_like_program_text

    path = Path(path)
    text = read_input_text(path, "torch CSV file")
    check_number_sizes(text, path)
    first = re.search(r"[^,\s]+", text)
    if first is not None and not looks_like_program_text(first.group()):
        raise ParseError(f"{path}: not a torch schedule CSV (its first cell is not a torch "
                         f"action; see 'schedsim generate NAME --format torch-csv')")
    cells, longest = _cell_sizes(text)
    if longest > 4096:
        for m in re.finditer(r"[^,\n]+", text):
            if m.end() - m.start() > 4096:
                line = text.count("\n", 0, m.start()) + 1
                raise ParseError(f"{path}: row {line}: a cell of {m.end() - m.start():,} "
                                 f"characters is not a torch action")
    check("instructions", cells, f"{path} with {cells:,} cells")
    return path, text


def _cell_sizes(text: str) -> tuple[int, int]:
    """``(number of cells, characters in the longest)`` of a CSV text, a cell being a
    maximal run of characters other than comma and newline (``[^,\\n]+``). ASCII text
    is measured on a byte array (about 20 ms for the 10 MB of a pp64 v4 m512 file,
    against 0.25 s for a regex loop); other text by the regex."""
    if not text.isascii():
        sizes = [m.end() - m.start() for m in re.finditer(r"[^,\n]+", text)]
        return len(sizes), max(sizes, default=0)
    import numpy as np

    b = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    seps = np.flatnonzero((b == ord(",")) | (b == ord("\n")))
    bounds = np.concatenate(([-1], seps, [len(b)]))
    runs = np.diff(bounds) - 1            # characters between consecutive separators
    runs = runs[runs > 0]
    return len(runs), int(runs.max()) if len(runs) else 0


def _parse(path: Path, text: str) -> tuple[list[list[Action]], list[list[int]]]:
    """:func:`parse_torch_csv` of a file's text, with its messages' quotes shortened and
    its size checked against the limits before any placement is built."""
    from schedsim.util.limits import check_program_size
    from schedsim.util.text import shorten_quotes

    try:
        rows, cols = parse_torch_csv(text, str(path))
    except ParseError as e:
        raise ParseError(shorten_quotes(str(e))) from None
    atoms = [a for row in rows for x in row
             for a in (x.atoms() if isinstance(x, Op) else (x,))]
    check_program_size(str(path), ranks=len(rows),
                       stages=max((a.stage for a in atoms), default=0) + 1,
                       microbatches=max((a.mb for a in atoms), default=0) + 1,
                       instructions=sum(map(len, rows)))
    return rows, cols


PLACEMENTS = ("loop", "v", "dual")


def _make_placement(kind: str, p: int, atoms: list, stages: int | None,
                    microbatches: int | None) -> tuple[Placement, int]:
    """The ``kind`` placement of ``p`` ranks a CSV's atoms are read with (stages and
    microbatches inferred when None). Raises :class:`ScheduleError` on bad sizes."""
    ops = [a for _, a in atoms if isinstance(a, Op)]
    if stages is None:
        stages = {"v": 2 * p, "dual": p}.get(kind, max(a.stage for a in ops) + 1)
        if kind == "loop" and stages % p:
            stages += p - stages % p
    m = microbatches or max(a.mb for a in ops) + 1
    return Placement(kind=kind, ranks=p, stages=stages,
                     microbatches=m if kind == "dual" else None), m


def _misplaced(pl: Placement, atoms: list) -> tuple[int, Op] | None:
    """The first ``(row, op)`` whose stage ``pl`` puts on another rank, or None."""
    for r, a in atoms:
        if isinstance(a, Op) and a.stage < pl.stages and pl.rank_of(a.stage, a.mb) != r:
            return r, a
    return None


def _placement(path: Path, rows: list[list[Action]], placement: str, stages: int | None,
               microbatches: int | None) -> tuple[Placement, int]:
    """The placement and microbatch count a CSV is read with (defaults inferred)."""
    if placement not in PLACEMENTS:
        raise ScenarioError(f"{path}: unknown placement {placement!r} for a torch CSV: "
                            f"expected loop, v or dual (a custom placement needs a schedsim "
                            f"JSON schedule, 'generate --format json')")
    p = len(rows)
    atoms = [(r, a) for r, row in enumerate(rows) for x in row
             for a in (x.atoms() if isinstance(x, Op) else (x,))]
    if not any(isinstance(a, Op) for _, a in atoms):
        raise ParseError(f"{path}: no compute action in any row")
    try:
        pl, m = _make_placement(placement, p, atoms, stages, microbatches)
    except ScheduleError as e:
        raise ScenarioError(f"{path}: {e}") from None
    bad = _misplaced(pl, atoms)
    if bad is not None:
        # a stage found on the wrong rank: say which placement the file follows
        r, a = bad
        hint = ""
        tries = [(o, microbatches) for o in PLACEMENTS if o != placement]
        if placement == "dual" and microbatches:
            tries.insert(0, ("dual", None))     # the directions of another count
        for other, mb in tries:
            try:
                alt, m_alt = _make_placement(other, p, atoms, None, mb)
            except ScheduleError:
                continue
            if _misplaced(alt, atoms) is None:
                hint = (f"; the file follows the {other} placement: pass --placement "
                        f"{other}" if other != placement else
                        f"; the file follows the dual placement with {m_alt} microbatches: "
                        f"pass --microbatches {m_alt}")
                break
        where = (f"stage {a.stage}" if placement != "dual" else
                 f"stage {a.stage} for microbatch {a.mb} (direction {pl.direction(a.mb)} "
                 f"of {m} microbatches)")
        raise ScheduleError(f"{path}: row {r + 1} (rank {r}) runs {where}, which the "
                            f"{placement} placement puts on rank "
                            f"{pl.rank_of(a.stage, a.mb)}{hint}")
    return pl, m


def _located_validate(path: Path, sched: Schedule, cols: list[list[int]]) -> Schedule:
    from schedsim.program.validate import validate_schedule

    def locate(r: int, i: int) -> str:
        return (f"{path}: row {r + 1} (rank {r}), column {cols[r][i]} "
                f"({format_torch_action(sched.ranks[r][i])})")

    return validate_schedule(sched, locate=locate)


def _fast_read(path: Path, text: str, placement: str, stages: int | None,
               microbatches: int | None) -> tuple | None:
    """``(columns, placement, microbatches, flat schedule)`` of a CSV the one-pass reader
    (:mod:`schedsim.interop.torch_csv`) handles and finds valid; None otherwise (the
    per-cell reader then reads it, or names what is wrong)."""
    from schedsim.interop.torch_csv import compute_schedule, placement_ok, read_columns
    from schedsim.program.validate_flat import is_valid
    from schedsim.util.gc import no_gc
    from schedsim.util.limits import check_program_size

    if placement not in PLACEMENTS:
        return None
    with no_gc():          # millions of small strings: no collector passes over them
        cols = read_columns(text)
    if cols is None or cols.ranks < 1 or cols.is_comm.all():
        return None
    p = cols.ranks
    check_program_size(str(path), ranks=p, stages=int(cols.stage.max()) + 1,
                       microbatches=int(cols.mb.max()) + 1, instructions=len(cols.kind))
    st, mbs = cols.stage[~cols.is_comm], cols.mb[~cols.is_comm]
    if stages is None:
        stages = {"v": 2 * p, "dual": p}.get(placement, int(st.max()) + 1)
        if placement == "loop" and stages % p:
            stages += p - stages % p
    m = microbatches or int(mbs.max()) + 1
    try:
        pl = Placement(kind=placement, ranks=p, stages=stages,
                       microbatches=m if placement == "dual" else None)
    except ScheduleError:
        return None
    if not placement_ok(cols, pl, m):
        return None
    fs = compute_schedule(cols)
    if not is_valid(fs, pl, m, complete=True):
        return None
    return cols, pl, m, fs


def read_torch_csv(path: str | Path, placement: str = "loop", stages: int | None = None,
                   microbatches: int | None = None) -> Schedule:
    """Read a torch CSV (compute-only, or compute+comms with its comm cells dropped) as a
    validated :class:`Schedule`.

    ``placement`` is ``loop`` (stage s on rank s mod p), ``v`` or ``dual`` (DualPipe: a
    stage's rank depends on the microbatch's direction, microbatches below
    ``microbatches // 2`` flowing one way and the rest the other, so the same stage index
    appears on two rows; torch can parse such a file but not run it, its stages live on
    one rank each); ``stages`` defaults to the largest stage + 1 (rounded up to a
    multiple of the ranks) for loop, 2 x ranks for v and the ranks for dual;
    ``microbatches`` to the largest microbatch + 1 (every microbatch appears in a valid
    schedule, so this also fixes dual's directions). Raises :class:`ParseError` for
    a bad cell (row, column, text, expected forms), :class:`ScheduleError` for a schedule
    that breaks a rule of :func:`schedsim.program.validate.validate_schedule` (naming the cell of
    the first offending action) or a stage on the wrong rank for the placement,
    :class:`ScenarioError` for a missing file or bad option.
    """
    from schedsim.util.inputs import loading
    from schedsim.util.limits import check_program_size

    with loading(path, "torch CSV"):
        path, text = _read(path)
        if stages is not None or microbatches is not None:
            check_program_size(str(path), stages=stages or 1, microbatches=microbatches or 1)
        fast = _fast_read(path, text, placement, stages, microbatches)
        if fast is not None:
            _, pl, m, fs = fast
            return Schedule.from_flat(fs, name=path.stem, placement=pl, microbatches=m,
                                      params={"source": str(path)}, validated=True)
        rows, cols = _parse(path, text)
        return _schedule(path, rows, cols, placement, stages, microbatches)


def _schedule(path: Path, rows: list[list[Action]], cols: list[list[int]], placement: str,
              stages: int | None, microbatches: int | None) -> Schedule:
    pl, m = _placement(path, rows, placement, stages, microbatches)
    ops, ocols = [], []
    for row, col in zip(rows, cols):
        keep = [(x, c) for x, c in zip(row, col) if isinstance(x, Op)]
        ops.append([x for x, _ in keep])
        ocols.append([c for _, c in keep])
    sched = Schedule(name=path.stem, placement=pl, microbatches=m, ranks=ops,
                     params={"source": str(path)})
    return _located_validate(path, sched, ocols)


def read_torch_csv_program(path: str | Path, placement: str = "loop",
                           stages: int | None = None,
                           microbatches: int | None = None) -> Program | None:
    """Read a compute+comms torch CSV as the :class:`Program` torch's runtime runs
    (``_PipelineScheduleRuntime._step_microbatches``: posts where the actions stand, each
    compute waits its RECVs right before it, sends waited at the end). Returns ``None``
    when the file has no SEND/RECV action (a compute-only CSV).

    Same defaults and errors as :func:`read_torch_csv`; a missing or misplaced SEND/RECV
    is reported when the program is compiled (:class:`~schedsim.errors.ProgramError`).
    """
    from schedsim.interop.torch_csv import runtime_program
    from schedsim.program.torch_runtime import runtime_flat
    from schedsim.util.inputs import loading

    with loading(path, "torch CSV"):
        path, text = _read(path)
        fast = _fast_read(path, text, placement, stages, microbatches)
        if fast is not None:
            cols, pl, m, _ = fast
            if not cols.is_comm.any():
                return None
            flat = runtime_program(cols, pl)
            if flat is not None:
                return Program.from_flat(flat, name=path.stem, placement=pl,
                                         microbatches=m, params={"source": str(path)},
                                         validated=True)
    sched = read_torch_csv(path, placement, stages, microbatches)
    with loading(path, "torch CSV"):
        rows, _ = _parse(path, text)
    if not any(isinstance(x, Comm) for row in rows for x in row):
        return None
    return Program.from_flat(runtime_flat(sched.placement, rows), name=sched.name,
                             placement=sched.placement, microbatches=sched.microbatches,
                             params=sched.params, validated=sched.validated)

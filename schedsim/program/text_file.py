"""Program text files: a file of per-rank instruction lines (:mod:`schedsim.program.tokens`)
read into a :class:`~schedsim.program.ir.Program` with a placement, the sizes checked and
bounded before anything is built (a compute-only file is lowered by a comm policy).
Re-exported by :mod:`schedsim.scenario`, whose ``[schedule] program = FILE`` reads one."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from schedsim.errors import ParseError, ScenarioError, ScheduleError
from schedsim.program.ir import Placement, Program


def load_program_file(path: str | Path, placement: str | None = None, *, ranks: int | None = None,
                      stages: int | None = None, microbatches: int | None = None,
                      comm_policy: str | None = None,
                      policy_params: dict[str, Any] | None = None) -> Program:
    """Load a program text file (see :mod:`schedsim.program.tokens`) with the given placement
    (None: the one its compute ops run under, :func:`infer_placement`).

    ``ranks`` defaults to the number of lines, ``stages`` to ranks (``2 x ranks`` for
    ``v``), ``microbatches`` to the largest microbatch used + 1. A program without any
    comm instruction is a compute-only schedule and is lowered with ``comm_policy``
    (default ``async``) and its ``policy_params``. Raises
    :class:`ScenarioError`/:class:`ParseError`.
    """
    from schedsim.program.bounds import check_program_text
    from schedsim.program.tokens import parse_program_text
    from schedsim.util.inputs import loading, read_input_text
    from schedsim.util.text import shorten_quotes

    path = Path(path)
    with loading(path, "program text file"):
        text = read_input_text(path, "program text file")
        check_program_text(text, path)
        try:
            rows = parse_program_text(text)
        except ParseError as e:
            raise ParseError(f"{path}: {shorten_quotes(str(e))}") from None
        return program_from_rows(rows, placement, ranks=ranks, stages=stages,
                                 microbatches=microbatches, comm_policy=comm_policy,
                                 name=path.stem, policy_params=policy_params)


def _default_stages(kind: str, ranks: int, top_stage: int) -> int:
    """The stage count of placement ``kind`` when none is given: for ``loop`` the fewest,
    a multiple of ``ranks``, that hold stage ``top_stage``; ``2 x ranks`` for ``v``;
    ``ranks`` for ``dual``."""
    if kind == "loop":
        return ranks * max(1, -(-(top_stage + 1) // ranks))
    return 2 * ranks if kind == "v" else ranks


def infer_placement(rows: list, ranks: int, stages: int | None = None,
                    microbatches: int | None = None) -> str:
    """The placement a program's compute ops run under: the first of ``loop``, ``v`` and
    ``dual`` that puts every op's stage (and microbatch) on the rank whose line holds it
    (``stages``/``microbatches`` None: each placement's defaults, as
    :func:`program_from_rows`); ``loop`` when none does (whose check then names the
    first op out of place). So a program ``generate`` wrote for a V-shape or DualPipe
    schedule reads back without ``--placement``."""
    from schedsim.program.ir import Compute

    atoms = [(r, a.stage, a.mb) for r, row in enumerate(rows) for i in row
             if isinstance(i, Compute) for a in i.op.atoms()]
    if not atoms:
        return "loop"
    top_stage = max(s for _, s, _ in atoms)
    m = microbatches or max(mb for _, _, mb in atoms) + 1
    for kind in ("loop", "v", "dual"):
        s = stages or _default_stages(kind, ranks, top_stage)
        if top_stage >= s or (kind == "dual" and m % 2):
            continue
        try:
            pl = Placement(kind=kind, ranks=ranks, stages=s,
                           microbatches=m if kind == "dual" else None)
        except (ValueError, ScenarioError, ScheduleError):
            continue
        if all(pl.rank_of(st, mb) == r for r, st, mb in atoms):
            return kind
    return "loop"


def program_from_rows(rows: list, placement: str | None = None, *, ranks: int | None = None,
                      stages: int | None = None, microbatches: int | None = None,
                      comm_policy: str | None = None, name: str = "custom",
                      policy_params: dict[str, Any] | None = None) -> Program:
    """Build a :class:`Program` from parsed instruction rows (see
    :func:`load_program_file` for the defaults)."""
    from schedsim.program.ir import Compute, Wait
    from schedsim.program.ops import launched
    from schedsim.util.limits import check_program_size

    ranks = ranks or len(rows)
    check_program_size(name, ranks=max(ranks, len(rows)))
    if len(rows) != ranks:
        raise ScenarioError(f"program has {len(rows)} rank lines but ranks = {ranks}")
    used = [(a.stage, a.mb) for row in rows for i in row if isinstance(i, Compute)
            for a in i.op.atoms()]
    used += [(c.stage, c.mb) for row in rows for i in row for c in launched(i)]
    used += [(c.stage, c.mb) for row in rows for i in row if isinstance(i, Wait)
             for c in i.comms]
    top_mb = max((mb for _, mb in used), default=0)
    top_stage = max((st for st, _ in used), default=0)
    # the per-stage, per-microbatch tables are bounded before a placement is inferred (which
    # builds placements of that many stages)
    check_program_size(name, stages=max(stages or 0, top_stage + 1),
                       microbatches=microbatches or top_mb + 1,
                       instructions=sum(len(row) for row in rows))
    if placement is None:
        placement = infer_placement(rows, ranks, stages, microbatches)
    if placement not in ("loop", "v", "dual"):
        raise ScenarioError(f"unknown placement {placement!r}: expected loop, v or dual")
    if microbatches is not None and top_mb >= microbatches:
        raise ScenarioError(f"the program uses microbatch {top_mb} but microbatches = "
                            f"{microbatches}: pass --microbatches {top_mb + 1} or more")
    m = microbatches or top_mb + 1
    if stages is None:
        stages = _default_stages(placement, ranks, top_stage)
    # every per-stage, per-microbatch table is bounded before it is built
    check_program_size(name, stages=max(stages, top_stage + 1), microbatches=m,
                       instructions=sum(len(row) for row in rows))
    if top_stage >= stages:
        raise ScenarioError(f"the program uses stage {top_stage} but the {placement} "
                            f"placement has {stages} stages on {ranks} ranks: pass --stages "
                            f"{ranks * -(-(top_stage + 1) // ranks)} (or another placement)")
    pl = Placement(kind=placement, ranks=ranks, stages=stages,
                   microbatches=m if placement == "dual" else None)
    prog = Program(name=name, placement=pl, microbatches=m, ranks=rows)
    if not prog.has_comm():
        from schedsim.program.lower import lower

        return lower(prog.schedule(), comm_policy or "async", **(policy_params or {}))
    if policy_params:
        raise ScenarioError(f"the program {name!r} has its own sends/recvs, so no comm "
                            f"policy lowers it and {', '.join(sorted(policy_params))} would "
                            f"do nothing: drop them")
    return prog

"""A plan candidate's name for people: the one formatter of the table's layout cell,
the ``best:`` line, the ``--gantt`` title, the ``--html`` page, the Pareto labels and the
rule examples (``tp8 pp2x2 dp4 z1 zbv recompute none``). Machine outputs (``--out``)
keep the full :attr:`~schedsim.plan.space.Candidate.key` and carry this name beside it.
"""
from __future__ import annotations

from typing import Any


def layout_name(c: Any, stages: int = 0) -> str:
    """``tp4 pp8 dp2`` plus what differs from the plain layout: ``x2`` model chunks per
    rank (``stages`` the program's stage count; 0: the candidate's ``chunks`` when it
    names them), ``ep8``, ``cp2``, ``mbs2``, the ZeRO stage ``z1``."""
    per = stages // c.pp if c.pp and stages else (c.chunks or 1)
    parts = [f"tp{c.tp}", f"pp{c.pp}" + (f"x{per}" if per > 1 else ""), f"dp{c.dp}"]
    parts += [f"ep{c.ep}"] if c.ep > 1 else []
    parts += [f"cp{c.cp}"] if c.cp > 1 else []
    parts += [f"mbs{c.micro_batch_size}"] if c.micro_batch_size > 1 else []
    return " ".join(parts + [f"z{c.zero}"])


def candidate_name(c: Any, stages: int = 0) -> str:
    """The candidate's name: :func:`layout_name`, its schedule and its recompute
    (``tp8 pp2x2 dp4 z1 zbv recompute none``)."""
    return f"{layout_name(c, stages)} {c.schedule} recompute {c.recompute}"

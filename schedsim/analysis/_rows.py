"""Read a program's instructions without building every rank's object rows.

A program is its flat arrays (:mod:`schedsim.program.flat`); reading the object view
``Program.ranks`` builds ~3 objects per instruction
(5 s for the 518 K instructions of 1F1B 64 x 1024). An analysis that names a few
instructions, or looks at one rank, reads them from the arrays here instead.
"""
from __future__ import annotations

from collections.abc import Iterator

from schedsim.program.ir import Instr, Program
from schedsim.program.tokens import parse_instr


def instr_token(program: Program, r: int, i: int) -> str | None:
    """Program text token of rank r's instruction i (``5SEND_B0``, ``BATCH[...]``), None
    when i is past the end of the rank's program (or negative)."""
    fl = program.flat()
    if not 0 <= i < fl.row_length(r):
        return None
    return fl.token(int(fl.rptr[r]) + i)


def rank_rows(program: Program, rank: int | None = None
              ) -> Iterator[tuple[int, list[Instr]]]:
    """``(r, instructions)`` for every rank, or only for ``rank`` when given. A single
    rank is parsed from its tokens (the object view of the other ranks stays unbuilt);
    every rank reads the view ``Program.ranks``."""
    if rank is not None:
        fl = program.flat()
        if 0 <= rank < fl.ranks:
            lo, hi = int(fl.rptr[rank]), int(fl.rptr[rank + 1])
            yield rank, [parse_instr(fl.token(g)) for g in range(lo, hi)]
        return
    yield from enumerate(program.ranks)

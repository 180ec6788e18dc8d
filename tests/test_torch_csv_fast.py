"""The one-pass torch CSV reader (:mod:`schedsim.interop.torch_csv`) gives exactly what the
per-cell reader gives: the same schedule, and for a compute+comms file the same program
as :func:`schedsim.program.torch_runtime.runtime_flat` makes from the parsed actions.
Files it does not handle (an OVERLAP_F_B cell, a bad cell) go to the per-cell reader."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch.distributed.pipelining.schedules as S
from torch_ref import torch_schedule

from schedsim import Program
from schedsim.errors import ParseError
from schedsim.interop.torch_csv import read_columns
from schedsim.interop.torch_format import (
    parse_torch_csv,
    program_to_torch_csv,
    read_torch_csv,
    read_torch_csv_program,
)
from schedsim.program.ir import Op
from schedsim.program.torch_runtime import runtime_flat


def _torch_csv(tmp: Path, cls: str, p: int, m: int, v: int) -> Path:
    """torch's own compute+comms lowering (``_add_send_recv``) of one of its schedules."""
    sch = torch_schedule(cls, p, m, v)
    order = {r: [a for a in sch.pipeline_order[r] if a is not None]
             for r in sch.pipeline_order}
    stage_rank = (lambda s: s % p) if cls != "ZBVZeroBubble" else \
        (lambda s: s if s < p else 2 * p - 1 - s)
    comms = S._add_send_recv(order, stage_to_rank=stage_rank, num_stages=p * v)
    f = tmp / f"{cls}_{p}_{m}.csv"
    with open(f, "w", newline="") as fh:
        w = csv.writer(fh)
        for r in sorted(comms):
            w.writerow(comms[r])
    return f


def _slow_program(f: Path, placement: str) -> list[list[str]]:
    rows, _ = parse_torch_csv(f.read_text(), str(f))
    sched = read_torch_csv(f, placement)
    prog = Program.from_flat(runtime_flat(sched.placement, rows), name="slow",
                             placement=sched.placement, microbatches=sched.microbatches)
    return prog.tokens()


@pytest.mark.parametrize("cls,p,m,v,placement", [
    ("Interleaved1F1B", 4, 8, 2, "loop"), ("Interleaved1F1B", 3, 6, 3, "loop"),
    ("Interleaved1F1B", 8, 32, 2, "loop"), ("LoopedBFS", 4, 6, 2, "loop"),
    ("InterleavedZeroBubble", 4, 8, 2, "loop"), ("ZBVZeroBubble", 4, 8, 2, "v"),
])
def test_fast_reader_equals_the_per_cell_reader(tmp_path, cls, p, m, v, placement) -> None:
    f = _torch_csv(tmp_path, cls, p, m, v)
    assert read_columns(f.read_text()) is not None            # the fast path reads it
    prog = read_torch_csv_program(f, placement)
    assert prog.validated          # checked by the reader (validate_flat), not again
    assert prog.tokens() == _slow_program(f, placement)
    sched = read_torch_csv(f, placement)
    assert sched.validated
    rows, _ = parse_torch_csv(f.read_text())
    assert sched.ranks == [[a for a in row if isinstance(a, Op)] for row in rows]


def test_cells_the_fast_reader_leaves_to_the_per_cell_reader(tmp_path) -> None:
    from schedsim import build_program

    prog = build_program("dualpipe", 4, 8)              # FB pairs: OVERLAP_F_B cells
    f = tmp_path / "d.csv"
    f.write_text(program_to_torch_csv(prog))
    assert read_columns(f.read_text()) is None
    back = read_torch_csv_program(f, "dual")
    assert back.validated and back.tokens() == _slow_program(f, "dual")
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0SEND_F0,0Fx\n1RECV_F0,1F0\n")
    with pytest.raises(ParseError, match=r"row 1 \(rank 0\), column 3"):
        read_torch_csv_program(bad)

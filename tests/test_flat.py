"""The flat program form (integer arrays per rank) and the object IR built from it.

The arrays are the program; generators and policies emit them and ``Program.ranks`` is a
read-only view built on demand. Checked here: round trips between the two forms, the
public API on programs made either way (``Program(..., ranks=[[...]])``, ``prog.ranks``,
``to_text()``, JSON), that reading the view changes nothing (not the program, not its
validation) and that the view cannot be edited, the array lowering against a direct
object-level reading of the policies, and the array validator against the per-op one.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from schedsim import (
    Comm,
    CommModel,
    CostModel,
    DeadlockError,
    Op,
    Program,
    Schedule,
    build_program,
    generate,
    simulate,
    validate_schedule,
)
from schedsim.errors import SchedsimError, ScheduleError
from schedsim.program.flat import FlatProgram, FlatSchedule, Opcode
from schedsim.program.flat_build import flat_program
from schedsim.program.ir import Batch, Commit, Compute, Post, Wait
from schedsim.program.comm_plan import op_recvs, op_sends
from schedsim.program.validate_flat import is_valid

FAMILIES = [("gpipe", {}), ("1f1b", {}), ("dualpipe", {}), ("dualpipev", {}),
            ("interleaved-1f1b", {"chunks": 2}), ("interleaved-1f1b", {"chunks": 3}),
            ("interleaved-1f1b", {"chunks": 2, "variant": "megatron"}),
            ("looped-bfs", {"chunks": 2}), ("interleaved-zb", {"chunks": 3}), ("zb-h1", {}),
            ("zb-h2", {}), ("zbv", {})]
SIZES = [(1, 1), (2, 4), (3, 6), (4, 8), (4, 5)]


def programs():
    for name, params in FAMILIES:
        for p, m in SIZES:
            for policy in (None, "async", "commit", "torch"):
                try:
                    yield build_program(name, p, m, policy, **params)
                except SchedsimError:
                    continue


def test_round_trip_between_objects_and_arrays() -> None:
    n = 0
    for prog in programs():
        toks = prog.tokens()                       # straight from the arrays when flat
        flat = flat_program(prog.ranks)
        assert flat.tokens() == toks == [[str(t) for t in row] for row in prog.tokens()]
        assert flat.rows() == prog.ranks
        s = prog.schedule()
        assert FlatSchedule.from_rows(s.ranks).rows() == s.ranks
        n += 1
    assert n > 150


@pytest.mark.parametrize("name,policy", [("1f1b", None), ("dualpipe", None),
                                         ("dualpipev", None), ("1f1b", "torch"),
                                         ("interleaved-1f1b", "torch"), ("1f1b", "megatron"),
                                         ("gpipe", "commit"), ("zbv", "commit"),
                                         ("zb-h1", None)])
def test_generators_emit_arrays_and_reading_the_rows_changes_nothing(name, policy) -> None:
    """Every generator and policy emits a validated value; reading its rows (the view)
    leaves the arrays, the text and the validation as they were."""
    kw = {"chunks": 2} if name == "interleaved-1f1b" else {}
    prog = build_program(name, 4, 8, policy, **kw)
    assert prog.validated
    fl, text = prog.flat(), prog.to_text()
    rows = prog.ranks
    assert prog.validated and prog.flat() is fl and prog.to_text() == text
    assert prog.ranks is rows                     # built once, kept
    assert Program(placement=prog.placement, microbatches=8, ranks=rows,
                   name=name).to_text() == text
    assert not Program(placement=prog.placement, microbatches=8, ranks=rows).validated


def test_rows_are_a_read_only_view() -> None:
    prog = build_program("1f1b", 4, 8)
    rows = prog.ranks
    assert rows[0][:3] == [Compute(Op("F", 0, 0)), Post(Comm("SEND_F", 0, 0)),
                           Compute(Op("F", 0, 1))]
    for edit in (lambda: rows[0].append(Commit()), lambda: rows.pop(),
                 lambda: rows[1].__setitem__(0, Commit()), lambda: rows[0].reverse()):
        with pytest.raises(TypeError, match="read-only view"):
            edit()
    with pytest.raises(AttributeError):
        prog.flat().code = prog.flat().code[::-1]  # the arrays are the value
    with pytest.raises(Exception):
        prog.name = "other"                       # a frozen model
    assert prog.ranks == build_program("1f1b", 4, 8).ranks


def test_json_of_a_flat_program_equals_the_object_programs() -> None:
    a = build_program("interleaved-1f1b", 3, 6, chunks=2)
    b = Program(name=a.name, placement=a.placement, microbatches=a.microbatches,
                params=a.params, ranks=FlatProgram.rows(a.flat()))
    assert a.model_dump_json() == b.model_dump_json()
    back = Program.model_validate_json(a.model_dump_json())
    assert back == a and back.to_text() == a.to_text()
    assert json.loads(a.model_dump_json())["ranks"][0][0] == "0F0"


def test_an_edited_copy_is_a_new_program() -> None:
    """Rows edited in a copy make a new, unvalidated program: it is what gets simulated
    (here: a compute moved before the batch that receives its input deadlocks under
    rendezvous), and the original is unchanged."""
    prog = build_program("1f1b", 2, 2, "commit")
    c = CommModel(semantics="rendezvous")
    assert simulate(prog, CostModel(), comm=c).makespan == 9     # (m + p - 1)(F + BW)
    rows = [list(r) for r in prog.ranks]
    row = rows[1]
    i = next(k for k, x in enumerate(row) if isinstance(x, Batch))
    j = next(k for k, x in enumerate(row) if isinstance(x, Compute) and k > i)
    row[i], row[j] = row[j], row[i]          # compute before receiving its input
    edited = Program(name=prog.name, placement=prog.placement,
                     microbatches=prog.microbatches, ranks=rows)
    assert not edited.validated and edited != prog
    with pytest.raises(SchedsimError):
        simulate(edited, CostModel(), comm=c)
    assert simulate(prog, CostModel(), comm=c).makespan == 9


def test_validation_is_recorded_in_the_value() -> None:
    """A program checked once is a checked value: simulating it again does not check
    it again, and reading its rows does not undo that."""
    from schedsim.program.validate import validate_program

    prog = Program(placement={"kind": "loop", "ranks": 2, "stages": 2}, microbatches=1,
                   ranks=[["0F0", "0SEND_F0"], ["1RECV_F0", "WAIT[1RECV_F0]", "1F0"]])
    checked = validate_program(prog)
    assert validate_program(checked) is checked and checked == prog
    assert checked.ranks == prog.ranks and validate_program(checked) is checked
    bad = Program(placement={"kind": "loop", "ranks": 2, "stages": 2}, microbatches=1,
                  ranks=[["0SEND_F0"], ["1RECV_F0", "WAIT[1RECV_F0]", "1F0", "1F0"]])
    with pytest.raises(SchedsimError, match="rank 1, instr 3 .1F0.: duplicate F"):
        simulate(bad)


def test_launch_ids() -> None:
    prog = Program(placement={"kind": "loop", "ranks": 2, "stages": 2}, microbatches=2,
                   ranks=[["0F0", "0SEND_F0", "0F1", "BATCH[0SEND_F1]", "COMMIT"],
                          ["1RECV_F0", "1RECV_F1", "WAIT[1RECV_F0]", "1F0",
                           "WAIT[1RECV_F1]", "1F1"]])
    fl = prog.flat()
    assert fl.launch_ids().tolist() == [-1, 0, -1, 1, -1, 0, 1, -1, -1, -1, -1]
    assert fl.code.tolist() == [0, 1, 0, 2, 4, 1, 1, 3, 0, 3, 0]
    assert fl.member_instr().tolist() == [1, 3, 5, 6, 7, 9]


# -- the array lowering against an object-level reading of the policies --------------------
def _link_ordered(s: Schedule) -> list[list[list]]:
    """Per rank and op, the recvs to post (link order), read op by op from the rule."""
    pl = s.placement
    sends: dict = {}
    for r, ops in enumerate(s.ranks):
        for op in ops:
            for c in op_sends(op, r, pl):
                link = (r, pl.rank_of(c.stage + (1 if c.kind == "SEND_F" else -1), c.mb))
                sends.setdefault(link, []).append(c.message_key())
    out = []
    for r, ops in enumerate(s.ranks):
        nxt: dict = {}
        row = []
        for op in ops:
            batch = []
            for c in op_recvs(op, r, pl):
                key = c.message_key()
                link = (pl.rank_of(key[1], key[2]), r)
                seq = sends.get(link, [])
                i = seq.index(key)
                while nxt.get(link, 0) <= i:
                    k2 = seq[nxt.get(link, 0)]
                    nxt[link] = nxt.get(link, 0) + 1
                    from schedsim.program.ops import recv_comm
                    batch.append(recv_comm(k2))
            row.append(batch)
        out.append(row)
    return out


def _async_objects(s: Schedule) -> list[list]:
    posts = _link_ordered(s)
    rows = []
    for r, ops in enumerate(s.ranks):
        row = [Post(c) for c in (posts[r][0] if ops else [])]
        for k, op in enumerate(ops):
            if k + 1 < len(ops):
                row += [Post(c) for c in posts[r][k + 1]]
            need = op_recvs(op, r, s.placement)
            if need:
                row.append(Wait(tuple(need)))
            row.append(Compute(op))
            row += [Post(c) for c in op_sends(op, r, s.placement)]
        rows.append(row)
    return rows


def _commit_objects(s: Schedule) -> list[list]:
    posts = _link_ordered(s)
    rows = []
    for r, ops in enumerate(s.ranks):
        row, pending = [], list(posts[r][0]) if ops else []
        for k, op in enumerate(ops):
            if pending:
                row += [Batch(tuple(pending)), Commit()]
            row.append(Compute(op))
            pending = op_sends(op, r, s.placement) + (posts[r][k + 1] if k + 1 < len(ops)
                                                      else [])
        if pending:
            row += [Batch(tuple(pending)), Commit()]
        rows.append(row)
    return rows


@pytest.mark.parametrize("name,params", FAMILIES)
def test_array_lowering_matches_the_policy_read_op_by_op(name, params) -> None:
    for p, m in SIZES + [(5, 10), (6, 12)]:
        try:
            s = generate(name, p, m, **params)
        except SchedsimError:
            continue
        s = s.schedule() if isinstance(s, Program) else s
        assert build_program(name, p, m, "async", **params).ranks == _async_objects(s)
        assert build_program(name, p, m, "commit", **params).ranks == _commit_objects(s)


# -- the array validator agrees with the per-op validator ---------------------------------
def _mutations(s: Schedule, rng: random.Random):
    rows = [list(r) for r in s.ranks]
    r = rng.randrange(len(rows))
    if not rows[r]:
        return rows
    i = rng.randrange(len(rows[r]))
    what = rng.randrange(5)
    op = rows[r][i]
    if what == 0 and len(rows[r]) > 1:              # swap with a neighbour
        j = min(i + 1, len(rows[r]) - 1)
        rows[r][i], rows[r][j] = rows[r][j], rows[r][i]
    elif what == 1:                                  # drop an op
        del rows[r][i]
    elif what == 2:                                  # run an op twice
        rows[r].append(op)
    elif what == 3 and op.kind != "FB":             # another microbatch
        rows[r][i] = type(op)(op.kind, op.stage, op.mb + rng.choice([-1, 1, 40]))
    elif what == 4 and len(rows) > 1 and op.kind != "FB":   # move it to another rank
        del rows[r][i]
        rows[(r + 1) % len(rows)].insert(0, op)
    return rows


def test_array_validator_agrees_with_the_per_op_validator() -> None:
    rng = random.Random(7)
    verdicts = {True: 0, False: 0}
    for name, params in FAMILIES:
        for p, m in SIZES:
            try:
                base = generate(name, p, m, **params)
            except SchedsimError:
                continue
            base = base.schedule() if isinstance(base, Program) else base
            for _ in range(12):
                s = Schedule(placement=base.placement, microbatches=base.microbatches,
                             ranks=_mutations(base, rng))
                for complete in (True, False):
                    fast = is_valid(FlatSchedule.from_rows(s.ranks), s.placement,
                                    s.microbatches, complete)
                    try:
                        validate_schedule(Schedule(placement=s.placement,
                                                   microbatches=s.microbatches,
                                                   ranks=s.ranks), complete=complete)
                        slow = True
                    except ScheduleError:
                        slow = False
                    assert fast == slow, (name, p, m, complete, s.ranks)
                    verdicts[fast] += 1
    assert verdicts[True] > 100 and verdicts[False] > 300


def test_opcodes_are_named() -> None:
    assert [o.name for o in Opcode] == ["COMPUTE", "POST", "BATCH", "WAIT", "COMMIT"]
    fl = build_program("1f1b", 2, 2).flat()
    assert set(np.unique(fl.code).tolist()) == {Opcode.COMPUTE, Opcode.POST, Opcode.WAIT}
    with pytest.raises(DeadlockError):
        simulate(build_program("interleaved-1f1b", 4, 8, "commit"), CostModel(F=1, BW=2),
                 comm=CommModel(semantics="rendezvous"))

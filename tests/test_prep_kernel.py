"""The numba passes of :func:`schedsim.sim.prep.prep` (:mod:`schedsim.sim.prep_kernel`)
give its numpy form's :class:`~schedsim.sim.prep.Prep`, array by array and type by type,
on generated programs under every policy (FB ops, dual placement), shuffled compute
orders, shape messages and members out of range; and the program simulates the same."""
from __future__ import annotations

import random

import numpy as np
import pytest

from schedsim import generate, lower
from schedsim.generators import build_program
from schedsim.program.ir import Placement, Program, Schedule
from schedsim.sim.costs import CommModel, CostModel
from schedsim.sim.prep import prep
from schedsim.sim.simulate import simulate
from conftest import shuffled_ranks

pytest.importorskip("numba")


def _programs() -> list[tuple[str, Program]]:
    out = []
    for name, p, m in [("1f1b", 4, 8), ("gpipe", 3, 5), ("zb-1p", 4, 12), ("zbv", 4, 8),
                       ("interleaved-1f1b", 4, 8), ("dualpipe", 4, 8)]:
        for policy in ("async", "commit"):
            out.append((f"{name}-{p}x{m}-{policy}", build_program(name, p, m, policy)))
    out.append(("1f1b-torch", lower(generate("1f1b", 4, 8), "torch")))
    rnd = random.Random(3)
    sc = generate("1f1b", 5, 9)
    for t in range(3):
        rows = shuffled_ranks(sc.ranks, rnd)
        out.append((f"shuffled-{t}", lower(Schedule(name="1f1b", placement=sc.placement,
                                                    microbatches=9, ranks=rows))))
    pl = Placement(kind="loop", ranks=2, stages=2)
    out.append(("shape-and-out-of-range", Program(
        placement=pl, microbatches=2,
        ranks=[["0F0", "0SEND_FS0", "0SEND_F0", "0SEND_F7", "0F1", "1SEND_B0"],
               ["1RECV_FS0", "1RECV_F0", "WAIT[1RECV_FS0+1RECV_F0]", "1F0", "1B0",
                "3RECV_F1"]])))
    return out


def _fields(pr) -> dict:
    return {k: (v.dtype.str, v.tobytes()) if isinstance(v, np.ndarray) else v
            for k, v in vars(pr).items()}


def test_prep_kernels_give_the_numpy_forms_arrays(monkeypatch) -> None:
    checked = 0
    for label, program in _programs():
        fl = program.flat()
        monkeypatch.setenv("SCHEDSIM_ENGINE", "python")
        a = prep(fl, program)
        monkeypatch.setenv("SCHEDSIM_ENGINE", "numba")
        b = prep(fl, program)
        assert _fields(a) == _fields(b), label
        assert len(b.a_instr) > 0 and len(b.mcode) > 0
        checked += 1
    assert checked == 17


def test_prep_kernels_real_values(monkeypatch) -> None:
    """The hand-written program: the shape message counts (4 codes per stage and mb),
    the out-of-range members are not valid (mb 7 of 2, stage 3 of 2) and have no ranks
    (``1SEND_B0`` written on rank 0 is a valid message: its ranks are its stages');
    the FB program has two atoms per FB op."""
    monkeypatch.setenv("SCHEDSIM_ENGINE", "numba")
    program = dict(_programs())["shape-and-out-of-range"]
    pr = prep(program.flat(), program)
    assert pr.ncodes == 4 * 2 * 2
    assert pr.mvalid.tolist() == [True, True, False, True, True, True, True, True, False]
    assert pr.msrc.tolist() == [0, 0, -1, 1, 0, 0, 0, 0, -1]
    assert pr.mdst.tolist() == [1, 1, -1, 0, 1, 1, 1, 1, -1]
    assert pr.mcode.tolist()[:2] == [(2 * 2 + 0) * 2 + 0, 0]
    assert pr.a_in.tolist() == [-1, -1, 0, -1] and pr.a_in_rank.tolist() == [-1, -1, 0, -1]
    fb = build_program("dualpipe", 4, 8)
    fl = fb.flat()
    pr = prep(fl, fb)
    assert len(pr.a_instr) == int(np.count_nonzero(fl.code == 0)) + len(fl.fb_at)
    assert len(fl.fb_at) > 0 and np.all(np.diff(pr.aptr)[fl.fb_at] == 2)


@pytest.mark.parametrize("semantics", ["rendezvous", "eager"])
def test_both_executors_simulate_the_same(semantics, monkeypatch) -> None:
    """Spans, makespan and deadlock (commit lowerings can deadlock under rendezvous)."""
    finished = 0
    for label, program in _programs()[:12]:
        runs = []
        for engine in ("python", "numba"):
            monkeypatch.setenv("SCHEDSIM_ENGINE", engine)
            tl = simulate(program, CostModel(F=1, B=2, W=1), comm=CommModel(semantics=semantics),
                          raise_on_deadlock=False)
            runs.append((tl.makespan, [(s.rank, s.start, s.end) for s in tl.spans],
                         tl.deadlock and tl.deadlock.message))
        assert runs[0] == runs[1], label
        finished += runs[0][2] is None
    assert finished >= 6


def test_instr_sizes_under_both_executors(monkeypatch) -> None:
    """Compute instructions and members of launches: the kernel's counts are the numpy
    form's; the hand-written program has 4 computes and 7 bare posts (its WAIT's two
    members are not launched)."""
    from schedsim.sim.prep import instr_sizes

    progs = _programs()
    for label, program in progs:
        fl = program.flat()
        monkeypatch.setenv("SCHEDSIM_ENGINE", "python")
        a = instr_sizes(fl)
        monkeypatch.setenv("SCHEDSIM_ENGINE", "numba")
        assert instr_sizes(fl) == a, label
    assert instr_sizes(dict(progs)["shape-and-out-of-range"].flat()) == (4, 7)


def test_pass_only_prep_writes_the_pass_fields(monkeypatch) -> None:
    """``pass_only``: the fields the compile pass reads equal the whole Prep's, the
    others empty (numba); under CPython the whole Prep."""
    read = {"S", "M", "P", "mk", "side", "mvalid", "mcode", "msrc", "mdst", "aptr", "a_in",
            "a_out", "a_skip", "ncodes", "skips"}
    for label, program in _programs():
        fl = program.flat()
        monkeypatch.setenv("SCHEDSIM_ENGINE", "numba")
        whole, lean = _fields(prep(fl, program)), _fields(prep(fl, program, pass_only=True))
        assert {k: v for k, v in lean.items() if k in read} == \
            {k: v for k, v in whole.items() if k in read}, label
        assert all(v[1] == b"" for k, v in lean.items() if k not in read), label
        monkeypatch.setenv("SCHEDSIM_ENGINE", "python")
        assert _fields(prep(fl, program, pass_only=True)) == whole, label

"""The lowering's sequential passes (:mod:`schedsim.program.lower_kernel`) give the same
program under CPython and numba, byte for byte, on generated, shuffled and stage-graph
schedules, under the two policies that use them; and their link order is the rule's
(a rank consuming a peer's messages out of order posts the earlier ones first)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from schedsim import generate, lower
from schedsim.generators import build_program
from schedsim.program.comm_plan import atom_comms, link_order
from schedsim.program.ir import Placement, Schedule
from conftest import shuffled_ranks

pytest.importorskip("numba")


def _schedules() -> list[tuple[str, Schedule]]:
    out = []
    for name, p, m in [("1f1b", 4, 8), ("gpipe", 3, 5), ("zb-1p", 4, 12), ("zbv", 4, 8),
                       ("interleaved-1f1b", 4, 8)]:
        out.append((f"{name}-{p}x{m}", generate(name, p, m)))
    out.append(("dualpipe-4x8", build_program("dualpipe", 4, 8).schedule()))     # FB ops
    for p, m, skips in [(4, 4, ((0, 2),)), (6, 10, ((0, 3), (2, 5)))]:
        sc = build_program("1f1b", p, m).schedule()
        out.append((f"skips-{p}x{m}", Schedule(
            name="1f1b", placement=Placement(kind="loop", ranks=p, stages=p, skips=skips),
            microbatches=m, ranks=sc.ranks)))
    rnd = random.Random(7)
    for name, p, m in [("1f1b", 6, 16), ("zb-1p", 4, 10), ("gpipe", 5, 9)]:
        sc = generate(name, p, m)
        for t in range(3):
            rows = shuffled_ranks(sc.ranks, rnd)
            out.append((f"shuffled-{name}-{t}", Schedule(
                name=name, placement=sc.placement, microbatches=m, ranks=rows)))
    return out


def _arrays(fl) -> dict:
    return {k: (v.dtype.str, v.tobytes()) if isinstance(v, np.ndarray) else v
            for k, v in vars(fl).items()}


@pytest.mark.parametrize("policy", ["async", "commit"])
def test_python_and_numba_lowerings_are_identical(policy, monkeypatch) -> None:
    checked = 0
    for label, sched in _schedules():
        monkeypatch.setenv("SCHEDSIM_ENGINE", "python")
        a = lower(sched, policy).flat()
        monkeypatch.setenv("SCHEDSIM_ENGINE", "numba")
        b = lower(sched, policy).flat()
        assert _arrays(a) == _arrays(b), label
        assert len(a) > 0
        checked += 1
    assert checked == 17


def test_link_order_posts_a_peers_earlier_messages_first(monkeypatch) -> None:
    """Rank 1 consumes F1 before F0 of rank 0, which sends F0 first: before F1 it posts
    the recvs of F0 and F1, in that order, and nothing before F0."""
    pl = Placement(kind="loop", ranks=2, stages=2)
    sched = Schedule(name="x", placement=pl, microbatches=2,
                     ranks=[["0F0", "0F1"], ["1F1", "1F0"]])
    for engine in ("python", "numba"):
        monkeypatch.setenv("SCHEDSIM_ENGINE", engine)
        rp = link_order(atom_comms(sched.flat(), pl, 2), 2)
        assert rp.op.tolist() == [2, 2]                 # both posted for rank 1's first op
        assert rp.mb.tolist() == [0, 1] and rp.stage.tolist() == [1, 1]
        toks = lower(sched).tokens()[1]
        assert toks[:2] == ["1RECV_F0", "1RECV_F1"], engine


def _comms(ac) -> dict:
    return {k: (v.dtype.str, v.tobytes()) if isinstance(v, np.ndarray) else v
            for k, v in vars(ac).items()}


def test_atom_comms_kernel_gives_the_numpy_forms_arrays(monkeypatch) -> None:
    """:func:`atom_comms` under numba (the kernels, for schedules without skip edges) and
    under CPython (its numpy form): every array and type equal, on generated (FB ops,
    dual placement), shuffled and stage-graph schedules; the counts are real (a 1F1B of
    4 ranks and 8 microbatches: 3 x 8 F and 3 x 8 B messages cross ranks)."""
    checked = 0
    for label, sched in _schedules():
        fs, pl, m = sched.flat(), sched.placement, sched.microbatches
        monkeypatch.setenv("SCHEDSIM_ENGINE", "python")
        a = atom_comms(fs, pl, m)
        monkeypatch.setenv("SCHEDSIM_ENGINE", "numba")
        b = atom_comms(fs, pl, m)
        assert _comms(a) == _comms(b), label
        if label == "1f1b-4x8":
            assert len(b.need_op) == len(b.send_op) == 48
            assert b.need_code.dtype == np.int64 and b.need_op.dtype == np.int32
        checked += 1
    assert checked == 17

"""The two executors of the simulator's kernels agree exactly.

The compile pass and the event loop (:mod:`schedsim.sim.kernels`,
:mod:`schedsim.sim.compile_kernel`) run in CPython over lists or compiled by numba over
numpy arrays (:mod:`schedsim.sim.fast`). This property test simulates at least 1,000
random programs (every generator family, every comm policy, random per-stage costs,
latencies, bandwidths, measured message and host times, every semantics and comm stream,
launch costs, lazy init, eager thresholds, free ops and messages, and programs with two instructions swapped, which
deadlock or are rejected) with both and requires the same Timeline JSON (or the same
error) from each.
"""
from __future__ import annotations

import numba  # noqa: E402,F401 - the [fast] extra (installed by [dev]); required here
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedsim import CommModel, CostModel, LinkModel, Program, build_program, simulate
from schedsim.errors import SchedsimError
from schedsim.sim import fast
from schedsim.util import jit

FAMILIES = [("gpipe", {}), ("1f1b", {}), ("dualpipe", {}), ("dualpipev", {}),
            ("interleaved-1f1b", {"chunks": 2}), ("interleaved-1f1b", {"chunks": 3}),
            ("interleaved-1f1b", {"chunks": 2, "variant": "megatron"}),
            ("looped-bfs", {"chunks": 2}), ("interleaved-zb", {"chunks": 2}),
            ("zb-h1", {}), ("zb-h2", {}), ("zbv", {})]


def _build(name: str, p: int, m: int, policy: str | None, params: dict) -> Program | None:
    try:
        return build_program(name, p, m, policy, **params)
    except SchedsimError:
        return None          # not defined at this size (e.g. dualpipe needs even ranks)


@st.composite
def cases(draw):
    name, params = draw(st.sampled_from(FAMILIES))
    p = draw(st.integers(1, 5))
    m = draw(st.integers(1, 8))
    policy = draw(st.sampled_from([None, "async", "commit", "torch"]))
    prog = _build(name, p, m, policy, params)
    if prog is None:
        prog = build_program("1f1b", p, m, policy)
    S = prog.placement.stages
    costs = CostModel(F=draw(st.sampled_from([0, 0.5, 1, 2])),
                      B=draw(st.sampled_from([0.5, 1, 1.5])), W=draw(st.sampled_from([0, 1])),
                      BW=draw(st.sampled_from([None, 2, 3.25])),
                      FB=draw(st.sampled_from([None, 2.5])),
                      stage={s: {"F": draw(st.sampled_from([1, 1.75]))}
                             for s in draw(st.sets(st.integers(0, S - 1), max_size=2))},
                      message_bytes=draw(st.sampled_from([0, 10, 100])))
    link = LinkModel(latency=draw(st.sampled_from([0, 0.25, 1])),
                     bandwidth=draw(st.sampled_from([float("inf"), 50, 400])),
                     messages=[{"kind": k, "stage": s_, "mb": mb, "time": t, "send": sd}
                               for k, s_, mb, t, sd in draw(st.lists(st.tuples(
                                   st.sampled_from("FB"), st.integers(0, S - 1),
                                   st.integers(0, m - 1), st.sampled_from([0, 0.5, 2]),
                                   st.sampled_from([None, 0.25])), max_size=2))])
    host = [{"rank": r, "index": i, "before": b, "launch": la}
            for r, i, b, la in draw(st.lists(st.tuples(
                st.integers(0, p - 1), st.integers(0, 6), st.sampled_from([0, 0.5]),
                st.sampled_from([None, 0.3])), max_size=3))]
    sem = draw(st.sampled_from(["data", "eager", "rendezvous"]))
    comm = CommModel(semantics=sem,
                     comm_stream=draw(st.sampled_from(["none", "per-peer", "per-rank"])),
                     launch_cost=draw(st.sampled_from([0, 0, 0.1])),
                     lazy_init=draw(st.booleans()),
                     init_cost=draw(st.sampled_from([0, 0.5])),
                     eager_threshold_bytes=draw(st.sampled_from([None, 10])), host=host,
                     group_semantics=draw(st.sampled_from(["independent", "atomic"])))
    if draw(st.booleans()):           # swap two instructions of one rank
        rows = [list(r) for r in prog.ranks]
        r = draw(st.integers(0, len(rows) - 1))
        if len(rows[r]) >= 2:
            i = draw(st.integers(0, len(rows[r]) - 2))
            j = draw(st.integers(i + 1, min(i + 3, len(rows[r]) - 1)))
            rows[r][i], rows[r][j] = rows[r][j], rows[r][i]
        prog = Program(name=prog.name, placement=prog.placement,
                       microbatches=prog.microbatches, ranks=rows)
    free = draw(st.sampled_from(["none", "op", "message"]))
    return prog, costs, link, comm, free


def _run(prog, costs, link, comm, free, engine: str, monkeypatch) -> str:
    monkeypatch.setenv("SCHEDSIM_ENGINE", engine)
    kw = {}
    try:
        if free != "none":
            tl0 = simulate(prog, costs, link, comm, raise_on_deadlock=False)
            if free == "op" and tl0.spans:
                s = tl0.spans[len(tl0.spans) // 2]
                kw["free_ops"] = [(s.rank, s.index)]
            elif free == "message" and tl0.messages:
                msg = tl0.messages[len(tl0.messages) // 2]
                kw["free_messages"] = [(msg.kind, msg.stage, msg.mb)]
        return simulate(prog, costs, link, comm, raise_on_deadlock=False, **kw).to_json()
    except SchedsimError as e:
        return f"{type(e).__name__}: {e}"


@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(case=cases())
def test_python_and_numba_engines_give_identical_timelines(case, monkeypatch) -> None:
    prog, costs, link, comm, free = case
    a = _run(prog, costs, link, comm, free, "python", monkeypatch)
    b = _run(prog, costs, link, comm, free, "numba", monkeypatch)
    assert a == b


def test_the_numba_engine_is_used_for_large_programs(monkeypatch) -> None:
    """Under ``auto``, a program of THRESHOLD instructions or more runs on numba; a
    small one on CPython unless the compiled kernels are loaded already."""
    monkeypatch.setenv("SCHEDSIM_ENGINE", "auto")
    monkeypatch.setattr(jit, "_JITTED", {})
    assert fast.use_numba(fast.THRESHOLD) and not fast.use_numba(fast.THRESHOLD - 1)
    fast.jitted()
    assert fast.use_numba(1)
    monkeypatch.setenv("SCHEDSIM_ENGINE", "python")
    assert not fast.use_numba(10 ** 9)
    monkeypatch.setenv("SCHEDSIM_ENGINE", "fortran")
    with pytest.raises(SchedsimError, match="SCHEDSIM_ENGINE='fortran'"):
        fast.use_numba(1)

"""ZeRO stages 0-3: the data-parallel bytes a step moves, the time they cost and the
memory they save, written out from the model config, the degrees and the GPU's figures
(``schedsim/workload/derive.py`` module docstring, **ZeRO-2 and ZeRO-3**)."""
from __future__ import annotations

import math

import pytest

from schedsim.program.ir import Placement
from schedsim.sim.stage_costs import StageCosts
from schedsim.workload import Workload, derive, simulate_workload

GiB = 2**30
PB, GB = 2, 4                  # bf16 parameters, fp32 gradients (the defaults)
H100 = dict(nvlink=450e9, network=50e9, latency_nv=0.005, latency_net=0.015)


def _ring(kind: str, n: int, nbytes: float, span: int, ce: float = 0.8) -> float:
    """A ring all-gather / reduce-scatter (n - 1 steps, (n - 1) / n of the buffer) or
    all-reduce (twice that) on H100's NVLink inside a node of 8, else its network (ms)."""
    bw, lat = ((H100["nvlink"], H100["latency_nv"]) if span <= 8
               else (H100["network"], H100["latency_net"]))
    k = 2 if kind == "all-reduce" else 1
    return k * (n - 1) * lat + k * (n - 1) / n * nbytes / (bw * ce / 1e3)


def _llama8b_params(tp: int) -> tuple[float, float, float]:
    """Llama 3.1 8B on one of ``tp`` ranks, whole model on one stage: (all weights, one
    decoder layer's, the final norm + LM head's), from its config.json figures."""
    h, a, g, d, f, L, vocab = 4096, 32, 8, 128, 14336, 32, 128256
    layer = h * a * d + 2 * h * g * d + a * d * h + 3 * h * f + 2 * h
    mult = 128 * tp
    V = -(-vocab // mult) * mult
    head = V * h / tp + h
    return (L * layer / tp + V * h / tp + head, layer / tp, head)


def _run(zero: int, **kw):
    base = dict(model="llama3.1-8b", gpu="h100-sxm", seq=1024, global_batch_size=64,
                tp=1, pp=1, dp=16, zero=zero)
    w = Workload(**{**base, **kw})
    d = derive(w, Placement(kind="loop", ranks=w.pp, stages=w.pp))
    return w, d, simulate_workload(w, "1f1b")


def _phases(d) -> tuple[float, float]:
    sc = StageCosts(d.stage_model)
    return sc.kind_cost("F", 0), sc.kind_cost("B", 0) + sc.kind_cost("W", 0)


@pytest.mark.parametrize("kw", [dict(), dict(seq=8192, dp=2, global_batch_size=8)],
                         ids=["network, exposed", "nvlink, hidden"])
def test_zero_step_closed_forms(kw: dict) -> None:
    """Per step and rank (pp 1, ``m`` microbatches, ``n`` weights):

    - z1: reduce-scatter ``n x 4`` bytes + all-gather ``n x 2``, once;
    - z2: reduce-scatter ``n x 4`` per microbatch (in B), all-gather ``n x 2`` once;
    - z3 (FSDP resharding after forward, torchtitan's default without PP): all-gather
      ``n x 2`` in each F, ``(n - head) x 2`` in each B, reduce-scatter ``n x 4`` in each B.

    A per-microbatch phase exposes ``max(one layer's collective, C - compute)``; z2 / z3
    minus z1 is that, less z1's end-of-step collectives; the makespans are equal."""
    w1, d1, r1 = _run(1, **kw)
    w2, d2, r2 = _run(2, **kw)
    w3, d3, r3 = _run(3, **kw)
    dp, m = w1.data_parallel, w1.microbatches
    assert m == w1.global_batch_size // dp
    span = dp                                       # tp 1: the DP group's GPUs
    n, layer, head = _llama8b_params(1)

    # bytes a rank's DP collectives take per step
    z1_bytes = n * GB + n * PB
    z2_bytes = m * n * GB + n * PB
    z3_bytes = m * (n * PB + (n - head) * PB + n * GB)
    assert z2_bytes - z1_bytes == pytest.approx((m - 1) * n * GB)
    assert z3_bytes == pytest.approx(m * (4 * n - head) * 2)

    rs, ag = _ring("reduce-scatter", dp, n * GB, span), _ring("all-gather", dp, n * PB, span)
    rs_u = _ring("reduce-scatter", dp, layer * GB, span)
    ag_u = _ring("all-gather", dp, layer * PB, span)
    ag_b = _ring("all-gather", dp, (n - head) * PB, span)
    f, bw = _phases(d1)
    assert _phases(d3) == pytest.approx((f, bw))

    opt = d1.step_boundary_ms - rs - ag              # the optimizer step (z1's formula)
    assert opt > 0
    z2_extra = m * max(rs_u, rs - bw) - rs
    z3_extra = m * (max(ag_u, ag - f) + max(rs_u, ag_b + rs - bw)) - rs - ag
    assert d2.step_boundary_ms == pytest.approx(opt + ag + m * max(rs_u, rs - bw))
    assert d2.step_boundary_ms - d1.step_boundary_ms == pytest.approx(z2_extra)
    assert d3.step_boundary_ms - d1.step_boundary_ms == pytest.approx(z3_extra)
    assert r1.makespan_ms == r2.makespan_ms == r3.makespan_ms
    assert r3.step_ms - r1.step_ms == pytest.approx(z3_extra)
    assert r2.step_ms - r1.step_ms == pytest.approx(z2_extra)
    if "seq" not in kw:          # the network case: each phase's collectives exposed
        assert ag - f > ag_u and ag_b + rs - bw > rs_u
        assert r3.step_ms - r1.step_ms == pytest.approx(
            m * (ag - f + ag_b + rs - bw) - rs - ag)
        assert r3.step_ms > r2.step_ms > r1.step_ms
    else:                        # NVLink, long sequence: only one layer's each shows
        assert ag - f < ag_u and ag_b + rs - bw < rs_u
        assert r3.step_ms - r1.step_ms == pytest.approx(m * (ag_u + rs_u) - rs - ag)


def test_zero_memory_closed_forms() -> None:
    """z1 -> z2: the gradients shard (``n x 4 x (1 - 1/dp)`` less); z2 -> z3: the
    parameters shard and two layers are gathered at a time (``n x 2 x (1 - 1/dp) - 2 x
    layer x 2`` less); the peaks differ by exactly that (same activations)."""
    w1, d1, r1 = _run(1)
    _, d2, r2 = _run(2)
    _, d3, r3 = _run(3)
    dp = w1.data_parallel
    n, layer, _ = _llama8b_params(1)
    z12 = n * GB * (1 - 1 / dp)
    z23 = n * PB * (1 - 1 / dp) - 2 * layer * PB
    assert d1.static[0].total - d2.static[0].total == pytest.approx(z12)
    assert d2.static[0].total - d3.static[0].total == pytest.approx(z23)
    assert d3.static[0].unsharded == pytest.approx(2 * layer * PB)
    assert r1.peak_memory_bytes[0] - r2.peak_memory_bytes[0] == pytest.approx(z12)
    assert r2.peak_memory_bytes[0] - r3.peak_memory_bytes[0] == pytest.approx(z23)


def test_zero0_zero1_boundary_unchanged() -> None:
    """z0: one all-reduce of the fp32 gradients; z1: reduce-scatter + all-gather; no
    per-microbatch term for either."""
    w0, d0, _ = _run(0)
    _, d1, _ = _run(1)
    dp = w0.data_parallel
    n, _, _ = _llama8b_params(1)
    opt1 = (n / dp * (2 * PB + GB) + 2 * n / dp * 12) / (3.35e12 * 0.5) * 1e3
    opt0 = (n * (2 * PB + GB) + 2 * n * 12) / (3.35e12 * 0.5) * 1e3
    assert d1.step_boundary_ms == pytest.approx(
        _ring("reduce-scatter", dp, n * GB, dp) + _ring("all-gather", dp, n * PB, dp) + opt1)
    assert d0.step_boundary_ms == pytest.approx(_ring("all-reduce", dp, n * GB, dp) + opt0)


def test_zero3_under_pp_gathers_once_and_holds_the_stage() -> None:
    """Under PP ZeRO-3 keeps each stage's parameters gathered for the step
    (torchtitan's ``reshard_after_forward = not pp_enabled``): the step boundary is
    z1's (one reduce-scatter, one all-gather) and the memory holds the stage's whole
    gathered parameters and unsharded gradients."""
    kw = dict(pp=2, dp=8, global_batch_size=32)
    w1, d1, r1 = _run(1, **kw)
    _, d3, r3 = _run(3, **kw)
    assert d3.step_boundary == pytest.approx(d1.step_boundary)
    assert r3.step_ms == pytest.approx(r1.step_ms)
    from schedsim.workload.memory import stage_params

    dp = w1.data_parallel
    for r in range(2):
        st = d1.pieces[r].layout
        n = sum(stage_params(w1.model, st.first, st.layers, st.embedding, st.head, 1, 1))
        assert d3.static[r].unsharded == pytest.approx(n * PB * (1 - 1 / dp) + n * GB)
        assert d3.static[r].params == pytest.approx(n * PB / dp)
        assert math.isclose(d3.static[r].total, n * PB + n * GB * (1 + 1 / dp) + n * 12 / dp,
                            rel_tol=1e-9)
        # against ZeRO-1: the same bf16 parameters and fp32 gradients, plus the
        # gradients' shard that the reduce-scatter fills
        assert d3.static[r].total - d1.static[r].total == pytest.approx(n * GB / dp)


def test_overlap_grad_reduce_hides_all_but_the_excess() -> None:
    """With ``overlap_grad_reduce`` no unit stays exposed: a phase shows ``max(0, C -
    compute)``, and z1's end-of-step collectives are hidden (the optimizer alone)."""
    w1, d1, _ = _run(1, overlap_grad_reduce=True)
    _, d3, _ = _run(3, overlap_grad_reduce=True)
    dp, m = w1.data_parallel, w1.microbatches
    n, _, head = _llama8b_params(1)
    rs, ag = _ring("reduce-scatter", dp, n * GB, dp), _ring("all-gather", dp, n * PB, dp)
    ag_b = _ring("all-gather", dp, (n - head) * PB, dp)
    f, bw = _phases(d1)
    opt = (n / dp * (2 * PB + GB) + 2 * n / dp * 12) / (3.35e12 * 0.5) * 1e3
    assert d1.step_boundary_ms == pytest.approx(opt)
    assert d3.step_boundary_ms == pytest.approx(
        opt + m * (max(0.0, ag - f) + max(0.0, ag_b + rs - bw)))
    _, d3_long, _ = _run(3, overlap_grad_reduce=True, seq=8192, dp=2, global_batch_size=8)
    _, d1_long, _ = _run(1, overlap_grad_reduce=True, seq=8192, dp=2, global_batch_size=8)
    assert d3_long.step_boundary_ms == pytest.approx(d1_long.step_boundary_ms)

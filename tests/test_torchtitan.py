"""torchtitan's Llama 3.1 405B on 512 H100 (Table 5 of torchtitan's
``benchmarks/llama3_h100_202412_torchtitan.md``; torchtitan 9dec370, torch 1963fc8):
``schedules/torchtitan-405b-1f1b.toml`` and ``schedules/torchtitan-405b-interleaved.toml``
as shipped, against the published figures (docs/torchtitan.md).

Published: 1F1B 100 TPS/GPU at 82.5 GiB, Interleaved 1F1B 128 TPS/GPU at 72.7 GiB (the
maximum over all GPUs of ``torch.cuda`` ``reserved_bytes.all.peak``).

The one efficiency both files carry is not fitted to Table 5: it is the one that makes
torchtitan's own pipeline-free run of the same model on the same GPUs (docs/performance.md
@3faaa1a, Aug 2024: 128 H100, FSDP 16 x TP 8, local batch 2, seq 8192, full AC, Float8 +
async TP: 185 TPS/GPU) come out at 185 (:func:`test_efficiency_source`).
"""
from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path

import pytest

from schedsim.scenario import load_scenario
from schedsim.workload.hardware import GiB
from schedsim.workload.layout import Workload, torchtitan_split
from schedsim.workload.run import calibrate_efficiency, simulate_workload

ROOT = Path(__file__).resolve().parents[1] / "schedules"
FILES = {"1f1b": ROOT / "torchtitan-405b-1f1b.toml",
         "interleaved": ROOT / "torchtitan-405b-interleaved.toml"}
#: Table 5: TPS/GPU and memory (GiB)
PUBLISHED = {"1f1b": (100.0, 82.5), "interleaved": (128.0, 72.7)}
#: docs/performance.md @3faaa1a, "Float8 + Async TP" row: 405B, 128 H100, no pipeline
TPS_2D = 185.0


@lru_cache(maxsize=None)
def run(which: str):
    """(scenario, WorkloadResult) of one shipped file, simulated as `schedsim simulate`
    does."""
    from schedsim.cli.workload import simulate_scenario

    sc = load_scenario(FILES[which])
    tl, res = simulate_scenario(sc.build_program(), sc)
    assert res is not None and tl.deadlock is None
    return sc, res


def generate_split_points(layers: int, stages: int) -> list[int]:
    """torchtitan/parallelisms/pipelining_utils.py::generate_split_points @9dec370, its
    loop transcribed (split points ``layers.N``), as layer counts per stage."""
    base, extra = divmod(layers, stages)
    splits, cur = [], 0
    for i in range(stages - 1):
        if i == 0:
            cur += base
        elif extra > 0:
            cur += base + 1
            extra -= 1
        else:
            cur += base
        splits.append(cur)
    b = [0, *splits, layers]
    return [b[i + 1] - b[i] for i in range(stages)]


def test_stage_split_is_torchtitans_generate_split_points():
    assert torchtitan_split(126, 8) == [15, 16, 16, 16, 16, 16, 16, 15]
    assert torchtitan_split(126, 16) == [7] + [8] * 14 + [7]
    for layers in range(1, 60):
        for stages in range(1, layers + 1):
            assert torchtitan_split(layers, stages) == generate_split_points(layers, stages)
    for which, stages in (("1f1b", 8), ("interleaved", 16)):
        sc, res = run(which)
        got = [p.layout.layers for p in res.derived.pieces]
        assert got == torchtitan_split(126, stages)
        assert res.derived.pieces[0].layout.embedding and res.derived.pieces[-1].layout.head


def test_microbatches_are_torchtitans_default_the_pp_degree():
    # build_pipeline_schedule: n_microbatches = pipeline_parallel_microbatches or
    # pipeline_parallel_degree; Table 5 sets none: 8 microbatches of 32 / 8 = 4 samples
    for which in FILES:
        w = run(which)[0].workload_model()
        assert (w.pp, w.microbatches, w.micro_batch_size) == (8, 8, 4)
        assert (w.data_parallel, w.tp, w.gpus) == (8, 8, 512)
        assert w.global_batch_size // w.data_parallel == 32          # local batch


def test_the_two_files_differ_only_in_the_schedule():
    a, b = (tomllib.loads(FILES[k].read_text()) for k in ("1f1b", "interleaved"))
    assert {k: v for k, v in a.items() if k not in ("schedule", "title")} == \
        {k: v for k, v in b.items() if k not in ("schedule", "title")}
    assert (a["schedule"], b["schedule"]) == ({"name": "1f1b"},
                                              {"name": "interleaved-1f1b", "chunks": 2})


def _two_d(efficiency: float) -> Workload:
    """The Aug 2024 run (docs/performance.md @3faaa1a + train_configs/llama3_405b.toml):
    128 H100, FSDP 16 x TP 8, local batch 2 (global 32), seq 8192, full AC, Float8, no
    pipeline; FSDP2's per-layer all-gathers and reduce-scatters overlap the compute
    (prefetching), so only the optimizer is at the step boundary."""
    w = run("1f1b")[0].workload_model()
    keep = {k: getattr(w, k) for k in ("model", "gpu", "seq", "tp", "sequence_parallel",
                                       "zero", "recompute", "gemm_dtype", "params_dtype",
                                       "grad_dtype", "master_dtype", "framework",
                                       "fp8_param_gather", "vocab_divisor")}
    return Workload(**keep, num_gpus=128, pp=1, dp=16, micro_batch_size=2,
                    global_batch_size=32, overlap_grad_reduce=True, efficiency=efficiency)


def test_efficiency_source():
    """The files' efficiency is the one at which the 2D run gives its measured 185
    TPS/GPU: 32 x 8192 tokens a step on 128 GPUs, 2048 / 185 s a step."""
    w = _two_d(0.5)
    step_ms = w.tokens_per_step / w.gpus / TPS_2D * 1e3
    eff = calibrate_efficiency(w, "1f1b", step_ms)
    assert simulate_workload(_two_d(eff), "1f1b").tokens_per_s_per_gpu == pytest.approx(TPS_2D)
    for which in FILES:
        assert run(which)[0].workload_model().efficiency == pytest.approx(eff, abs=5e-4)


def test_throughput_ratio_within_5_percent_of_1_28():
    t1 = run("1f1b")[1].tokens_per_s_per_gpu
    ti = run("interleaved")[1].tokens_per_s_per_gpu
    ratio = ti / t1
    assert ratio == pytest.approx(128 / 100, rel=0.05)
    # the bubbles alone: (m + p - 1) stage slots of 16 layers against (m v + p - 1) chunk
    # slots of 8, 240 / 184 = 1.304; the step boundary (same in both) pulls it down
    assert 1.0 < ratio < 240 / 184 + 0.03


def test_absolute_throughput_from_the_independent_efficiency():
    for which, (tps, _) in PUBLISHED.items():
        assert run(which)[1].tokens_per_s_per_gpu == pytest.approx(tps, rel=0.05)


def _stage_params(w: Workload, layers: int) -> float:
    """Decoder-layer weights of ``layers`` layers on one TP rank (405B: 398.5 M each)."""
    return layers * w.model.layer_params(0) / w.tp


def test_1f1b_peak_is_the_sum_of_its_parts_on_rank_1():
    """Rank 1 of 1F1B (16 layers; 7 microbatches in flight from its first backward on):
    the peak, at the start of its second backward (B1, after F0..F7 and B0), is the
    closed-form sum of every mechanism the model counts."""
    sc, res = run("1f1b")
    w = sc.workload_model()
    P = _stage_params(w, 16)
    A = w.seq * w.micro_batch_size * w.model.hidden_size * 2 / w.tp   # 128 MiB, SP shard
    gemm = 16 * (w.model.layer_params(0) - 2 * w.model.hidden_size) / w.tp
    sharded = P * 12 / w.data_parallel          # fp32 param (= master) + Adam m, v
    recv = 2 * w.microbatches * A               # a forward and a grad buffer per mb
    gathered = gemm * 1 + (P - gemm) * 2        # fp8 all-gather; norms in bf16
    grads = P * 4                               # fp32 unsharded, accumulated
    acts = 7 * 16 * A                           # full AC: each layer's input, 7 mbs
    kept = 8 * A + 1 * A                        # outputs of F0..F7, B0's input grad
    work = res.derived.stage_bytes[1].working   # one layer's recompute during B
    expect = sharded + recv + gathered + grads + acts + kept + work
    assert res.memory[1].peak == pytest.approx(expect, rel=1e-6)
    assert res.memory[1].held == pytest.approx(gathered + grads + kept, rel=1e-6)
    assert res.memory[1].peak_activations == pytest.approx(acts + work, rel=1e-6)
    assert grads / GiB == pytest.approx(23.75, abs=0.01)


def test_interleaved_holds_one_chunks_grads_where_1f1b_holds_its_whole_stages():
    """The mechanism of the published 9.8 GiB: FSDP's unsharded fp32 gradients live from
    a stage's first backward to its last; torch's interleaved order runs all of chunk 2's
    backwards before chunk 1's, so a rank never holds both."""
    _, r1 = run("1f1b")
    _, ri = run("interleaved")
    g1 = [h.grads for h in r1.derived.stage_held]
    gi = [h.grads for h in ri.derived.stage_held]
    assert max(r1.peak_memory_bytes) > max(ri.peak_memory_bytes)
    # rank 1: 1F1B holds stage 1 (16 layers); interleaved stages 1 and 9 (8 + 8)
    assert g1[1] == pytest.approx(gi[1] + gi[9])
    # what interleaved rank 1 adds back: 16 more recv buffers, 128 - 112 more layer inputs
    # held (16 stage-microbatches of 8 layers against 7 of 16) and 8 more kept outputs
    A = 2 ** 27
    diff = r1.memory[1].peak - ri.memory[1].peak
    assert gi[9] - (16 + 16 + 8) * A - 2 * A <= diff < gi[9]


def test_peaks_against_the_published_reserved_bytes():
    """The tensors' bytes (torch's allocated) sit below the published reserved peaks:
    61.5 and 56.7 GiB against 82.5 and 72.7 (57.7 and 52.8 before the backward's and
    the loss's transients)."""
    for which, (_, gib) in PUBLISHED.items():
        peak = max(run(which)[1].peak_memory_bytes) / GiB
        assert peak < gib
    assert max(run("1f1b")[1].peak_memory_bytes) / GiB == pytest.approx(61.5, abs=0.15)
    assert max(run("interleaved")[1].peak_memory_bytes) / GiB == pytest.approx(56.7, abs=0.15)


#: the caching allocator's steady-state reserved peaks of the two files (GiB, max over ranks)
RESERVED = {"1f1b": 71.0, "interleaved": 68.6}


def test_reserved_peaks_from_the_caching_allocator():
    """The tensor-level stream through the caching allocator model (the same rules for
    both files): 71.0 GiB for 1F1B and 68.6 for interleaved, within 15% of the published
    82.5 (-14.0%) and 72.7 (-5.6%). Reserved is never below allocated, on every rank."""
    for which, (_, published) in PUBLISHED.items():
        res = run(which)[1]
        reserved = res.peak_reserved_bytes
        assert len(reserved) == 8
        assert all(r >= a for r, a in zip(reserved, res.peak_memory_bytes))
        assert max(reserved) / GiB == pytest.approx(RESERVED[which], abs=0.1)
        assert abs(max(reserved) / GiB / published - 1) < 0.15
        assert res.timeline.workload["peak_reserved_bytes"] == reserved


def test_expandable_segments_reserve_less():
    """The allocator setting the benchmark does not record: with expandable segments
    (``allocator = "expandable"``) the same streams reserve 67.1 and 64.3 GiB, less than
    the default allocator's 71.0 and 68.6 (-19% and -12% against the published)."""
    for which, gib in (("1f1b", 67.1), ("interleaved", 64.3)):
        sc, res = run(which)
        w = res.derived.workload.model_copy(update={"allocator": "expandable"})
        r = simulate_workload(w, sc.schedule.name)
        assert r.peak_memory_bytes == pytest.approx(res.peak_memory_bytes, rel=1e-12)
        assert max(r.peak_reserved_bytes) / GiB == pytest.approx(gib, abs=0.1)
        assert max(r.peak_reserved_bytes) < max(res.peak_reserved_bytes)


@pytest.mark.parametrize("which", sorted(FILES))
def test_the_tensor_stream_peaks_at_the_aggregated_peak(which: str):
    """The allocations and frees of the tensor-level stream add up, at their peak, to
    the aggregated byte model's peak on every rank (the same sizes, cut into blocks)."""
    import numpy as np

    from schedsim.program.flat import Opcode
    from schedsim.workload.reserved import reserved_run
    from schedsim.workload.run import _fb_parts

    sc, res = run(which)
    fl = sc.build_program().flat()
    gi = np.flatnonzero(fl.code == Opcode.COMPUTE)
    kind, stage = fl.kind[gi].astype(np.int64), fl.stage[gi].astype(np.int64)
    bkind, bstage = _fb_parts(fl, gi, kind, stage)
    pos = gi.astype(np.float64)
    rr = reserved_run(res.derived, fl.ranks, fl.rank_of_instr()[gi], kind, stage, bkind,
                      bstage, pos, pos + 0.5)
    # blocks are whole bytes: a rounding tolerance
    assert [r.peak_requested for r in rr] == pytest.approx(res.peak_memory_bytes, rel=1e-6)
    assert [r.peak_reserved for r in rr] == pytest.approx(res.peak_reserved_bytes, rel=1e-9)
    assert not any(r.oom for r in rr)


def test_one_layers_backward_working_set_closed_form():
    """What one decoder layer's backward holds beyond the stored inputs (full AC, TP 8 +
    SP, Float8 with fp8 all-gather, FSDP2), per token on one TP rank, 405B (h 16384, 128
    heads of 128, 8 KV heads, SwiGLU f 53248): the recomputed tensors, torch's way (the
    norms' inputs seq-sharded; QKV's and fc1's fp8 inputs all-gathered; q, and k, v
    repeated to every query head (repeat_kv); SDPA's output and its fp8 copy, the SwiGLU's two inputs, fc2's fp8 input, the log-sum-exp),
    fc1's gradients in flight (its two outputs' bf16 gradients and their e5m2 casts, its
    full-sequence input gradient) and the layer's bf16 weight gradients."""
    sc, res = run("1f1b")
    w = sc.workload_model()
    h, a, d, f, t = 16384, 128, 128, 53248, 8
    T = w.seq * w.micro_batch_size
    recomputed = (2 * h * 2 / t + 2 * h * 1 + a * d * 2 / t + 2 * a * d * 2 / t
                  + a * d * (2 + 1) / t + 2 * f * 2 / t + f * 1 / t + a * 4 / t)
    fc1_grads = 2 * f / t * (2 + 1) + h * 2
    wgrads = w.model.layer_params(0) / t * 2
    expect = T * (recomputed + fc1_grads) + wgrads
    assert res.derived.stage_bytes[1].working == pytest.approx(expect, rel=1e-9)
    assert expect / GiB == pytest.approx(5.79, abs=0.01)


def test_last_stage_backward_peaks_in_the_loss():
    """torchtitan's loss, ``cross_entropy(pred.flatten(0, 1).float())`` under loss
    parallel: the backward holds three fp32 tensors of the vocabulary shard beyond the
    saved log-softmax (zeros, exp, their sum / the product), 12 bytes a logit: 4 x 8192
    tokens x 128256 / 8 logits = 5.87 GiB, more than a layer's 5.79, so it is the last
    stage's working set; its stored bytes carry the bf16 logits (kept by torch's
    pipelining) and the fp32 log-softmax."""
    sc, res = run("1f1b")
    w = sc.workload_model()
    n = w.seq * w.micro_batch_size * 128256 / w.tp
    last = res.derived.stage_bytes[-1]
    assert last.working == pytest.approx(12 * n, rel=1e-9)
    layer_inputs = 15 * w.seq * w.micro_batch_size * 16384 * 2 / w.tp
    head = w.seq * w.micro_batch_size * 16384 * 2 * (1 / w.tp + 1) + n * (2 + 4)
    assert last.stored == pytest.approx(layer_inputs + head, rel=1e-9)


#: torchtitan benchmarks/llama3_h100_202412_torchtitan.md (same file and versions as
#: Table 5), full-AC runs without pipeline parallelism: (Workload keywords, GiB)
NON_PP = {
    # Table 2, first row: 8B, FSDP 8, CP 1, local batch 1, seq 32768, compile + Float8
    "table2": (dict(model="llama3.1-8b", num_gpus=8, seq=32768, micro_batch_size=1,
                    global_batch_size=8, dp=8), 83.9),
    # Table 4, "2D + AsyncTP": 70B, FSDP 32 x TP 8, local batch 16, seq 8192
    "table4": (dict(model="llama3.1-70b", num_gpus=256, seq=8192, micro_batch_size=16,
                    global_batch_size=512, tp=8, dp=32), 67.6),
}


@pytest.mark.parametrize("which", sorted(NON_PP))
def test_non_pp_full_ac_runs_as_a_cross_check(which: str):
    """The same rules on torchtitan's full-AC runs without PP (the loss's transient is
    their peak: 8 or 12 bytes a logit over 32768 or 131072 tokens): allocated below the
    published reserved peak, by 15% and 14% (71.2 GiB against 83.9, 58.1 against 67.6;
    52.0 and 42.8 without the loss's and the backward's transients); reserved within 5%."""
    kw, published = NON_PP[which]
    w = Workload(gpu={"name": "h100-sxm", "hbm_bytes": 96 * GiB, "hbm_bandwidth": 2.4e12},
                 zero=3, framework="torchtitan", overlap_grad_reduce=True, recompute="full",
                 gemm_dtype="fp8", fp8_param_gather=True, vocab_divisor=1, **kw)
    r = simulate_workload(w, "1f1b")
    peak = max(r.peak_memory_bytes) / GiB
    assert 0.84 * published < peak < published
    # the caching allocator's reserved peak: 83.0 against 83.9, 70.0 against 67.6
    reserved = max(r.peak_reserved_bytes) / GiB
    assert reserved == pytest.approx({"table2": 83.0, "table4": 70.0}[which], abs=0.1)
    assert abs(reserved / published - 1) < 0.05
    d = r.derived
    n = w.seq * w.micro_batch_size * 128256 / w.tp
    assert d.stage_bytes[0].working == pytest.approx(n * (12 if w.tp > 1 else 8), rel=1e-9)


def test_the_timeline_json_carries_the_held_bytes(tmp_path):
    """A saved Timeline's workload object (stage_held included) gives the run's peaks
    again, as the Gantt's memory panel reads them."""
    from schedsim.analysis.memory import workload_memory
    from schedsim.timeline import Timeline

    _, res = run("interleaved")
    path = tmp_path / "t.json"
    res.timeline.write_json(path)
    again = workload_memory(Timeline.read_json(path))
    assert [m.peak for m in again] == pytest.approx(res.peak_memory_bytes, rel=1e-9)
    assert [m.held for m in again] == pytest.approx([m.held for m in res.memory], rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_torch_saved_set_is_the_papers_without_tp_gqa_or_fp8(recompute: str):
    """torch's way of keeping the GEMM inputs differs from Korthikanti's only through TP
    (the gathered inputs), GQA (repeat_kv) and fp8 (the casts): for an MHA model on one
    GPU in bf16 the two tensor sets are the same; with TP + SP the column-parallel inputs
    grow by ``2 x (h - h/t) x 2`` bytes a token, with GQA K and V by ``2 (a - g) d x 2 / t``."""
    from schedsim.workload.memory import layer_activations
    from schedsim.workload.model import ModelConfig, load_model

    mha = ModelConfig(hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
                      intermediate_size=11008, vocab_size=32000, hidden_act="silu")
    paper = layer_activations(mha, 0, 4096, 2, recompute=recompute)
    torch_ = layer_activations(mha, 0, 4096, 2, recompute=recompute, gemm_inputs=2.0)
    assert torch_.stored == pytest.approx(paper.stored, rel=1e-12)
    assert torch_.working == pytest.approx(paper.working, rel=1e-12)
    m = load_model("llama3.1-70b")
    h, a, g, d, t, T = 8192, 64, 8, 128, 8, 8192.0
    paper = layer_activations(m, 0, 8192, 1, t, True, "none")
    torch_ = layer_activations(m, 0, 8192, 1, t, True, "none", gemm_inputs=2.0)
    grow = T * (2 * (h - h / t) * 2 + 2 * (a - g) * d * 2 / t)
    assert torch_.stored - paper.stored == pytest.approx(grow, rel=1e-12)


def test_the_memory_panel_shows_the_reserved_peaks():
    """The Gantt's memory panel of a run with the allocator replay: each drawn rank's
    legend names its allocated and reserved peaks, the highest reserved peak is a line at
    70.99 GiB (rank 1), the HBM at the same precision (one formatter), and the axis says the curves are allocated bytes."""
    from matplotlib.figure import Figure

    from schedsim.plot.memory import GIB_RESERVED_YLABEL, draw_memory
    from schedsim.util.units import fmt_gib

    res = run("1f1b")[1]
    ax = Figure().subplots()
    peaks = draw_memory(ax, res.timeline)
    labels = ax.get_legend_handles_labels()[1]
    gib = [b / GiB for b in res.peak_reserved_bytes]
    assert f"rank 1 (peak {fmt_gib(peaks[1] * GiB)}, reserved {fmt_gib(gib[1] * GiB)})" \
        in labels
    assert "reserved peak 70.99 GiB (rank 1)" in labels and "HBM 96 GiB" in labels
    assert ax.get_ylabel() == GIB_RESERVED_YLABEL
    line = [h for h, lb in zip(*ax.get_legend_handles_labels()) if lb.startswith("reserved")]
    assert line[0].get_ydata()[0] == pytest.approx(max(gib))

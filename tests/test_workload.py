"""The workload model: model FLOPs against Megatron-LM's formula, activation bytes
against Korthikanti et al.'s Table 2, presets against published parameter counts, the
rules of a runnable workload, and the derived costs and bytes against closed forms."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from schedsim.program.ir import Placement
from schedsim.workload import (
    Workload,
    WorkloadError,
    derive,
    load_model,
    model_flops_per_step,
    simulate_workload,
)
from schedsim.workload.flops import head_pieces, layer_pieces, padded_vocab
from schedsim.workload.memory import layer_activations
from schedsim.workload.model import ModelConfig, model_from_dict
from schedsim.errors import ScenarioError


# -- Megatron-LM's num_floating_point_operations, written out independently ----------
def megatron_flops(args: SimpleNamespace, batch_size: int) -> float:
    """``transformer_flops()`` of ``num_floating_point_operations`` in
    NVIDIA/Megatron-LM ``megatron/training/training.py`` at commit d98e8a64ddf3 (BSHD
    path: real tokens = batch x seq, seq^2 sum = batch x seq^2; no MTP, no linear
    attention, no latent MoE, no output gate)."""
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.num_experts is None:
        num_dense_layers, num_moe_layers, routed = args.num_layers, 0, 0
    else:
        pattern = args.moe_layer_freq
        num_moe_layers = sum(pattern)
        num_dense_layers = args.num_layers - num_moe_layers
        routed = args.moe_router_topk
    moe_ffn = args.moe_ffn_hidden_size or args.ffn_hidden_size
    shared = args.moe_shared_expert_intermediate_size or 0
    fb, fma = 3, 2
    ffn_exp = 3 if args.swiglu else 2
    if args.multi_latent_attention:
        if args.q_lora_rank is None:
            q_term = args.hidden_size * args.num_attention_heads * (
                args.qk_head_dim + args.qk_pos_emb_head_dim)
        else:
            q_term = args.q_lora_rank * (args.hidden_size + args.num_attention_heads * (
                args.qk_head_dim + args.qk_pos_emb_head_dim) + 1)
        attn = fb * fma * (q_term + args.kv_lora_rank * (
            args.hidden_size + args.num_attention_heads * (args.qk_head_dim + args.v_head_dim)
            + 1) + args.hidden_size * args.qk_pos_emb_head_dim
            + args.num_attention_heads * args.v_head_dim * args.hidden_size)
        core = fb * fma * (args.num_attention_heads * (
            args.qk_head_dim + args.qk_pos_emb_head_dim) / 2
            + args.num_attention_heads * args.v_head_dim / 2)
    else:
        q = args.kv_channels * args.num_attention_heads
        kv = args.kv_channels * args.num_query_groups
        attn = fb * fma * (args.hidden_size * (q + kv + kv) + q * args.hidden_size)
        core = fb * fma * q / 2 * 2
    tokens = batch_size * args.seq_length
    sq = batch_size * args.seq_length * args.seq_length
    return (tokens * (
        fb * fma * args.hidden_size * (
            args.ffn_hidden_size * ffn_exp * num_dense_layers
            + moe_ffn * routed * ffn_exp * num_moe_layers
            + shared * ffn_exp * num_moe_layers)
        + attn * args.num_layers
        + fb * fma * args.hidden_size * args.padded_vocab_size)
        + sq * core * args.num_layers)


def megatron_args(m: ModelConfig, seq: int, tp: int) -> SimpleNamespace:
    """Megatron's arguments for ``m`` as its Hugging Face converters set them."""
    mult = 128 * tp
    moe = m.experts > 0
    return SimpleNamespace(
        hidden_size=m.hidden_size, num_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        group_query_attention=m.kv_heads != m.num_attention_heads and not m.mla,
        num_query_groups=m.kv_heads, kv_channels=m.kv_channels,
        ffn_hidden_size=m.intermediate_size, swiglu=m.hidden_act == "silu",
        num_experts=m.experts if moe else None,
        moe_layer_freq=[int(m.is_moe_layer(i)) for i in range(m.num_hidden_layers)],
        moe_router_topk=m.num_experts_per_tok,
        moe_ffn_hidden_size=m.moe_intermediate_size,
        moe_shared_expert_intermediate_size=(m.n_shared_experts or 0) * (m.moe_intermediate_size or 0) or None,
        padded_vocab_size=math.ceil(m.vocab_size / mult) * mult, seq_length=seq,
        multi_latent_attention=m.mla, q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank, qk_head_dim=m.qk_nope_head_dim,
        qk_pos_emb_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim)


@pytest.mark.parametrize("name,seq,gbs,tp", [
    ("llama3.1-70b", 8192, 512, 8), ("llama3.1-8b", 4096, 64, 2),
    ("mixtral-8x7b", 4096, 256, 4), ("qwen3-30b-a3b", 4096, 128, 4),
    ("deepseek-v3", 4096, 1024, 2), ("llama3.1-405b", 8192, 256, 8)])
def test_model_flops_equal_megatron(name: str, seq: int, gbs: int, tp: int) -> None:
    m = load_model(name)
    ours = model_flops_per_step(m, seq, gbs, tp)
    ref = megatron_flops(megatron_args(m, seq, tp), gbs)
    assert ours == pytest.approx(ref, rel=1e-12)      # the issue asks for 1%: exact


def test_model_flops_closed_form_llama70b() -> None:
    """6 x (decoder GEMM weights + LM head) x tokens + 6 x layers x heads x d x B x s^2
    (the causal core attention: 2 GEMMs, half the scores, 3 passes)."""
    m = load_model("llama3.1-70b")
    seq, gbs, tp = 8192, 16, 8
    h, a, g, d, f = 8192, 64, 8, 128, 28672
    per_layer = h * (a * d + 2 * g * d) + a * d * h + 3 * h * f
    V = 128256                           # already a multiple of 128 x 8 = 1024? no:
    V = -(-V // 1024) * 1024
    expect = 6 * (80 * per_layer + V * h) * gbs * seq + 6 * 80 * a * d * gbs * seq ** 2
    assert model_flops_per_step(m, seq, gbs, tp) == pytest.approx(expect, rel=1e-12)
    assert padded_vocab(m, 8) == 129024


@pytest.mark.parametrize("name", ["llama3.1-70b", "deepseek-v3", "mixtral-8x7b"])
def test_pieces_sum_to_model_flops(name: str) -> None:
    m = load_model(name)
    seq, mbs, tp = 2048, 2, 4
    tot = sum(p.total() for i in range(m.num_hidden_layers)
              for p in layer_pieces(m, i, seq, mbs, tp).values())
    tot += head_pieces(m, seq, mbs, tp).total()
    assert tot == pytest.approx(model_flops_per_step(m, seq, mbs, tp), rel=1e-12)


@pytest.mark.parametrize("name,params", [
    ("llama3.1-8b", 8.03e9), ("llama3.1-70b", 70.55e9), ("llama3.1-405b", 405.85e9),
    ("deepseek-v3", 671.0e9), ("qwen3-30b-a3b", 30.53e9), ("mixtral-8x7b", 46.70e9)])
def test_presets_match_published_parameter_counts(name: str, params: float) -> None:
    """Model cards: 8.03B, 70.6B, 405.9B (Meta), 671B (DeepSeek-V3 without its 14B MTP
    module), 30.5B (Qwen3-30B-A3B), 46.7B (Mixtral 8x7B)."""
    m = load_model(name)
    assert m.total_params() == pytest.approx(params, rel=2e-3)
    assert m.source.startswith("huggingface.co/")


# -- Korthikanti et al. 2022, Table 2 --------------------------------------------------
GPT = ModelConfig(hidden_size=12288, num_hidden_layers=2, num_attention_heads=96,
                  intermediate_size=4 * 12288, vocab_size=51200, hidden_act="gelu")


@pytest.mark.parametrize("t,sp,recompute,row", [
    (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (8, True, "none", lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t))),
    (1, False, "selective", lambda s, b, h, a, t: s * b * h * 34),
    (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    (8, True, "selective", lambda s, b, h, a, t: s * b * h * 34 / t),
    (1, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
    (8, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
    (8, True, "full", lambda s, b, h, a, t: 2 * s * b * h / t),
])
@pytest.mark.parametrize("s,b", [(2048, 1), (4096, 4)])
def test_activations_equal_korthikanti(t, sp, recompute, row, s, b) -> None:
    act = layer_activations(GPT, 0, s, b, t, sp, recompute, flash=False, dropout=True)
    assert act.stored == pytest.approx(row(s, b, 12288, 96, t), rel=1e-12)


@pytest.mark.parametrize("t,sp", [(1, False), (8, False), (8, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activations_llama_closed_form(t, sp, recompute) -> None:
    """Llama 3.1 70B (RMSNorm, GQA, SwiGLU, no dropout, flash attention), per token:
    replicated 4 x 2h (norm inputs, QKV and fc1 inputs); sharded 2(a d + 2 g d + a d) +
    2(2f + f); core: the fp32 log-sum-exp, 4a."""
    m = load_model("llama3.1-70b")
    s, b, h, a, g, d, f = 8192, 1, 8192, 64, 8, 128, 28672
    rep, shard, core = 8 * h, 2 * (a * d + 2 * g * d + a * d) + 2 * 3 * f, 4 * a
    rd = t if sp else 1
    full = s * b * (rep / rd + shard / t + core / t)
    expect = {"none": full, "selective": full - s * b * core / t,
              "full": s * b * 2 * h / rd}[recompute]
    act = layer_activations(m, 0, s, b, t, sp, recompute)
    assert act.stored == pytest.approx(expect, rel=1e-12)


# -- bad input -------------------------------------------------------------------------
def test_unknown_config_key_named() -> None:
    with pytest.raises(ScenarioError, match="'num_hidden_layer'.*did you mean "
                                            "'num_hidden_layers'"):
        model_from_dict({"hidden_size": 8, "num_hidden_layer": 2})
    # harmless Hugging Face bookkeeping is accepted and ignored
    m = model_from_dict({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "intermediate_size": 128, "vocab_size": 100, "rope_theta": 1e4,
                         "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"})
    assert m.kv_heads == 4 and m.kv_channels == 16


TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100}


@pytest.mark.parametrize("key,value,allowed", [
    ("num_hidden_layers", -2, "a whole number from 1 to 16,384"),
    ("num_hidden_layers", 0, "a whole number from 1 to 16,384"),
    ("hidden_size", 10 ** 7, "a whole number from 1 to 1,048,576"),
    ("vocab_size", 0, "a whole number from 1 to 16,777,216"),
    ("num_key_value_heads", 0, "a whole number from 1 to 16,384"),
    ("n_shared_experts", -1, "a whole number from 0 to 65,536"),
])
def test_model_figure_out_of_range_named_with_the_range(key, value, allowed) -> None:
    """A model figure out of its bounds: one line with the key, the value and the allowed
    range (it read "'num_hidden_layers': Input should be greater than or equal to 1")."""
    with pytest.raises(ScenarioError) as e:
        model_from_dict({**TINY, key: value})
    assert str(e.value) == f"model config {key} = {value} is out of range: give {allowed}"
    with pytest.raises(ScenarioError) as e:
        model_from_dict({**TINY, key: value}, "cfg/config.json")
    assert str(e.value).startswith(f"cfg/config.json: model config {key} = {value} is out")


def test_workload_figure_out_of_range_named_with_the_range() -> None:
    from schedsim.workload.layout import workload_from_dict

    base = dict(model="llama3.1-8b", gpu="h100-sxm", seq=4096, global_batch_size=16)
    for key, value, allowed in (("tp", 0, "a whole number >= 1"),
                                ("zero", 4, "a whole number from 0 to 3"),
                                ("efficiency", 1.5, "a number > 0 and <= 1")):
        with pytest.raises(ScenarioError) as e:
            workload_from_dict({**base, key: value})
        assert str(e.value) == (f"[workload]: {key} = {value} is out of range: give "
                                f"{allowed}")


def _w(**kw) -> Workload:
    base = dict(model="llama3.1-70b", gpu="h100-sxm", seq=4096, global_batch_size=32,
                tp=8, pp=4)
    return Workload(**{**base, **kw})


@pytest.mark.parametrize("kw,rule", [
    (dict(tp=3), "heads % tp"),
    (dict(model="qwen3-30b-a3b", tp=8), "kv_heads % tp"),
    (dict(model="mixtral-8x7b", ep=3, tp=1, dp=3, global_batch_size=30), "experts % ep"),
    (dict(pp=3), "layers fill pp x chunks stages"),
    (dict(pp=4, chunks=3), "layers fill pp x chunks stages"),
    (dict(global_batch_size=30, dp=4), "global_batch_size % (micro_batch_size x dp)"),
    (dict(tp=16, model="deepseek-v3", pp=1, layout=None, seq=4096), "tp within a node"),
    (dict(cp=2), "cp not built"),
    (dict(num_gpus=100), "gpus % (tp x cp x pp)"),
    (dict(num_gpus=64, dp=3), "gpus = tp x cp x dp x pp"),
    (dict(gpu="a100-80gb", gemm_dtype="fp8"), "gemm dtype on gpu"),
    (dict(layout="Et*40|t*40|L"), "layers fill pp x chunks stages"),
    (dict(layout="Et*20|t*20|t*20|t*20m|L", pp=5), "layout"),
])
def test_rules_one_line(kw, rule) -> None:
    with pytest.raises(WorkloadError) as e:
        _w(**kw).check()
    assert e.value.rule == rule
    assert "\n" not in str(e.value)


def test_layout_string_and_list() -> None:
    w = _w(layout="Et*19|t*20|t*20|t*21L").check()
    ls = w.stage_layout()
    assert [s.layers for s in ls] == [19, 20, 20, 21]
    assert [s.first for s in ls] == [0, 19, 39, 59]
    assert ls[0].embedding and ls[-1].head and not ls[1].embedding
    assert [s.layers for s in _w(layout=[19, 20, 20, 21]).check().stage_layout()] == \
        [19, 20, 20, 21]
    w = _w(layout="E(tt|)*3t*2,L", pp=4, model=load_model("llama3.1-8b").model_copy(
        update={"num_hidden_layers": 8}), tp=1)
    assert [s.layers for s in w.check().stage_layout()] == [2, 2, 2, 2]


# -- derived costs and bytes -----------------------------------------------------------
@pytest.mark.parametrize("name,chunks", [("zb-1p", 1), ("dualpipev", 2)])
def test_op_costs_array_path_matches_per_op(name: str, chunks: int) -> None:
    """The array path of derived costs (one lookup per distinct kind and stage, FB pairs
    included) gives what the op-by-op :meth:`CostModel.cost` gives."""
    from schedsim.generators import build_program
    from schedsim.program.flat import Opcode
    from schedsim.sim.prep import compute_costs

    layout = "Et*9|t*10|t*10|t*10|t*10|t*10|t*10|t*11L" if chunks == 2 else \
        "Et*19|t*20|t*20|t*21L"
    w = _w(layout=layout, chunks=chunks)
    prog = build_program(name, 4, w.microbatches)
    d = derive(w, prog.placement)
    fl = prog.flat()
    fast = compute_costs(fl, d.costs, fl.code == Opcode.COMPUTE)
    slow = [d.costs.cost(i.op) for row in prog.ranks for i in row if hasattr(i, "op")]
    assert len(fast) == len(slow)
    assert np.array_equal(fast, np.array(slow))
    assert len(set(np.round(fast, 9))) > 4       # stages differ: a real lookup


def test_1f1b_peak_memory_closed_form() -> None:
    """1F1B: rank 0 holds pp microbatches' activations at its peak; rank pp-1 one."""
    w = _w(dp=2, global_batch_size=64, recompute="none")
    r = simulate_workload(w, "1f1b")
    d = r.derived
    for q, expect_mbs in ((0, 4), (3, 1)):
        st = d.stage_bytes[q]
        assert r.memory[q].peak_activations == pytest.approx(expect_mbs * st.stored)
        assert r.memory[q].peak == pytest.approx(d.static[q].total + expect_mbs * st.stored)
    assert r.step_ms == pytest.approx(r.timeline.makespan + d.step_boundary_ms)
    gpus = 8 * 2 * 4
    assert r.tokens_per_s_per_gpu == pytest.approx(64 * 4096 / (r.step_ms / 1e3) / gpus)
    assert r.mfu == pytest.approx(r.model_flops_per_step / (r.step_ms / 1e3 * gpus * 989.4e12))


def test_static_bytes_distributed_optimizer() -> None:
    """Megatron's distributed optimizer (zero 1, bf16 params, fp32 grads): 6 bytes per
    parameter plus 12 / dp."""
    w = _w(dp=4, global_batch_size=64, zero=1)
    d = derive(w, Placement(kind="loop", ranks=4, stages=4))
    from schedsim.workload.memory import stage_params

    st = d.pieces[1].layout
    n, _ = stage_params(w.model, st.first, st.layers, False, False, 8, 1)
    assert d.static[1].total == pytest.approx(n * (2 + 4 + 12 / 4))


def test_does_not_fit_is_a_result() -> None:
    w = _w(model="llama3.1-405b", tp=8, pp=2, dp=1, global_batch_size=8, seq=8192,
           layout=None)
    r = simulate_workload(w, "1f1b")
    assert not r.fits and "does NOT fit" in r.line()


@pytest.mark.parametrize("name,chunks", [("interleaved-1f1b", 2), ("zb-1p", 1),
                                         ("dualpipev", 2), ("dualpipe", 1)])
def test_order_only_peak_equals_run_peak(name: str, chunks: int) -> None:
    """peak_bytes (program order) equals the run's peaks (time order), for every rank."""
    from schedsim.workload.run import peak_bytes, workload_program

    w = _w(layout=None, model=load_model("llama3.1-8b"), chunks=chunks, tp=2, dp=2,
           global_batch_size=32, recompute="selective")
    r = simulate_workload(w, name)
    prog = workload_program(w, name)
    assert peak_bytes(derive(w, prog.placement), prog) == r.peak_memory_bytes


def test_calibrate_efficiency_recovers_it() -> None:
    from schedsim.workload.run import calibrate_efficiency

    w = _w(model=load_model("llama3.1-8b"), tp=2, dp=1, layout=None)
    step = simulate_workload(w.model_copy(update={"efficiency": 0.37}), "1f1b").step_ms
    assert calibrate_efficiency(w, "1f1b", step) == pytest.approx(0.37, rel=1e-5)
    with pytest.raises(ScenarioError, match="faster than"):
        calibrate_efficiency(w, "1f1b", step / 10)


def test_fp8_speeds_decoder_gemms_not_the_head() -> None:
    """gemm_dtype fp8 halves the decoder linears' compute-bound time (H100: 1979 vs
    989 TFLOP/s), not the LM head's; vocab_divisor 1 leaves the vocabulary unpadded."""
    from schedsim.workload.cost import stage_pieces

    base = _w(layout=None, recompute="none", overhead_ms=0.0)
    bf, f8 = stage_pieces(base), stage_pieces(base.model_copy(update={"gemm_dtype": "fp8"}))
    assert f8[-1].head == bf[-1].head
    assert f8[1].mlp.F == pytest.approx(bf[1].mlp.F / 2, rel=1e-3)
    assert padded_vocab(base.model, 8, 1) == 128256 and padded_vocab(base.model, 8) == 129024


def test_v_placement_puts_embedding_and_head_on_rank_0() -> None:
    """ZB-V: stages 0 (embedding) and 2P-1 (head) on rank 0, whose static bytes hold both
    vocabulary matrices; the middle ranks hold neither."""
    from schedsim.workload.memory import stage_params
    from schedsim.workload.run import workload_program

    w = _w(layout=None, model=load_model("llama3.1-8b"), tp=2, dp=1, chunks=2)
    prog = workload_program(w, "zbv")
    d = derive(w, prog.placement)
    assert prog.placement.rank_of(0) == prog.placement.rank_of(7) == 0
    assert d.pieces[0].layout.embedding and d.pieces[7].layout.head
    m = w.model
    per_rank = [sum(sum(stage_params(m, d.pieces[s].layout.first, d.pieces[s].layout.layers,
                                     d.pieces[s].layout.embedding, d.pieces[s].layout.head,
                                     2, 1)) for s in prog.placement.stages_of(r))
                for r in range(4)]
    vocab = 2 * 128256 * 4096 / 2 + 4096                # embedding + head + final norm
    assert per_rank[0] - per_rank[1] == pytest.approx(vocab)
    assert d.static[0].params == pytest.approx(per_rank[0] * 2)       # bf16


def test_torch_receive_buffers_per_microbatch() -> None:
    """recv_buffers = per-microbatch: every stage but the first holds one input buffer
    per microbatch, every stage but the last one gradient buffer, for the whole step
    (one message each: seq x mb x h x 2 / tp under sequence parallelism)."""
    w = _w(layout=None, model=load_model("llama3.1-8b"), tp=2, dp=1,
           recv_buffers="per-microbatch")
    d = derive(w, Placement(kind="loop", ranks=4, stages=4))
    msg = 4096 * 1 * 4096 * 2 / 2
    assert d.recv_bytes == [32 * msg, 64 * msg, 64 * msg, 32 * msg]
    r = simulate_workload(w, "1f1b")
    assert r.memory[1].recv == 64 * msg and r.memory[1].static == d.static[1].total
    assert r.memory[1].peak >= d.static[1].total + 64 * msg + r.memory[1].peak_activations


def test_typed_kind_wins_over_derived(tmp_path) -> None:
    from schedsim.program.ir import Op
    from schedsim.scenario import parse_scenario

    sc = parse_scenario({"schedule": {"name": "1f1b"}, "costs": {"F": 5.0},
                         "workload": {"model": "llama3.1-8b", "gpu": "h100-sxm",
                                      "seq": 4096, "global_batch_size": 16, "tp": 2,
                                      "pp": 4}})
    assert sc.costs.unit == "ms" and sc.schedule.ranks == 4 and sc.schedule.microbatches == 16
    assert sc.costs.cost(Op("F", 2, 0)) == 5.0
    derived = derive(sc.workload_model(), Placement(kind="loop", ranks=4, stages=4))
    assert sc.costs.cost(Op("B", 2, 0)) == derived.costs.cost(Op("B", 2, 0)) > 0


def test_every_overlap_mode_runs_with_embedding_and_head_stages() -> None:
    """An MoE workload on DualPipeV (FB pairs on the stages holding the embedding and the
    head) under each overlap mode of the stage model: overlapping an FB pair's
    collectives never makes the step longer than running them exposed."""
    base = dict(model="mixtral-8x7b", gpu="h100-sxm", seq=4096, global_batch_size=64,
                tp=2, ep=4, pp=4, dp=4, chunks=2)
    steps = {o: simulate_workload(Workload(**base, overlap=o), "dualpipev").step_ms
             for o in ("none", "domino", "fb", "megatron")}
    assert all(0 < v < float("inf") for v in steps.values())
    assert steps["fb"] <= steps["none"] and steps["megatron"] <= steps["none"]

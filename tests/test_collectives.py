"""Collectives: the alpha-beta costs follow nccl-tests' bus-bandwidth conventions;
tensor-parallel shards reassemble the single-process layers exactly; and on real gloo
processes (float64, every run with a timeout) check-collectives measures the gradient
scale of each way of writing the all-reduce, and a pp=2 x tp=2 replay passes the
gradient check for Megatron's f/g and for Domino's."""
from __future__ import annotations

import json
import math
import re

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.sim.collectives import ModelLinks, bus_factor, collective_time

runner = CliRunner()
TIMEOUT = 120.0


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter",
                                  "all-to-all"])
@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_bus_bandwidth_convention(kind, n):
    """Without latency, algbw = S/t and busbw = algbw x factor (nccl-tests
    doc/PERFORMANCE.md): the time of S bytes at bus bandwidth B gives back B."""
    S, B = 3.0e8, 2.5e7
    t = collective_time(kind, n, S, B)
    factor = 2 * (n - 1) / n if kind == "all-reduce" else (n - 1) / n
    assert bus_factor(kind, n) == factor
    assert (S / t) * factor == pytest.approx(B, rel=1e-12)
    steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    assert collective_time(kind, n, S, B, 0.01) - t == pytest.approx(steps * 0.01)


def test_edge_cases():
    assert collective_time("all-reduce", 1, 1e9, 1.0, 5.0) == 0.0
    assert collective_time("all-to-all", 4, 1e9, math.inf, 0.5) == 1.5
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time("broadcast", 4, 1.0, 1.0)
    links = ModelLinks(gpus_per_node=8, intra={"bandwidth": 4.0}, inter={"bandwidth": 1.0})
    assert links.for_span(8).bandwidth == 4.0 and links.for_span(16).bandwidth == 1.0
    assert links.time("all-reduce", 2, 8.0, 16) == 8.0     # 2(1)/2 x 8 / 1


# -- TP shards -----------------------------------------------------------------------------
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("workload", ["mlp", "transformer"])
def test_shards_reassemble_and_partial_sums_add_up(workload):
    """Every parameter's shards unshard to the full tensor, and the row-parallel partial
    outputs of the tp ranks sum to the single-process block's output (before the bias)."""
    import torch.nn.functional as F

    from schedsim.replay.config import ReplayConfig
    from schedsim.replay.tensor_parallel import TPBlock, shard, unshard
    from schedsim.replay.stage_modules import build_stage

    cfg = ReplayConfig(workload=workload, hidden=8, heads=4, ffn_mult=2, dtype="float64",
                       tp=2)
    full = build_stage(cfg, 1)
    for name, p in full.named_parameters():
        parts = [shard(name, p.detach(), cfg, r) for r in range(2)]
        assert parts[0].shape != p.shape or name.endswith(("fc2.bias", "proj.bias"))
        assert torch.equal(unshard(name, parts, cfg), p.detach())
    blk = full.blocks[0]
    tps = [TPBlock(blk, "blocks.0.", cfg, r) for r in range(2)]
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        for j, sub in enumerate(tps[0].subs):
            u = sub.pre(x)
            got = sum(t.subs[j].inner(u) for t in tps)
            if sub.kind == "mlp":
                want = F.linear(F.gelu(blk.fc1(u)), blk.fc2.weight)
            else:
                b, s, h = u.shape
                qkv = blk.qkv(u).view(b, s, 3, 4, 2).permute(2, 0, 3, 1, 4)
                att = (qkv[0] @ qkv[1].transpose(-2, -1)) / math.sqrt(2)
                att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1),
                                      float("-inf")).softmax(-1)
                want = F.linear((att @ qkv[2]).transpose(1, 2).reshape(b, s, h),
                                blk.proj.weight)
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_fit_scale():
    from schedsim.replay.collectives_check import common_scale, fit

    r = {"a": torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64),
         "b": torch.tensor([[0.5, 4.0]], dtype=torch.float64)}
    assert fit(4 * r["a"], r["a"]) == (4.0, 0.0)
    assert common_scale({k: 4 * v for k, v in r.items()}, r) == 4.0
    assert common_scale({"a": 4 * r["a"], "b": r["b"]}, r) is None      # two scales
    assert common_scale({"a": r["a"] + 1e-3, "b": r["b"]}, r) is None   # not a multiple


def test_bad_tp_replay_settings_are_one_line():
    args = ["replay", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2"]
    r = runner.invoke(app, args + ["--set", "tp=2", "--set", "tp_comm=domino", "--set",
                                   "microbatch_size=3"])
    assert r.exit_code == 2 and "microbatch_size (3) must be even" in r.output
    r = runner.invoke(app, args + ["--set", "tp=3"])
    assert r.exit_code == 2 and "tp = 3 must divide the MLP size" in r.output
    r = runner.invoke(app, args + ["--set", "tp=2", "--set", "tp_comm=raw"])
    assert r.exit_code == 2 and "tp_comm" in r.output
    r = runner.invoke(app, args + ["--set", "tp=2", "--compare"])
    assert r.exit_code == 2 and "calibration" in r.output and "tp = 2" in r.output
    r = runner.invoke(app, args + ["--set", "tp=2", "--nproc", "2"])
    assert r.exit_code == 2 and "use --nproc 4" in r.output


# -- multi-process (gloo) ------------------------------------------------------------------
@pytest.mark.parametrize("tp", [2, 4])
def test_check_collectives(tp, tmp_path):
    """The scale of each variant against the replicated and the summed loss, within
    1e-9 (the lab note's x.grad = tp is the summed loss's gradient), and the saved-tensor
    hazard: silent, with a large error, while a tracked in-place change raises."""
    out = tmp_path / "c.json"
    r = runner.invoke(app, ["check-collectives", "--tp", str(tp), "--json", str(out),
                            "--timeout", str(TIMEOUT)], terminal_width=200)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["tp"] == tp
    v = {x["name"]: x for x in res["variants"]}
    for x in res["variants"]:
        assert set(x) == {"name", "scale_replicated_loss", "scale_summed_loss",
                          "correct_for", "note"}
    for name in ("megatron-fg", "raw-forward-allreduce"):
        assert abs(v[name]["scale_replicated_loss"] - 1.0) <= 1e-9
        assert abs(v[name]["scale_summed_loss"] - 1.0 / tp) <= 1e-9
        assert v[name]["correct_for"] == "replicated"
    for name in ("allreduce-both-ways", "torch-nn-functional"):
        assert abs(v[name]["scale_replicated_loss"] - tp) <= 1e-9
        assert abs(v[name]["scale_summed_loss"] - 1.0) <= 1e-9
        assert v[name]["correct_for"] == "summed"
    assert v["no-f"]["scale_replicated_loss"] is None and v["no-f"]["correct_for"] == "neither"
    (f,) = res["findings"]
    assert f["name"] == "saved-tensor-inplace-allreduce" and f["silent"] is True
    assert f["max_rel_error"] > 0.1
    assert "modified by an inplace operation" in f["tracked_inplace_error"]
    assert re.search(rf"allreduce-both-ways\s+│\s+{tp}\.0 │\s+1\.0 │ summed", r.output)
    assert "finding saved-tensor-inplace-allreduce" in r.output


@pytest.mark.parametrize("comm", ["megatron-fg", "domino"])
def test_tp_replay_pp2_tp2_passes_the_gradient_check(comm, tmp_path):
    """pp=2 x tp=2 (4 gloo processes), zero-bubble H1 (B and W split), float64: every
    parameter's gathered gradient matches the single-process reference, the TP copies of
    the replicated biases agree, and the measured timeline records the collectives (F and
    B ops, none in W; Domino's in two halves)."""
    out = tmp_path / "tl.json"
    r = runner.invoke(app, ["replay", "--schedule", "zb-h1", "--ranks", "2",
                            "--microbatches", "3", "--set", "tp=2", "--set",
                            f"tp_comm={comm}", "--set", "workload=transformer", "--set",
                            "hidden=8", "--set", "heads=2", "--set", "seq=4", "--set",
                            "layers_per_stage=1", "--set",
                            "dtype=float64", "--check-grads", "--json", str(out),
                            "--timeout", str(TIMEOUT)], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "gradient check passed" in r.output
    tl = json.loads(out.read_text())
    gc = tl["grad_check"]
    assert gc["passed"] and gc["max_rel_error"] <= 1e-9 and gc["tp_replica_rel_error"] <= 1e-9
    assert (tl["tp"], tl["tp_comm"], tl["world_size"]) == (2, comm, 4)
    pieces = tl["pieces"]
    kinds = {(s["rank"], s["index"]): s["kind"] for s in tl["spans"]}
    per_op: dict = {}
    for p in pieces:
        assert p["collective"] == "all-reduce" and p["end"] >= p["start"]
        assert p["kind"] == kinds[(p["rank"], p["index"])] in ("F", "B")
        per_op.setdefault((p["rank"], p["tp_rank"], p["kind"], p["index"]), []).append(p)
    # 1 layer = attention + MLP: F has proj and fc2 all-reduces (g), B the fc1 and qkv
    # input-gradient all-reduces (f's backward) — but stage 0's input (the data) needs
    # no gradient, so its qkv one is skipped; Domino: each per half
    halves = 2 if comm == "domino" else 1
    want = {(0, "F"): 2, (1, "F"): 2, (0, "B"): 1, (1, "B"): 2}
    assert {k: len(v) for k, v in per_op.items()} == {
        k: halves * want[(k[0], k[2])] for k in per_op}
    assert len(per_op) == 2 * 2 * 2 * 3          # ranks x tp ranks x (F + B) x mb
    assert {p["half"] for p in pieces} == ({0, 1} if comm == "domino" else {None})

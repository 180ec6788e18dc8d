"""Stage-internal piece traces (schedsim.interop.kineto_pieces, piece_model): DeepSeek's
public H800 trace of one overlapped forward+backward chunk pair (4 MoE layers, EP64,
github.com/deepseek-ai/profile-data train.json) read as pieces with the streams kept apart,
its per-piece GPU times put into the stage model (overlap "fb"), hand-made traces with
hand-computed answers, and the HTA traces (all-to-all SendRecv kernels) refused."""
from __future__ import annotations

import json
import tomllib

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.interop.kineto import import_traces, read_piece_trace
from schedsim.interop.kineto_pieces import piece_costs, union_length
from schedsim.interop.piece_model import predict_pair
from schedsim.sim.stage_costs import StageCosts
from schedsim.sim.stage_model import StageModel
from tests.conftest import ref_path

runner = CliRunner()
#: DeepSeek's trace: its kernels span 0.533 .. 129.545 ms (first kernel start to last
#: kernel end) over 4 layers: 32.253 ms per layer (the figure issue 24 quotes, 32.25)
DS_SPAN_PER_LAYER = 32.253


@pytest.fixture(scope="module")
def deepseek():
    return read_piece_trace(ref_path("public-traces", "deepseek-profile-data", "train.json"))


def test_deepseek_imports_as_pieces_streams_apart(deepseek):
    """40 pieces (10 kinds x 4 layers); compute kernels on streams 7 and 23 (mlp(W)'s
    grouped GEMM runs on a second stream), DeepEP's dispatch/combine on stream 27, none
    mixed; the notes list what was not read."""
    assert len(deepseek.pieces) == 40
    costs = piece_costs(deepseek)
    assert sorted(costs) == sorted(f"{b}({p})" for b, p in [
        ("attn", "F"), ("attn", "B"), ("attn", "W"), ("mlp", "F"), ("mlp", "B"),
        ("mlp", "W"), ("dispatch", "F"), ("dispatch", "B"), ("combine", "F"),
        ("combine", "B")])
    assert all(c["layers"] == 4 for c in costs.values())
    comm_streams = {s for p in deepseek.pieces if p.is_comm for s in p.streams}
    comp_streams = {s for p in deepseek.pieces if not p.is_comm for s in p.streams}
    assert comm_streams == {27} and comp_streams == {7, 23}
    tl = import_traces([deepseek.path])
    assert tl.trace_source == "pieces" and tl.ranks == 1 and tl.spans[0].kind == "FB"
    assert tl.makespan == pytest.approx(4 * DS_SPAN_PER_LAYER, abs=1e-3)
    recs = tl.pieces
    assert {r["device_stream"] for r in recs if r["stream"] == "collective"} == {27}
    assert {(r["name"], r["device_stream"]) for r in recs if r["kind"] == "W"} == {
        ("attn", 7), ("mlp", 7), ("mlp", 23)}
    # a piece's busy time per stream is at most its span there
    assert all(r["busy"] <= r["end"] - r["start"] + 1e-9 for r in recs)
    notes = " | ".join(tl.import_notes)
    assert "'1F1B', 'ProfilerStep#1'" in notes and "4387 cpu_op events" in notes
    assert "host range durations are not costs" in notes and "rank 0 of 64" in notes


def test_deepseek_pair_predicted_within_10_percent(deepseek):
    """The stage model with the trace's per-piece GPU times (means over the 4 layers)
    predicts the overlapped F&B pair per layer within 10% of the measured span; the
    non-overlapped sum is about twice it; the prediction lies between its bounds."""
    pred = predict_pair(deepseek)
    assert pred.layers == 4
    err = (pred.overlapped - DS_SPAN_PER_LAYER) / DS_SPAN_PER_LAYER
    assert abs(err) < 0.10, err                    # measured: 31.42 ms, -2.6%
    assert pred.sequential == pytest.approx(sum(pred.costs.values()))
    assert pred.sequential > 1.8 * DS_SPAN_PER_LAYER       # 59.7 ms: overlap halves it
    assert max(pred.compute, pred.collective) - 1e-9 <= pred.overlapped <= pred.sequential
    # the pair's compute pieces are exactly the measured compute (nothing lost or added)
    assert pred.op_cost.compute == pytest.approx(4 * pred.compute)


def test_calibrate_from_trace_writes_a_model_table(deepseek, tmp_path):
    """calibrate --from-trace: a [model] table the stage model reads; its all-to-alls
    share one time (their mean), and its F&B pair is still within 10% of the span."""
    out = tmp_path / "model.toml"
    r = runner.invoke(app, ["calibrate", "--from-trace", str(deepseek.path), "--out",
                            str(out)])
    assert r.exit_code == 0, r.output
    assert "error -2.6%" in r.output and "nothing overlapped 59.7 ms" in r.output
    m = StageModel.model_validate(tomllib.loads(out.read_text())["model"])
    assert m.layers == 4 and m.moe and m.overlap == "fb"
    costs = piece_costs(deepseek)
    assert m.attention.B == pytest.approx(costs["attn(B)"]["mean"])
    fb = StageCosts(m).fb(None, None, "BW").cost / 4
    assert abs(fb - DS_SPAN_PER_LAYER) / DS_SPAN_PER_LAYER < 0.10


def kernel(ts, dur, corr, stream, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
            "dur": dur, "args": {"correlation": corr, "stream": stream}}


def launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
            "tid": tid, "ts": ts, "dur": 2, "args": {"correlation": corr}}


def ann(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1,
            "ts": ts, "dur": dur}


def test_hand_made_piece_trace(tmp_path):
    """attn(F) launches kernels [100,150] on stream 7 and [120,200] on stream 8 (busy:
    union = 100 µs), dispatch(F) one on stream 9 [210,260]; a kernel launched outside
    every piece and one without a launch record are left out and noted."""
    evs = [ann("outer", 0, 1000), ann("attn(F)", 10, 40), ann("dispatch(F)", 60, 20),
           launch(12, 1), launch(20, 2, tid=2), launch(65, 3), launch(90, 4),
           kernel(100, 50, 1, 7), kernel(120, 80, 2, 8), kernel(210, 50, 3, 9),
           kernel(300, 10, 4, 7), kernel(400, 10, 99, 7)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    pt = read_piece_trace(p)
    a, d = pt.pieces
    assert a.busy == 100 and set(a.streams) == {7, 8} and a.streams[8].busy == 80
    assert d.is_comm and d.busy == 50 and not a.is_comm
    notes = " | ".join(pt.notes)
    assert "1 kernels launched outside every piece (0.01 ms" in notes
    assert "1 kernels without a launch record" in notes and "'outer'" in notes
    tl = import_traces([p])
    assert tl.spans[0].kind == "F" and tl.makespan == pytest.approx(0.160)
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4


def test_overlapping_pieces_and_cpu_only_refused(tmp_path):
    p = tmp_path / "o.json"
    p.write_text(json.dumps({"traceEvents": [ann("attn(F)", 0, 50), ann("mlp(F)", 40, 20)]}))
    with pytest.raises(ScenarioError, match="overlap on the host"):
        read_piece_trace(p)
    p.write_text(json.dumps({"traceEvents": [ann("attn(F)", 0, 50)]}))
    with pytest.raises(ScenarioError, match="launched no GPU kernel"):
        read_piece_trace(p)


@pytest.mark.parametrize("name", ["trace_diff_test_rank1.json.gz",
                                  "trace_filter_sampled_rank-0.json.gz"])
def test_hta_all_to_all_traces_refused(name, tmp_path):
    """HTA's traces hold NCCL SendRecv kernels launched by nccl:all_to_all (collectives):
    one line saying so, exit 2, no output file."""
    f = ref_path("public-traces", "hta", name)
    out = tmp_path / "x.json"
    r = runner.invoke(app, ["import-trace", str(f), "--json", str(out)])
    assert r.exit_code == 2
    msg = " ".join(r.output.split())
    assert "NCCL SendRecv kernels were launched by nccl:all_to_all" in msg
    assert "not pipeline send/recv" in msg and "Traceback" not in r.output
    assert not out.exists()

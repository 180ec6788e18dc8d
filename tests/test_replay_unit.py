"""Replay pieces that need no process launch: workloads (B/W split), the reference, the
in-process executor on one rank, calibration fit and cost file, metrics, trace import,
config errors, and that the CLI and the torch-free modules import without torch."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from replay_helpers import write_trace as _trace  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from schedsim.analysis.accuracy import compare_metrics  # noqa: E402
from schedsim.cli import app  # noqa: E402
from schedsim.errors import ScenarioError  # noqa: E402
from schedsim.interop.kineto import import_traces  # noqa: E402
from schedsim.program.ir import Compute  # noqa: E402
from schedsim.program.tokens import parse_program_text  # noqa: E402
from schedsim.program.validate import validate_schedule  # noqa: E402
from schedsim.replay.calibrate import Calibration, fit_link  # noqa: E402
from schedsim.replay.config import Fault, ReplayConfig  # noqa: E402
from schedsim.replay.stage_modules import (  # noqa: E402
    WEIGHT_GRADS,
    build_stage,
    loss_fn,
    microbatch_input,
    microbatch_target,
    reference_step,
)
from schedsim.scenario import apply_costs_file, parse_scenario, program_from_rows  # noqa: E402
from schedsim.timeline import Span, Timeline  # noqa: E402


@pytest.mark.parametrize("workload", ["mlp", "transformer"])
def test_b_then_w_equals_bw(workload):
    """B gives the same input gradient as BW and leaves parameter grads untouched; W then
    makes them equal to BW's (bit for bit: the same kernels run)."""
    cfg = ReplayConfig(workload=workload, hidden=16, heads=2, seq=5, dtype="float64")
    m1, m2 = build_stage(cfg, 1), build_stage(cfg, 1)
    x = microbatch_input(cfg, 0)
    g = microbatch_target(cfg, 0)
    x1 = x.clone().requires_grad_(True)
    with WEIGHT_GRADS.capture() as fns:
        torch.autograd.backward(m1(x1), g)
    assert len(fns) == (2 if workload == "mlp" else 4) * cfg.layers_per_stage
    assert all(p.grad is None for p in m1.parameters())
    x2 = x.clone().requires_grad_(True)
    torch.autograd.backward(m2(x2), g)
    assert torch.equal(x1.grad, x2.grad)
    for fn in fns:
        fn()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1.grad, p2.grad)
        assert not p1.grad.requires_grad     # W built no autograd graph


def test_build_is_seeded_per_stage():
    cfg = ReplayConfig(hidden=8, seq=3)
    a, b, c = build_stage(cfg, 2), build_stage(cfg, 2), build_stage(cfg, 3)
    pa, pb, pc = (list(m.parameters()) for m in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert not torch.equal(pa[0], pc[0])
    assert pa[0].dtype == torch.float32
    assert not torch.equal(microbatch_input(cfg, 0), microbatch_input(cfg, 1))


def test_reference_gradient_is_mean_over_microbatches():
    """reference_step's grads are those of mean_mb loss_mb (checked against autograd of
    the explicit mean)."""
    cfg = ReplayConfig(hidden=8, seq=3, dtype="float64")
    loss, losses, grads = reference_step(cfg, 2, 3)
    mods = [build_stage(cfg, s) for s in range(2)]
    total = sum(loss_fn(mods[1](mods[0](microbatch_input(cfg, mb))),
                        microbatch_target(cfg, mb)) for mb in range(3)) / 3
    total.backward()
    total = total.detach()
    assert loss == pytest.approx(total.item(), rel=1e-14)
    assert len(losses) == 3
    for s in range(2):
        for g, p in zip(grads[s], mods[s].parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-13, atol=0)


# one rank, two stages, local hand-offs, B/W split, an FB pair, W out of order
LOCAL_PROGRAM = "0F0 1F0 0F1 1F1 1B0 0B0 (0F2;1BW1) 1F2 1W0 0BW1 1BW2 0B2 0W2 0W0"


@pytest.fixture
def world_of_one():
    from schedsim.replay.launch import free_port

    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=30),
                            init_method=f"tcp://127.0.0.1:{free_port()}")
    yield
    dist.destroy_process_group()


def test_executor_single_rank_matches_reference(world_of_one):
    from schedsim.replay.executor import RankExecutor
    from schedsim.replay.gradcheck import grad_check

    prog = program_from_rows(parse_program_text(LOCAL_PROGRAM), "loop", ranks=1, stages=2)
    validate_schedule(prog.schedule())
    assert not prog.has_comm()
    cfg = ReplayConfig(hidden=16, seq=4, dtype="float64")
    ex = RankExecutor(prog, 0, cfg)
    rec = ex.step()
    assert [i for i, _, _ in rec["spans"]] == list(range(len(prog.ranks[0])))
    assert all(t0 <= t1 for _, t0, t1 in rec["spans"])
    gc = grad_check(cfg, 2, 3, [ex.grads()], [ex.losses])
    assert gc["passed"] and gc["max_rel_error"] < 1e-12, gc
    # a second step after zero_grad gives the same gradients
    g1 = {k: [g.clone() for g in v] for k, v in ex.grads().items()}
    ex.zero_grad()
    ex.step()
    for k, v in ex.grads().items():
        assert all(torch.equal(a, b) for a, b in zip(v, g1[k]))


def test_executor_reports_missing_w(world_of_one):
    from schedsim.replay.executor import RankExecutor, RankFailure

    prog = program_from_rows(parse_program_text("0F0 0B0"), "loop", ranks=1, stages=1)
    ex = RankExecutor(prog, 0, ReplayConfig(hidden=4, seq=2))
    with pytest.raises(RankFailure, match="never run by a W"):
        ex.step()


def test_fit_link_recovers_line():
    lat, bw = 0.05, 2.0e6
    samples = [[b, lat + b / bw] for b in (1e3, 1e4, 1e5, 1e6)]
    got_lat, got_bw = fit_link(samples)
    assert got_lat == pytest.approx(lat, rel=1e-9)
    assert got_bw == pytest.approx(bw, rel=1e-9)
    assert fit_link([]) == (0.0, math.inf)
    assert fit_link([[1e3, 0.2], [1e6, 0.1]]) == (pytest.approx(0.15), math.inf)


def test_cost_file_round_trip(tmp_path):
    stages = {0: dict(F=1.5, B=1.25, W=0.5, BW=1.75, FB=3.0),
              1: dict(F=2.5, B=1.5, W=0.75, BW=2.25, FB=4.5)}
    cal = Calibration(stages=stages, link_samples=[[1e3, 0.051], [1e6, 0.55]],
                      message_bytes=4096, fb_backward_kinds=["BW"])
    path = tmp_path / "costs.toml"
    path.write_text(cal.to_toml("t"))
    sc = parse_scenario({"schedule": {"name": "1f1b", "ranks": 2, "microbatches": 4},
                         "comm": {"semantics": "eager"}})
    sc2 = apply_costs_file(sc, path)
    assert sc2.costs.unit == "ms" and sc2.costs.message_bytes == 4096
    for s, c in stages.items():
        for k, v in c.items():
            assert sc2.costs.stage[s].model_dump()[k] == pytest.approx(v, rel=1e-5)
    assert sc2.costs.F == pytest.approx(2.0)
    lat, bw = fit_link(cal.link_samples)
    assert sc2.link.latency == pytest.approx(lat, rel=1e-5)
    assert sc2.link.bandwidth == pytest.approx(bw, rel=1e-5)
    assert sc2.comm.semantics == "eager"
    # an FB of a program with (F;B) pairs is left to F + B
    cal_b = cal.model_copy(update={"fb_backward_kinds": ["B"]})
    assert cal_b.cost_model().stage[0].FB is None
    assert "# FB = 3" in cal_b.to_toml()
    bad = tmp_path / "bad.toml"
    bad.write_text("[schedule]\nname='x'\n")
    with pytest.raises(ScenarioError, match="only \\[costs\\], \\[link\\] and \\[comm\\]"):
        apply_costs_file(sc, bad)


def _tl(starts: list[tuple[int, int, float, float]]) -> Timeline:
    spans = [Span(r, "F", i, 0, r, a, b, i) for r, i, a, b in starts]
    mk, pr = Timeline.summarize(2, spans)
    return Timeline(schedule="x", ranks=2, stages=2, microbatches=2, semantics="eager",
                    makespan=mk, per_rank=pr, spans=spans)


def test_compare_metrics_values():
    pred = _tl([(0, 0, 0, 1), (0, 1, 1, 2), (1, 0, 1, 2), (1, 1, 2, 3)])
    meas = _tl([(0, 0, 0, 1), (0, 1, 1.5, 2.5), (1, 0, 1, 2), (1, 1, 3, 4)])
    m = compare_metrics(pred, meas)
    assert m["makespan_error_pct"] == pytest.approx(-25.0)
    assert m["mean_start_error_pct"] == pytest.approx(100 * (0.5 + 1.0) / 4 / 4)
    assert m["max_start_error_pct"] == pytest.approx(25.0)
    assert m["worst_op"] == "1F1 on rank 1"
    with pytest.raises(ScenarioError, match="different ops"):
        compare_metrics(pred, _tl([(0, 0, 0, 1)]))


def test_import_torch_pipelining_ranges(tmp_path):
    """PP:<action> ranges: I -> B, B -> BW, comm actions are posts; rank from the file."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _trace(b, 1, [("PP:1RECV_F0", 1000, 5), ("PP:1F0", 1100, 400), ("PP:1I0", 1500, 300),
                  ("PP:1SEND_B0", 1800, 5), ("PP:1W0", 1810, 200), ("aten::mm", 1100, 50)])
    _trace(a, 0, [("PP:0F0", 1000, 100), ("PP:0SEND_F0", 1100, 5), ("PP:0RECV_B0", 1105, 5),
                  ("PP:0B0", 2000, 300), ("PP:UNSHARD", 900, 1)])
    tl = import_traces([b, a])       # order of arguments does not matter: ranks from files
    got = sorted((s.rank, s.kind, s.stage, s.mb, s.start, s.end) for s in tl.spans)
    assert got == [(0, "BW", 0, 0, 1.0, 1.3), (0, "F", 0, 0, 0.0, 0.1),
                   (1, "B", 1, 0, 0.5, 0.8), (1, "F", 1, 0, 0.1, 0.5),
                   (1, "W", 1, 0, 0.81, 1.01)]
    assert tl.placement == "loop" and tl.source == "measured" and tl.unit == "ms"
    msg = {(m.kind, m.src, m.dst): m for m in tl.messages}
    # posted = the end of the post range (Message's definition, the simulator's too)
    assert msg[("F", 0, 1)].send_posted == pytest.approx(0.105)
    assert msg[("F", 0, 1)].recv_posted == pytest.approx(0.005)
    assert msg[("B", 1, 0)].recv_posted == pytest.approx(0.11)


def test_import_single_stage_ranges_and_errors(tmp_path):
    a, b = tmp_path / "r0.json", tmp_path / "r1.json"
    # no distributedInfo: rank = argument position; baseTimeNanoseconds offsets ts
    for p, r in ((a, 0), (b, 1)):
        ev = [("Forward 0", 10 + r, 2), ("Backward 0", 20 + r, 3)]
        p.write_text(json.dumps({"traceEvents": [
            {"ph": "X", "name": n, "ts": t, "dur": d} for n, t, d in ev],
            "baseTimeNanoseconds": 1_000_000 * r}))
    tl = import_traces([a, b])
    f1 = tl.find_span(1, "F", 0)
    assert f1.stage == 1 and f1.start == pytest.approx(1.001)
    assert tl.find_span(0, "BW", 0).end == pytest.approx(0.013)
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1}]}))
    with pytest.raises(ScenarioError, match="no recognised compute ranges"):
        import_traces([empty])
    with pytest.raises(ScenarioError, match="not a Chrome/Kineto trace"):
        (tmp_path / "x.json").write_text("{")
        import_traces([tmp_path / "x.json"])


def test_config_errors():
    with pytest.raises(ScenarioError, match="unknown key 'hiden'"):
        ReplayConfig.from_table({"hiden": 4})
    with pytest.raises(ScenarioError, match="'dtype'"):
        ReplayConfig.from_table({"dtype": "float16"})
    with pytest.raises(ScenarioError, match="multiple of heads"):
        ReplayConfig.from_table({"workload": "transformer", "hidden": 10, "heads": 4})
    assert ReplayConfig.from_table({"hidden": 4}, backend="nccl").backend == "nccl"
    assert Fault.parse("2:7:hang") == Fault(rank=2, index=7, kind="hang")
    with pytest.raises(ScenarioError, match="RANK"):
        Fault.parse("x")


runner = CliRunner()


def test_cli_input_errors(tmp_path):
    r = runner.invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "4", "--nproc", "3"])
    assert r.exit_code == 2 and "--nproc 3 does not match the program's 2 ranks" in r.output
    r = runner.invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "4", "--set", "hiden=3"])
    assert r.exit_code == 2 and "unknown key 'hiden'" in r.output
    r = runner.invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "4", "--gantt", str(tmp_path / "x.gif")])
    assert r.exit_code == 2 and "unsupported figure format" in r.output
    assert not (tmp_path / "x.gif").exists()
    r = runner.invoke(app, ["import-trace", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "no such trace file" in r.output
    (tmp_path / "f").write_text("")
    r = runner.invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "4", "--compare", "--out-dir",
                            str(tmp_path / "f")])
    assert r.exit_code == 2 and "is a file; give a folder" in r.output


def test_cli_without_torch(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    r = runner.invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                            "--microbatches", "4"])
    assert r.exit_code == 2
    # a source checkout: the editable install of the extra (the folder when not the cwd)
    assert "needs torch, which is not installed: pip install -e '" in r.output
    assert "[replay]' (or pip install torch)" in r.output


def test_torch_free_imports():
    """The CLI and the parent-side replay modules import with torch unavailable."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import schedsim, schedsim.cli, schedsim.cli.replay, schedsim.replay, "
            "schedsim.replay.launch, schedsim.replay.calibrate, schedsim.analysis.accuracy, "
            "schedsim.interop.kineto, schedsim.replay.fit, schedsim.replay.check, "
            "schedsim.cli.check, schedsim.cli.inputs\n"
            "assert sys.modules['torch'] is None\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_measured_timeline_assembly():
    """Records of two ranks -> spans with chunks, FB parts, messages with both sides."""
    from schedsim import build_program
    from schedsim.replay.timing import measured_timeline

    prog = build_program("1f1b", 2, 1)
    recs = []
    for r, row in enumerate(prog.ranks):
        t = 1_000_000 * (r + 1)
        rec = {"spans": [], "posts": [], "waits": [], "comm_post": {}, "comm_done": {},
               "comm_bytes": {}, "begin": t}
        for i, ins in enumerate(row):
            if isinstance(ins, Compute):
                rec["spans"].append((i, t + 100_000 * i, t + 100_000 * i + 50_000))
            elif hasattr(ins, "comm"):
                rec["comm_post"][str(ins.comm)] = (i, t + 100_000 * i)
                rec["comm_done"][str(ins.comm)] = t + 100_000 * i + 70_000
                rec["comm_bytes"][str(ins.comm)] = 64
        recs.append(rec)
    tl = measured_timeline(prog, recs, backend="gloo", world_size=2)
    assert tl.source == "measured" and tl.unit == "ms" and tl.semantics == "gloo"
    assert tl.world_size == 2 and len(tl.spans) == 4
    f0 = tl.find_span(0, "F", 0)
    assert f0.start == pytest.approx(0.1 * f0.index)
    assert f0.end == pytest.approx(0.1 * f0.index + 0.05)
    assert {(m.kind, m.src, m.dst) for m in tl.messages} == {("F", 0, 1), ("B", 1, 0)}
    m = next(m for m in tl.messages if m.kind == "F")
    assert m.bytes == 64 and m.send_index >= 0 and m.recv_index >= 0
    assert m.recv_posted == pytest.approx(1.0 + 0.1 * m.recv_index)  # rank 1 began 1 ms later


def test_error_messages_print_brackets_literally(tmp_path):
    """fail() escapes rich markup: gloo errors and tokens such as WAIT[0RECV_B0] or
    '[/path/x.cc:78]' print as written (an unescaped '[/...]' made rich raise)."""
    name = str(tmp_path / "a[") + "/red].json"
    r = runner.invoke(app, ["import-trace", name])
    assert r.exit_code == 2
    assert "a[/red].json: no such trace file" in r.output.replace("\n", "")


def test_interleaved_step_order():
    """replay --compare's contended calibration takes turns with the measured steps
    (both see the machine's drifting load); the surplus first, a measured step last."""
    from schedsim.replay.worker import step_order

    assert step_order(5, 5) == "cmcmcmcmcm"
    assert step_order(3, 1) == "cccm" and step_order(1, 3) == "mmcm"
    assert all(step_order(c, m).count("c") == c and step_order(c, m).count("m") == m
               and step_order(c, m)[-1] == "m" for c in range(1, 7) for m in range(1, 7))

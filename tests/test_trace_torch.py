"""Real torch.distributed.pipelining runs recorded with torch.profiler (2 gloo processes,
torch 2.13): each imports with every cross-rank message paired, ``--program-out`` gives
torch's runtime order (schedsim's ``torch`` lowering, token for token), ``check-trace``'s
semantics error is within 5% of the makespan, the sends show rendezvous behaviour, and
``stalls``/``critical-path`` name the message waits; DualPipeV's OVERLAP_F_B ranges split
into their parts. Schedule1F1B records no range: its traces are refused with a message
that says so."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from torch_traces import record  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from schedsim import build_program  # noqa: E402
from schedsim.cli import app  # noqa: E402
from schedsim.errors import ScenarioError  # noqa: E402
from schedsim.interop.kineto import import_traces  # noqa: E402
from schedsim.program.ir import Program  # noqa: E402
from schedsim.program.tokens import parse_program_text  # noqa: E402
from schedsim.replay.check import send_waits_before_recv  # noqa: E402

runner = CliRunner()

#: torch schedule class -> (microbatches, stages per rank, schedsim generator, its kw,
#: cross-rank messages: 2 x microbatches x stage boundaries)
RUNS = {
    "ScheduleInterleaved1F1B": (8, 2, "interleaved-1f1b", {"chunks": 2}, 48),
    "ScheduleInterleavedZeroBubble": (8, 2, "interleaved-zb", {"chunks": 2}, 48),
    "ScheduleGPipe": (4, 1, "gpipe", {}, 8),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """One profiled step of each schedule (and of Schedule1F1B), recorded once (after the
    recorder's warm-up steps: ``ProfilerStep#1``)."""
    root = tmp_path_factory.mktemp("torch-traces")
    return record(root, [(name, m, v) for name, (m, v, *_) in RUNS.items()]
                  + [("Schedule1F1B", 2, 1), ("ScheduleDualPipeV", 4, 2),
                     ("ScheduleZBVZeroBubble", 4, 2)])


@pytest.mark.parametrize("name", list(RUNS))
def test_real_traces_import_paired(traces, name):
    m, v, _, _, messages = RUNS[name]
    tl = import_traces(traces[name], name=name)
    assert (tl.ranks, tl.stages, tl.microbatches, tl.placement) == (2, 2 * v, m, "loop")
    assert tl.p2p == {"messages": messages, "paired": messages, "one_sided": 0,
                      "calls": 2 * messages}
    for msg in tl.messages:      # both sides: posted, completed, split into wait/transfer
        assert None not in (msg.send_posted, msg.recv_posted, msg.send_done, msg.recv_done)
        assert msg.start == max(msg.send_posted, msg.recv_posted) <= msg.arrival
    assert len(tl.spans) == 2 * v * m * (3 if "ZeroBubble" in name else 2)
    assert tl.semantics == "gloo"
    for f in traces[name]:      # the profiler's warm-up step (#0) was traced and dropped
        steps = [e["name"] for e in json.loads(f.read_text())["traceEvents"]
                 if str(e.get("name", "")).startswith("ProfilerStep#")]
        assert steps == ["ProfilerStep#1"]
    assert import_traces(traces[name], step=1).makespan == pytest.approx(tl.makespan)


#: V-placed runs: (microbatches, schedsim generator, its kw)
V_RUNS = {"ScheduleZBVZeroBubble": (4, "zbv", {"variant": "torch"})}


@pytest.mark.parametrize("name", list(RUNS) + list(V_RUNS))
def test_program_out_is_torch_runtime_order(traces, name, tmp_path):
    m, gen, kw = V_RUNS[name] if name in V_RUNS else (RUNS[name][0], *RUNS[name][2:4])
    out = tmp_path / "prog.txt"
    r = runner.invoke(app, ["import-trace", *map(str, traces[name]), "--program-out",
                            str(out)])
    assert r.exit_code == 0, r.output
    rows = parse_program_text(out.read_text())
    assert rows == build_program(gen, 2, m, "torch", **kw).ranks


@pytest.mark.parametrize("name", list(RUNS))
def test_check_trace_semantics_error(traces, name, tmp_path):
    """The engine, given the run's own durations, predicts every op start within 5% of
    the makespan on average and the makespan within 5%."""
    r = runner.invoke(app, ["check-trace", *map(str, traces[name]), "--json",
                            str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    e = json.loads((tmp_path / "e.json").read_text())
    sem = e["semantics_error"]
    assert sem["mean_start"] <= 0.05 and abs(sem["makespan"]) <= 0.05, e
    assert set(e["cost_model_error"]) == {"makespan", "mean_start", "max_start"}
    assert "cost-model error:" in r.output


def test_gloo_sends_behave_like_rendezvous(tmp_path_factory):
    """GPipe waits its forward sends after the last forward; rank 1's stage sleeps 0.1 s
    per forward, so it posts its later recvs well after rank 0 began waiting those sends
    (a fixed order, not the luck of a loaded machine): each such send completes only
    after its recv was posted (rendezvous, not eager)."""
    files = record(tmp_path_factory.mktemp("slow-gpipe"), [("ScheduleGPipe", 4, 1)],
                   hidden=32, slow=0.1)
    late, total = send_waits_before_recv(import_traces(files["ScheduleGPipe"]))
    assert total >= 2 and late == total


def test_stalls_and_critical_path_name_message_waits(traces, tmp_path):
    tj = tmp_path / "t.json"
    import_traces(traces["ScheduleInterleaved1F1B"]).write_json(tj)
    r = runner.invoke(app, ["stalls", str(tj), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    st = json.loads((tmp_path / "s.json").read_text())
    waits = [s for s in st if s["cause"] in ("wait-recv", "warmup") and s["comms"]]
    assert waits and all("RECV" in s["comms"][0] for s in waits)
    assert any("waits for the activation" in s["detail"] for s in waits)
    r = runner.invoke(app, ["critical-path", str(tj), "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    path = json.loads((tmp_path / "c.json").read_text())["path"]
    assert any(s["kind"] == "message" for s in path)
    prog = Program.model_validate(json.loads(tj.read_text())["program"])
    assert prog.placement.stages == 4


def test_schedule1f1b_records_no_ranges(traces):
    with pytest.raises(ScenarioError, match="but no compute ranges: torch 2.13's "
                       "Schedule1F1B records no compute ranges"):
        import_traces(traces["Schedule1F1B"])


def test_dualpipev_overlap_ranges(traces):
    """ScheduleDualPipeV (V placement, OVERLAP_F_B actions run as their two parts): the
    program is schedsim's dualpipev lowered with torch's policy, every message paired, and
    the engine explains the run."""
    from schedsim.replay.check import two_errors

    tl = import_traces(traces["ScheduleDualPipeV"])
    assert tl.placement == "v" and tl.p2p["paired"] == tl.p2p["messages"] == 16
    prog = Program.model_validate(tl.program)
    assert prog.ranks == build_program("dualpipev", 2, 4, "torch").ranks
    sem = two_errors(tl, prog).to_dict()["semantics_error"]
    assert sem["mean_start"] <= 0.05 and abs(sem["makespan"]) <= 0.05

"""Kineto trace import on hand-made traces with hand-computed answers: torch runtime
(``PP:``) and single-stage (``Forward N``) ranges with their c10d/gloo P2P events, the
program they show, the split of a recv span into waiting and transferring, schedsim's
own ranges, NCCL kernels, profiler steps, and the one-line errors for traces that
cannot be read. (Real torch runs: test_trace_torch.py.)"""
from __future__ import annotations

import json

import pytest

from schedsim import build_program
from schedsim.errors import ScenarioError
from schedsim.interop.kineto import import_traces
from schedsim.program.ir import Placement, Program
from schedsim.timeline import Timeline


def ev(name, ts, dur, **args):
    e = {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if args:
        e["args"] = args
    return e


def write(path, rank, events, world=2, **top):
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {
        "rank": rank, "world_size": world, "backend": "gloo"}, **top}))
    return path


def send(t0, t1, done, **a):
    """A c10d::send call and its gloo work range (starts inside, ends at ``done``)."""
    return [ev("c10d::send", t0, t1 - t0, **a), ev("gloo:send", t1 - 1, done - t1 + 1)]


def recv(t0, t1, done, **a):
    return [ev("c10d::recv_", t0, t1 - t0, **a), ev("gloo:recv", t1 - 1, done - t1 + 1)]


def runtime_traces(tmp_path):
    """1 microbatch, 2 stages, as torch's _PipelineScheduleRuntime records it (µs)."""
    r0 = [ev("PP:0UNSHARD", -50, 5), ev("PP:0F0", 0, 100),
          ev("PP:0SEND_F0", 100, 20), *send(105, 115, 400),
          ev("PP:0RECV_B0", 120, 10), *recv(122, 128, 350),
          ev("PP:0B0", 300, 200), ev("aten::mm", 360, 50)]
    r1 = [ev("PP:1RECV_F0", 0, 10), *recv(2, 8, 150),
          ev("PP:1F0", 50, 200), ev("PP:1B0", 250, 30),
          ev("PP:1SEND_B0", 280, 10), *send(282, 288, 352)]
    return write(tmp_path / "r0.json", 0, r0), write(tmp_path / "r1.json", 1, r1)


def test_runtime_program_waits_and_times(tmp_path):
    """PP ranges: a SEND/RECV action is a bare post, a compute waits the recv it
    consumes inside its range (the wait ends when gloo:recv ends, the span starts
    there), the sends are waited at the end, the last posted first; a side is posted at
    its c10d call's start."""
    tl = import_traces(list(runtime_traces(tmp_path)))
    prog = Program.model_validate(tl.program)
    assert prog.to_text() == ("rank 0: 0F0 0SEND_F0 0RECV_B0 WAIT[0RECV_B0] 0BW0 "
                              "WAIT[0SEND_F0]\n"
                              "rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1BW0 1SEND_B0 "
                              "WAIT[1SEND_B0]\n")
    assert (tl.trace_source, tl.semantics, tl.placement, tl.unit) == (
        "torch-runtime", "gloo", "loop", "ms")
    spans = {(s.rank, s.kind): (s.start, s.end, s.index) for s in tl.spans}
    assert spans == {(0, "F"): (0.0, 0.1, 0), (0, "BW"): (0.35, 0.5, 4),
                     (1, "F"): (0.15, 0.25, 2), (1, "BW"): (0.25, 0.28, 3)}
    waits = sorted((w.rank, w.index, w.kind, w.start, w.end, tuple(w.comms))
                   for w in tl.waits)
    assert waits == [(0, 3, "WAIT", 0.3, 0.35, ("0RECV_B0",)),
                     (0, 5, "WAIT", 0.5, 0.5, ("0SEND_F0",)),
                     (1, 1, "WAIT", 0.05, 0.15, ("1RECV_F0",)),
                     (1, 5, "WAIT", 0.29, 0.352, ("1SEND_B0",))]
    m = {m.kind: m for m in tl.messages}
    f, b = m["F"], m["B"]
    assert (f.src, f.dst, f.send_posted, f.recv_posted, f.send_done, f.recv_done) == (
        0, 1, 0.105, 0.002, 0.4, 0.15)
    # waiting for the peer (recv posted 0.002 -> send posted 0.105), then transferring
    assert (f.start, f.arrival) == (0.105, 0.15)
    assert (b.send_posted, b.recv_posted, b.start, b.arrival, b.send_done) == (
        0.282, 0.122, 0.282, 0.35, 0.352)
    assert (f.send_index, f.recv_index, b.send_index, b.recv_index) == (1, 0, 4, 2)
    assert tl.p2p == {"messages": 2, "paired": 2, "one_sided": 0, "calls": 4}
    assert tl.import_notes == []
    assert sorted((p["rank"], p["index"], p["start"], p["end"]) for p in tl.posts) == [
        (0, 1, 0.1, 0.12), (0, 2, 0.12, 0.13), (1, 0, 0.0, 0.01), (1, 4, 0.28, 0.29)]


def gpipe_traces(tmp_path, m=2):
    """ScheduleGPipe on 2 ranks: each range holds its recv, wait, compute and send."""
    r0, r1 = [], []
    t = 0
    for i in range(m):               # rank 0: forwards, then the forward-send waits
        r0 += [ev(f"Forward {i}", t, 100), *send(t + 80, t + 90, 250 + 10 * i)]
        t += 110
    t = 300
    for i in range(m):
        r0 += [ev(f"Backward {i}", t, 100), *recv(t + 5, t + 10, t + 40)]
        t += 110
    t = 0
    for i in range(m):
        r1 += [ev(f"Forward {i}", t + 50, 100), *recv(t + 55, t + 60, t + 95)]
        t += 110
    t = 270
    for i in range(m):
        r1 += [ev(f"Backward {i}", t, 30), *send(t + 20, t + 25, 320 + 110 * i)]
        t += 30
    return write(tmp_path / "g0.json", 0, r0), write(tmp_path / "g1.json", 1, r1)


def test_single_stage_program_is_torch_gpipe(tmp_path):
    """'Forward N'/'Backward N' ranges: the program equals schedsim's lowering of GPipe
    with torch's policy (ScheduleGPipe's own waits), token for token; a span is the
    compute between the range's recv wait and its send call."""
    tl = import_traces(list(gpipe_traces(tmp_path)))
    prog = Program.model_validate(tl.program)
    assert prog.ranks == build_program("gpipe", 2, 2, "torch").ranks
    assert tl.trace_source == "torch-single"
    spans = {(s.rank, s.kind, s.mb): (s.start, s.end) for s in tl.spans}
    assert spans[(0, "F", 1)] == (0.11, 0.19)          # to the send call at 190 µs
    assert spans[(1, "F", 0)] == (0.095, 0.15)         # from the recv's end at 95 µs
    assert spans[(0, "BW", 0)] == (0.34, 0.4)
    w = [(x.index, x.start, x.end) for x in tl.waits if x.rank == 0][:2]
    assert w == [(4, 0.21, 0.25), (5, 0.25, 0.26)]     # after the last forward, in order
    assert tl.p2p["paired"] == 4


def test_schedsim_ranges_and_the_older_post_form(tmp_path):
    """schedsim:<token> ranges are the program; the calls inside a BATCH bind to its ops
    in order; the replay's older POST[a+b] reads as one launch (a BATCH)."""
    r0 = [ev("schedsim:0F0", 0, 10), ev("schedsim:BATCH[0SEND_F0+0RECV_B0]", 10, 10),
          *send(11, 13, 40), *recv(14, 16, 35), ev("schedsim:WAIT[0RECV_B0]", 20, 15),
          ev("schedsim:0BW0", 35, 10), ev("schedsim:END", 45, 1)]
    r1 = [ev("schedsim:POST[1RECV_F0]", 0, 2), *recv(0, 1, 12),
          ev("schedsim:COMMIT", 2, 10), ev("schedsim:1F0", 12, 5), ev("schedsim:1BW0", 17, 5),
          ev("schedsim:1SEND_B0", 22, 2), *send(22.5, 23, 34),
          ev("schedsim:END", 24, 11)]
    a, b = write(tmp_path / "a.json", 0, r0), write(tmp_path / "b.json", 1, r1)
    tl = import_traces([a, b])
    prog = Program.model_validate(tl.program)
    assert prog.to_text() == (
        "rank 0: 0F0 BATCH[0SEND_F0+0RECV_B0] WAIT[0RECV_B0] 0BW0\n"
        "rank 1: 1RECV_F0 COMMIT 1F0 1BW0 1SEND_B0\n")
    m = {x.kind: x for x in tl.messages}
    assert (m["F"].send_posted, m["F"].send_done) == (0.011, 0.04)
    assert (m["B"].recv_posted, m["B"].recv_done, m["B"].send_posted) == (0.014, 0.035, 0.0225)
    assert [(w.rank, w.kind) for w in tl.waits] == [(0, "WAIT"), (0, "END"), (1, "COMMIT"),
                                                    (1, "END")]


def test_bytes_and_peer_from_recorded_shapes(tmp_path):
    """record_shapes=True: the call's Input Dims and the work's Input type give bytes."""
    dims = {"Input Dims": [[[4, 64]], [], [], []], "Concrete Inputs": ["", "", "1", "0"]}
    r0 = [ev("PP:0F0", 0, 10), ev("PP:0SEND_F0", 10, 5), ev("c10d::send", 11, 2, **dims),
          ev("gloo:send", 12, 30, **{"Input type": ["float"]})]
    tl = import_traces([write(tmp_path / "a.json", 0, r0)])
    assert [x.bytes for x in tl.messages] == [4 * 64 * 4]


def test_nccl_kernel_completes_the_call(tmp_path):
    """NCCL (untested on hardware): the ncclDevKernel_SendRecv launched from inside a
    call (matched by correlation) ends the op: completion = the kernel's end."""
    r1 = [ev("PP:1RECV_F0", 0, 10), ev("c10d::recv_", 2, 6),
          {**ev("cudaLaunchKernel", 4, 1, correlation=7), "cat": "cuda_runtime"},
          ev("nccl:recv", 7, 5), ev("ncclDevKernel_SendRecv(ncclDevComm*)", 30, 20,
                                    correlation=7),
          ev("PP:1F0", 60, 10)]
    tl = import_traces([write(tmp_path / "b.json", 1, r1)])
    w = next(x for x in tl.waits if x.kind == "WAIT")
    assert (w.start, w.end) == (0.06, 0.06)          # the kernel ended before the wait
    assert tl.messages[0].recv_done == 0.05


def test_profiler_steps(tmp_path):
    """Several profiled steps in one file: --step N keeps the events inside
    ProfilerStep#N; without it, the median step (of 2, the lower: step 3, 0.01 ms against
    0.02), noted. The same ops twice without profiler steps: an error."""
    r0 = [ev("ProfilerStep#3", 0, 50), ev("PP:0F0", 0, 10), ev("ProfilerStep#4", 100, 50),
          ev("PP:0F0", 105, 20)]
    p = write(tmp_path / "a.json", 0, r0, world=1)
    tl = import_traces([p])
    assert [(s.start, s.end) for s in tl.spans] == [(0.0, 0.01)]
    assert (tl.step, tl.step_makespans) == (3, [0.01, 0.02])
    assert tl.import_notes[-1].startswith("2 profiler steps (makespans 0.01 .. 0.02 ms): "
                                          "imported step 3, the median makespan")
    q = write(tmp_path / "b.json", 0, [r0[1], r0[3]], world=1)
    with pytest.raises(ScenarioError, match="0F0 appears twice .*: profile one step per "
                                            "file$"):
        import_traces([q])
    tl = import_traces([p], step=4)
    assert [(s.start, s.end) for s in tl.spans] == [(0.0, 0.02)]
    with pytest.raises(ScenarioError, match="no profiler step 5 \\(ProfilerStep# ranges: 3, 4\\)"):
        import_traces([p], step=5)


@pytest.mark.parametrize("events,match", [
    ([ev("c10d::send", 0, 5), ev("gloo:send", 4, 9)],
     "1 P2P calls .* but no compute ranges: torch 2.13's Schedule1F1B records no compute "
     "ranges"),
    ([ev("aten::mm", 0, 5), ev("aten::add", 6, 1)],
     "no recognised compute ranges .* not a trace of a pipeline-parallel step \\(it holds 2 "
     "other events, e.g. 'aten::add', 'aten::mm'\\)"),
    ([ev("PP:0F0", 0, 5), ev("schedsim:0F1", 6, 1)],
     "ranges of two executors on one rank \\(schedsim, torch-runtime\\)"),
])
def test_unreadable_traces_say_what_they_hold(tmp_path, events, match):
    with pytest.raises(ScenarioError, match=match):
        import_traces([write(tmp_path / "a.json", 0, events, world=1)])


def test_sends_and_recvs_must_pair_in_order(tmp_path):
    """The k-th send and k-th recv of a link name the same message, as gloo matches them."""
    r0 = [ev("PP:0F0", 0, 5), ev("PP:0F1", 5, 5), ev("PP:0SEND_F0", 10, 1),
          ev("PP:0SEND_F1", 11, 1)]
    r1 = [ev("PP:1RECV_F1", 0, 1), ev("PP:1RECV_F0", 1, 1), ev("PP:1F0", 20, 1),
          ev("PP:1F1", 21, 1)]
    with pytest.raises(ScenarioError, match="do not pair on link 0->1: the 1st send is "
                       "0SEND_F0 \\(rank 0, instr 2\\) but the 1st recv is 1RECV_F1"):
        import_traces([write(tmp_path / "a.json", 0, r0), write(tmp_path / "b.json", 1, r1)])


def test_partial_trace_notes(tmp_path):
    """One rank's trace: no program, the missing rank and the one-sided messages named."""
    a, _ = runtime_traces(tmp_path)
    tl = import_traces([a])
    assert getattr(tl, "program", None) is None and tl.missing_ranks == [1]
    assert tl.p2p["one_sided"] == 2
    assert any("2 of 2 messages have one side only" in n for n in tl.import_notes)
    assert tl.messages[0].start is None           # the other side was not seen


def test_timeline_json_round_trip(tmp_path):
    """The imported timeline (with its extra fields) survives JSON."""
    tl = import_traces(list(runtime_traces(tmp_path)))
    p = tmp_path / "t.json"
    tl.write_json(p)
    back = Timeline.read_json(p)
    assert back.program == tl.program and back.p2p == tl.p2p
    assert [m.arrival for m in back.messages] == [m.arrival for m in tl.messages]


def test_committed_real_traces(tmp_path):
    """The real torch 2.13 traces in docs/examples (no torch needed to read them): every
    message paired, the program is torch's runtime order, the engine explains the run."""
    from pathlib import Path

    from schedsim.replay.check import two_errors

    root = Path(__file__).resolve().parents[1] / "docs" / "examples" / "traces"
    for name, gen, kw, m, msgs in (("interleaved-1f1b", "interleaved-1f1b", {"chunks": 2},
                                    8, 48), ("gpipe", "gpipe", {}, 4, 8)):
        tl = import_traces(sorted((root / name).glob("rank*.json.gz")), name=name)
        assert tl.p2p["paired"] == tl.p2p["messages"] == msgs
        prog = Program.model_validate(tl.program)
        assert prog.ranks == build_program(gen, 2, m, "torch", **kw).ranks
        sem = two_errors(tl, prog).to_dict()["semantics_error"]
        assert sem["mean_start"] <= 0.05 and abs(sem["makespan"]) <= 0.05


def test_overlap_range_splits_and_final_waits_reverse():
    """torch runtime without a registered overlap function: an OVERLAP_F_B range runs
    its forward, then its backward after the backward's recv wait (the range is cut where
    that recv completed; the forward ends with its last operator); at the end the sends
    are waited last posted first."""
    from schedsim.interop.kineto_events import classify_rank
    from schedsim.interop.kineto_program import build_rank
    from schedsim.program.tokens import format_instr

    events = [ev("PP:0F0", 0, 10), ev("PP:0SEND_F0", 10, 10), *send(11, 12, 900),
              ev("PP:0F1", 20, 10), ev("PP:0SEND_F1", 30, 10), *send(31, 32, 800),
              ev("PP:0RECV_B0", 40, 10), *recv(41, 42, 360),
              ev("PP:(0F2;0B0)OVERLAP_F_B", 300, 200),
              {**ev("aten::linear", 305, 35), "cat": "cpu_op"},
              {**ev("autograd::engine::evaluate_function: AddmmBackward0", 365, 50),
               "cat": "cpu_op"}]
    for e in events:
        e.setdefault("args", {})
    run = build_rank(classify_rank(events, 0, "t", 0.0), 0,
                     Placement(kind="loop", ranks=2, stages=2))
    toks = " ".join(format_instr(i) for i in run.instrs)     # torch's B is schedsim's BW
    assert toks == ("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0F2 WAIT[0RECV_B0] 0BW0 "
                    "WAIT[0SEND_F1] WAIT[0SEND_F0]")
    assert [(str(op), a, b) for op, a, b, _ in run.spans][2:] == [("0F2", 300, 340),
                                                                  ("0BW0", 360, 500)]
    assert [(k, a, b) for _, k, a, b, _ in run.waits] == [
        ("WAIT", 340, 360), ("WAIT", 500, 800), ("WAIT", 800, 900)]

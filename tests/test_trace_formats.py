"""Other measurement formats into the same Timeline: Megatron-LM per-op pipeline timer
dumps (as github.com/Victarry/PP-Schedule-Visualization's examples/megatron-lm/plot.py
reads them; that repository ships no dump, so these are made from its documented file
names and keys) and nsys SQLite exports (the tables zero-bubble's
tools/load_nsys_events.py queries, made here with sqlite3), with hand-computed answers
and the one-line errors."""
from __future__ import annotations

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.interop.kineto import import_traces
from schedsim.program.ir import Program

runner = CliRunner()


def dump(folder, pp, vpp, other, p, times):
    f = folder / f"event_times_PP{pp}_VPP{vpp}_TPxCPxDP_rank_{other}_pp_rank_{p}_rank_{p}.json"
    f.write_text(json.dumps(times))
    return f


def ops(**spans):
    """``forward-0=(a, b)`` -> the dump's start/end keys."""
    out = {}
    for k, (a, b) in spans.items():
        out[f"{k.replace('_', '-')}-start"], out[f"{k.replace('_', '-')}-end"] = a, b
    return out


def test_megatron_dumps_1f1b(tmp_path):
    """PP 2, VPP 1, 2 microbatches (ms): rank 0 F0 [100,110] F1 [112,122] BW0 [140,160]
    BW1 [165,185]; rank 1 F0 [111,121] BW0 [121,141] F1 [141,151] BW1 [151,171]. A TP
    rank 1 dump is left out (as plot.py does)."""
    dump(tmp_path, 2, 1, 0, 0, ops(forward_0=(100, 110), forward_1=(112, 122),
                                   backward_0=(140, 160), backward_1=(165, 185)))
    dump(tmp_path, 2, 1, 0, 1, ops(forward_0=(111, 121), backward_0=(121, 141),
                                   forward_1=(141, 151), backward_1=(151, 171)))
    dump(tmp_path, 2, 1, 1, 0, ops(forward_0=(0, 1)))
    tl = import_traces([tmp_path])
    assert tl.trace_source == "megatron-timers" and tl.makespan == 85.0
    assert [(s.rank, s.kind, s.stage, s.mb, s.start, s.end) for s in tl.spans] == [
        (0, "F", 0, 0, 0, 10), (0, "F", 0, 1, 12, 22), (0, "BW", 0, 0, 40, 60),
        (0, "BW", 0, 1, 65, 85), (1, "F", 1, 0, 11, 21), (1, "BW", 1, 0, 21, 41),
        (1, "F", 1, 1, 41, 51), (1, "BW", 1, 1, 51, 71)]
    assert Program.model_validate(tl.program).to_text().splitlines()[1] == \
        "rank 1: 1F0 1BW0 1F1 1BW1"
    notes = " | ".join(tl.import_notes)
    assert "no P2P" in notes and "1 dumps of TPxCPxDP ranks other than 0" in notes


def test_megatron_dumps_interleaved(tmp_path):
    """VPP 2: forward-CHUNK-MB keys; chunk c of pipeline rank p is stage 2c + p."""
    for p in (0, 1):
        dump(tmp_path, 2, 2, 0, p, ops(**{f"forward_{c}_0": (10 * c + p, 10 * c + p + 1)
                                          for c in (0, 1)},
                                       **{f"backward_{c}_0": (50 - 10 * c + p, 52 - 10 * c + p)
                                          for c in (0, 1)}))
    tl = import_traces([tmp_path])
    assert (tl.stages, tl.placement) == (4, "loop")
    assert sorted((s.stage, s.kind, s.rank) for s in tl.spans if s.kind == "F") == [
        (0, "F", 0), (1, "F", 1), (2, "F", 0), (3, "F", 1)]


@pytest.mark.parametrize("times, match", [
    ({"forward-0-start": 1}, "has \\['start'\\]"),
    ({"forward-0-begin": 1}, "is not of the form forward-MB-start"),
    ({"forward-0-start": 5, "forward-0-end": 1}, "an end after it"),
    ({"forward-0-start": "x", "forward-0-end": 1}, "expected a number"),
])
def test_megatron_bad_dumps(tmp_path, times, match):
    dump(tmp_path, 1, 1, 0, 0, times)
    with pytest.raises(ScenarioError, match=match):
        import_traces([tmp_path])


def test_check_trace_reads_megatron_dumps_without_step(tmp_path):
    """check-trace without --step (which checks every profiler step of Kineto traces)
    reads other formats as import-trace does: the dumps of the 1F1B case, one step."""
    dump(tmp_path, 2, 1, 0, 0, ops(forward_0=(100, 110), forward_1=(112, 122),
                                   backward_0=(140, 160), backward_1=(165, 185)))
    dump(tmp_path, 2, 1, 0, 1, ops(forward_0=(111, 121), backward_0=(121, 141),
                                   forward_1=(141, 151), backward_1=(151, 171)))
    out = " ".join(runner.invoke(app, ["check-trace", str(tmp_path)]).output.split())
    assert "imported: 2 ranks, 2 stages, 2 microbatches, 8 ops" in out
    assert "measured makespan 85 ms" in out and "profiler steps" not in out


def test_megatron_missing_rank_exit_2(tmp_path):
    dump(tmp_path, 2, 1, 0, 0, ops(forward_0=(0, 1)))
    r = runner.invoke(app, ["import-trace", str(tmp_path)])
    assert r.exit_code == 2 and "no dump of pipeline rank(s) [1]" in " ".join(r.output.split())


PID0, PID1 = 100, 101


def gtid(pid, tid):
    return (pid << 24) | tid


def nsys_db(path, ops_by_pid, extra_ranges=()):
    """An nsys-like export: per process ``[(text, start, end, [(kernel start, end)])]``
    on device = pid - 100, thread 1; each kernel launched 1 ns after its range starts."""
    con = sqlite3.connect(path)
    c = con.cursor()
    c.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER, name TEXT)")
    c.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?)",
                  [(59, "NvtxPushPopRange"), (60, "NvtxStartEndRange")])
    c.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    c.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, globalTid INTEGER, "
              "text TEXT, eventType INTEGER)")
    c.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (correlationId INTEGER, start "
              "INTEGER, end INTEGER, globalTid INTEGER, nameId INTEGER)")
    c.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (correlationId INTEGER, start "
              "INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER, shortName INTEGER, "
              "globalPid INTEGER)")
    corr = 0
    for pid, ops_ in ops_by_pid.items():
        for text, a, b, kernels in ops_:
            c.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, 59)",
                      (a, b, gtid(pid, 1), text))
            for ks, ke in kernels:
                corr += 1
                c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 0)",
                          (corr, a + 1, a + 2, gtid(pid, 1)))
                c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, 7, 0, ?)",
                          (corr, ks, ke, pid - 100, pid << 24))
    for text, a, b in extra_ranges:
        c.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, 59)", (a, b, gtid(PID0, 1), text))
    con.commit()
    con.close()
    return path


def test_nsys_export_zero_bubble_ranges(tmp_path):
    """2 GPUs of one server, zero-bubble names F{mb}.{chunk}.{seq}: rank 0 F0 kernels
    [1e6, 2e6] and [2e6, 3e6] ns -> [0, 2] ms; B0 [5e6, 6e6]; W0 [6e6, 7e6]; rank 1
    F0 [3e6, 4e6], B0 [4e6, 5e6], W0 [5e6, 5.5e6]. A SEND range and an Optimizer range
    are noted, not read."""
    db = nsys_db(tmp_path / "run.sqlite", {
        PID0: [("F0.0.0", 0, 10, [(1e6, 2e6), (2e6, 3e6)]), ("B0.0.1", 20, 30, [(5e6, 6e6)]),
               ("W0.0.2", 40, 50, [(6e6, 7e6)])],
        PID1: [("F0.0.0", 0, 10, [(3e6, 4e6)]), ("B0.0.1", 20, 30, [(4e6, 5e6)]),
               ("W0.0.2", 40, 50, [(5e6, 5.5e6)])]},
        extra_ranges=[("SEND_FORWARD.0.0.0", 11, 12), ("Optimizer", 60, 70)])
    tl = import_traces([db])
    assert tl.trace_source == "nsys" and tl.makespan == 6.0
    assert [(s.rank, s.kind, s.stage, s.start, s.end) for s in tl.spans] == [
        (0, "F", 0, 0, 2), (0, "B", 0, 4, 5), (0, "W", 0, 5, 6), (1, "F", 1, 2, 3),
        (1, "B", 1, 3, 4), (1, "W", 1, 4, 4.5)]
    notes = " | ".join(tl.import_notes)
    assert "1 SEND_*/RECV_* ranges" in notes and "'Optimizer'" in notes


def test_nsys_without_w_is_full_backward_and_errors(tmp_path):
    db = nsys_db(tmp_path / "a.sqlite", {PID0: [("F0.0.0", 0, 10, [(0, 1e6)]),
                                                ("B0.0.1", 20, 30, [(2e6, 3e6)])]})
    assert [s.kind for s in import_traces([db]).spans] == ["F", "BW"]
    bad = tmp_path / "b.sqlite"
    con = sqlite3.connect(bad)
    con.execute("CREATE TABLE x (a INTEGER)")
    con.commit()
    con.close()
    r = runner.invoke(app, ["import-trace", str(bad)])
    assert r.exit_code == 2 and "not an nsys SQLite export" in " ".join(r.output.split())
    empty = nsys_db(tmp_path / "c.sqlite", {PID0: [("Optimizer", 0, 10, [(0, 1)])]})
    with pytest.raises(ScenarioError, match="no op range with kernels"):
        import_traces([empty])

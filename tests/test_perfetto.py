"""Perfetto / Chrome trace export: every event checked against the Trace Event Format."""
from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
from schedsim.analysis.memory import memory_curves
from schedsim.errors import ScenarioError
from schedsim.interop.perfetto import trace_events, us_per_unit, write_trace
from schedsim.timeline import Timeline

FIG = CostModel(F=1, B=1, W=1, BW=2, FB=3)
META_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index",
              "process_labels"}


def _num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_trace(data: dict) -> dict[str, int]:
    """Validate a trace dict against the Trace Event Format (JSON object form).

    Required fields per phase; args are objects; every flow id has exactly one start
    (``s``) and one finish (``f``), the finish not before the start, each inside a complete
    slice of its own track (that is what binds it); complete slices on one track
    (pid, tid) never overlap; every process and thread that has events is named.
    Returns the count of events per phase.
    """
    assert set(data) >= {"traceEvents"}
    assert data.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = data["traceEvents"]
    assert isinstance(events, list) and events
    counts: dict[str, int] = defaultdict(int)
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[object, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    named_p, named_t, used_p, used_t = set(), set(), set(), set()
    for ev in events:
        ph = ev["ph"]
        counts[ph] += 1
        assert isinstance(ev.get("name"), str) and ev["name"], ev
        assert isinstance(ev.get("pid"), int), ev
        if "args" in ev:
            assert isinstance(ev["args"], dict), ev
        if ph == "M":
            assert ev["name"] in META_NAMES, ev
            if ev["name"].startswith("thread"):
                assert isinstance(ev.get("tid"), int), ev
            if ev["name"] == "process_name":
                named_p.add(ev["pid"])
                assert isinstance(ev["args"]["name"], str)
            elif ev["name"] == "thread_name":
                named_t.add((ev["pid"], ev["tid"]))
                assert isinstance(ev["args"]["name"], str)
            else:
                assert isinstance(ev["args"]["sort_index"], int)
            continue
        assert _num(ev.get("ts")) and ev["ts"] >= 0, ev
        used_p.add(ev["pid"])
        if ph == "X":
            assert isinstance(ev.get("tid"), int) and _num(ev.get("dur")), ev
            assert ev["dur"] >= 0, ev
            assert isinstance(ev.get("cat"), str), ev
            slices[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
            used_t.add((ev["pid"], ev["tid"]))
        elif ph in ("i", "I"):
            assert ev.get("s", "t") in ("g", "p", "t"), ev
            if ev.get("s", "t") == "t":
                assert isinstance(ev.get("tid"), int), ev
                used_t.add((ev["pid"], ev["tid"]))
        elif ph == "C":
            assert ev["args"] and all(_num(v) for v in ev["args"].values()), ev
        elif ph in ("s", "t", "f"):
            assert isinstance(ev.get("tid"), int) and "id" in ev, ev
            assert isinstance(ev.get("cat"), str), ev
            if ph == "f":
                assert ev.get("bp", "e") in ("e",), ev
            flows[ev["id"]][ph].append(ev)
            used_t.add((ev["pid"], ev["tid"]))
        else:
            raise AssertionError(f"phase {ph!r} not produced by schedsim")
    # no overlapping slices on one track
    for track, ivs in slices.items():
        ivs.sort()
        for (s0, e0), (s1, e1) in zip(ivs, ivs[1:]):
            assert s1 >= e0 - 1e-9, f"overlapping slices on {track}: {(s0, e0)} {(s1, e1)}"
    # flows: one start, one finish, each inside a slice of its track
    for fid, by in flows.items():
        assert len(by["s"]) == 1 and len(by["f"]) == 1, (fid, dict(by))
        s, f = by["s"][0], by["f"][0]
        assert s["ts"] <= f["ts"], (s, f)
        for ev in (s, f):
            ivs = slices[(ev["pid"], ev["tid"])]
            assert any(a < ev["ts"] < b for a, b in ivs), f"flow event not in a slice: {ev}"
    assert used_p <= named_p, used_p - named_p
    assert used_t <= named_t, used_t - named_t
    return dict(counts)


def _sim(name: str, ranks: int, mb: int, costs=FIG, **comm) -> Timeline:
    prog = build_program(name, ranks, mb)
    return simulate(prog, costs, LinkModel(), CommModel(**comm))


@pytest.mark.parametrize("semantics", ["data", "eager", "rendezvous"])
def test_dualpipe_trace_is_valid_and_complete(tmp_path, semantics):
    tl = _sim("dualpipe", 8, 20, semantics=semantics)
    path = tmp_path / "t.json"
    write_trace(path, [tl])
    data = json.loads(path.read_text())
    counts = check_trace(data)
    # one slice per op, one send and one recv slice per message, one flow per message
    assert counts["X"] == len(tl.spans) + 2 * len(tl.messages)
    assert counts["s"] == counts["f"] == len(tl.messages) == 280
    # a counter sample per distinct memory change time, per rank
    curves = memory_curves(tl)
    assert counts["C"] == sum(len({t for t, _ in c}) for c in curves)
    # slot -> 1000 us: the makespan is 66 ms
    ends = [e["ts"] + e["dur"] for e in data["traceEvents"]
            if e["ph"] == "X" and e["cat"] == "compute"]
    assert max(ends) == 66_000.0
    assert counts.get("i", 0) > 0          # stalls as instant events


def test_compute_slices_carry_the_op(tmp_path):
    tl = _sim("dualpipe", 8, 20)
    data = trace_events([tl])
    comp = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
    # rank 4 (pid 5) runs BW of mb 0 at T12..T14 (the README figure)
    bw0 = [e for e in comp if e["pid"] == 5 and e["args"]["kind"] == "BW"
           and e["args"]["mb"] == 0]
    assert len(bw0) == 1 and bw0[0]["ts"] == 12_000.0 and bw0[0]["dur"] == 2_000.0
    fb = [e for e in comp if e["args"]["kind"] == "FB"]
    assert fb and all(len(e["args"]["parts"]) == 2 for e in fb)
    assert {e["args"]["chunk"] for e in comp} == {0, 1}


def test_flow_goes_from_producer_to_consumer():
    tl = _sim("dualpipe", 8, 20)
    ev = trace_events([tl])["traceEvents"]
    by_id = defaultdict(dict)
    for e in ev:
        if e["ph"] in "sf":
            by_id[e["id"]][e["ph"]] = e
    # rank 5 (pid 6) B of mb 0 in T10 -> rank 4 (pid 5) BW of mb 0 at T12..T14
    hits = [d for d in by_id.values() if d["s"]["pid"] == 6 and d["f"]["pid"] == 5
            and d["s"]["ts"] == 10_500.0]
    assert len(hits) == 1 and hits[0]["f"]["ts"] == 13_000.0


def test_predicted_and_measured_are_separate_process_groups(tmp_path):
    pred = _sim("1f1b", 4, 8, CostModel(F=1, BW=2))
    meas = Timeline.model_validate({**pred.model_dump(), "source": "measured",
                                    "unit": "ms"})
    path = tmp_path / "both.json"
    write_trace(path, [pred, meas])
    data = json.loads(path.read_text())
    check_trace(data)
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[1] == "predicted · rank 0" and names[1004] == "measured · rank 3"
    assert len(names) == 8
    # flow ids are unique across the two groups
    ids = [e["id"] for e in data["traceEvents"] if e["ph"] == "s"]
    assert len(ids) == len(set(ids)) == 2 * len(pred.messages)
    other = json.loads(data["otherData"]["timelines"])
    assert [o["us_per_unit"] for o in other] == [1000.0, 1000.0]


def test_overlapping_transfers_get_their_own_lanes():
    # finite bandwidth + latency: transfers on one link overlap in time (pipelined latency)
    prog = build_program("gpipe", 2, 6)
    costs = CostModel(F=1, BW=2, message_bytes=100)
    tl = simulate(prog, costs, LinkModel(latency=5, bandwidth=1000), CommModel())
    data = trace_events([tl])
    check_trace(data)
    lanes = {e["args"]["name"] for e in data["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    assert "send → rank 1" in lanes and "send → rank 1 #2" in lanes


def test_units_and_bad_input(tmp_path):
    assert us_per_unit("slot") == 1000.0 and us_per_unit("ms") == 1000.0
    assert us_per_unit("us") == 1.0 and us_per_unit("s") == 1e6
    tl = _sim("1f1b", 2, 2, CostModel(F=1, BW=2))
    with pytest.raises(ScenarioError, match="distinct name"):
        trace_events([tl, tl], names=["a", "a"])
    with pytest.raises(ScenarioError, match=".json"):
        write_trace(tmp_path / "t.txt", [tl])
    assert not (tmp_path / "t.txt").exists()
    data = trace_events([tl], memory=False, stalls=False)
    assert not [e for e in data["traceEvents"] if e["ph"] in "Ci"]


def test_writing_a_trace_does_not_import_matplotlib(tmp_path):
    """Issue 14: the trace writer (library and CLI) loads no plotting code. Checked in a
    fresh interpreter, since this test process may have imported matplotlib already."""
    import subprocess
    import sys

    out = tmp_path / "t.json"
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from schedsim import CostModel, build_program, simulate\n"
        "from schedsim.cli import app\n"
        "from schedsim.interop.perfetto import write_trace\n"
        "tl = simulate(build_program('dualpipe', 4, 8), CostModel(F=1, B=1, W=1, FB=3))\n"
        f"write_trace({str(out)!r}, [tl])\n"
        "r = CliRunner().invoke(app, ['simulate', '-s', '1f1b', '-p', '4', '-m', '8',\n"
        f"                            '--trace', {str(tmp_path / 'c.json')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'\n"
        "             or m.startswith('schedsim.plot'))\n"
        "print('loaded:', bad)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "loaded: []"
    assert check_trace(json.loads(out.read_text()))["X"] > 0
    assert (tmp_path / "c.json").exists()


def test_streamed_file_is_the_trace_events_dict(tmp_path):
    """The file write_trace streams parses to exactly what trace_events returns, for a
    non-slot unit whose timestamps need rounding and for two timelines at once."""
    pred = _sim("zbv", 4, 8, CostModel(F=1.1, B=0.7, W=0.33), semantics="rendezvous")
    meas = Timeline.model_validate({**pred.model_dump(), "source": "measured",
                                    "unit": "ms"})
    path = tmp_path / "t.json"
    write_trace(path, [pred, meas], us_per_unit_override=7.3)
    text = path.read_text()
    assert text.isascii()
    data = json.loads(text)
    assert data == trace_events([pred, meas], us_per_unit_override=7.3)
    check_trace(data)
    ts = [e["ts"] for e in data["traceEvents"] if "ts" in e]
    assert all(round(t, 3) == t for t in ts) and any(t != int(t) for t in ts)

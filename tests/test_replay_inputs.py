"""Replay input handling that needs no process launch: partial and malformed profiler
traces, the torch-free module entry, fault-spec validation, the rendezvous deadlock
pre-check, output paths checked before launch and written all-or-nothing, and the meaning
of measured post times."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from replay_helpers import write_trace as _trace  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from schedsim.cli import app  # noqa: E402
from schedsim.errors import ScenarioError  # noqa: E402
from schedsim.interop.kineto import import_traces  # noqa: E402
from schedsim.replay.config import Fault  # noqa: E402
from schedsim.scenario import parse_scenario  # noqa: E402
from schedsim.timeline import Timeline  # noqa: E402

runner = CliRunner()


# -- partial and malformed traces ---------------------------------------------------------
# 1F1B, 2 ranks x 2 microbatches, as schedsim's replay records it (ts in µs)
_RANK0 = [("schedsim:0F0", 0, 10), ("schedsim:POST[0SEND_F0+0RECV_B0]", 10, 2),
          ("schedsim:0F1", 12, 10), ("schedsim:POST[0SEND_F1+0RECV_B1]", 22, 2),
          ("schedsim:WAIT[0RECV_B0]", 24, 30), ("schedsim:0BW0", 54, 20),
          ("schedsim:WAIT[0RECV_B1]", 74, 10), ("schedsim:0BW1", 84, 20),
          ("schedsim:END", 104, 1)]
_RANK1 = [("schedsim:POST[1RECV_F0]", 0, 2), ("schedsim:WAIT[1RECV_F0]", 2, 10),
          ("schedsim:1F0", 12, 10), ("schedsim:1BW0", 22, 20),
          ("schedsim:POST[1SEND_B0+1RECV_F1]", 42, 3), ("schedsim:WAIT[1RECV_F1]", 45, 1),
          ("schedsim:1F1", 46, 10), ("schedsim:1BW1", 56, 20),
          ("schedsim:POST[1SEND_B1]", 76, 2), ("schedsim:END", 78, 6)]


def test_import_one_rank_is_a_partial_timeline(tmp_path):
    """One rank's trace (the user's `import-trace prof/rank0.json`, an IndexError before):
    every rank of the run, the untraced one empty and listed; messages placed from the
    traced side; the same spans and messages as in the full import."""
    a, b = tmp_path / "rank0.json", tmp_path / "rank1.json"
    _trace(a, 0, _RANK0)
    _trace(b, 1, _RANK1)
    full = import_traces([a, b])
    assert getattr(full, "missing_ranks", None) is None
    for path, r in ((a, 0), (b, 1)):
        tl = import_traces([path])
        assert (tl.ranks, tl.stages, tl.placement, tl.missing_ranks) == (2, 2, "loop", [1 - r])
        assert {s.rank for s in tl.spans} == {r}
        key = lambda s: (s.rank, s.index, s.kind, s.stage, s.mb)  # noqa: E731
        assert sorted(map(key, tl.spans)) == sorted(key(s) for s in full.spans if s.rank == r)
        assert {(m.kind, m.src, m.dst, m.mb) for m in tl.messages} == {
            ("F", 0, 1, 0), ("F", 0, 1, 1), ("B", 1, 0, 0), ("B", 1, 0, 1)}
    # times are ms from the earliest event of the files given
    tl = import_traces([a])
    m = next(m for m in tl.messages if (m.kind, m.mb) == ("F", 0))
    assert (m.send_posted, m.recv_posted, m.send_index) == (pytest.approx(0.012), None, 1)
    # the CLI: exit 0 and a note naming the missing rank
    r = runner.invoke(app, ["import-trace", str(a), "--json", str(tmp_path / "i.json")])
    assert r.exit_code == 0, r.output
    assert "no trace of rank(s) 1: a partial timeline" in " ".join(r.output.split())
    assert Timeline.read_json(tmp_path / "i.json").missing_ranks == [1]


def test_import_infers_the_fewest_ranks_without_distributed_info(tmp_path):
    """No distributedInfo: rank = argument position; a posted message needs its two ends
    on two ranks, so stage 0's trace with a send to stage 1 means 2 ranks."""
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "PP:0F0", "ts": 0, "dur": 5},
        {"ph": "X", "name": "PP:0SEND_F0", "ts": 5, "dur": 1}]}))
    tl = import_traces([p])
    assert (tl.ranks, tl.stages, tl.placement, tl.missing_ranks) == (2, 2, "loop", [1])
    assert [(m.src, m.dst, m.send_posted) for m in tl.messages] == [(0, 1, 0.006)]


def _events(path, events, **top):
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


@pytest.mark.parametrize("case,match", [
    ("ts", "event 'schedsim:0F0' has ts '5': expected a finite number of µs"),
    ("dur", "event 'schedsim:0F0' has dur -1: expected a finite number of µs >= 0"),
    ("rank", "distributedInfo.rank is 'x': expected an integer >= 0"),
    ("rank_world", "distributedInfo.rank 3 is not below its world_size 2"),
    ("base", "baseTimeNanoseconds is 'soon': expected an integer"),
    ("worlds", "runs of different sizes: .*world_size 2, .*has 4"),
    ("twice", "0F0 appears twice \\(the trace holds several steps\\?\\)"),
    ("stage", "rank 0 posts 0SEND_B0, a message to stage -1, which cannot exist"),
    ("dir", "is a directory; give the trace files"),
    ("placement", "placement 'v' does not fit the traces: stage 2 \\(microbatch 0\\) ran "
                  "on rank 0, not 1"),
    ("unknown", "cannot tell which rank holds stage\\(s\\) \\[1\\]"),
])
def test_import_malformed_traces_are_one_line_errors(tmp_path, case, match):
    """Each malformed input is a ScenarioError naming the file and the problem, and the
    CLI prints it as one line, exit 2."""
    info = {"rank": 0, "world_size": 2}
    f0 = {"ph": "X", "name": "schedsim:0F0", "ts": 0, "dur": 1}
    p = tmp_path / "a.json"
    args, kw = [p], {}
    if case == "ts":
        _events(p, [{**f0, "ts": "5"}])
    elif case == "dur":
        _events(p, [{**f0, "dur": -1}])
    elif case == "rank":
        _events(p, [f0], distributedInfo={"rank": "x"})
    elif case == "rank_world":
        _events(p, [f0], distributedInfo={"rank": 3, "world_size": 2})
    elif case == "base":
        _events(p, [f0], baseTimeNanoseconds="soon")
    elif case == "worlds":
        _events(p, [f0], distributedInfo=info)
        args.append(_events(tmp_path / "b.json", [{**f0, "name": "schedsim:1F0"}],
                            distributedInfo={"rank": 1, "world_size": 4}))
    elif case == "twice":
        _events(p, [f0, {**f0, "ts": 5}], distributedInfo=info)
    elif case == "stage":
        _events(p, [f0, {**f0, "name": "schedsim:POST[0SEND_B0]"}], distributedInfo=info)
    elif case == "dir":
        p.mkdir()
    elif case == "placement":     # stages 0 and 2 on rank 0: loop, not v, on 2 ranks
        _events(p, [f0, {**f0, "name": "schedsim:2F0"}], distributedInfo=info)
        kw = {"placement": "v"}
    elif case == "unknown":       # the same on 3 ranks: neither loop nor v fits
        _events(p, [f0, {**f0, "name": "schedsim:2F0"}],
                distributedInfo={"rank": 0, "world_size": 3})
    with pytest.raises(ScenarioError, match=match):
        import_traces(args, **kw)
    cli = ["import-trace", *map(str, args)]
    if kw:
        cli += ["--placement", kw["placement"]]
    r = runner.invoke(app, cli)
    assert r.exit_code == 2 and r.output.startswith("error: "), r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


# -- checks before any process starts -------------------------------------------------
_NO_TORCH = """import runpy, sys
sys.modules['torch'] = None
sys.argv = ['python -m schedsim.replay'] + sys.argv[1:]
runpy.run_module('schedsim.replay', run_name='__main__', alter_sys=True)
"""


@pytest.mark.parametrize("args", [["schedules/replay-1f1b.toml"], ["--spec", "x.json"]])
def test_module_entry_without_torch(args):
    """`python -m schedsim.replay` says what `schedsim replay` says (one line, exit 2), not
    a chained ModuleNotFoundError traceback."""
    from conftest import ROOT

    out = subprocess.run([sys.executable, "-c", _NO_TORCH, *args], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    # a source checkout (this one, run from its root): the editable install of the extra
    assert out.stderr.strip() == (
        "python -m schedsim.replay: error: the replay needs torch, which is not installed: "
        "pip install -e '.[replay]' (or pip install torch)")


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if a command gets as far as starting processes."""
    import schedsim.replay.launch as launch_mod

    def refuse(*a, **k):
        raise AssertionError("launch() was called")
    monkeypatch.setattr(launch_mod, "launch", refuse)


_1F1B = ["--schedule", "1f1b", "--ranks", "2", "--microbatches", "2"]


@pytest.mark.parametrize("spec,match", [
    ("5:1", "rank 5 is out of range: the program has 2 ranks \\(0..1\\)"),
    ("1:11", "instr 11 is out of range: rank 1's program has instructions 0..9 and 10 = "
             "END"),
    ("0:3:boom", "expected RANK\\[:INDEX\\[:raise\\|hang\\]\\]"),
])
def test_inject_fault_is_validated(no_launch, spec, match):
    r = runner.invoke(app, ["replay", *_1F1B, "--inject-fault", spec])
    assert r.exit_code == 2 and r.output.startswith("error: bad --inject-fault"), r.output
    import re

    assert re.search(match, r.output), r.output


def test_inject_fault_bounds_are_the_program():
    from schedsim.replay.config import spec_from_scenario

    sc = parse_scenario({"schedule": {"name": "1f1b", "ranks": 2, "microbatches": 2}})
    n = len(sc.build_program().ranks[1])
    assert spec_from_scenario(sc, fault=Fault(rank=1, index=n)).fault.index == n   # END
    with pytest.raises(ScenarioError, match="out of range"):
        spec_from_scenario(sc, fault=Fault(rank=1, index=n + 1))


@pytest.mark.parametrize("argv,chain", [
    (["schedules/crossed-sends.toml"],
     "rank 0 waits at instr 8 (WAIT[2SEND_F0]) for 2SEND_F0, which needs its partner "
     "3RECV_F0, which rank 1 posts only at instr 9"),
    # the commit policy's crossing sends: gloo hangs on this one too (measured)
    (["--schedule", "zbv", "--ranks", "2", "--microbatches", "4", "--comm-policy",
      "commit"], "Blocked ranks: 0, 1"),
])
def test_replay_refuses_rendezvous_deadlock(no_launch, argv, chain):
    """A program that deadlocks under rendezvous (gloo/NCCL) is refused before any process
    starts, with the simulator's chain; it runs under eager, so the old eager pre-check
    let it through to hang until the timeout."""
    from conftest import ROOT

    from schedsim.replay.config import spec_from_scenario
    from schedsim.scenario import load_scenario
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate

    argv = [str(ROOT / a) if a.endswith(".toml") else a for a in argv]
    r = runner.invoke(app, ["replay", *argv])
    text = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert text.startswith("error: refusing to replay") and "deadlocks under rendezvous " \
        "semantics" in text and "gloo/NCCL would hang" in text, text
    assert chain in text and "pass --no-precheck to run it anyway" in text
    if argv[0].endswith(".toml"):
        sc = load_scenario(argv[0])
        simulate(sc.build_program(), comm=CommModel(semantics="eager"))   # no deadlock
        spec = spec_from_scenario(sc, precheck=False)          # the escape hatch
        assert spec.program["name"] == "crossed-sends"
        # calibration does not run the program: no pre-check
        spec_from_scenario(sc, calibrate=True, replay=False)
        # the torchrun entry point refuses it too, before any process group
        out = subprocess.run([sys.executable, "-m", "schedsim.replay", *argv],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and "refusing to replay" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("extra,match", [
    (["--json", "/proc/x.json"], "/proc/x.json: cannot write in folder /proc"),
    (["--gantt", "/proc/x.png"], "/proc/x.png: cannot write in folder /proc"),
    (["--json", "{tmp}/nodir/x.json"], "folder {tmp}/nodir does not exist"),
    (["--json", "{tmp}"], "{tmp}: is a directory"),
    (["--compare", "--out-dir", "{tmp}/afile"],
     "--out-dir {tmp}/afile: is a file; give a folder"),
    (["--compare", "--out-dir", "{tmp}/afile/sub"],
     "--out-dir {tmp}/afile/sub: cannot be created: {tmp}/afile is a file"),
    (["--compare", "--out-dir", "/proc/out"], "--out-dir /proc/out: cannot create a folder"),
    (["--compare", "--out-dir", "{tmp}"], "{tmp}/1f1b-overlay.png: is a directory"),
    (["--profile-dir", "{tmp}/afile"], "--profile-dir {tmp}/afile: is a file"),
    (["--profile-dir", "{tmp}"], "{tmp}/rank1.json: is a directory"),
])
def test_replay_output_paths_checked_before_launch(tmp_path, no_launch, extra, match):
    (tmp_path / "afile").write_text("")
    (tmp_path / "1f1b-overlay.png").mkdir()
    (tmp_path / "rank1.json").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    r = runner.invoke(app, ["replay", *_1F1B, *argv])
    assert r.exit_code == 2, r.output
    assert match.replace("{tmp}", str(tmp_path)) in " ".join(r.output.split()), r.output
    assert not (tmp_path / "afile" / "sub").exists()


def test_calibrate_and_import_check_outputs_first(tmp_path, no_launch):
    r = runner.invoke(app, ["calibrate", *_1F1B, "--out", "/proc/c.toml"])
    assert r.exit_code == 2 and "/proc/c.toml: cannot write" in r.output
    a = tmp_path / "rank0.json"
    _trace(a, 0, _RANK0)
    for opt, path in (("--json", "/proc/i.json"), ("--gantt", "/proc/i.png")):
        r = runner.invoke(app, ["import-trace", str(a), opt, path])
        assert r.exit_code == 2 and f"{path}: cannot write" in r.output


def _fake_launch(prog_name="1f1b"):
    """A launch() that returns a simulated timeline dressed as rank 0's result."""
    from schedsim.program.ir import Program
    from schedsim.sim.simulate import simulate

    def fake(spec, n, **kw):
        tl = simulate(Program.model_validate(spec.program))
        data = json.loads(tl.to_json())
        data.update(source="measured", unit="ms", backend="gloo")
        return {"timeline": data}
    return fake


def test_replay_outputs_all_or_nothing(tmp_path, monkeypatch):
    """--json, --gantt and --compare's five files appear together; when one fails none
    does (nor the --out-dir made for them), and the error names it."""
    import schedsim.plot.figure as plot
    import schedsim.replay.launch as launch_mod

    monkeypatch.setattr(launch_mod, "launch", _fake_launch())
    costs = tmp_path / "c.toml"
    costs.write_text("[costs]\nF = 1\nB = 1\nW = 1\nunit = \"ms\"\n")
    out = tmp_path / "new" / "out"
    argv = ["replay", *_1F1B, "--json", str(tmp_path / "m.json"), "--gantt",
            str(tmp_path / "m.png"), "--compare", "--costs-file", str(costs), "--out-dir",
            str(out)]
    real = plot.save_figure

    def broken(fig, path):
        if str(path).endswith(".png") and "overlay" in str(path):
            raise ScenarioError(f"{path}: disk full")
        real(fig, path)
    monkeypatch.setattr(plot, "save_figure", broken)
    r = runner.invoke(app, argv)
    assert r.exit_code == 2 and "disk full" in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]
    monkeypatch.setattr(plot, "save_figure", real)
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.json").exists() and (tmp_path / "m.png").exists()
    assert sorted(p.name for p in out.iterdir()) == [
        "1f1b-errors.json", "1f1b-measured.json", "1f1b-overlay.png", "1f1b-predicted.json"]


def test_out_dir_without_compare_is_honoured(tmp_path, monkeypatch):
    """--out-dir alone receives NAME-measured.json (the folder made for it); --semantics
    and --isolated without --compare are errors, not ignored."""
    import schedsim.replay.launch as launch_mod

    monkeypatch.setattr(launch_mod, "launch", _fake_launch())
    out = tmp_path / "a" / "b"
    r = runner.invoke(app, ["replay", *_1F1B, "--out-dir", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["1f1b-measured.json"]
    assert Timeline.read_json(out / "1f1b-measured.json").source == "measured"
    for flag in (["--semantics", "eager"], ["--isolated"]):
        r = runner.invoke(app, ["replay", *_1F1B, *flag])
        assert r.exit_code == 2 and "goes with --compare" in r.output, r.output


def test_measured_posts_mean_what_simulated_posts_mean():
    """Message.send_posted/recv_posted: the end of launching the batch in both executors.
    Records made as the executor makes them (a post run stamped before and after
    batch_isend_irecv; each post at the run's end) from a simulated run with a launch
    cost give back the simulator's messages and spans exactly: zero prediction error."""
    from schedsim import build_program
    from schedsim.analysis.accuracy import prediction_error
    from schedsim.program.ops import launched
    from schedsim.replay.timing import measured_timeline
    from schedsim.sim.costs import CommModel, CostModel
    from schedsim.sim.simulate import simulate

    prog = build_program("1f1b", 2, 3)
    lc = 0.25
    sim = simulate(prog, CostModel(F=1, BW=2), comm=CommModel(semantics="eager",
                                                             launch_cost=lc))
    ns = lambda t: round(t * 1e6)  # noqa: E731 - ms -> ns
    posted = {}
    for m in sim.messages:
        posted[(m.src, m.send_index)] = m.send_posted
        posted[(m.dst, m.recv_index)] = m.recv_posted
    recs = []
    for r, row in enumerate(prog.ranks):
        rec = {"spans": [(s.index, ns(s.start), ns(s.end)) for s in sim.spans_of(r)],
               "posts": [], "waits": [], "comm_post": {}, "comm_done": {},
               "comm_bytes": {}, "begin": 0}
        for i, ins in enumerate(row):
            comms = launched(ins)
            if not comms:
                continue
            end = posted[(r, i)]                      # one launch, one post time
            rec["posts"].append((i, i, ns(end - lc), ns(end)))
            for c in comms:
                rec["comm_post"][str(c)] = (i, ns(end))
                rec["comm_bytes"][str(c)] = 8
        recs.append(rec)
    meas = measured_timeline(prog, recs, backend="gloo")
    key = lambda m: (m.kind, m.stage, m.mb)  # noqa: E731
    got = {key(m): (m.send_posted, m.recv_posted) for m in meas.messages}
    want = {key(m): (m.send_posted, m.recv_posted) for m in sim.messages}
    assert got == want           # quarters of a ms: exact in ns and back
    assert all(p["end"] - p["start"] == pytest.approx(lc) for p in meas.posts)
    pe = prediction_error(sim, meas)
    assert pe.makespan_error == pytest.approx(0, abs=1e-9) and pe.moved == 0

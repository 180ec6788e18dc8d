"""End-to-end replays on gloo (CPU, 1 thread per rank, tiny models, every run with a
timeout): each schedule family runs for real and passes the gradient check against the
single-process reference; the measured timeline obeys causality on the shared clock;
the CLI writes the timeline, the calibrated prediction, the overlay and profiler traces;
a rank that raises or hangs stops the whole run in time and names itself, and no child
process survives."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from replay_helpers import marked_pids, marked_rank_pids

pytest.importorskip("torch")

from schedsim.errors import ScenarioError  # noqa: E402
from schedsim.program.ir import Compute, Program  # noqa: E402
from schedsim.program.ops import launched
from schedsim.replay.config import Fault, ReplayConfig, ReplayError, spec_from_scenario  # noqa: E402
from schedsim.replay.launch import launch  # noqa: E402
from schedsim.scenario import parse_scenario  # noqa: E402
from schedsim.timeline import Timeline  # noqa: E402

TIMEOUT = 90.0      # seconds per run; runs take 4-12 s on 2 cores


def _replay(name: str, ranks: int, mb: int, params: dict | None = None, **table):
    table = {"hidden": 16, "seq": 4, "microbatch_size": 2, "heads": 2, **table}
    sc = parse_scenario({"schedule": {"name": name, "ranks": ranks, "microbatches": mb,
                                      **(params or {})}, "replay": table})
    spec = spec_from_scenario(sc, check_grads=True, timeout=TIMEOUT)
    res = launch(spec, ranks)
    return Program.model_validate(spec.program), Timeline.model_validate(res["timeline"])


def _check_timeline(prog: Program, tl: Timeline) -> None:
    """Every compute instruction is a span at its index, in program order, and data never
    moves backwards in time across ranks (one monotonic clock on this host)."""
    pl = prog.placement
    assert tl.source == "measured" and tl.backend == "gloo" and tl.unit == "ms"
    assert tl.world_size == pl.ranks and tl.clock == "shared"
    for r, row in enumerate(prog.ranks):
        idx = [i for i, ins in enumerate(row) if isinstance(ins, Compute)]
        spans = sorted((s for s in tl.spans if s.rank == r), key=lambda s: s.index)
        assert [s.index for s in spans] == idx
        for a, b in zip(spans, spans[1:]):
            assert a.start <= a.end <= b.start
    sends = sum(c.is_send for row in prog.ranks for i in row for c in launched(i))
    assert len(tl.messages) == sends
    # a side's post time is the end of the launch (bare post or batch) holding it, as in the
    # simulator (Message's definition); the data can arrive while the sender's batch call
    # is still running, but not before it began
    run = {(p["rank"], i): (p["start"], p["end"]) for p in tl.posts
           for i in range(p["index"], p["last_index"] + 1)}
    for m in tl.messages:
        assert m.bytes == tl.messages[0].bytes > 0
        assert m.send_posted == run[(m.src, m.send_index)][1] <= m.send_done
        assert m.recv_posted == run[(m.dst, m.recv_index)][1] <= m.recv_done
        assert run[(m.src, m.send_index)][0] <= m.recv_done
    end = {}
    for s in tl.spans:
        for p in (s.parts or [s]):
            end[(p.kind, p.stage, p.mb)] = (s.rank, s.start, s.end)
    for (kind, st, mb), (r, start, _) in end.items():
        if kind == "F" and st > 0:
            src = end[("F", st - 1, mb)]
        elif kind in ("B", "BW") and st < pl.stages - 1:
            src = end.get(("B", st + 1, mb)) or end[("BW", st + 1, mb)]
        else:
            continue
        if src[0] != r:             # cross-rank: the consumer starts after the producer
            assert start >= src[2], (kind, st, mb)


def _check_grads(tl: Timeline, stages: int, copies: int = 1) -> None:
    gc = tl.grad_check
    assert gc["passed"], gc
    assert gc["max_rel_error"] <= gc["tolerance"]
    assert [p["stage"] for p in gc["per_stage"]] == list(range(stages))
    assert all(p["copies"] == copies for p in gc["per_stage"])
    assert gc["loss"] == pytest.approx(gc["ref_loss"], rel=gc["tolerance"])


@pytest.mark.parametrize("name,ranks,mb,params,table,stages,copies", [
    ("1f1b", 2, 4, {}, {}, 2, 1),
    ("gpipe", 2, 3, {}, {"dtype": "float64", "workload": "transformer"}, 2, 1),
    ("zb-h1", 2, 4, {}, {"steps": 3}, 2, 1),
    ("interleaved-1f1b", 2, 4, {"chunks": 2}, {"dtype": "float64"}, 4, 1),
    ("dualpipe", 4, 8, {}, {}, 4, 2),
    ("dualpipev", 2, 4, {}, {"dtype": "float64", "workload": "transformer"}, 4, 1),
])
def test_family_replays_and_passes_grad_check(name, ranks, mb, params, table, stages,
                                              copies):
    prog, tl = _replay(name, ranks, mb, params, **table)
    _check_grads(tl, stages, copies)
    _check_timeline(prog, tl)
    if name in ("dualpipe", "dualpipev"):
        assert any(s.kind == "FB" and len(s.parts) == 2 for s in tl.spans)
    if name == "zb-h1":
        assert {s.kind for s in tl.spans} == {"F", "B", "W"}
        # three measured steps; the kept one has the median makespan
        assert len(tl.step_makespans) == 3
        assert tl.makespan == sorted(tl.step_makespans)[1] == tl.step_makespans[tl.step]
    if table.get("dtype") == "float64":
        assert tl.grad_check["tolerance"] == 1e-9


def test_estimated_clock_offsets_are_small():
    """Forcing the multi-host path (ping-pong offsets vs rank 0) on one host finds ~0."""
    sc = parse_scenario({"schedule": {"name": "1f1b", "ranks": 2, "microbatches": 2},
                         "replay": {"hidden": 8, "seq": 2, "warmup": 0}})
    res = launch(spec_from_scenario(sc, timeout=TIMEOUT, clock="estimate"), 2)
    tl = res["timeline"]
    assert tl["clock"] == "estimate" and tl["clock_offsets_ns"][0] == 0
    assert abs(tl["clock_offsets_ns"][1]) < 5e6       # < 5 ms (half the best round trip)


def test_fault_raise_stops_all_ranks(tmp_path):
    """One rank raises mid-step: the command exits 1 well within the timeout, names the
    rank and the instruction, writes no output file, and leaves no process behind."""
    marker = f"schedsim-test-{uuid.uuid4().hex}"
    env = dict(os.environ, SCHEDSIM_TEST_MARKER=marker)
    out = tmp_path / "m.json"
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "schedsim", "replay", "--schedule", "1f1b",
                        "--ranks", "3", "--microbatches", "4", "--set", "hidden=8",
                        "--set", "seq=2", "--inject-fault", "1:6", "--timeout", "60",
                        "--json", str(out)], env=env, capture_output=True, text=True,
                       timeout=120)
    elapsed = time.time() - t0
    assert p.returncode == 1, p.stderr
    assert "rank 1: injected fault at instr 6" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert elapsed < 45
    assert not out.exists()
    assert marked_pids(marker) == []


def test_fault_hang_times_out_naming_the_rank(monkeypatch):
    """A rank that hangs: every rank is stopped at the timeout; the silent rank is named
    and the others report where they were waiting."""
    marker = f"schedsim-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("SCHEDSIM_TEST_MARKER", marker)
    sc = parse_scenario({"schedule": {"name": "gpipe", "ranks": 2, "microbatches": 2},
                         "replay": {"hidden": 8, "seq": 2}})
    spec = spec_from_scenario(sc, fault=Fault(rank=1, index=2, kind="hang"))
    t0 = time.time()
    with pytest.raises(ReplayError) as ei:
        launch(spec, 2, timeout=15)
    elapsed = time.time() - t0
    msg = str(ei.value)
    assert "timed out after 15 s: rank(s) 1 did not finish" in msg
    assert "rank 0 timed out at instr" in msg
    assert elapsed < 15.5
    assert marked_pids(marker) == []


def test_spec_refuses_deadlocking_program(tmp_path):
    prog = tmp_path / "p.txt"
    # both ranks wait for each other's data first: can never finish
    prog.write_text("rank 0: 0RECV_B0 WAIT[0RECV_B0] 0F0 0SEND_F0 0BW0\n"
                    "rank 1: 1RECV_F0 WAIT[1RECV_F0] 1F0 1BW0 1SEND_B0\n")
    sc = parse_scenario({"schedule": {"program": str(prog), "placement": "loop"}})
    from schedsim.errors import DeadlockError, ProgramError

    with pytest.raises((DeadlockError, ProgramError, ScenarioError)):
        spec_from_scenario(sc)


def test_cli_replay_compare_profile_and_import(tmp_path):
    """One CLI run: --check-grads --json --gantt --compare --profile-dir; then the cost
    file feeds simulate and import-trace rebuilds the same spans from the traces."""
    sc = tmp_path / "s.toml"
    sc.write_text('[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n'
                  '[replay]\nhidden = 32\nseq = 8\ntimeout = 90\n')
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "schedsim"]
    p = subprocess.run(cmd + ["replay", str(sc), "--check-grads", "--json",
                              str(tmp_path / "m.json"), "--gantt", str(tmp_path / "m.png"),
                              "--compare", "--out-dir", str(out), "--profile-dir",
                              str(tmp_path / "prof")], capture_output=True, text=True,
                       timeout=150)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "gradient check passed" in text and "makespan: predicted" in text
    assert "per batch; without it: makespan" in text     # the launch cost's share
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["source"] == "measured" and data["backend"] == "gloo"
    assert data["world_size"] == 2 and data["grad_check"]["passed"] is True
    assert (tmp_path / "m.png").stat().st_size > 10_000
    for f in ("1f1b-measured.json", "1f1b-predicted.json", "1f1b-costs.toml",
              "1f1b-errors.json", "1f1b-overlay.png"):
        assert (out / f).exists(), f
    pred = Timeline.read_json(out / "1f1b-predicted.json")
    assert pred.source == "simulated" and pred.unit == "ms"
    assert pred.semantics == "rendezvous"          # how gloo behaves: the default
    errors = json.loads((out / "1f1b-errors.json").read_text())
    assert set(errors["semantics_error"]) == {"makespan", "mean_start", "max_start"}
    assert "semantics error : makespan" in text and "cost-model error:" in text
    p2 = subprocess.run(cmd + ["simulate", str(sc), "--costs-file",
                               str(out / "1f1b-costs.toml"), "--semantics", "rendezvous", "-q",
                               "--json",
                               str(tmp_path / "p.json")], capture_output=True, text=True,
                        timeout=60)
    assert p2.returncode == 0, p2.stderr
    # the cost file is lossless: simulate --costs-file predicts the very same makespan
    # (with 6 significant digits it differed in the last places and failed ~1 run in 7),
    # the calibrated launch cost included
    assert Timeline.read_json(tmp_path / "p.json").makespan == pred.makespan
    assert "\n[comm]\nlaunch_cost = " in (out / "1f1b-costs.toml").read_text()
    # one rank's trace alone: a partial timeline with that rank's spans
    p4 = subprocess.run(cmd + ["import-trace", str(tmp_path / "prof" / "rank0.json"),
                               "--json", str(tmp_path / "i0.json")], capture_output=True,
                        text=True, timeout=60)
    assert p4.returncode == 0, p4.stderr
    part = Timeline.read_json(tmp_path / "i0.json")
    assert part.ranks == 2 and part.missing_ranks == [1]
    p3 = subprocess.run(cmd + ["import-trace", str(tmp_path / "prof" / "rank1.json"),
                               str(tmp_path / "prof" / "rank0.json"), "--json",
                               str(tmp_path / "i.json")], capture_output=True, text=True,
                        timeout=60)
    assert p3.returncode == 0, p3.stderr
    meas = Timeline.read_json(tmp_path / "m.json")
    imp = Timeline.read_json(tmp_path / "i.json")
    key = lambda s: (s.rank, s.index, s.kind, s.stage, s.mb)  # noqa: E731
    assert sorted(map(key, imp.spans)) == sorted(map(key, meas.spans))
    assert {(w.rank, w.index, w.kind) for w in imp.waits} == \
        {(w.rank, w.index, w.kind) for w in meas.waits}
    assert len(imp.messages) == len(meas.messages)
    assert sorted(map(key, part.spans)) == sorted(key(s) for s in meas.spans if s.rank == 0)
    # the replay's own ranges are a program: check-trace explains them
    p5 = subprocess.run(cmd + ["check-trace", str(tmp_path / "prof" / "rank0.json"),
                               str(tmp_path / "prof" / "rank1.json"), "--json",
                               str(tmp_path / "e.json")], capture_output=True, text=True,
                        timeout=60)
    assert p5.returncode == 0, p5.stderr
    sem = json.loads((tmp_path / "e.json").read_text())["semantics_error"]
    assert sem["mean_start"] <= 0.05 and abs(sem["makespan"]) <= 0.05
    assert Program.model_validate(imp.program).ranks == \
        parse_scenario({"schedule": {"name": "1f1b", "ranks": 2,
                                     "microbatches": 4}}).build_program().ranks


def test_calibrate_three_ranks_launch_cost():
    """With more than two ranks only ranks 0 and 1 measure the link and the launches (the
    others must not be left in a collective). 1F1B on 3 ranks as torch runs it launches
    single sends, single recvs and send+recv batches."""
    sc = parse_scenario({"schedule": {"name": "1f1b", "ranks": 3, "microbatches": 4,
                                      "comm_policy": "torch"},
                         "replay": {"hidden": 16, "seq": 4, "microbatch_size": 2}})
    t0 = time.monotonic()
    res = launch(spec_from_scenario(sc, timeout=60, calibrate=True, replay=False,
                                    calib_repeats=1), 3)
    assert time.monotonic() - t0 < 60
    from schedsim.replay.calibrate import Calibration, post_runs

    cal = Calibration.model_validate(res["calibration"])
    assert cal.world_size == 3 and sorted(cal.stages) == [0, 1, 2]
    assert cal.post_runs == post_runs(sc.build_program()) == {"1+0": 6, "1+1": 10,
                                                              "0+1": 6}
    # 10 timed rounds per composition pair on each of ranks 0 and 1 (rank 1 launches the
    # mirror of rank 0's composition: 1+0 <-> 0+1)
    assert {k: len(v) for k, v in cal.launch_samples.items()} == {
        "1+0": 20, "0+1": 20, "1+1": 20}
    assert all(x > 0 for v in cal.launch_samples.values() for x in v)
    assert cal.launch_cost() > 0


def test_cli_calibrate_writes_cost_file(tmp_path):
    """schedsim calibrate --no-contended (the benchmarks) on DualPipeV: every stage
    measured (two per rank), FB written
    (its pairs are (F;BW)), a link fitted from rank 0 <-> 1, a launch cost from the
    program's batch compositions; simulate reads the file and charges the launches."""
    cmd = [sys.executable, "-m", "schedsim"]
    out = tmp_path / "c.toml"
    sched = ["--schedule", "dualpipev", "--ranks", "2", "--microbatches", "4"]
    p = subprocess.run(cmd + ["calibrate", *sched, "--set", "hidden=16", "--set", "seq=4",
                              "--repeats", "2", "--timeout", "90", "--no-contended",
                              "--out", str(out)],
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr
    from schedsim.scenario import tomllib  # tomli on Python 3.10

    data = tomllib.loads(out.read_text())
    assert data["costs"]["unit"] == "ms"
    assert data["costs"]["message_bytes"] == 2 * 4 * 16 * 4
    assert sorted(data["costs"]["stage"]) == ["0", "1", "2", "3"]
    for c in data["costs"]["stage"].values():
        assert set(c) == {"F", "B", "W", "BW", "FB"} and all(v > 0 for v in c.values())
    assert data["link"]["latency"] >= 0
    assert set(data["comm"]) == {"launch_cost"} and data["comm"]["launch_cost"] > 0
    text = out.read_text()
    # single send, single recv, pair and every composition of the program's batches
    # measured by both ranks (2 repeats x 10 rounds each)
    from schedsim.replay.calibrate import post_runs

    runs = post_runs(parse_scenario({"schedule": {"name": "dualpipev", "ranks": 2,
                                                  "microbatches": 4}}).build_program())
    for k in {"1+0", "0+1", "1+1", *runs}:
        assert f"{k}: " in text.split("# launch time per batch")[1].split("\n")[0], k
    assert "# the program's batches (sends+recvs: count): " + ", ".join(
        f"{k}: {c}" for k, c in sorted(runs.items())) in text
    p2 = subprocess.run(cmd + ["simulate", *sched, "--costs-file", str(out), "--semantics",
                               "eager", "-q", "--json", str(tmp_path / "p.json")],
                        capture_output=True, text=True, timeout=60)
    assert p2.returncode == 0, p2.stderr
    tl = Timeline.read_json(tmp_path / "p.json")
    fb = next(s for s in tl.spans if s.kind == "FB")
    assert fb.end - fb.start == pytest.approx(data["costs"]["stage"][str(fb.stage)]["FB"])
    # without the [comm] table the same program is shorter
    (tmp_path / "nc.toml").write_text(text.split("\n[comm]")[0])
    p3 = subprocess.run(cmd + ["simulate", *sched, "--costs-file", str(tmp_path / "nc.toml"),
                               "--semantics", "eager", "-q", "--json",
                               str(tmp_path / "p0.json")],
                        capture_output=True, text=True, timeout=60)
    assert p3.returncode == 0, p3.stderr
    assert Timeline.read_json(tmp_path / "p0.json").makespan < tl.makespan


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_stops_every_rank(tmp_path, sig, code):
    """SIGTERM / SIGHUP to `schedsim replay` (timeout, Slurm, kill, a closed terminal)
    while a rank hangs: every rank is killed, the temporary folder removed, exit 128+N,
    one line."""
    marker = f"schedsim-test-{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, SCHEDSIM_TEST_MARKER=marker, TMPDIR=str(tmp))
    p = subprocess.Popen([sys.executable, "-m", "schedsim", "replay", "--schedule", "gpipe",
                          "--ranks", "2", "--microbatches", "2", "--set", "hidden=8",
                          "--set", "seq=2", "--inject-fault", "1:2:hang", "--timeout", "60"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while len(marked_rank_pids(marker)) < 2 and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert len(marked_rank_pids(marker)) == 2 and list(tmp.iterdir())
        time.sleep(3.0)                       # ranks past start-up, rank 1 hanging
        p.send_signal(sig)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == code, err
    assert err.strip() == (f"error: replay interrupted by {sig.name}: every rank was "
                           f"stopped and the run's temporary files removed")
    assert marked_pids(marker) == []
    assert list(tmp.iterdir()) == []


def test_hung_rank_stops_itself_after_the_deadline(tmp_path):
    """Ranks started without the launcher (as under torchrun, or after the launcher was
    SIGKILLed): the rank that hangs where no timeout reaches stops itself GRACE_S after
    the deadline; its peer times out in its wait."""
    from schedsim.replay.launch import free_port
    from schedsim.replay.worker import GRACE_S

    sc = parse_scenario({"schedule": {"name": "gpipe", "ranks": 2, "microbatches": 2},
                         "replay": {"hidden": 8, "seq": 2, "warmup": 0}})
    deadline = time.time() + 10
    spec = spec_from_scenario(sc, fault=Fault(rank=1, index=2, kind="hang")).model_copy(
        update={"deadline": deadline})
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    port = free_port()
    procs = []
    try:
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, "-m", "schedsim.replay", "--spec",
                                           str(path)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        errs = [q.communicate(timeout=30)[1] for q in procs]
        ended = time.time()
    finally:
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
    assert [q.returncode for q in procs] == [1, 1]
    assert "rank 0 timed out at instr" in errs[0]
    assert (f"rank 1: still running {GRACE_S:g} s after the run's deadline" in errs[1]), errs
    assert deadline + GRACE_S <= ended < deadline + GRACE_S + 5


def test_no_precheck_runs_a_rendezvous_deadlock_until_the_timeout():
    """The escape hatch: crossed-sends (refused by default) launches and hangs on gloo
    until the timeout, as the pre-check predicts. (15 s: both ranks must import torch and
    reach their wait before it; 8 s was not always enough on a loaded 2-core machine, where
    the ranks then report nothing.)"""
    from conftest import SCHEDULES

    from schedsim.scenario import load_scenario

    sc = load_scenario(SCHEDULES / "crossed-sends.toml")
    with pytest.raises(ScenarioError, match="deadlocks under rendezvous"):
        spec_from_scenario(sc)
    spec = spec_from_scenario(sc, precheck=False).model_copy(
        update={"config": ReplayConfig(hidden=8, seq=2, warmup=0)})
    t0 = time.time()
    with pytest.raises(ReplayError, match=r"timed out at instr 8 \(WAIT\[(2SEND_F0|1SEND_F1)"):
        launch(spec, 2, timeout=15)
    assert time.time() - t0 < 16

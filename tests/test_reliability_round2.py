"""Reliability, second round (issue 23): each reproducer of the campaign as a regression
test, and a property test per class of defect: every Timeline JSON field mutated, typer's
own usage errors as one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from schedsim.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_or_ok(r) -> None:
    """Exit 0, or exit 2 with one ``error:`` line: never a traceback (exit 1)."""
    assert r.exit_code in (0, 2), (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    if r.exit_code == 2:
        err = r.stderr.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1, err


@pytest.fixture(scope="module")
def timeline(tmp_path_factory) -> dict:
    p = tmp_path_factory.mktemp("tl") / "tl.json"
    r = run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "--semantics", "rendezvous",
            "-q", "--json", p)
    assert r.exit_code == 0, r.output
    return json.loads(p.read_text())


# -- class 1: Timeline JSON fields validated at load -----------------------------------
@pytest.mark.parametrize("field,value,want", [
    ("comm_stream", "bogus", "unknown comm_stream 'bogus': expected one of none, per-peer"),
    ("placement", "bogus", "unknown placement 'bogus': expected one of loop, v, dual"),
    ("semantics", "bogus", "unknown semantics 'bogus' of a simulated timeline"),
])
@pytest.mark.parametrize("command", ["stalls", "align", "memory", "critical-path", "render"])
def test_unknown_names_are_refused_at_load(tmp_path, timeline, field, value, want, command):
    """The campaign's reproducers: an unknown ``comm_stream`` made five commands exit 1
    with a pydantic traceback, an unknown ``placement`` crashed ``memory``, an unknown
    ``semantics`` was accepted and printed."""
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({**timeline, field: value}))
    extra = ["-o", tmp_path / "x.png"] if command == "render" else []
    r = run(command, p, *extra)
    assert r.exit_code == 2, r.output
    assert want in r.stderr and str(p) in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_a_measured_timeline_names_its_backend(tmp_path, timeline):
    ok = {**timeline, "source": "measured", "semantics": "gloo"}
    (tmp_path / "ok.json").write_text(json.dumps(ok))
    assert run("stalls", tmp_path / "ok.json").exit_code == 0
    (tmp_path / "bad.json").write_text(json.dumps({**ok, "semantics": "\x1b[2J"}))
    r = run("stalls", tmp_path / "bad.json")
    assert r.exit_code == 2 and "expected the backend that ran it" in r.stderr


#: values a hand edit or a fuzzer puts in a field
HOSTILE = [None, True, -1, 0, 2 ** 63, -1e308, 1e308, float("nan"), "", "bogus",
           "\x1b]0;pwned\x07", [], {}, [1, 2], {"a": 1}]


def _paths(d: dict) -> list[tuple]:
    """Every scalar field of a Timeline JSON (top level, and the first record of each
    list) as a key path."""
    out = []
    for k, v in d.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            out += [(k, 0, f) for f in v[0]]
        out.append((k,))
    return out


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_timeline_field_mutated_is_ok_or_one_line(tmp_path, timeline, data):
    """Property: any one field of a valid Timeline JSON set to any hostile value gives exit
    0 or one line with exit 2 in the commands that read a Timeline JSON, never a
    traceback."""
    d = json.loads(json.dumps(timeline))
    path = data.draw(st.sampled_from(_paths(d)))
    value = data.draw(st.sampled_from(HOSTILE))
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    p = tmp_path / "mut.json"
    p.write_text(json.dumps(d))
    command = data.draw(st.sampled_from(["stalls", "memory", "align", "render"]))
    extra = ["-o", tmp_path / "m.png"] if command == "render" else []
    one_line_or_ok(run(command, p, *extra))


# -- class 9: typer's usage errors -----------------------------------------------------
@pytest.mark.parametrize("args,want", [
    (["simulate", "-s", "1f1b", "-p", "abc", "-m", "4"], "Invalid value for '--ranks' / '-p'"),
    (["simulate", "--bogus-flag"], "No such option: --bogus-flag"),
    (["report", "schedules/1f1b.toml"], "Missing option '--html'"),
    # a value the scenario refuses names the flag that set it, not the [schedule] key
    (["simulate", "-s", "1f1b", "-p", "0", "-m", "8"],
     "Invalid value for '--ranks' / '-p': Input should be greater than or equal to 1"),
    (["simulate", "-s", "1f1b", "-p", "2", "-m", "4", "--latency", "-1"],
     "Invalid value for '--latency': Input should be greater than or equal to 0"),
])
def test_usage_errors_are_one_line(args, want):
    """``-p abc`` printed typer's boxed multi-line usage error: now one ``error:`` line
    naming the flag and pointing to ``--help``, exit 2."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "schedsim", *args], capture_output=True,
                       text=True, timeout=60, cwd=root, check=False)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert want in err and "--help" in err and "╭" not in err


# -- class 8: loose types --------------------------------------------------------------
#: (table, key, a value of the wrong type that lax parsing took): quoted numbers and
#: booleans where a number goes, a quoted boolean where a boolean goes
LOOSE = [
    ("schedule", "ranks", '"2"'), ("schedule", "microbatches", "true"),
    ("costs", "F", "true"), ("costs", "F", '"1"'), ("costs", "message_bytes", '"1e6"'),
    ("link", "latency", '"0.5"'), ("link", "bandwidth", "true"),
    ("comm", "launch_cost", '"0.1"'), ("comm", "lazy_init", '"true"'),
    ("comm", "eager_threshold_bytes", "false"),
    ("model", "layers", '"2"'), ("model", "tp", "true"), ("model", "activation_bytes", '"1"'),
    ("model", "sequence_parallel", '"yes"'), ("model", "topk", "1.5"),
    ("memory", "F", '"1"'), ("memory", "B", "true"),
]


@pytest.mark.parametrize("table,key,value", LOOSE, ids=[f"{t}.{k}={v}" for t, k, v in LOOSE])
def test_loose_types_are_refused_with_the_type_expected(tmp_path, table, key, value):
    """``F = true`` was 1, ``F = "1"`` and ``ranks = "2"`` numbers: each key of the scenario
    is now read strictly, the message naming the key, the type expected and the value."""
    body = {"schedule": 'name = "1f1b"\nranks = 2\nmicrobatches = 4\n', "costs": "",
            "link": "", "comm": 'semantics = "rendezvous"\n', "model": "", "memory": ""}
    body[table] = "\n".join(line for line in body[table].splitlines()
                            if not line.startswith(f"{key} ")) + f"\n{key} = {value}\n"
    text = "".join(f"[{t}]\n{b}\n" for t, b in body.items() if b.strip() or t == table)
    p = tmp_path / "loose.toml"
    p.write_text(text)
    r = run("simulate", p, "-q")
    assert r.exit_code == 2, (text, r.output)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and key in err, err
    assert "should be a valid" in err or "Input should be" in err, err


def test_integer_table_keys_and_whole_numbers_still_read(tmp_path):
    """Strictness refuses the wrong type, not TOML's own forms: per-stage tables keyed by
    number and whole numbers where a float goes."""
    p = tmp_path / "ok.toml"
    p.write_text('[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n'
                 '[costs]\nF = 1\nBW = 2\n[costs.stage.1]\nF = 2\n[link]\nlatency = 0\n')
    r = run("simulate", p, "-q")
    assert r.exit_code == 0, r.output


# -- class 7: silent modelling defaults ------------------------------------------------
def _model_scenario(tmp_path, tp: str, links: str) -> Path:
    p = tmp_path / "m.toml"
    p.write_text(f'[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n[model]\nlayers = 2\n'
                 f'tp = {tp}\nactivation_bytes = 1e6\n[model.links]\n{links}\n')
    return p


def test_a_tp_group_wider_than_a_node_needs_the_inter_link(tmp_path):
    """tp = 8 ran 105.6 and tp = 9 30: the 9-GPU group fell on the unset inter-node link,
    free. Now it is refused, naming the key to set; with it set, tp = 9 costs more than 8."""
    intra = "intra = { bandwidth = 1e5 }"
    r = run("simulate", _model_scenario(tmp_path, "9", intra), "-q")
    assert r.exit_code == 2 and "set [model.links] inter" in r.stderr, r.output

    def makespan(tp: str, links: str) -> float:
        p = tmp_path / "tl.json"
        assert run("simulate", _model_scenario(tmp_path, tp, links), "-q", "--json",
                   p).exit_code == 0
        return json.loads(p.read_text())["makespan"]

    both = intra + "\ninter = { bandwidth = 2e4 }"
    assert makespan("9", both) > makespan("8", both) > 0


def test_absurd_group_sizes_are_bounded_by_the_work_limits(tmp_path):
    r = run("simulate", _model_scenario(tmp_path, str(10 ** 30), ""), "-q")
    assert r.exit_code == 2 and "above the limit of 4,096 ranks" in r.stderr, r.output


# -- class 5: terminal control sequences -----------------------------------------------
#: ESC sequences a name may carry: OSC (window title), CSI (clear screen), a bare ESC and
#: a C1 control
CONTROL_NAMES = ["a\x1b]0;pwned\x07b", "\x1b[2Jcleared", "x\x1bcy", "z\x9bq"]


@pytest.mark.parametrize("name", CONTROL_NAMES, ids=["osc", "csi", "esc", "c1"])
@pytest.mark.parametrize("field", ["schedule", "unit"])
@pytest.mark.parametrize("command", ["stalls", "memory", "align", "render"])
def test_control_sequences_in_names_never_reach_the_terminal(tmp_path, timeline, name,
                                                             field, command):
    """A Timeline's texts are valid data with ESC sequences in them: every command prints
    them as escapes (``\\x1b``), and matplotlib draws them without a glyph warning."""
    import warnings

    p = tmp_path / "esc.json"
    p.write_text(json.dumps({**timeline, field: name}))
    extra = ["-o", tmp_path / "esc.png"] if command == "render" else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run(command, p, *extra)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x9b" not in r.output and "\x07" not in r.output
    assert not [w for w in caught if "Glyph" in str(w.message)]


def test_a_file_name_with_control_characters_is_printed_escaped(tmp_path, timeline):
    p = tmp_path / "we\x1b[2Jird.json"
    p.write_text(json.dumps({**timeline, "semantics": "bogus"}))
    r = run("stalls", p)
    assert r.exit_code == 2 and "\\x1b" in r.stderr and "\x1b" not in r.stderr


# -- class 4: outputs ------------------------------------------------------------------
def _traces(tmp_path):
    from test_trace_import import runtime_traces

    return runtime_traces(tmp_path)


def test_import_trace_json_and_program_out_on_one_path(tmp_path):
    a, b = _traces(tmp_path)
    x = tmp_path / "x"
    r = run("import-trace", a, b, "--json", x, "--program-out", x)
    assert r.exit_code == 2 and "both write" in r.stderr, r.output
    assert not x.exists()


def test_json_inside_the_out_dir_it_creates(tmp_path):
    """``check-trace --json od/x.json --out-dir od`` said the folder did not exist though
    --out-dir creates it; ``--json od/NAME-errors.json`` overwrote the out-dir's own
    file. Now the first runs and the second is refused before any work."""
    a, b = _traces(tmp_path)
    od = tmp_path / "od"
    r = run("check-trace", a, b, "--json", od / "x.json", "--out-dir", od, "--name", "pp")
    assert r.exit_code == 0, r.output
    assert (od / "x.json").exists() and (od / "pp-errors.json").exists()
    od2 = tmp_path / "od2"
    r = run("check-trace", a, b, "--json", od2 / "pp-errors.json", "--out-dir", od2,
            "--name", "pp")
    assert r.exit_code == 2 and "--json and --out-dir both write" in r.stderr, r.output
    assert not od2.exists()


@pytest.mark.parametrize("name", ["../../escaped", "/abs/name", "..", ".hidden"])
def test_names_never_leave_the_out_dir(tmp_path, name):
    a, b = _traces(tmp_path)
    od = tmp_path / "deep" / "od"
    before = set(tmp_path.rglob("*"))
    r = run("check-trace", a, b, "--out-dir", od, "--name", name)
    assert r.exit_code == 0, r.output
    made = sorted(p for p in set(tmp_path.rglob("*")) - before if p.is_file())
    assert len(made) == 6 and all(p.parent == od for p in made), made


# -- class 6: signals at any moment ----------------------------------------------------
def _signal_trial(folder: Path, signum: int, delay: float) -> tuple[int, str, list[str]]:
    """Run a command that writes three outputs, send ``signum`` after ``delay`` seconds;
    (exit code, stderr, the files left in ``folder``)."""
    import subprocess
    import sys

    folder.mkdir()
    args = [sys.executable, "-m", "schedsim", "simulate", "-s", "dualpipe", "-p", "8", "-m",
            "32", "-q", "--json", folder / "a.json", "--gantt", folder / "b.png", "--trace",
            folder / "c.json"]
    import signal

    def held() -> None:     # as a launcher may: the signals wait until schedsim takes them
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

    p = subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, preexec_fn=held)
    try:
        p.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        p.send_signal(signum)
    _, err = p.communicate(timeout=120)
    return p.returncode, err, sorted(f.name for f in folder.iterdir())


def test_signals_at_random_moments_leave_all_or_nothing(tmp_path):
    """30 runs of a command writing three outputs, each sent SIGTERM or SIGINT at a
    pseudo-random moment from its start to past its end (stratified: one delay drawn in
    each thirtieth of 1.1 x the measured length of an undisturbed run, so every stretch of
    the run is hit, which 50 independent draws did not promise; the child starts with both signals blocked, as a launcher
    may, so one sent during the interpreter's own start-up is held until schedsim's entry
    point takes it): every run exits 0, 130 or 143 with at most one
    ``error:`` line and no traceback or "Exception ignored", leaves all three outputs or
    none, no temporary file, and says which it did."""
    import random
    import signal
    import time
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    rc, err, files = _signal_trial(tmp_path / "undisturbed", signal.SIGTERM, 600)
    length = time.monotonic() - t0
    assert rc == 0 and files == ["a.json", "b.png", "c.json"], err
    rng = random.Random(23)
    n = 30
    trials = [(tmp_path / f"t{i}", (signal.SIGTERM, signal.SIGINT)[i % 2],
               (i + rng.random()) / n * 1.1 * length) for i in range(n)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda t: _signal_trial(*t), trials))
    codes = set()
    for (folder, signum, delay), (rc, err, files) in zip(trials, results):
        what = f"signal {signum} at {delay:.2f} s: rc {rc}, files {files}, stderr {err!r}"
        codes.add(rc)
        assert rc in (0, 128 + signum), what
        assert "Traceback" not in err and "Exception ignored" not in err, what
        assert files in ([], ["a.json", "b.png", "c.json"]), what
        if rc:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: stopped by "), what
            assert ("no output written" in lines[0]) == (files == []), what
    assert codes - {0}, "no trial was stopped: the delays missed the run"


def test_a_stop_swallowed_by_a_garbage_collector_callback_still_stops_before_commit(
        tmp_path, capfd):
    """A stop signal whose handler runs inside a weakref callback (matplotlib's transform
    tree frees its children so) raises where Python only prints "Exception ignored" and
    goes on: CI once saw such a run finish with rc 0 and a traceback on stderr. The stop
    stays pending, silently, and stops the run before its outputs are renamed: none is
    written, and the command's Stopped names the signal."""
    import gc
    import os
    import signal
    import weakref

    from schedsim.errors import Stopped
    from schedsim.util.files import output_group
    from schedsim.util.signals import stop_signals

    class Node:
        pass

    out = tmp_path / "a.json"
    with pytest.raises(Stopped) as stopped:
        with stop_signals(), output_group() as group:
            group.path(out).write_text("{}")
            node = Node()
            # the signal arrives while the callback runs: its Stopped is unraisable there
            ref = weakref.ref(node, lambda _: os.kill(os.getpid(), signal.SIGTERM))
            del node
            gc.collect()
            assert ref() is None
    assert stopped.value.signum == signal.SIGTERM
    assert "no output written" in str(stopped.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err


# -- class 3: trace import trusts numbers ----------------------------------------------
def test_a_negative_tensor_dimension_is_no_size(tmp_path):
    """A negative ``Input Dims`` gave negative message bytes (exit 0) and check-trace then
    crashed building a cost model: such a record's size is unknown, never negative."""
    from test_trace_import import ev, write

    from schedsim.interop.kineto import import_traces

    dims = {"Input Dims": [[[4, -64]], [], [], []], "Concrete Inputs": ["", "", "1", "0"]}
    r0 = [ev("PP:0F0", 0, 10), ev("PP:0SEND_F0", 10, 5), ev("c10d::send", 11, 2, **dims),
          ev("gloo:send", 12, 30, **{"Input type": ["float"]})]
    tl = import_traces([write(tmp_path / "a.json", 0, r0)])
    assert all(m.bytes >= 0 for m in tl.messages)


#: absurd but finite numbers a corrupt trace holds
ABSURD = [1e30, -1e308, 1e17 * 1.5, -1.0, 2 ** 64, float("nan"), "12", True, None]


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_traces_with_absurd_numbers_are_refused_or_sane(tmp_path, data):
    """Property: one event's ``ts``, ``dur`` or tensor dimension set to an absurd value:
    import-trace and check-trace exit 0 with finite times within the makespan and bytes
    >= 0, or 2 with one line; never a traceback."""
    from test_trace_import import runtime_traces

    a, b = runtime_traces(tmp_path)
    path = data.draw(st.sampled_from([a, b]))
    d = json.loads(path.read_text())
    i = data.draw(st.integers(0, len(d["traceEvents"]) - 1))
    key = data.draw(st.sampled_from(["ts", "dur", "dims"]))
    value = data.draw(st.sampled_from(ABSURD))
    if key == "dims":
        d["traceEvents"][i].setdefault("args", {})["Input Dims"] = [[[4, value]]]
    else:
        d["traceEvents"][i][key] = value
    path.write_text(json.dumps(d))
    out = tmp_path / "tl.json"
    r = run("import-trace", a, b, "--json", out)
    one_line_or_ok(r)
    if r.exit_code == 0:
        tl = json.loads(out.read_text())
        assert all(0 <= s["start"] <= s["end"] <= tl["makespan"] < 1e12 for s in tl["spans"])
        assert all(m["bytes"] >= 0 for m in tl["messages"])
    one_line_or_ok(run("check-trace", a, b))


def test_a_busy_rendezvous_port_is_named_with_the_setting_to_change(monkeypatch):
    """Under torchrun (env:// rendezvous) a busy MASTER_PORT said only "Address already in
    use": the error names the port and what sets it."""
    import socket

    from schedsim.replay.config import ReplayError
    from schedsim.replay.launch import init_group

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SCHEDSIM_LAUNCHER_PID", raising=False)
    try:
        with pytest.raises(ReplayError, match=rf"MASTER_PORT={port} on 127.0.0.1 is "
                                              rf"already in use.*--master-port"):
            init_group("gloo", 0, 1, 5.0)
    finally:
        held.close()


def test_a_stop_inside_a_validation_is_the_users_not_the_inputs(monkeypatch, tmp_path) -> None:
    """A stop signal that lands while pydantic validates an input (which also builds the
    model's schema on the first validation: defer_build) goes up as the stop (exit
    128 + N), never wrapped as that input's error (exit 2, 'command line: stopped by')."""
    import signal

    from schedsim.errors import Stopped
    from schedsim.interop.schedule_files import load_schedule_file
    from schedsim.program.ir import Schedule
    from schedsim.scenario import Scenario, parse_scenario
    from schedsim.workload.layout import Workload, workload_from_dict

    def stop(*a, **k):
        raise Stopped(signal.SIGTERM)

    for model in (Scenario, Workload, Schedule):
        monkeypatch.setattr(model, "model_validate", stop)
    sched = tmp_path / "s.json"
    sched.write_text('{"placement": {"kind": "loop", "ranks": 1, "stages": 1}, '
                     '"microbatches": 1, "ranks": [["0F0"]]}')
    for call in (lambda: parse_scenario({"schedule": {"name": "1f1b"}}, "command line"),
                 lambda: workload_from_dict({"model": "llama3.1-8b"}),
                 lambda: load_schedule_file(sched)):
        with pytest.raises(Stopped) as e:
            call()
        assert e.value.exit_code == 128 + signal.SIGTERM

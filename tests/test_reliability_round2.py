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

"""Output through a pipe (issue 27): full rows when stdout is not a terminal, ``--format
table|csv|json`` on the commands that print tables, ``-`` as stdout for an output."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from schedsim.cli import app

T10 = "schedules/dualpipe-issue-t10-t12.toml"
ALIGN = ["align", T10, "--semantics", "rendezvous", "--rank", "5"]
QUERY = ["query", T10, "--semantics", "all", "--effect", "rank=5 W mb=0",
         "--cause", "rank=5 SEND_B mb=0"]


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


def _rows(stdout: str) -> list[dict]:
    """The rows of a one-table ``--format json`` document (one key: the table's id)."""
    doc = json.loads(stdout)
    assert len(doc) == 1, list(doc)
    return next(iter(doc.values()))["rows"]


def _shown(v: object) -> str:
    """A json cell as the table prints it (these tables' numbers are whole)."""
    return "-" if v is None else str(v)


def _run(args: list[str]) -> object:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r


def test_align_through_a_real_pipe_prints_whole_rows() -> None:
    """`schedsim align ... | cat`: every row on one line (its message and its consumer
    together), no cut cell."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "schedsim", *ALIGN, "--all"],
                         stdout=subprocess.PIPE, text=True, env=env, check=True,
                         timeout=120).stdout
    rows = _rows(_run([*ALIGN, "--format", "json"]).stdout)
    assert len(rows) == 80 and "…" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert len(lines) == len(rows)
    for ln, row in zip(lines, rows):
        cells = [c.strip() for c in ln.strip("│").split("│")]
        assert [c or "-" for c in cells] == [_shown(v) for v in row.values()]


@pytest.mark.parametrize("args", [ALIGN, QUERY], ids=["align", "query"])
def test_piped_table_has_no_broken_word(args: list[str]) -> None:
    out = _run(args).stdout
    assert "…" not in out
    rows = _rows(_run([*args, "--format", "json"]).stdout)
    table = [[c.strip() for c in ln.strip("│").split("│")]
             for ln in out.splitlines() if ln.startswith("│")]
    assert [[c or "-" for c in r] for r in table] == [
        [_shown(v) for v in r.values()] for r in rows][:len(table)]
    assert len(table) == min(len(rows), 40)     # the table's --limit


@pytest.mark.parametrize("args", [ALIGN, QUERY], ids=["align", "query"])
def test_csv_parses_into_the_json_rows(args: list[str]) -> None:
    rc = _run([*args, "--format", "csv"])
    rj = _run([*args, "--format", "json"])
    header, *rows = list(csv.reader(io.StringIO(rc.stdout)))
    recs = _rows(rj.stdout)       # one table: plain csv, its header the json keys
    assert header == list(recs[0])
    assert [dict(zip(header, r)) for r in rows] == [
        {k: "" if v is None else str(v) for k, v in r.items()} for r in recs]
    assert len(recs) == (80 if args is ALIGN else 3)       # csv/json: every row, no --limit
    assert "messages flagged" in rc.stderr or "freeing both" in rc.stderr  # text: stderr


def test_query_json_rows_are_the_answers() -> None:
    recs = _rows(_run([*QUERY, "--format", "json"]).stdout)
    assert [(r["semantics"], r["effect_at"], r["delay"]) for r in recs] == [
        ("data", 11, 0), ("eager", 12, 0), ("rendezvous", 12, 0)]


def test_several_tables_are_keyed_by_id() -> None:
    r = _run(["critical-path", "-s", "1f1b", "-p", "2", "-m", "2", "--cost", "F=1,BW=2",
              "--slack", "--format", "json"])
    recs = json.loads(r.stdout)
    assert sorted(recs) == ["critical_path", "slack"]
    assert recs["slack"]["title"] == "slack per op (slots)"      # the title names the unit
    slack = recs["slack"]["rows"]
    assert len(slack) == 8 and {s["op"] for s in slack} >= {"0F0", "1BW1"}
    assert min(s["slack"] for s in slack) == 0


def test_json_dash_is_stdout_and_text_goes_to_stderr() -> None:
    r = _run(QUERY + ["--json", "-"])
    recs = json.loads(r.stdout)
    assert [a["semantics"] for a in recs] == ["data", "eager", "rendezvous"]
    assert "freeing both" in r.stderr


def test_two_outputs_on_stdout_are_refused(tmp_path) -> None:
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "2", "-m", "2",
                                 "--json", "-", "--trace", "-"])
    assert r.exit_code == 2
    assert "--json and --trace both write stdout" in r.stderr


def test_trace_dash_is_stdout_and_claims_it(tmp_path) -> None:
    """``--trace -``: the Perfetto trace on stdout, the very bytes ``--trace f.json``
    writes (it was refused, 'use a .json name'); the table goes to stderr; with
    ``--format csv`` both would write stdout: refused as ``--json -`` is."""
    sim = ["simulate", "-s", "1f1b", "-p", "2", "-m", "2"]
    r = _run([*sim, "--trace", "-"])
    _run([*sim, "--trace", str(tmp_path / "t.json")])
    assert r.stdout == (tmp_path / "t.json").read_text()
    ops = [e["name"] for e in json.loads(r.stdout)["traceEvents"]
           if e.get("ph") == "X" and e["name"].startswith(("F ", "BW "))]
    assert sorted(ops) == sorted(["BW mb0", "BW mb1", "F mb0", "F mb1"] * 2)  # 2 ranks
    assert "makespan 9 slots" in r.stderr
    r = CliRunner().invoke(app, [*sim, "--trace", "-", "--format", "csv"])
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.strip() == (
        "error: --format csv and --trace both write stdout: give one of them a file name")


@pytest.mark.parametrize("cmd,quiet_lines", [
    (["simulate", "-s", "1f1b", "-p", "4", "-m", "8"],
     ["makespan 33 slots   bubble ratio 0.273 (idle / (ranks x makespan))"]),
    (["compare", "-p", "4", "-m", "8", "--schedules", "1f1b,zbv"],
     ["1f1b: makespan 33 slots, bubble ratio 0.273",
      "zbv: makespan 25.5 slots, bubble ratio 0.059"]),
    (["plan", "--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--tp", "2",
      "--pp", "4", "--schedules", "1f1b", "--recompute", "none"], None)])
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_quiet_with_a_data_format_prints_the_rows(cmd, quiet_lines, fmt: str) -> None:
    """``-q --format csv|json`` (simulate, compare, plan: commands with their own -q):
    stdout holds the very rows ``--format csv|json`` alone prints (it held nothing); -q
    still silences the human-readable lines: stderr has the -q lines alone."""
    full, quiet = _run([*cmd, "--format", fmt]), _run([*cmd, "--format", fmt, "-q"])
    assert quiet.stdout == full.stdout and full.stdout.strip()
    if quiet_lines is None:         # plan's -q drops its tables alone: the same lines
        assert quiet.stderr == full.stderr and quiet.stderr.startswith("plan: llama3.1-8b")
    else:
        assert quiet.stderr.splitlines() == quiet_lines != full.stderr.splitlines()


def test_unknown_format_is_refused() -> None:
    r = CliRunner().invoke(app, [*ALIGN, "--format", "cvs"])
    assert r.exit_code == 2 and "did you mean 'csv'" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_json_dash_with_a_data_format_is_refused(fmt: str) -> None:
    """``--json -`` and ``--format csv|json`` would both write stdout: one line, exit 2,
    nothing on stdout."""
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "2", "-m", "2",
                                 "--json", "-", "--format", fmt])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"error: --format {fmt} and --json both write stdout: "
                                "give one of them a file name")


def test_json_dash_with_table_format_keeps_stdout_for_the_json() -> None:
    r = _run(["simulate", "-s", "1f1b", "-p", "2", "-m", "2", "--json", "-",
              "--format", "table"])
    assert json.loads(r.stdout)["makespan"] == 9.0      # (m + p - 1) x (F + B), F=1 B=2


@pytest.mark.parametrize("extra", [[], ["--format", "csv"], ["--json", "-"]],
                         ids=["table", "csv", "json-dash"])
def test_closed_pipe_on_stdout_finishes_the_command(tmp_path, extra: list[str]) -> None:
    """``schedsim simulate ... | head -1``, the reader gone before anything is written
    (a pipe whose read end is closed: every write is EPIPE): the rest of stdout goes to
    /dev/null, the output files are written whole, exit 0, nothing on stderr but the
    command's own text."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    outs = ["--trace", str(tmp_path / "tr.json")]
    if extra != ["--json", "-"]:
        outs += ["--json", str(tmp_path / "t.json")]
    try:
        p = subprocess.run([sys.executable, "-m", "schedsim", "simulate", "-s", "1f1b",
                            "-p", "4", "-m", "8", *outs, *extra], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "error" not in p.stderr.lower()
    events = json.loads((tmp_path / "tr.json").read_text())
    # every F and B of 4 ranks x 8 microbatches
    assert len([e for e in events["traceEvents"] if e.get("cat") == "compute"]) == 4 * 8 * 2
    if extra != ["--json", "-"]:
        assert json.loads((tmp_path / "t.json").read_text())["makespan"] == 33.0
    if extra:       # stdout carried data: the text went to stderr, whole
        assert "makespan 33 slots" in p.stderr

"""The `schedsim` command: main job, JSON contract, errors (exit 2, one line, no traceback,
no partial file) and deadlocks (exit 3, JSON still written)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SCHEDULES
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.program.tokens import parse_program_text

runner = CliRunner()

DEADLOCK_PROGRAM = """\
rank 0: 0F0 0SEND_F0 COMMIT 0F1 0SEND_F1 COMMIT 2RECV_F0 COMMIT 2F0 2SEND_F0 COMMIT 2RECV_F1 COMMIT 2F1 2SEND_F1 COMMIT
rank 1: 1RECV_F0 COMMIT 1F0 1SEND_F0 COMMIT 1RECV_F1 COMMIT 1F1 1SEND_F1 COMMIT 3RECV_F0 COMMIT 3F0 3RECV_F1 COMMIT 3F1
"""


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_main_job(tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "dp.json", tmp_path / "dp.png"
    r = run("simulate", SCHEDULES / "dualpipe-figure.toml", "--json", out_json,
            "--gantt", out_png)
    assert r.exit_code == 0, r.output
    assert "makespan 66" in r.stdout
    d = json.loads(out_json.read_text())
    assert {"schedule", "ranks", "microbatches", "semantics", "makespan", "per_rank",
            "spans", "messages", "deadlock"} <= set(d)
    assert (d["schedule"], d["ranks"], d["microbatches"], d["semantics"], d["makespan"],
            d["deadlock"]) == ("dualpipe", 8, 20, "data", 66.0, None)
    assert d["per_rank"][5] == {"rank": 5, "busy": 60.0, "idle": 6.0,
                                "bubble_ratio": pytest.approx(6 / 66),
                                "first_start": 2.0, "last_end": 66.0}
    span = d["spans"][0]
    assert set(span) >= {"rank", "kind", "mb", "chunk", "stage", "start", "end", "parts"}
    fb = next(s for s in d["spans"] if s["kind"] == "FB")
    assert [p["kind"] for p in fb["parts"]] == ["F", "BW"] and fb["mb"] == fb["parts"][0]["mb"]
    msg = d["messages"][0]
    assert set(msg) >= {"kind", "src", "dst", "mb", "send_posted", "recv_posted", "start",
                        "arrival"}
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flags_equal_scenario(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run("simulate", SCHEDULES / "dualpipe-figure.toml", "--semantics", "rendezvous",
               "--json", a, "-q").exit_code == 0
    r = run("simulate", "--schedule", "dualpipe", "--ranks", 8, "--microbatches", 20,
            "--cost", "F=1,B=1,W=1,BW=2,FB=3", "--semantics", "rendezvous", "--json", b, "-q")
    assert r.exit_code == 0, r.output
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ja["spans"] == jb["spans"] and ja["makespan"] == jb["makespan"] == 66


def test_1f1b_scenario() -> None:
    r = run("simulate", SCHEDULES / "1f1b.toml")
    assert r.exit_code == 0 and "makespan 33" in r.stdout and "0.273" in r.stdout


def test_deadlock_exit_3_writes_json(tmp_path: Path) -> None:
    prog, out = tmp_path / "prog.txt", tmp_path / "dl.json"
    prog.write_text(DEADLOCK_PROGRAM)
    r = run("simulate", "--program", prog, "--ranks", 2, "--stages", 4, "--placement",
            "loop", "--semantics", "rendezvous", "--json", out)
    assert r.exit_code == 3
    assert "rank 0 waits at instr 5 (COMMIT)" in r.stderr and "1RECV_F1" in r.stderr
    assert "2RECV_F0" in r.stderr
    d = json.loads(out.read_text())
    assert {c["rank"] for c in d["deadlock"]["cycle"]} == {0, 1}
    r = run("simulate", "--program", prog, "--ranks", 2, "--stages", 4, "--placement",
            "loop", "--semantics", "eager")
    assert r.exit_code == 0 and "makespan 5" in r.stdout


def test_generate_program_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "dp.txt"
    assert run("generate", "dualpipe", "-p", 4, "-m", 8, "--out", out).exit_code == 0
    rows = parse_program_text(out.read_text())
    from schedsim import generate
    assert rows == generate("dualpipe", 4, 8).ranks
    r = run("simulate", "--program", out, "--placement", "dual", "--microbatches", 8,
            "--cost", "F=1,B=1,W=1,BW=2,FB=3")
    assert r.exit_code == 0 and "makespan 26" in r.stdout


def test_generate_takes_the_schedule_as_simulate_does() -> None:
    """``generate -s NAME`` (simulate's flag) writes what ``generate NAME`` writes; two
    different names, or none, are one line each, exit 2."""
    a = run("generate", "zbv", "-p", 4, "-m", 8)
    b = run("generate", "-s", "zbv", "-p", 4, "-m", 8)
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout
    assert a.stdout.startswith("rank 0: ")
    r = run("generate", "zbv", "-s", "1f1b", "-p", 4, "-m", 8)
    assert r.exit_code == 2 and "two schedules named: 'zbv' and -s '1f1b'" in r.output
    r = run("generate", "-p", 4, "-m", 8)
    assert r.exit_code == 2 and "generate needs a schedule" in r.output
    assert r.output.count("\n") == 1


def test_list() -> None:
    r = run("list")
    assert r.exit_code == 0
    for name in ("gpipe", "1f1b", "dualpipe", "dualpipev"):
        assert name in r.stdout


def _bad(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("args,needle", [
    (["simulate", "--schedule", "nosuch", "-p", 4, "-m", 8], "unknown schedule 'nosuch'"),
    (["simulate", "--schedule", "dualpipe", "-p", 3, "-m", 12], "even number of ranks"),
    (["simulate", "--schedule", "1f1b", "-p", 4, "-m", 8, "--cost", "F=1,G=2"],
     "unknown cost key 'G'"),
    (["simulate", "--schedule", "1f1b", "-p", 4, "-m", 8, "--cost", "F=x"], "not a number"),
    (["simulate", "--schedule", "1f1b", "-p", 4, "-m", 8, "--semantics", "fast"],
     "semantics"),
    (["simulate", "nosuch.toml"], "no such scenario file"),
])
def test_bad_input_exit_2(args, needle, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    r = run(*args, "--json", out)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and r.stderr.startswith("error:")
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("text,needle", [
    ("[schedule\nname = 1", "malformed TOML"),
    ("[schedule]\nname='1f1b'\nranks=4\nmicrobatches=8\n[costs]\nG = 1\n", "unknown key 'costs.G' (allowed: F, B, W, BW, FB"),
    ("[schedule]\nname='1f1b'\nranks=4\nmicrobatches=8\n[comm]\nsemantics='x'\n",
     "comm.semantics"),
    ("[schedule]\nname='1f1b'\nranks=4\nmicrobatches=8\n[costs]\nF = -1\n", "costs.F"),
    ("[schedule]\nname='1f1b'\nranks=4\n", "set ranks and microbatches"),
    ("[schedule]\nname='1f1b'\nranks=4\nmicrobatches=8\nwhatever=3\n",
     "takes no parameter 'whatever'"),
    ("[typo]\n", "unknown key 'typo'"),
])
def test_bad_scenario_exit_2(text, needle, tmp_path: Path) -> None:
    out = tmp_path / "g.png"
    r = run("simulate", _bad(tmp_path, text), "--gantt", out)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_no_traceback_in_a_real_process(tmp_path: Path) -> None:
    """Through the console entry point: one line on stderr, exit 2, no traceback."""
    p = subprocess.run([sys.executable, "-m", "schedsim", "simulate", "--schedule",
                        "dualpipe", "--ranks", "5", "--microbatches", "20"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "even number of ranks" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_program_stages_default_to_what_it_uses(tmp_path: Path) -> None:
    """Without --stages a loop program gets the fewest stages (a multiple of ranks) that
    fit; too few explicit stages is an error that says what to pass."""
    prog = tmp_path / "prog.txt"
    prog.write_text(DEADLOCK_PROGRAM)
    r = run("simulate", "--program", prog, "--semantics", "eager")
    assert r.exit_code == 0 and "makespan 5" in r.stdout
    r = run("simulate", "--program", prog, "--stages", 2)
    assert r.exit_code == 2 and "uses stage 3" in r.stderr and "--stages 4" in r.stderr
    r = run("simulate", "--program", prog, "--microbatches", 1)
    assert r.exit_code == 2 and "uses microbatch 1" in r.stderr


@pytest.mark.parametrize("extra,needle", [
    ("[costs.stage.7]\nF = 2\n", "[costs.stage.7]: the program has stages 0..3"),
    ("[[costs.overrides]]\nstage = 0\nmb = 99\nkind = 'F'\ncost = 2\n", "mb 99"),
    ("[[link.links]]\nsrc = 0\ndst = 9\nlatency = 1\n", "src 0 dst 9"),
    ("program = 'x.txt'\n", "sets name and program"),
])
def test_scenario_references_must_exist(extra, needle, tmp_path: Path) -> None:
    text = "[schedule]\nname='1f1b'\nranks=4\nmicrobatches=8\n"
    if extra.startswith("program"):
        text = "[schedule]\nname='1f1b'\nranks=4\nmicrobatches=8\n" + extra
    else:
        text += extra
    r = run("simulate", _bad(tmp_path, text))
    assert r.exit_code == 2 and needle in r.stderr, r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--param", "overlap=maybe"], "bad value overlap='maybe'"),
    (["--cost", "F=1,F=2"], "cost F given twice"),
    (["--cost", "F=1e308,BW=1e308,B=1e308,W=1e308,FB=1e308"], "from 0 to 1e+15"),
    (["--message-bytes", "1e300", "--bandwidth", "1e-300", "--semantics", "eager"],
     "overflow"),
    (["--latency", "inf"], "finite"),
    (["--placement", "v"], "fixed by the generator"),
])
def test_bad_flags(args, needle) -> None:
    r = run("simulate", "-s", "dualpipe", "-p", 4, "-m", 8, *args)
    assert r.exit_code == 2 and needle in r.stderr, r.stderr


def test_param_values_are_typed() -> None:
    a = run("simulate", "-s", "dualpipe", "-p", 8, "-m", 20, "--cost",
            "F=1,B=1,W=1,BW=2,FB=3", "--param", "overlap=no")
    b = run("simulate", "-s", "dualpipe", "-p", 8, "-m", 20, "--cost",
            "F=1,B=1,W=1,BW=2,FB=3", "--param", "overlap=false")
    assert a.exit_code == b.exit_code == 0
    assert "makespan 63" in a.stdout and "makespan 63" in b.stdout


@pytest.mark.parametrize("cmd", [["simulate", SCHEDULES / "1f1b.toml"],
                                 ["compare", "-p", "2", "-m", "2", "--schedules", "1f1b"]])
def test_a_figure_path_that_is_a_folder_or_stdout_says_so(tmp_path: Path, cmd) -> None:
    """``--gantt DIR`` and ``--gantt -`` said "unsupported figure format ''"."""
    r = run(*cmd, "--gantt", tmp_path)
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.strip() == (
        f"error: {tmp_path} is a directory: give a file name such as {tmp_path}/gantt.png")
    r = run(*cmd, "--gantt", "-")
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.strip() == (
        "error: a figure cannot go to stdout: give a file name (.png, .svg, .pdf)")
    assert list(tmp_path.iterdir()) == []


def test_outputs_appear_together_or_not_at_all(tmp_path: Path) -> None:
    ok = tmp_path / "ok.json"
    r = run("simulate", SCHEDULES / "1f1b.toml", "--json", ok, "--gantt",
            tmp_path / "nodir" / "x.png")
    assert r.exit_code == 2 and "folder" in r.stderr and "does not exist" in r.stderr
    assert not ok.exists() and not (tmp_path / "nodir").exists()
    r = run("simulate", SCHEDULES / "1f1b.toml", "--json", tmp_path)
    assert r.exit_code == 2 and "is a directory" in r.stderr
    assert list(tmp_path.iterdir()) == []      # no temporary file left behind


def test_wrong_files_are_named(tmp_path: Path) -> None:
    tl = tmp_path / "tl.json"
    assert run("simulate", SCHEDULES / "1f1b.toml", "-q", "--json", tl).exit_code == 0
    r = run("simulate", "--schedule-file", tl)
    assert r.exit_code == 2 and "Timeline JSON" in r.stderr
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    r = run("simulate", "--program", png)
    assert r.exit_code == 2 and "not a program text file" in r.stderr


def test_deadlock_still_draws_what_ran(tmp_path: Path) -> None:
    prog, png = tmp_path / "prog.txt", tmp_path / "dl.png"
    prog.write_text(DEADLOCK_PROGRAM)
    r = run("simulate", "--program", prog, "--semantics", "rendezvous", "--gantt", png)
    assert r.exit_code == 3 and png.read_bytes()[:4] == b"\x89PNG"

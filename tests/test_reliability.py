"""Bad input as an attacker or a careless user gives it (issue 13): every reproducer exits
2 with one line and no traceback (or 0 where the input is valid), work is refused up front
by the limits (and ``--max`` raises them), input files must be regular UTF-8 text files,
user text is never markup nor mathtext, two outputs never share a path nor overwrite an
input, temporary files go away on SIGTERM and, after a SIGKILL, with the next run, and
cost files are lossless."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import typer
from conftest import SCHEDULES
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.cli.common import handle_errors
from schedsim.errors import InputError, LimitError
from schedsim.timeline import Timeline
from schedsim.util import limits
from schedsim.util.files import TMP_MARK, atomic_path, temp_tag
from schedsim.util.inputs import read_input_text
from schedsim.util.text import excerpt, mpl_escape, rich_escape, shorten_quotes

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(r, code: int = 2) -> str:
    """The result's single ``error:`` line (asserting exit ``code``, no traceback)."""
    assert r.exit_code == code, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    err = r.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in r.output
    return err


@pytest.fixture
def tl_json(tmp_path) -> dict:
    r = run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "-q", "--json",
            tmp_path / "tl.json")
    assert r.exit_code == 0, r.output
    return json.loads((tmp_path / "tl.json").read_text())


# -- up-front limits -------------------------------------------------------------------
def test_huge_generator_refused_at_once_with_the_flag_to_raise_it() -> None:
    """`simulate -s 1f1b -p 1000000 -m 8` is refused before anything is built: one line
    with the estimate and the --max flag, and almost no memory (the old code built it
    for minutes, 3.4 GB)."""
    tracemalloc.start()
    r = run("simulate", "-s", "1f1b", "-p", "1000000", "-m", "8", "-q")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = one_line_error(r)
    assert "1,000,000 ranks: above the limit of 4,096 ranks" in err
    assert "--max ranks=1000000" in err
    assert peak < 20e6
    err = one_line_error(run("simulate", "-s", "zbv", "-p", "4000", "-m", "20000", "-q"))
    assert "8,000 stages x 20,000 microbatches: about 1,920,000,000 instructions" in err
    assert "--max instructions=1920000000" in err
    err = one_line_error(run("simulate", "-s", "looped-bfs", "-p", "4", "-m", "4",
                             "--chunks", "999999999", "-q"))
    assert "instructions" in err


def test_max_raises_a_limit_and_bad_max_is_named() -> None:
    one_line_error(run("simulate", "-s", "1f1b", "-p", "8", "-m", "4", "-q", "--max",
                       "ranks=4"))
    assert run("simulate", "-s", "1f1b", "-p", "5000", "-m", "1", "-q", "--max",
               "ranks=5000").exit_code == 0
    assert "bad --max 'x=1'" in one_line_error(run("simulate", "-s", "1f1b", "-p", "2", "-m",
                                                   "2", "--max", "x=1"))
    assert "whole number" in one_line_error(run("simulate", "-s", "1f1b", "-p", "2", "-m",
                                                "2", "--max", "ranks=nan"))


def test_estimate_bounds_every_generator() -> None:
    """The estimate (INSTR_PER_CELL x stages x microbatches) is an upper bound of what
    each generator and comm policy emits, so a size under the limit is never refused
    wrongly."""
    from schedsim.errors import ScheduleError
    from schedsim.generators import build_program, get, names
    from schedsim.program.lower import POLICIES
    from schedsim.generators import generated_stages as _generated_stages

    for name in names():
        for p, m in ((2, 4), (4, 8), (3, 9), (8, 16), (8, 2)):
            for policy in POLICIES:
                params = {"chunks": 3} if "chunks" in get(name).accepted() else {}
                try:
                    prog = build_program(name, p, m, policy, **params)
                except ScheduleError:
                    continue
                stages = _generated_stages(get(name), p, params)
                assert stages == prog.placement.stages, name
                assert prog.num_instructions() <= limits.estimate_instructions(stages, m)


def test_program_with_a_huge_index_is_refused(tmp_path) -> None:
    """`1000000000F0` (one token) no longer builds per-stage tables until memory runs
    out; nor does a stage within the digit bound but above the work limit."""
    p = tmp_path / "p.txt"
    p.write_text("1000000000F0\n")
    tracemalloc.start()
    err = one_line_error(run("simulate", "--program", p, "-q"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "a number of 10 digits" in err and peak < 20e6
    p.write_text("0F0 99999999F0\n")
    assert "per-stage, per-microbatch" in one_line_error(run("simulate", "--program", p, "-q"))
    p.write_text("0F0 0B0 0W0\n")
    assert "100,000,000 stages" in one_line_error(
        run("simulate", "--program", p, "--stages", "100000000", "-q"))


def test_stage_model_layers_are_bounded(tmp_path) -> None:
    """`[model] layers = 99999999` looped for minutes over the layers; now refused."""
    sc = tmp_path / "s.toml"
    sc.write_text('[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n'
                  '[model]\nlayers = 99999999\n')
    assert "99,999,999 layers per stage" in one_line_error(run("simulate", sc, "-q"))
    sc.write_text('[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n'
                  '[model]\nlayers = 2000000\n')           # one stage fits, two do not
    assert "on 2 stages: about 32,000,000 pieces" in one_line_error(run("simulate", sc, "-q"))


def test_replay_process_limit() -> None:
    pytest.importorskip("torch")
    err = one_line_error(run("replay", "-s", "1f1b", "-p", "256", "-m", "256"))
    assert "256 processes" in err and "--max procs=256" in err


# -- input files -----------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_fifo_dev_zero_and_folders_are_not_input_files(tmp_path) -> None:
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a regular file" in one_line_error(
        run("simulate", "--program", fifo, "-q"))
    sc = tmp_path / "s.toml"
    sc.write_text('[schedule]\nprogram = "/dev/zero"\n')
    assert "/dev/zero: is a character device" in one_line_error(run("simulate", sc, "-q"))
    assert "is a directory" in one_line_error(run("render", tmp_path, "-o", tmp_path / "x.png"))


def test_nul_in_path_binary_and_non_utf8(tmp_path) -> None:
    sc = tmp_path / "s.toml"
    sc.write_text('[schedule]\nprogram = "a\\u0000b.txt"\n')
    assert "NUL byte" in one_line_error(run("simulate", sc, "-q"))
    with pytest.raises(InputError, match="NUL byte"):
        read_input_text("a\x00b")
    bad = tmp_path / "c.toml"
    bad.write_bytes(b"[costs]\nF = 1 # \xff\xfe\n")
    err = one_line_error(run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "-q",
                             "--costs-file", bad))
    assert "not a cost file (not UTF-8 text: byte 16 on line 2)" in err
    env = tmp_path / "env.txt"
    env.write_bytes(b"0F0 0B0\x000W0")
    assert "binary data" in one_line_error(run("simulate", "--program", env, "-q"))


def test_size_cap(tmp_path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (3 * 1024 * 1024))
    err = one_line_error(run("render", big, "-o", tmp_path / "x.png", "--max", "file_mb=2"))
    assert "above the limit of 2 MiB per input file" in err and "--max file_mb=3" in err
    with limits.using(file_mb=1), pytest.raises(LimitError):
        read_input_text(big)


def test_gzip_bomb_is_bounded(tmp_path) -> None:
    import gzip

    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b"[" + b" " * (5 * 1024 * 1024) + b"]"))
    err = one_line_error(run("import-trace", p, "--max", "file_mb=1"))
    assert "decompressed: more than" in err


DECODING = [
    ("deep.toml", "a = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ("big.toml", '[schedule]\nname = "1f1b"\nranks = ' + "9" * 4400 + "\n",
     "an integer with too many digits"),
]


@pytest.mark.parametrize("name,text,want", DECODING)
def test_decoding_errors_name_the_file(tmp_path, name, text, want) -> None:
    p = tmp_path / name
    p.write_text(text)
    err = one_line_error(run("simulate", p, "-q"))
    assert f"{p}: cannot read this scenario TOML: {want}" in err


def test_deep_and_huge_json(tmp_path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "recursion limit" in one_line_error(run("render", deep, "-o", tmp_path / "x.png"))
    sched = tmp_path / "s.json"
    sched.write_text('{"name": "x", "placement": {"kind": "loop", "ranks": 1, "stages": 1}, '
                     '"microbatches": ' + "9" * 5000 + ', "ranks": [["0F0"]]}')
    err = one_line_error(run("simulate", "--schedule-file", sched, "-q"))
    assert "cannot read this schedule JSON: an integer with too many digits" in err
    sched.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in one_line_error(run("simulate", "--schedule-file", sched))


def test_csv_field_and_nested_overlap(tmp_path) -> None:
    csv = tmp_path / "x.csv"
    csv.write_text("0F0," + "x" * 140_000 + "\n")
    assert "a cell of 140,000 characters" in one_line_error(
        run("simulate", "--schedule-file", csv, "-q"))
    csv.write_text("(" * 3000 + "0F0" + ";1I0)OVERLAP_F_B" * 3000 + "\n")
    one_line_error(run("simulate", "--schedule-file", csv, "-q"))
    txt = tmp_path / "x.txt"
    txt.write_text("(" * 3000 + "0F0" + ";1B0)OVERLAP_F_B" * 3000 + "\n")
    one_line_error(run("simulate", "--program", txt, "-q"))


def test_trace_base_time_infinity(tmp_path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "schedsim:0F0", "ts": 1, "dur": 1}],'
                 ' "baseTimeNanoseconds": Infinity}')
    assert "baseTimeNanoseconds is inf" in one_line_error(run("import-trace", p))


@pytest.mark.parametrize("table,want", [
    ("[memory]\nF = nan", "finite number"),
    ("[costs.stage_bytes]\n0 = -100", "greater than or equal to 0"),
    ("[costs.stage_bytes]\n0 = nan", "finite number"),
    ("[memory]\nscale = 0", "scale must be 'auto' or a number > 0"),
])
def test_non_physical_numbers(tmp_path, table, want) -> None:
    """`[costs.stage_bytes] 0 = -100` delivered a message before it was sent, `= nan`
    started a consumer before its producer, `[memory] F = nan` crashed: all refused."""
    sc = tmp_path / "s.toml"
    sc.write_text(f'[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 4\n{table}\n')
    assert want in one_line_error(run("simulate", sc, "-q"))


@pytest.mark.parametrize("change,want", [
    (lambda d: d["spans"][0].__setitem__("bogus", 1),
     "spans.0: unknown key 'bogus': expected one of rank, kind"),
    (lambda d: d.__setitem__("ranks", 0), "need ranks >= 1"),
    (lambda d: d["spans"][0].__setitem__("rank", 5), "spans[0] has rank 5"),
    (lambda d: d["spans"][0].__setitem__("end", 1e12), "spans[0] runs from 0.0 to 1000000000000.0"),
    (lambda d: d.__setitem__("makespan", math.nan), "makespan nan"),
    (lambda d: d.__setitem__("ranks", 10 ** 7), "10,000,000 ranks"),
    (lambda d: d["spans"][0].__setitem__("kind", "$x$"), "unknown kind"),
    (lambda d: d.__setitem__("schedule", "x" * 5000), "schedule has 5,000 characters"),
    (lambda d: d["messages"].append({**d["messages"][0], "src": -1}), "messages[8]"),
    # the fuzz campaign's hang: a chunk of 2**31 built a colour per chunk
    (lambda d: d["spans"][0].__setitem__("chunk", 2 ** 31), "chunk 2147483648"),
    (lambda d: d["spans"][0].__setitem__("mb", 2 ** 40), "the timeline has"),
    (lambda d: d["spans"].append(dict(d["spans"][0])), "a second time"),
    # the fuzz campaign's crash: an FB span without parts ('MemoryModel' has no FB)
    (lambda d: d["spans"][0].__setitem__("kind", "FB"), "spans[0] is FB with 0 parts"),
])
def test_render_refuses_bad_timelines(tmp_path, tl_json, change, want) -> None:
    change(tl_json)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(tl_json))
    err = one_line_error(run("render", p, "-o", tmp_path / "x.png"))
    assert want in err and str(p) in err
    assert not (tmp_path / "x.png").exists()


# -- quoting and escaping --------------------------------------------------------------
def test_a_non_program_file_is_never_echoed(tmp_path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\nbin:*:19000::::::\n")
    sc = tmp_path / "s.toml"
    sc.write_text(f'[schedule]\nprogram = "{secret}"\n')
    err = one_line_error(run("simulate", sc, "-q")).split(str(secret), 1)[1]
    assert "not a program text file" in err and "SECRET" not in err and "root" not in err
    if Path("/proc/self/environ").exists():
        sc.write_text('[schedule]\nprogram = "/proc/self/environ"\n')
        err = one_line_error(run("simulate", sc, "-q"))
        assert "=" not in err.split(":", 2)[-1]


def test_bad_tokens_are_quoted_short(tmp_path) -> None:
    p = tmp_path / "p.txt"
    p.write_text("0F0 0F" + "X" * 3000 + "\n")
    err = one_line_error(run("simulate", "--program", p, "-q"))
    assert len(err) < 400 and "3002 chars" in err
    assert shorten_quotes("bad 'ab'") == "bad 'ab'"
    assert excerpt("x" * 100, 10) == "'xxxxxxxxxx'... (100 chars)"


def test_user_text_is_neither_markup_nor_emoji_nor_mathtext(tmp_path) -> None:
    """A schedule named `[/]:x:$\\frac{$` prints as is in the table title (rich: no
    markup, no emoji) and is drawn as is in the Gantt title (matplotlib: no mathtext)."""
    assert run("generate", "1f1b", "-p", "2", "-m", "2", "-f", "json", "-o",
               tmp_path / "s.json").exit_code == 0
    d = json.loads((tmp_path / "s.json").read_text())
    d["name"] = "[/]:x:$\\frac{$"
    (tmp_path / "s.json").write_text(json.dumps(d))
    r = run("simulate", "--schedule-file", tmp_path / "s.json", "--gantt",
            tmp_path / "g.png")
    assert r.exit_code == 0, r.output
    assert "[/]:x:$\\frac{$: 2 ranks" in " ".join(r.stdout.split())
    assert "\u274c" not in r.stdout
    assert (tmp_path / "g.png").stat().st_size > 1000
    p = tmp_path / ":x:[bold].txt"          # a file name is the name of its program
    p.write_text("0F0 0B0 0W0\n")
    r = run("simulate", "--program", p)
    assert r.exit_code == 0 and ":x:[bold]: 1 ranks" in " ".join(r.stdout.split())
    assert rich_escape("[/]") == "\\[/]" and mpl_escape("$a$") == "\\$a\\$"


def test_title_with_mathtext_renders(tmp_path, tl_json) -> None:
    tl_json["schedule"] = "$\\frac{$"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(tl_json))
    for extra in ([], ["--title", "$\\frac{$ [/]"], ["--overlay", p, "--names", "$a,[/]"]):
        r = run("render", p, "-o", tmp_path / "x$\\frac{$.png", *extra)
        assert r.exit_code == 0, r.output


# -- outputs ---------------------------------------------------------------------------
def test_two_outputs_on_one_path_and_output_is_input(tmp_path) -> None:
    same = tmp_path / "same.json"
    err = one_line_error(run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "--json", same,
                             "--trace", same))
    assert "--json and --trace both write" in err and not same.exists()
    # another spelling of the same file is the same file
    err = one_line_error(run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "--json", same,
                             "--trace", tmp_path / "." / "same.json"))
    r = run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "-q", "--json", same)
    assert r.exit_code == 0
    before = same.read_bytes()
    err = one_line_error(run("import-trace", same, "--json", same))
    assert "is an input of this command" in err and same.read_bytes() == before
    prog = tmp_path / "p.txt"
    prog.write_text("0F0 0B0 0W0\n")
    sc = tmp_path / "s.toml"
    sc.write_text(f'[schedule]\nprogram = "{prog.name}"\n')
    err = one_line_error(run("simulate", sc, "--json", prog))
    assert "is an input of this command" in err and prog.read_text() == "0F0 0B0 0W0\n"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temp_files_are_removed_by_the_next_run(tmp_path) -> None:
    """A run killed with SIGKILL leaves its temporary file; the next run writing the same
    output removes it (its process is gone); a live process's temporary file stays."""
    out = tmp_path / "out.json"
    host = temp_tag().split("-")[0]
    stale = tmp_path / f".out.json.{host}-{_dead_pid()}-abc{TMP_MARK}.json"
    live = tmp_path / f".out.json.{host}-{os.getpid()}-abc{TMP_MARK}.json"
    other = tmp_path / f".other.json.{host}-{_dead_pid()}-abc{TMP_MARK}.json"
    for f in (stale, live, other):
        f.write_text("partial")
    r = run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "-q", "--json", out)
    assert r.exit_code == 0 and out.exists()
    assert not stale.exists() and live.exists() and other.exists()


def test_sigterm_removes_temp_files(tmp_path) -> None:
    """SIGTERM while an output is half written: the guard turns it into exit 143 after
    the temporary file is removed (no partial file, no final file)."""
    out = tmp_path / "o.txt"

    @handle_errors
    def writes() -> None:
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("not reached")      # pragma: no cover

    with pytest.raises(typer.Exit) as ei:
        writes()
    assert ei.value.exit_code == 143
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sighup_stops_a_cli_run_cleanly(tmp_path) -> None:
    """A real process: SIGHUP while it is busy exits 129 with one line, no files."""
    code = ("import os, signal, time, sys\n"
            "from schedsim.cli.common import handle_errors\n"
            "from schedsim.util.files import atomic_path\n"
            "@handle_errors\n"
            "def f():\n"
            f"    with atomic_path({str(tmp_path / 'o.png')!r}) as t:\n"
            "        t.write_text('x'); print('ready', flush=True); time.sleep(60)\n"
            "try:\n"
            "    f()\n"
            "except SystemExit as e:\n"
            "    raise\n"
            "except BaseException as e:\n"
            "    sys.exit(getattr(e, 'exit_code', 1))\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGHUP)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 129, err
    assert err.strip() == "error: stopped by SIGHUP: temporary files removed, no output written"
    assert list(tmp_path.iterdir()) == []


# -- lossless cost files ---------------------------------------------------------------
def test_cost_file_round_trips_exactly(tmp_path) -> None:
    """The cost file reads back as the very floats the calibration holds, so simulate
    --costs-file predicts the same makespan to the last bit (the replay test was flaky
    with 6 significant digits)."""
    import random

    from schedsim.replay.calibrate import Calibration
    from schedsim.scenario import apply_costs_file, parse_scenario
    from schedsim.sim.simulate import simulate

    rng = random.Random(7)
    for _ in range(20):
        cal = Calibration(stages={s: {k: rng.uniform(0.01, 3) for k in
                                      ("F", "B", "W", "BW", "FB")} for s in range(2)},
                          link_samples=[[b, 0.01 + b * rng.uniform(1e-7, 1e-5)]
                                        for b in (1024, 8192, 65536)],
                          message_bytes=1024.0, world_size=2,
                          launch_samples={"1+0": [rng.uniform(0.001, 0.1)] * 3},
                          post_runs={"1+0": 4})
        f = tmp_path / "c.toml"
        f.write_text(cal.to_toml("x"))
        sc = apply_costs_file(parse_scenario({"schedule": {"name": "1f1b", "ranks": 2,
                                                           "microbatches": 4}}), f)
        assert sc.costs == cal.cost_model() and sc.link == cal.link_model()
        assert sc.comm.launch_cost == cal.launch_cost()
        prog = sc.build_program()
        comm = cal.comm_model("eager")
        assert simulate(prog, sc.costs, sc.link, sc.comm.model_copy(
            update={"semantics": "eager"})).makespan == \
            simulate(prog, cal.cost_model(), cal.link_model(), comm).makespan


def test_simulated_timelines_pass_the_checks(tmp_path) -> None:
    """read_json's checks accept what the simulator writes, deadlocks included."""
    for args in (["-s", "dualpipe", "-p", "4", "-m", "8"],
                 [SCHEDULES / "crossed-sends.toml", "--semantics", "rendezvous"]):
        r = run("simulate", *args, "-q", "--json", tmp_path / "t.json")
        assert r.exit_code in (0, 3)
        Timeline.read_json(tmp_path / "t.json")


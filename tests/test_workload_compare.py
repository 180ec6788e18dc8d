"""``compare`` of a ``[workload]`` scenario runs each schedule as ``simulate -s NAME``
runs it with the same flags: the step, tokens/s/GPU and peak bytes of every row equal
``simulate``'s (a new user's trial: ``--cost``, ``[costs]``, ``--semantics eager
--latency``, ``[link]``, ``--chunks`` and ``[schedule] chunks`` were dropped), the
``--schedules`` syntax and refusals are plain compare's, ``-q`` prints one line per
schedule, and a flag it cannot honour is refused in one line, exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from workload_scenarios import my70

from schedsim.cli import app

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args], terminal_width=200)


def scenario(tmp_path: Path, schedule: str = "", tables: str = "") -> Path:
    p = tmp_path / "my70.toml"
    p.write_text(my70(schedule, tables))
    return p


def simulated(tmp_path: Path, sc: Path, *flags: object) -> dict:
    """The Timeline JSON's workload object of ``simulate SC FLAGS``."""
    out = tmp_path / "sim.json"
    r = run("simulate", sc, *flags, "-q", "--json", out)
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())["workload"]


def compared(tmp_path: Path, sc: Path, *flags: object) -> dict[str, dict]:
    out = tmp_path / "cmp.json"
    r = run("compare", sc, *flags, "--json", out)
    assert r.exit_code == 0, r.output
    return {x["schedule"]: x for x in json.loads(out.read_text())}


def same(row: dict, sim: dict) -> None:
    for k in ("step_ms", "makespan_ms", "tokens_per_s_per_gpu", "mfu",
              "peak_memory_bytes", "fits"):
        assert row[k] == sim[k], k


# (the scenario's extra [schedule] keys and tables, compare's flags, and per schedule
# label the simulate flags that give its row)
CASES = {
    "--cost": ("", "", ["--schedules", "1f1b,zbv", "--cost", "F=1"],
               {"1f1b": ["--cost", "F=1"], "zbv": ["-s", "zbv", "--cost", "F=1"]}),
    "[costs]": ("", "[costs]\nF = 1", ["--schedules", "1f1b,zbv"],
                {"1f1b": [], "zbv": ["-s", "zbv"]}),
    "--semantics --latency": (
        "", "", ["--schedules", "1f1b,zbv", "--semantics", "eager", "--latency", "50"],
        {"1f1b": ["--semantics", "eager", "--latency", "50"],
         "zbv": ["-s", "zbv", "--semantics", "eager", "--latency", "50"]}),
    "[link]": ("", "[link]\nlatency = 50", ["--schedules", "1f1b,zbv", "--semantics",
                                           "eager"],
               {"1f1b": ["--semantics", "eager"], "zbv": ["-s", "zbv", "--semantics",
                                                          "eager"]}),
    "--chunks": ("", "", ["--schedules", "1f1b,interleaved-1f1b", "--chunks", "4"],
                 {"1f1b": [], "interleaved-1f1b": ["-s", "interleaved-1f1b", "--chunks",
                                                   "4"]}),
    "per schedule": ("", "", ["--schedules", "1f1b,interleaved-1f1b:chunks=5"],
                     {"1f1b": [], "interleaved-1f1b:chunks=5": [
                         "-s", "interleaved-1f1b", "--chunks", "5"]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_row_is_what_simulate_gives(tmp_path: Path, case: str) -> None:
    sched, tables, flags, sims = CASES[case]
    sc = scenario(tmp_path, sched, tables)
    rows = compared(tmp_path, sc, *flags)
    assert list(rows) == list(sims)
    for label, sim_flags in sims.items():
        same(rows[label], simulated(tmp_path, sc, *sim_flags))


def test_the_trials_numbers(tmp_path: Path) -> None:
    """The trial's figures: 1f1b with F = 1 ms steps 51498.6 ms, as simulate says (compare
    said 79831.5, the derived F); eager with a 50 ms latency 96627.1 ms."""
    sc = scenario(tmp_path)
    assert round(compared(tmp_path, sc, "--schedules", "1f1b,zbv", "--cost",
                          "F=1")["1f1b"]["step_ms"], 1) == 51498.6
    assert round(compared(tmp_path, sc, "--schedules", "1f1b", "--semantics", "eager",
                          "--latency", "50")["1f1b"]["step_ms"], 1) == 96627.1


def test_schedule_chunks_of_the_file_go_to_the_schedules_that_take_them(
        tmp_path: Path) -> None:
    """``[schedule] name = "interleaved-1f1b"``, ``chunks = 4``: compare's interleaved
    row is the file's own run (it ran at 2 chunks: 79394.3 ms against 79180.9); 1f1b,
    which takes no chunks, is the file with ``-s 1f1b`` and no chunks."""
    sc = scenario(tmp_path, "chunks = 4")
    text = sc.read_text().replace('name = "1f1b"', 'name = "interleaved-1f1b"')
    sc.write_text(text)
    rows = compared(tmp_path, sc, "--schedules", "1f1b,interleaved-1f1b")
    own = simulated(tmp_path, sc)
    same(rows["interleaved-1f1b"], own)
    assert round(own["step_ms"], 1) == 79180.9
    assert rows["interleaved-1f1b"]["stages"] == 16
    plain = tmp_path / "plain"
    plain.mkdir()
    same(rows["1f1b"], simulated(tmp_path, scenario(plain)))


def test_an_unknown_schedule_is_refused_with_the_closest(tmp_path: Path) -> None:
    r = run("compare", scenario(tmp_path), "--schedules", "1f1b,zbvv")
    assert r.exit_code == 2
    assert r.output.startswith("error: unknown schedule 'zbvv' (did you mean 'zbv'?)")


def test_quiet_prints_one_line_per_schedule(tmp_path: Path) -> None:
    sc = scenario(tmp_path)
    r = run("compare", sc, "--schedules", "1f1b,zbv", "-q")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    sims = [run("simulate", sc, *f, "-q").output.splitlines()[1].split("; makespan")[0]
            for f in ([], ["-s", "zbv"])]
    assert [ln.rsplit(", bubble ratio", 1)[0] for ln in lines] == [
        f"1f1b: {sims[0]}", f"zbv: {sims[1]}"]
    assert lines[0] == ("1f1b: step 79831 ms, 820.9 tokens/s/GPU, MFU 37.3%, peak 46.32 GiB "
                        "of 80 GiB (fits), bubble ratio 0.044")
    csv = run("compare", sc, "--schedules", "1f1b,zbv", "-q", "--format", "csv")
    assert csv.exit_code == 0 and csv.stdout.splitlines()[0].startswith("schedule,stages,")


@pytest.mark.parametrize("flags, message", [
    (["--memory-model", "inflight"], "error: --memory-model and --fb-order count "
     "activations in microbatches' worth, and compare of a [workload] reports its byte "
     "model in GiB: drop them"),
    (["--model-overlap", "none,fb"], "error: --model-overlap compares the overlap modes of "
     "a [model] table, and this scenario has a [workload]"),
    (["-p", "8"], "error: Invalid value for '--ranks' / '-p': 8 but the scenario's "
     "[workload] pp = 4 (its pipeline ranks)"),
])
def test_a_flag_compare_cannot_honour_is_refused(tmp_path: Path, flags: list[str],
                                                 message: str) -> None:
    r = run("compare", scenario(tmp_path), "--schedules", "1f1b", *flags)
    assert r.exit_code == 2 and r.output.startswith(message), r.output
    assert len(r.output.strip().splitlines()) == 1

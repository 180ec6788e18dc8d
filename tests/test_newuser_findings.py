"""Defects a new user found by following the README and trying to break the CLI.

Each test names the reproducer. Outputs are written by renaming a temporary file onto the
target, so an existing target that is not a regular file (a device, a FIFO) was replaced:
run as root, ``--json /dev/null`` turned the machine's /dev/null into a regular file.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.cli.common import handle_errors

SMALL = ["simulate", "-s", "1f1b", "-p", "2", "-m", "2", "--cost", "F=1,BW=2", "-q"]


def test_output_onto_a_fifo_is_refused_and_the_fifo_kept(tmp_path: Path) -> None:
    """`schedsim simulate ... --json /dev/null` (as root) replaced the device by a file;
    a FIFO stands in for the device here. Exit 2, one line, the FIFO is still a FIFO."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    r = CliRunner().invoke(app, [*SMALL, "--json", str(fifo)])
    assert r.exit_code == 2, r.output
    assert "not a regular file" in r.output and "Traceback" not in r.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.json"]


def test_output_through_a_symlink_writes_the_target_and_keeps_the_link(
        tmp_path: Path) -> None:
    """A symlinked output is written through (as a shell's `>` does); the rename used to
    replace the link itself (so /dev/stdout, a link, was replaced by a file)."""
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = CliRunner().invoke(app, [*SMALL, "--json", str(link)])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["makespan"] == 9.0     # (m+p-1)(F+BW) = 3 x 3


def test_output_dash_is_stdout_not_a_file_named_dash(tmp_path: Path,
                                                     monkeypatch) -> None:
    """`schedsim simulate ... --json -` wrote a file named '-' in the current folder; then
    it was refused; now (issue 27) it is stdout: the Timeline JSON alone on stdout, the
    summary on stderr, and no file."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, [*SMALL, "--json", "-"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["makespan"] == 9.0
    assert "makespan 9" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags,named", [
    (["--lazy-init"], "--lazy-init"),
    (["--comm-stream", "per-rank"], "--comm-stream"),
    (["--launch-cost", "1"], "--launch-cost"),
    (["--semantics", "eager", "--init-cost", "3"], "--init-cost"),
    (["--semantics", "eager", "--eager-threshold", "10"], "--eager-threshold"),
])
def test_comm_flags_that_change_nothing_are_warned(flags: list[str], named: str) -> None:
    """`schedsim simulate -s 1f1b -p 4 -m 8 --lazy-init` printed the data-semantics result
    (33) with no hint that comm settings are ignored under data semantics."""
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "4", "-m", "8",
                                 "--cost", "F=1,BW=2", "-q", *flags])
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and named in warnings[0], r.output
    assert "makespan 33 slots" in r.output


@pytest.mark.parametrize("flags,makespan", [
    (["--semantics", "rendezvous", "--lazy-init", "--init-cost", "1", "--eager-threshold",
      "10"], 36),
    (["--semantics", "eager", "--comm-stream", "per-peer", "--comm-policy", "torch",
      "--launch-cost", "0.5"], 42.5),
])
def test_comm_flags_that_apply_are_not_warned(flags: list[str], makespan: float) -> None:
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "4", "-m", "8",
                                 "--cost", "F=1,BW=2", "-q", *flags])
    assert r.exit_code == 0, r.output
    assert "warning" not in r.output
    assert f"makespan {makespan:g} slots" in r.output      # they did change the run


def test_compare_reads_ranks_and_microbatches_from_the_scenario(tmp_path: Path) -> None:
    """`schedsim compare --scenario s.toml` with ranks and microbatches in [schedule]
    failed with 'compare needs --ranks and --microbatches' (search reads them)."""
    sc = tmp_path / "s.toml"
    sc.write_text('[schedule]\nname = "1f1b"\nranks = 4\nmicrobatches = 8\n'
                  '[costs]\nF = 1\nBW = 2\n')
    out = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["compare", "--scenario", str(sc), "--schedules",
                                 "1f1b,gpipe", "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = {d["schedule"]: d for d in json.loads(out.read_text())}
    assert rows["1f1b"]["makespan"] == 33          # (m + p - 1)(F + BW)
    assert rows["gpipe"]["makespan"] == 33
    assert rows["1f1b"]["idle"] == [9.0] * 4       # (p - 1)(F + BW)


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path, capsys) -> None:
    """Ctrl-C exited 130 silently while SIGTERM/SIGHUP print one line; now both do, and
    the temporary file of the output is gone."""
    from schedsim.util.files import atomic_path

    out = tmp_path / "o.json"

    @handle_errors
    def writes() -> None:
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as ei:
        writes()
    assert ei.value.exit_code == 130
    assert list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert err.strip() == "error: stopped by SIGINT: temporary files removed, no output written"


@pytest.mark.parametrize("flags", [
    ["-s", "1f1b", "--semantics", "eager", "--message-bytes", "1e300",
     "--bandwidth", "1e-300"],                                          # bytes / bandwidth
    ["-s", "dualpipe", "--semantics", "eager", "--message-bytes", "1e300",
     "--bandwidth", "1e-300"],
])
def test_overflowing_costs_give_one_line_and_no_numpy_warning(flags: list[str]) -> None:
    """`schedsim simulate -s dualpipe -p 4 -m 8 --cost F=1e308,BW=1e308` printed numpy's
    'RuntimeWarning: overflow encountered in add' and its source line before the error."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)     # a leaked warning now raises
        r = CliRunner().invoke(app, ["simulate", "-p", "4", "-m", "8", "-q", *flags])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        "error: times overflow to inf: the costs, latencies or message sizes are too large "
        "for floating point"]


def test_op_costs_above_max_cost_are_refused(tmp_path: Path) -> None:
    """`simulate -s 1f1b -p 4 -m 8 --cost F=1e300,BW=1e300` ran and printed a 301-digit
    makespan (and 1e308 overflowed): an op cost is at most MAX_COST (1e15, any unit), on
    the flag and in every cost table of a file; at the bound it runs, (m + p - 1)(F + BW)."""
    from schedsim.sim.costs import MAX_COST

    assert MAX_COST == 1e15
    base = ["simulate", "-s", "1f1b", "-p", "4", "-m", "8", "-q"]
    for cost in ("F=1e300,BW=1", "F=1,BW=1e308", "F=1,BW=1,FB=1000000000000001"):
        r = CliRunner().invoke(app, [*base, "--cost", cost])
        assert r.exit_code == 2, r.output
        bad = [c for c in cost.split(",") if float(c.split("=")[1]) > 1e15][0]
        assert r.output.strip().splitlines() == [
            f"error: bad cost value '{bad}': give a finite number from 0 to 1e+15 "
            "(in the cost unit)"]
    r = CliRunner().invoke(app, [*base, "--cost", "F=1e15,BW=1e15"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"makespan {int((8 + 4 - 1) * 2e15)} slots ")
    head = '[schedule]\nname = "1f1b"\nranks = 4\nmicrobatches = 8\n[costs]\nF = 1\nBW = 1\n'
    for table, where in (("F = 1e300\n", "costs.F"),
                         ("[costs.stage.1]\nF = 1e300\n", "costs.stage.1.F"),
                         ("[[costs.overrides]]\nstage = 0\nmb = 0\nkind = 'F'\n"
                          "cost = 1e300\n", "costs.overrides.0.cost")):
        text = head.replace("F = 1\n", "") + table if where == "costs.F" else head + table
        f = tmp_path / "c.toml"
        f.write_text(text)
        r = CliRunner().invoke(app, ["simulate", str(f), "-q"])
        assert r.exit_code == 2, r.output
        assert r.output.strip() == (f"error: {f}: '{where}': Input should be less than or "
                                    "equal to 1000000000000000"), r.output


@pytest.mark.parametrize("command", ["stalls", "align"])
@pytest.mark.parametrize("rank", ["4", "-1"])
def test_rank_outside_the_run_is_refused(command: str, rank: str, tmp_path: Path) -> None:
    """`schedsim stalls schedules/1f1b.toml --rank 7` (4 ranks) printed 'idle by cause
    (rank 7): none = 0 of 33' and exit 0, as if rank 7 existed and never stalled."""
    out = tmp_path / "s.json"
    r = CliRunner().invoke(app, [command, "-s", "1f1b", "-p", "4", "-m", "8", "--cost",
                                 "F=1,BW=2", "--rank", rank, "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"error: --rank {rank}: this run has ranks 0 to 3"
    assert not out.exists()


def test_rank_inside_the_run_still_filters() -> None:
    r = CliRunner().invoke(app, ["stalls", "-s", "1f1b", "-p", "4", "-m", "8", "--cost",
                                 "F=1,BW=2", "--rank", "3"])
    assert r.exit_code == 0, r.output
    # the last rank of 1F1B waits (p - 1) F = 3 for its first forward and ends at
    # m (F + BW) + 3 = 27, 6 before the makespan 33: (p - 1)(F + BW) = 9 idle in all
    assert r.output.splitlines()[0].startswith(
        "idle by cause (rank 3): cooldown 6 slots, warmup 3 slots = 9 slots of 33 slots")


@pytest.mark.parametrize("command", [["lint"], ["simulate"], ["compare", "--scenario"]])
def test_a_timeline_json_given_as_scenario_is_named_json(command: list[str], tmp_path: Path,
                                                         monkeypatch) -> None:
    """`schedsim lint tl.json` (a Timeline JSON from simulate --json) said 'malformed TOML:
    Invalid statement (at line 1, column 1)'."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, [*SMALL, "--json", "tl.json"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, [*command, "tl.json"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == ("error: tl.json: a JSON file, not a scenario TOML (a Timeline "
                                "JSON goes to render, report, stalls, align, critical-path, "
                                "memory; a JSON schedule to --schedule-file)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tl.json"]


@pytest.mark.parametrize("command", [["lint"], ["simulate"], ["stalls"]])
def test_a_program_text_given_as_scenario_is_named_program(command: list[str],
                                                           tmp_path: Path, monkeypatch) -> None:
    """`schedsim simulate g.txt` (the program text `generate -o g.txt` wrote) said
    'malformed TOML: Expected '=' after a key ...': it names the file's kind and the flag
    that reads it; that flag then runs it (1F1B 4 x 8 at F=1, BW=2: 33 slots)."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["generate", "-s", "1f1b", "-p", "4", "-m", "8", "-o", "g.txt"])
    assert r.exit_code == 0, r.output
    (tmp_path / "c.txt").write_text("# a comment first\n\n" + (tmp_path / "g.txt").read_text())
    for name in ("g.txt", "c.txt"):
        r = CliRunner().invoke(app, [*command, name, "-q"])
        assert r.exit_code == 2, r.output
        assert r.output.strip() == (f"error: {name}: a program text file, not a scenario "
                                    f"TOML: give it as --program {name}")
    r = CliRunner().invoke(app, ["simulate", "--program", "g.txt", "--cost", "F=1,BW=2", "-q"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("makespan 33 slots ")
    # other text that is not TOML is still malformed TOML
    (tmp_path / "x.toml").write_text("ranks 4\n")
    r = CliRunner().invoke(app, ["simulate", "x.toml"])
    assert r.exit_code == 2 and "x.toml: malformed TOML: " in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "g.txt", "x.toml"]


MODEL = ('[schedule]\nname = "1f1b"\nranks = 4\nmicrobatches = 8\n[model]\nlayers = {}\n'
         'attention = {{ F = 1.0, B = 1.0, W = 0.5 }}\nmlp = {{ F = 1.0, B = 1.0, W = 0.5 }}\n')


def test_compare_with_a_stage_model_does_not_point_to_per_rank_costs(tmp_path: Path) -> None:
    """`schedsim compare --scenario tp4.toml --schedules dualpipe,zbv` (a [model]) read the
    costs per op and told the user '--per-rank-costs costs one rank's share of the model
    instead', a flag a stage model ignores. Halving the layers per stage is the fix, and
    it equals the per-rank reading of plain costs exactly."""
    runs = {}
    for layers in (2, 1):
        sc = tmp_path / f"m{layers}.toml"
        sc.write_text(MODEL.format(layers))
        out = tmp_path / f"c{layers}.json"
        r = CliRunner().invoke(app, ["compare", "--scenario", str(sc), "--schedules",
                                     "1f1b,zbv", "--json", str(out)])
        assert r.exit_code == 0, r.output
        assert "--per-rank-costs" not in r.output
        runs[layers] = {d["schedule"]: d["makespan"] for d in json.loads(out.read_text())}
    assert "layers are per stage" in r.output and "fewer [model] layers" in r.output
    # F = 2 layers x (1 + 1) = 4, B = 4, W = 2: 1F1B (m + p - 1)(F + B + W) = 11 x 10
    assert runs[2]["1f1b"] == 110 and runs[1]["1f1b"] == 55
    plain = tmp_path / "plain.json"
    r = CliRunner().invoke(app, ["compare", "-p", "4", "-m", "8", "--cost", "F=4,B=4,W=2",
                                 "--schedules", "zbv", "--json", str(plain)])
    assert r.exit_code == 0, r.output
    [row] = json.loads(plain.read_text())
    assert row["cost_scale"] == 0.5 and row["makespan"] == runs[1]["zbv"] == 86


def test_critical_path_of_a_simulated_timeline_says_why_no_program(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """`schedsim simulate ... --json tl.json; schedsim critical-path tl.json` said the
    timeline was 'written before timelines carried one' (it was written a moment ago)."""
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, [*SMALL, "--json", "tl.json"]).exit_code == 0
    r = CliRunner().invoke(app, ["critical-path", "tl.json"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == (
        "error: tl.json: the timeline carries no program (simulate --json does not store "
        "it): give the scenario instead, or the program it ran with --program FILE")
    r = CliRunner().invoke(app, ["generate", "1f1b", "-p", "2", "-m", "2", "-o", "p.txt"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["critical-path", "tl.json", "--program", "p.txt"])
    assert r.exit_code == 0, r.output
    assert "makespan 9 slots = 9 slots compute + 0 slots waiting" in r.output  # (m+p-1)(F+BW)


def test_a_deadlocked_chart_says_deadlock_not_makespan() -> None:
    """`render` of a deadlocked run's JSON titled it 'makespan 3.4 slots, bubble ...'."""
    from conftest import SCHEDULES

    from schedsim.plot.style import default_title
    from schedsim.scenario import load_scenario
    from schedsim.sim.simulate import simulate

    sc = load_scenario(SCHEDULES / "crossed-sends-two-nodes.toml")
    tl = simulate(sc.build_program(), sc.costs, sc.link, sc.comm, raise_on_deadlock=False)
    title = default_title(tl)
    assert "DEADLOCK (blocked ranks 0, 1); what ran before it" in title
    assert "makespan" not in title and "bubble" not in title


def test_a_refused_flag_value_names_the_flag_a_file_value_its_key(tmp_path: Path) -> None:
    """`simulate -s 1f1b -p 0 -m 8` said `'schedule.ranks': Input should be ...`: the
    value came from `--ranks`, so the flag is named (FlagError); the same value in a
    file still names the file's key."""
    from schedsim.errors import FlagError, ScenarioError
    from schedsim.scenario_flags import build_scenario

    with pytest.raises(FlagError) as e:
        build_scenario(None, schedule="1f1b", ranks=0, microbatches=8)
    assert (e.value.flag, e.value.reason) == ("ranks", "Input should be greater than or "
                                                       "equal to 1")
    with pytest.raises(FlagError) as e:
        build_scenario(None, schedule="1f1b", ranks=2, microbatches=2, connections=0)
    assert e.value.flag == "connections"
    f = tmp_path / "s.toml"
    f.write_text("[schedule]\nname = '1f1b'\nranks = 0\nmicrobatches = 8\n")
    with pytest.raises(ScenarioError) as e:
        build_scenario(f)
    assert not isinstance(e.value, FlagError) and "'schedule.ranks'" in str(e.value)
    r = CliRunner().invoke(app, ["simulate", "-s", "1f1b", "-p", "0", "-m", "8"])
    assert r.exit_code == 2 and "Invalid value for '--ranks' / '-p'" in r.output, r.output


def test_a_long_gantt_title_lies_inside_the_figure() -> None:
    """`render dp.json --gantt r.png --arrows --memory --stalls --highlight B:5:4:0
    --window 10:40` (dualpipe, 8 ranks, 16 microbatches) drew its title from left of the
    figure (`ualpipe: 8 ranks, ...`): the title, centred on the axes that constrained
    layout moves, is wrapped until it fits (schedsim.plot.layout.fit_title)."""
    from schedsim import CommModel, CostModel, LinkModel, build_program, simulate
    from schedsim.plot import gantt

    tl = simulate(build_program("dualpipe", 8, 16),
                  CostModel(F=1, B=1, W=1, BW=2, FB=3), LinkModel(), CommModel())
    from schedsim.analysis.memory import MemoryModel
    from schedsim.cli.options import gantt_options

    fig = gantt(tl, **gantt_options(True, MemoryModel(), True, highlight=["B:5:4:0"],
                                    window="10:40"))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    title = fig.axes[0].title
    box = title.get_window_extent()
    assert title.get_text().startswith("dualpipe: 8 ranks") and "\n" in title.get_text()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)


# -- cli5: render -, sizes with units, the schedule-source clash, plan's GPU rule, the
#    command summaries, the legend of many chunks -------------------------------------

def _timeline_json(tmp_path: Path) -> str:
    out = tmp_path / "t.json"
    r = CliRunner().invoke(app, [*SMALL, "--json", str(out)])
    assert r.exit_code == 0, r.output
    return out.read_text()


def test_render_dash_reads_the_timeline_from_stdin(tmp_path: Path) -> None:
    """`schedsim simulate ... --json - | schedsim render - --out x.png` said
    `error: -: no such timeline JSON` (exit 2): an input `-` is stdin now (the one door,
    schedsim.util.inputs), as an output `-` is stdout."""
    text = _timeline_json(tmp_path)
    png = tmp_path / "x.png"
    r = CliRunner().invoke(app, ["render", "-", "--out", str(png), "-q"], input=text)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the commands that take a Timeline JSON in place of a scenario read it too
    r = CliRunner().invoke(app, ["stalls", "-"], input=text)
    assert r.exit_code == 0 and "cooldown" in r.output, r.output


@pytest.mark.parametrize("args,stdin,says", [
    (["render", "-"], "", "-: stdin is empty; pipe the timeline JSON in"),
    (["render", "-", "--overlay", "-"], None, "the timeline and --overlay are both '-'"),
    (["render", "-"], "{", "-: not a schedsim timeline JSON"),
])
def test_render_dash_refusals_are_one_line(args: list[str], stdin: str | None, says: str,
                                           tmp_path: Path) -> None:
    png = tmp_path / "x.png"
    r = CliRunner().invoke(app, [*args, "--out", str(png)],
                           input=_timeline_json(tmp_path) if stdin is None else stdin)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {says}"), r.output
    assert not png.exists()


@pytest.mark.parametrize("size,makespan", [
    ("1MiB", 9 + 2 * 2 ** 20 / 1e6), ("1048576", 9 + 2 * 2 ** 20 / 1e6),
    ("4MB", 9 + 2 * 4.0 + 1), ("1 MiB", 9 + 2 * 2 ** 20 / 1e6)])
def test_message_bytes_takes_a_size_with_a_unit(size: str, makespan: float) -> None:
    """`--message-bytes 1MiB` was refused ("Input should be a valid number"); a byte
    count flag takes a bare number of bytes or a size (schedsim.util.units.parse_size).
    At 1e6 bytes a slot, 1 MiB adds 1.048576 slots to each of the two critical
    hops; 4 MB makes the two ranks wait on the messages (18 slots)."""
    r = CliRunner().invoke(app, [*SMALL[:-1], "--message-bytes", size, "--bandwidth", "1e6",
                                 "--json", "-"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["makespan"] == pytest.approx(makespan), r.stdout


def test_eager_threshold_takes_a_size_with_a_unit() -> None:
    """--eager-threshold is a byte count too: 2MiB is 2,097,152 bytes, as typed bare;
    bits are refused naming the flag."""
    from schedsim.scenario_flags import build_scenario

    for t in ("2MiB", "2097152", "2 MiB"):
        sc = build_scenario(None, schedule="1f1b", ranks=2, microbatches=2,
                            semantics="rendezvous", eager_threshold=t)
        assert sc.comm.eager_threshold_bytes == 2 ** 21
    r = CliRunner().invoke(app, [*SMALL, "--semantics", "rendezvous", "--message-bytes",
                                 "1MiB", "--eager-threshold", "2MiB"])
    assert r.exit_code == 0 and "makespan 9 slots" in r.output, r.output
    assert r_err(["--eager-threshold", "2Mb"]).startswith(
        "error: Invalid value for '--eager-threshold': size '2Mb': Mb reads as bits")


def r_err(flags: list[str]) -> str:
    r = CliRunner().invoke(app, [*SMALL, *flags])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    return lines[0]


@pytest.mark.parametrize("value,says", [
    ("1Mb", "size '1Mb': Mb reads as bits (bytes are MB)"),
    ("1MiBs", "size '1MiBs': unknown unit 'MiBs'"),
    ("abc", "size 'abc': give a number > 0 or a size such as"),
    ("-5", "Input should be greater than or equal to 0"),
])
def test_a_bad_message_bytes_names_the_flag_and_writes_nothing(value: str, says: str,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    line = r_err(["--message-bytes", value, "--json", str(out)])
    assert line.startswith(f"error: Invalid value for '--message-bytes': {says}"), line
    assert not out.exists()


@pytest.mark.parametrize("flags,line", [
    (["-s", "1f1b", "--program", "PROG"],
     "error: -s/--schedule and --program both give the schedule: drop --program to "
     "generate '1f1b', or -s/--schedule to run the program text"),
    (["--program", "PROG", "--schedule-file", "s.json"],
     "error: --program and --schedule-file both give the schedule: drop --schedule-file "
     "to run the program text, or --program to run the schedule file"),
])
def test_schedule_and_program_together_name_both_flags(flags: list[str], line: str,
                                                       tmp_path: Path) -> None:
    """`schedsim simulate -s 1f1b --program p.txt` said `[schedule] sets name and program:
    give one of a generator name, a program file or a schedule file`: no flag named."""
    prog = tmp_path / "p.txt"
    r = CliRunner().invoke(app, ["generate", "-s", "1f1b", "-p", "2", "-m", "2", "-o",
                                 str(prog)])
    assert r.exit_code == 0, r.output
    flags = [str(prog) if f == "PROG" else f for f in flags]
    r = CliRunner().invoke(app, ["simulate", *flags, "--cost", "F=1,BW=2", "-q"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [line]


@pytest.mark.parametrize("gpus", ["8", "16"])
def test_plan_gpus_not_a_multiple_speaks_of_the_degrees_given(gpus: str) -> None:
    """`schedsim plan --model llama3.1-8b --gpus 8 --gpu h100-sxm --tp 3 --pp 2` said
    `num_gpus = 8 is not tp x cp x dp x pp = 3 x 1 x 1 x 2`: a dp (and cp) never given."""
    r = CliRunner().invoke(app, ["plan", "--model", "llama3.1-8b", "--gpus", gpus, "--gpu",
                                 "h100-sxm", "--tp", "3", "--pp", "2", "-j", "1"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert f"({gpus} GPUs is not a multiple of tp 3 x pp 2 = 6: change the GPUs or the " \
           f"degrees)" in lines[0], lines[0]
    assert "dp" not in lines[0].split(" x ") and " dp " not in lines[0], lines[0]


def test_a_given_dp_that_does_not_fill_the_gpus_names_dp() -> None:
    from schedsim.workload import Workload, WorkloadError

    with pytest.raises(WorkloadError) as e:
        Workload(model="llama3.1-70b", gpu="h100-sxm", seq=4096, global_batch_size=32,
                 tp=8, pp=4, dp=3, num_gpus=64).check()
    assert e.value.rule == "gpus = tp x cp x dp x pp"
    assert "64 GPUs is not tp 8 x pp 4 x dp 3 = 96" in str(e.value)


def test_every_command_summary_in_help_is_one_whole_sentence() -> None:
    """`schedsim --help` listed each command by its docstring's first paragraph with the
    docstring's line breaks (`costs  Print the derived costs of a scenario's [workload]
    per stage: layers, FLOPs, ms per` / `op kind and ...`), mid-sentence; now one short
    sentence (schedsim.cli.SUMMARY), on one line at 200 columns and at 80."""
    import subprocess
    import sys

    from schedsim.cli import COMMAND_MODULE, SUMMARY

    assert set(SUMMARY) == set(COMMAND_MODULE)
    for columns in ("200", "80"):
        env = {**os.environ, "COLUMNS": columns, "TERM": "dumb"}
        out = subprocess.run([sys.executable, "-m", "schedsim", "--help"], env=env,
                             capture_output=True, text=True, timeout=120).stdout
        panel = out[out.index("Commands"):]
        rows = [ln.strip("│ ").rstrip() for ln in panel.splitlines()[1:]
                if ln.startswith("│")]
        names = [r.split()[0] for r in rows]
        # one line each: no continuation line, every command listed once
        assert sorted(names) == sorted(COMMAND_MODULE), rows
        for row in rows:
            name, summary = row.split(None, 1)
            assert summary == SUMMARY[name].replace("\\[", "["), row
            assert summary.endswith(".") and not summary.endswith("..."), row
            assert "…" not in summary


def test_legend_of_five_chunks_has_a_row_per_kind_and_a_column_per_chunk() -> None:
    """`schedsim simulate -s interleaved-1f1b -p 4 -m 8 --chunks 5 --cost F=1,BW=2
    --gantt g.png`: the legend's 11 entries ran in 6 columns, so that `BW (full
    backward), chunk 0` ended the first row and `BW chunk 1` stood under `F chunk 0`.
    Now a row per kind, chunk c in column c, idle on a row of its own; the legend lies
    below every axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from schedsim import CommModel, CostModel, LinkModel, simulate
    from schedsim.api import scenario
    from schedsim.plot import gantt

    sc = scenario(schedule="interleaved-1f1b", ranks=4, microbatches=8, chunks=5)
    tl = simulate(sc.build_program(), CostModel(F=1, BW=2), LinkModel(), CommModel())
    fig = gantt(tl)
    FigureCanvasAgg(fig).draw()
    leg = fig.legends[0]
    assert leg._ncols == 5                                   # noqa: SLF001
    rows: dict[float, list[tuple[float, str]]] = {}
    for t in leg.get_texts():
        if t.get_text():
            box = t.get_window_extent()
            rows.setdefault(round(box.y0), []).append((box.x0, t.get_text()))
    read = [[s for _, s in sorted(r)] for _, r in sorted(rows.items(), reverse=True)]
    assert read == [["F (forward), chunk 0", *(f"F chunk {c}" for c in range(1, 5))],
                    ["BW (full backward), chunk 0", *(f"BW chunk {c}" for c in range(1, 5))],
                    ["idle"]], read
    # chunk c of both kinds in one column
    xs = {s: x for r in rows.values() for x, s in r}
    assert all(xs[f"F chunk {c}"] == xs[f"BW chunk {c}"] for c in range(1, 5))
    lb = leg.get_window_extent()
    for ax in fig.axes:
        ab = ax.get_tightbbox()
        assert lb.y1 <= ab.y0 + 1, (lb, ab)                  # below, not over, the axes
    assert 0 <= lb.x0 and lb.x1 <= fig.bbox.width

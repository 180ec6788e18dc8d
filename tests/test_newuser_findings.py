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

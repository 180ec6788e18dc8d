"""A new user's trial of the workload commands: a size ``--mem-limit`` above the GPU's
HBM is refused by one rule (``plan``, ``simulate``, ``[schedule] mem_limit``), ``memory
--memory-model`` on a workload says why its table is not in GiB, errors name the
``[workload]`` settings to change, and a scenario file's errors start with its name."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner
from workload_scenarios import my70

from schedsim.cli import app

runner = CliRunner()



def run(*args: object):
    return runner.invoke(app, [str(a) for a in args], terminal_width=200)


def write(tmp_path: Path, text: str, name: str = "my70.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def one_line(r) -> str:
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.output
    assert "Traceback" not in r.output
    return r.stderr.strip()


# -- 2: a size limit above the HBM ---------------------------------------------------------
PLAN = ["plan", "--model", "llama3.1-70b", "--gpus", "64", "--gpu", "h100-sxm", "--seq",
        "8192", "--global-batch-size", "512", "--tp", "8", "-q", "-j", "1"]


@pytest.mark.parametrize("limit", ["500GiB", "500"])
def test_plan_refuses_a_mem_limit_above_the_hbm(tmp_path: Path, limit: str) -> None:
    """It recommended tp8 pp1x2 with an 83.4 GiB peak on the 80 GiB H100, exit 0."""
    out = tmp_path / "plan.jsonl"
    line = one_line(run(*PLAN, "--mem-limit", limit, "--out", out))
    assert line == ("error: --mem-limit 500 GiB is above the h100-sxm's 80 GiB; give at "
                    "most 80GiB")
    assert not out.exists()


def test_simulate_and_the_file_refuse_it_by_the_same_rule(tmp_path: Path) -> None:
    p = write(tmp_path, my70())
    assert one_line(run("simulate", p, "-s", "zb-1p", "--mem-limit", "500GiB", "-q")) == (
        "error: Invalid value for '--mem-limit': 500 GiB is above the h100-sxm's 80 GiB; "
        "give at most 80GiB (see 'schedsim simulate --help')")
    # 86 GB is 80.09 GiB: above, too
    assert "80.09 GiB is above the h100-sxm's 80 GiB" in one_line(
        run("simulate", p, "-s", "zb-1p", "--mem-limit", "86GB", "-q"))
    f = write(tmp_path, my70('mem_limit = "81GiB"').replace(
        '"1f1b"', '"zb-1p"'), "zb.toml")
    assert one_line(run("simulate", f, "-q")) == (
        f"error: {f}: [schedule] mem_limit '81GiB': 81 GiB is above the h100-sxm's 80 GiB; "
        f"give at most 80GiB")
    # at the HBM it runs, and peaks within it
    r = run("simulate", p, "-s", "zb-1p", "--mem-limit", "80GiB", "-q")
    assert r.exit_code == 0 and "peak 77.73 GiB of 80 GiB (fits)" in r.output, r.output


def test_the_suggestion_is_a_size_that_passes() -> None:
    from schedsim.workload.hardware import gpu_preset, mem_limit_above_hbm
    from schedsim.util.units import parse_size

    for gpu, most in ((gpu_preset("h200"), "141GiB"),
                      (gpu_preset("h100-sxm", hbm_bytes=27e9), "27GB"),
                      (gpu_preset("h100-sxm", hbm_bytes=27.5e9 + 1), "25.61GiB")):
        text = mem_limit_above_hbm(gpu.hbm_bytes + 1, gpu)
        assert text is not None and text.endswith(f"give at most {most}")
        assert mem_limit_above_hbm(parse_size(most)[0], gpu) is None
        assert mem_limit_above_hbm(gpu.hbm_bytes, gpu) is None


# -- 3: memory --memory-model on a workload ------------------------------------------------
def test_memory_model_on_a_workload_says_why_it_is_not_in_gib(tmp_path: Path) -> None:
    p = write(tmp_path, my70())
    r = run("memory", p, "--memory-model", "inflight")
    assert r.exit_code == 0, r.output
    assert r.stderr == ("warning: --memory-model counts activations in microbatches' "
                        "worth, so this table is in those units, without the [workload]'s "
                        "GiB per rank and HBM check (its byte model, the default: drop "
                        "--memory-model for it)\n")
    assert "peak activation" in r.stdout and "GiB" not in r.stdout
    plain = run("memory", p)
    assert plain.exit_code == 0 and plain.stderr == "" and "HBM: fits" in plain.stdout
    # a scenario without a workload: no warning
    r = run("memory", "-s", "zb-h1", "-p", "4", "-m", "8", "--memory-model", "inflight")
    assert r.exit_code == 0 and r.stderr == ""


# -- 4: which workload setting to change ---------------------------------------------------
DS = """
[schedule]
name = "dualpipev"
[workload]
model = "deepseek-v3"
gpu = "h100-sxm"
num_gpus = 2048
seq = 4096
global_batch_size = 1024
pp = 16
ep = 8
layout = "torchtitan"
"""


def test_a_schedule_the_workloads_sizes_do_not_fill_names_the_settings(
        tmp_path: Path) -> None:
    p = write(tmp_path, DS, "ds.toml")
    assert one_line(run("simulate", p, "-q")) == (
        f"error: {p}: dualpipev needs microbatches >= 2 x ranks = 32 (got 8) to fill the "
        f"V; [workload] sets ranks = pp = 16 and microbatches = global_batch_size / "
        f"(micro_batch_size x dp) = 1024 / (1 x 128) = 8: raise global_batch_size to >= "
        f"4096 (32 microbatches), or change pp")
    # the suggestion runs
    r = run("simulate", write(tmp_path, DS.replace("= 1024", "= 4096"), "ds2.toml"), "-q")
    assert r.exit_code == 0, r.output
    # odd ranks: no batch helps
    odd = my70().replace("pp = 4", "pp = 5").replace("= 64", "= 80")
    assert one_line(run("simulate", write(tmp_path, odd, "odd.toml"), "-s", "dualpipe",
                        "-q")).endswith(
        "[workload] sets ranks = pp = 5 and microbatches = global_batch_size / "
        "(micro_batch_size x dp) = 512 / (1 x 2) = 256: change pp")
    # not the sizes (the comm policy refuses the placement): no size hint
    assert one_line(run("simulate", write(tmp_path, my70()), "-s", "zbv",
                        "--comm-policy", "megatron", "-q")).endswith(
        "this schedule has a v placement")


def test_gpus_that_tp_cp_pp_do_not_divide_name_no_made_up_dp(tmp_path: Path) -> None:
    p = write(tmp_path, my70().replace("tp = 8", "tp = 3"))
    assert one_line(run("simulate", p, "-q")) == (
        f"error: {p}: 64 GPUs is not a multiple of tp 3 x pp 4 = 12: change the GPUs or "
        f"the degrees")
    given = my70().replace("tp = 8", "tp = 3\ndp = 5")
    assert one_line(run("simulate", write(tmp_path, given, "dp.toml"), "-q")).endswith(
        "64 GPUs is not tp 3 x pp 4 x dp 5 = 60: change the GPUs or the degrees")


# -- 5: the file's name first --------------------------------------------------------------
def test_an_empty_scenario_file_is_named(tmp_path: Path) -> None:
    p = write(tmp_path, "", "empty.toml")
    assert one_line(run("simulate", p)) == (
        f"error: {p}: [schedule] needs a name (see 'schedsim list'), a program file or a "
        f"schedule_file")
    # with the flags it runs; flags alone name no file
    assert run("simulate", p, "-s", "1f1b", "-p", "4", "-m", "8", "-q").exit_code == 0
    assert one_line(run("simulate", "-s", "dualpipe", "-p", "3", "-m", "8")).startswith(
        "error: dualpipe needs an even number of ranks (got 3)")


def test_the_prefix_has_one_home() -> None:
    from schedsim.errors import FlagError, ScheduleError
    from schedsim.errors import file_message, in_file

    assert file_message("a.toml", "x") == "a.toml: x"
    assert file_message("a.toml", "a.toml: x") == "a.toml: x"
    assert file_message(None, "x") == "x"
    e = in_file(ScheduleError("bad"), "a.toml")
    assert isinstance(e, ScheduleError) and str(e) == "a.toml: bad"
    assert str(in_file(FlagError("ranks", "bad"), "a.toml")) == str(FlagError("ranks", "bad"))

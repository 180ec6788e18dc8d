"""Work bounded up front and stops reported once: worker counts (``plan -j``, ``compare
-j``, ``search --workers``: one rule), a plan's candidates under the ``--max`` limits, a
compare's total work, a replay's steps, workload sizes, quiet worker processes, and a
stopped plan that leaves no empty ``--out`` file."""
from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import LimitError, ScenarioError, Stopped

PLAN = ["plan", "--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm"]


def _one_line(r, *parts):
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    text = " ".join(r.output.split())
    for p in parts:
        assert p in text, text
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args,flag,lo", [
    (PLAN + ["-j", "100000"], "-j", 1),
    (PLAN + ["-j", "257"], "-j", 1),
    (["compare", "-p", "4", "-m", "8", "-j", "100000"], "-j", 0),
    (["search", "-p", "2", "-m", "2", "--workers", "100000"], "--workers", 1),
])
def test_worker_counts_have_one_upper_bound(args, flag, lo):
    _one_line(CliRunner().invoke(app, args), f"{flag} must be in {lo}..256 (got {args[-1]})")


def test_check_workers_is_the_rule():
    from schedsim.plan.executors import make_executor
    from schedsim.util.limits import MAX_WORKERS, check_workers

    check_workers("-j", MAX_WORKERS)
    with pytest.raises(ScenarioError, match=r"-j must be in 1\.\.256"):
        make_executor("local", MAX_WORKERS + 1)
    assert make_executor("local", MAX_WORKERS).jobs == MAX_WORKERS


@pytest.mark.parametrize("flag", ["--seq", "--global-batch-size"])
def test_plan_zero_sizes_are_refused_not_defaulted(flag):
    _one_line(CliRunner().invoke(app, PLAN + [flag, "0"]),
              "--seq and --global-batch-size must be >= 1")


def test_plan_candidates_over_the_instruction_limit_name_it_and_max():
    # 1F1B on pp = 1, dp = 1: 16,000,000 microbatches x 12 instructions = 192,000,000 a
    # candidate, three recompute modes: 576,000,000 (schedsim.plan.work)
    r = CliRunner().invoke(app, PLAN + ["--global-batch-size", "16000000", "--schedules",
                                        "1f1b", "--tp", "8", "--pp", "1", "-j", "1", "-q"])
    _one_line(r, "refusing a plan of 3 candidates: about 576,000,000 instructions",
              "about 192,000,000 each", "above the limit of 20,000,000 instructions",
              "--max instructions=576000000")


def test_workload_program_is_bounded_before_it_is_built():
    from schedsim.workload import Workload
    from schedsim.workload.run import workload_program

    w = Workload(model="llama3.1-8b", gpu="h100-sxm", seq=4096, global_batch_size=2_000_000,
                 tp=8, num_gpus=8).check()
    with pytest.raises(LimitError, match="about 24,000,000 instructions"):
        workload_program(w, "1f1b")


def test_a_stop_while_enumerating_is_a_stop_not_a_rejection(monkeypatch):
    import schedsim.plan.candidates as cands
    from schedsim.plan import PlanSpace
    from schedsim.plan.driver import run_plan

    def stopped(*a, **k):
        raise Stopped(signal.SIGINT)

    monkeypatch.setattr(cands, "program_of", stopped)
    cands._placement_chunks.cache_clear()
    monkeypatch.setattr(cands, "_placement_chunks", lambda name, chunks: 1)
    space = PlanSpace(model="llama3.1-8b", gpus=8, gpu="h100-sxm", schedules=["1f1b"],
                      tp=[8], pp=[1])
    with pytest.raises(Stopped):
        run_plan(space, top=1)


def test_a_stop_while_simulating_is_not_an_error_row(monkeypatch):
    import schedsim.plan.model as model

    def stopped(*a, **k):
        raise Stopped(signal.SIGTERM)

    monkeypatch.setattr(model, "simulate_candidate", stopped)
    with pytest.raises(Stopped):
        model.evaluate((SimpleNamespace(schedule="1f1b"), None, None, "data", {}, 0))


def test_a_plan_stopped_before_any_row_leaves_no_empty_out(tmp_path, monkeypatch):
    import schedsim.plan.model as model
    from schedsim.plan import PlanSpace

    def stopped(tasks):     # Ctrl-C while the first candidates simulate
        raise Stopped(signal.SIGINT)

    monkeypatch.setattr(model, "evaluate_batch", stopped)
    out = tmp_path / "pi.jsonl"
    r = CliRunner().invoke(app, PLAN + ["--schedules", "1f1b", "--tp", "4,8", "--pp", "1,2",
                                        "--recompute", "none", "-j", "1", "-q", "--out",
                                        str(out)])
    assert r.exit_code == 130, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "stopped by SIGINT: no candidate finished" in lines[0]
    assert "not written" in " ".join(r.output.split())
    assert not out.exists()


def test_compare_bounds_the_work_of_all_schedules():
    r = CliRunner().invoke(app, ["compare", "-p", "1000", "-m", "1000", "--schedules",
                                 "1f1b,zbv"])
    # 1f1b 1000 stages + zbv 2000 stages, x 1000 microbatches x 12 instructions
    _one_line(r, "compare of 2 schedules on 1,000 ranks x 1,000 microbatches",
              "about 36,000,000 instructions in all", "--max instructions=36000000")


@pytest.mark.parametrize("flag,runs", [("--steps", 100_000_001), ("--warmup", 100_000_005)])
def test_replay_steps_are_bounded_up_front(flag, runs):
    r = CliRunner().invoke(app, ["replay", "--schedule", "1f1b", "--ranks", "2",
                                 "--microbatches", "2", flag, "100000000"])
    # 1F1B on 2 ranks x 2 microbatches: 20 instructions a step
    _one_line(r, f"a replay of {runs:,} steps", "x 20 instructions of '1f1b'",
              f"--max instructions={runs * 20}")


@pytest.mark.parametrize("key,value", [("seq", 10 ** 12), ("global_batch_size", 2 ** 24 + 1),
                                       ("micro_batch_size", 2 ** 30), ("num_gpus", 64_000_000)])
def test_workload_sizes_are_bounded(key, value):
    from schedsim.workload import Workload, WorkloadError
    from schedsim.workload.layout import MAX_SIZES

    kw = dict(model="llama3.1-8b", gpu="h100-sxm", seq=4096, global_batch_size=64)
    with pytest.raises(WorkloadError, match=f"{key} = {value:,} is above "
                                            f"{MAX_SIZES[key]:,}") as e:
        Workload(**{**kw, key: value}).check()
    assert e.value.rule == "sizes"


@pytest.mark.parametrize("gbs,mb,want", [(100, 64, "64 or 128"), (8, 64, "64"),
                                         (128, 64, None)])
def test_batch_suggestion_names_each_multiple_once(gbs, mb, want):
    from schedsim.workload import Workload, WorkloadError

    w = Workload(model="llama3.1-8b", gpu="h100-sxm", seq=4096, global_batch_size=gbs,
                 micro_batch_size=mb, num_gpus=1)
    if want is None:
        w.check()
        return
    with pytest.raises(WorkloadError) as e:
        w.check()
    assert str(e.value).endswith(f"= {mb}: use {want}")


def _interrupt_self(_=None):
    os.kill(os.getpid(), signal.SIGINT)     # Ctrl-C reaches the whole process group
    return os.getpid()


def test_workers_ignore_ctrl_c_and_the_parent_reports_it():
    from schedsim.plan.executors import LocalExecutor
    from schedsim.util.signals import stop_signals, worker_pool

    with worker_pool(2) as pool:
        pids = set(pool.map(_interrupt_self, range(4)))
    assert os.getpid() not in pids
    with stop_signals(), LocalExecutor(2) as ex:
        got = sorted(i for i, _ in ex.map_unordered(_interrupt_self, list(range(4))))
    assert got == [0, 1, 2, 3]


def test_a_pool_left_by_an_exception_ends_its_workers():
    import time

    from schedsim.util.signals import worker_pool

    with pytest.raises(Stopped):
        with worker_pool(2) as pool:
            pool.submit(time.sleep, 600)
            procs = list(pool._processes.values())
            raise Stopped(signal.SIGTERM)
    assert procs and not any(p.is_alive() for p in procs)

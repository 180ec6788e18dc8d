"""``schedsim plan`` refuses before any work: the total instructions of every candidate's
simulation from the closed form (``schedsim.plan.work``), checked against generated
programs; unknown names with a suggestion; the ``best:`` line is its table row's text;
layers the stages do not divide split as torchtitan splits them."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import LimitError
from schedsim.plan import PlanSpace
from schedsim.plan.candidates import enumerate_candidates, grid_points, program_of
from schedsim.plan.driver import check_plan, resolve, run_plan
from schedsim.plan.work import plan_work, point_instructions
from schedsim.util import limits
from schedsim.workload.layout import torchtitan_llm_split

BIG = ["plan", "--model", "llama3.1-405b", "--gpus", "4096", "--gpu", "h100-sxm",
       "--global-batch-size", "65536", "-j", "1", "-q"]


def _one_line(r, *parts):
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    text = " ".join(r.output.split())
    for p in parts:
        assert p in text, text
    return text


def _nothing_generated(monkeypatch):
    """Make building any program, or simulating, fail the test."""
    import schedsim.plan.candidates as cands
    import schedsim.plan.model as model

    def built(*a, **k):
        raise AssertionError("a program was built")

    monkeypatch.setattr(cands, "program_of", built)
    monkeypatch.setattr(model, "evaluate_batch", built)


def test_a_405b_plan_on_4096_gpus_is_refused_with_the_closed_form_total(tmp_path,
                                                                         monkeypatch):
    # defaults: tp 1, 2, 4, 8; pp the divisors of 4096 up to 126 layers (1 .. 64, seven);
    # 1f1b, zb-h1 (1 stage a rank), interleaved-1f1b, zbv, dualpipev (2): 8 pp stages a
    # (tp, pp) point; three recompute modes, ZeRO 1. dp = 4096 / (tp pp), microbatches
    # m = 65536 / dp = 16 tp pp; every point passes the workload's rules (126 layers
    # split as torchtitan does up to 128 stages). Total: 3 x 12 x 8 pp x m summed.
    tps, pps = [1, 2, 4, 8], [1, 2, 4, 8, 16, 32, 64]
    total = sum(3 * 12 * 8 * pp * 16 * tp * pp for tp in tps for pp in pps)
    assert total == 377_464_320
    _nothing_generated(monkeypatch)
    out = tmp_path / "plan.jsonl"
    r = CliRunner().invoke(app, BIG + ["--out", str(out)])
    _one_line(r, "refusing a plan of 420 candidates: about 377,464,320 instructions",
              "the largest, tp8 pp64 dp8 interleaved-1f1b with 8,192 microbatches, about "
              "12,582,912 each",     # 12 x 128 stages x 8,192
              "above the limit of 20,000,000 instructions", "fewer --gpus",
              "--schedules", "a smaller --global-batch-size",
              "or raise it with --max instructions=377464320")
    assert not out.exists()


def test_the_limit_is_the_instructions_limit_at_its_boundary():
    space = PlanSpace(model="llama3.1-405b", gpus=4096, gpu="h100-sxm",
                      global_batch_size=65536)
    with limits.using(instructions=377_464_320):
        assert check_plan(space).work.instructions == 377_464_320
    with limits.using(instructions=377_464_319), pytest.raises(LimitError):
        check_plan(space)


def test_the_closed_form_holds_on_every_generated_program():
    """Each point's closed form: the ranks, stages and microbatches of the program its
    candidates simulate, exactly, and at most INSTR_PER_CELL instructions a cell; the
    plan's total is their sum over the candidates the workload's rules allow."""
    space = PlanSpace(model="llama3.1-8b", gpus=16, gpu="h100-sxm", seq=4096,
                      global_batch_size=64, tp=[2, 4], pp=[2, 3, 4],
                      schedules=["1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"],
                      recompute=["none", "full"])
    res = resolve(space)
    points = grid_points(res)
    work = plan_work(res, points)
    enum = enumerate_candidates(res, points)
    # the workload's rules removed pp 3 (16 GPUs); the schedules' own rules the rest
    workload_rules = enum.rejections.counts.pop("gpus % (tp x cp x pp)")
    assert work.candidates == enum.grid - workload_rules == 40
    assert len(enum.legal) + sum(enum.rejections.counts.values()) == work.candidates
    by_point = {(p.tp, p.pp, p.schedule): p for p in points}
    actual = 0
    for lg in enum.legal:
        c, w = lg.candidate, lg.workload
        pt = by_point[(c.tp, c.pp, c.schedule)]
        prog = program_of(w, c.schedule, None, {})
        assert prog.placement.ranks == c.pp
        assert prog.placement.stages == c.pp * pt.per_rank
        assert sorted({int(m) for m in prog.flat().mb if m >= 0}) == \
            list(range(w.microbatches))
        n = prog.num_instructions()
        assert n <= point_instructions(pt) == 12 * prog.placement.stages * w.microbatches
        actual += n
    # every legal candidate generated: the closed form is an upper bound and not a loose one
    legal_est = sum(point_instructions(by_point[(lg.candidate.tp, lg.candidate.pp,
                                                 lg.candidate.schedule)])
                    for lg in enum.legal)
    assert legal_est <= work.instructions
    assert 0.25 * legal_est <= actual <= legal_est


@pytest.mark.parametrize("extra,message", [
    (["--schedules", "1f1b,zbx"], "unknown schedule 'zbx' (did you mean 'zbv'?)"),
    (["--recompute", "ful"], "unknown --recompute 'ful' (did you mean 'full'?)"),
    (["--semantics", "dat"], "unknown --semantics 'dat' (did you mean 'data'?)"),
    (["--comm-policy", "asyn"], "unknown comm policy 'asyn' (did you mean 'async'?)"),
    (["--param", "mem_limt=3"], "unknown --param 'mem_limt' (did you mean 'mem_limit'?)"),
    (["--param", "chunks=3"], "--param chunks: the plan sets it (from --chunks)"),
    (["--executor", "locl"], "unknown --executor 'locl' (did you mean 'local'?)"),
    # a bad value, as the policy or schedule taking it converts it (it was refused per
    # candidate: "no legal layout: rule 'schedule 1f1b' removed 42 of 60 candidates")
    (["--comm-policy", "megatron", "--param", "batch_p2p_comm=maybe", "--schedules",
      "1f1b"], "error: comm policy 'megatron': bad value batch_p2p_comm='maybe': Input "
     "should be a valid boolean, unable to interpret input"),
    (["--param", "group_size=x"], "error: schedule 'interleaved-1f1b': bad value "
     "group_size='x': Input should be a valid integer, unable to parse string"),
    (["--mem-limit", "70Gx"], "error: --mem-limit '70Gx': unknown unit 'Gx'; give a "
     "number > 0 or a size such as 76GiB"),
    (["--mem-limit", "0"], "error: --mem-limit '0': must be finite and > 0"),
])
def test_unknown_names_are_refused_before_any_work(extra, message, monkeypatch):
    import schedsim.plan.candidates as cands
    import schedsim.plan.driver as driver

    def worked(*a, **k):
        raise AssertionError("the grid was enumerated")

    monkeypatch.setattr(driver, "grid_points", worked)
    monkeypatch.setattr(cands, "grid_points", worked)
    _nothing_generated(monkeypatch)
    # the 405B grid above the work limit: a name is refused before the work is counted
    _one_line(CliRunner().invoke(app, BIG + extra), message)


def test_mem_limit_takes_a_size_or_a_number_of_gib():
    """``plan --mem-limit 70GiB`` read "Input should be a valid number" (a float option;
    ``simulate --mem-limit 70GiB`` worked): a size is bytes per GPU, a bare number GiB as
    before (:func:`schedsim.util.units.parse_size`)."""
    from schedsim.cli.plan import _mem_limit_gib

    base = ["plan", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "h100-sxm",
            "--global-batch-size", "64", "--tp", "2", "--pp", "4", "--schedules", "1f1b",
            "--recompute", "none", "-j", "1", "-q", "--mem-limit"]
    outs = [CliRunner().invoke(app, base + [v]) for v in ("70GiB", "70", "71680 MiB")]
    assert [r.exit_code for r in outs] == [0, 0, 0], outs[0].output
    assert outs[0].output == outs[1].output == outs[2].output
    assert "memory limit 70 GiB," in outs[0].output
    assert _mem_limit_gib("75GB") == 75e9 / 2 ** 30 and _mem_limit_gib(None) is None
    assert _mem_limit_gib("0.5") == 0.5 and _mem_limit_gib("1TiB") == 1024


def _reference_split(layers, stages, input_weight=1, output_weight=1):
    """torchtitan/distributed/pipeline_parallel.py::_generate_llm_fqn_per_model_part
    (pytorch/torchtitan @b5bcd76), as written there, counting the ``layers.N`` names."""
    if stages == 1:
        return [layers]
    eff = layers + input_weight + output_weight
    per, extra = eff // stages, eff % stages
    if per == 0 or input_weight > per or output_weight > per:
        return None
    out, cur = [], 0
    for i in range(stages):
        mods = []
        n = per + (1 if i < extra else 0)
        if i == 0:
            n -= input_weight
        elif i == stages - 1:
            n -= output_weight
        for _ in range(n):
            if cur < layers:
                mods.append(f"layers.{cur}")
                cur += 1
        out.append(len(mods))
    return out


def test_torchtitan_llm_split_is_torchtitans():
    from schedsim.workload import WorkloadError

    assert torchtitan_llm_split(126, 4) == [31, 32, 32, 31]
    assert torchtitan_llm_split(126, 5) == [25, 26, 26, 25, 24]
    assert torchtitan_llm_split(126, 8) == [15] + [16] * 6 + [15]
    assert torchtitan_llm_split(126, 128) == [0] + [1] * 126 + [0]
    for layers in range(1, 70):
        for stages in range(1, layers + 4):
            ref = _reference_split(layers, stages)
            if ref is None:
                with pytest.raises(WorkloadError, match="torchtitan's split"):
                    torchtitan_llm_split(layers, stages)
            else:
                assert torchtitan_llm_split(layers, stages) == ref
                assert sum(ref) == layers


def test_a_126_layer_model_plans_at_pp_that_does_not_divide_126():
    # (the 141 GiB H200: ZeRO-3 under PP holds the stage's gathered parameters and fp32
    # gradients, 96.7 GiB, over an H100's 80; a --mem-limit above the HBM is refused)
    space = PlanSpace(model="llama3.1-405b", gpus=256, gpu="h200", seq=4096,
                      global_batch_size=256, tp=[8], pp=[4], schedules=["1f1b"],
                      recompute=["full"], zero=[3])
    res = run_plan(space, top=1)
    assert res.legal == 1 and res.simulated == 1
    best = res.ranking[0]
    assert (best.candidate.pp, best.stages, best.microbatches) == (4, 4, 32)
    w = enumerate_candidates(res.resolved).legal[0].workload
    assert [s.layers for s in w.stage_layout()] == [31, 32, 32, 31]
    # an even split stays Megatron-LM's: 126 over 2 stages
    w2 = enumerate_candidates(resolve(PlanSpace(**{**space.__dict__, "pp": [2],
                                                   "gpus": 16}))).legal[0].workload
    assert w2.layout is None and [s.layers for s in w2.stage_layout()] == [63, 63]


def test_the_best_line_is_its_table_row():
    args = ["plan", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq",
            "4096", "--global-batch-size", "64", "--tp", "2,4", "--pp", "2,4", "--schedules",
            "1f1b,zbv", "--recompute", "none,full", "--top", "2", "-j", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    rows = [[c.strip() for c in ln.strip("│").split("│")]
            for ln in r.stdout.splitlines() if ln.startswith("│")]
    _, layout, sched, rc, mb, step, tok, bubble, mfu, peak = rows[0]
    best = [ln for ln in r.stdout.splitlines() if ln.startswith("best:")]
    assert best == [f"best: {layout} {sched} recompute {rc}, {mb} microbatches: {tok} "
                    f"tokens/s/GPU, step {step} ms, bubble {bubble}, MFU {mfu}, peak GiB "
                    f"per rank {peak}"]
    res = run_plan(PlanSpace(model="llama3.1-8b", gpus=16, gpu="h100-sxm", seq=4096,
                             global_batch_size=64, tp=[2, 4], pp=[2, 4],
                             schedules=["1f1b", "zbv"], recompute=["none", "full"]), top=2)
    b = res.ranking[0]
    # a time, a rate and a GiB: 4 significant digits; MFU a percent (units.py)
    from schedsim.util.units import fmt_mfu, fmt_rate, fmt_time

    assert (tok, step, mfu) == (fmt_rate(b.tokens_per_s_per_gpu), fmt_time(b.step_ms),
                                fmt_mfu(b.mfu))
    assert peak == " ".join(fmt_time(g) for g in b.peak_gib)
    assert (step, peak) == ("1879", "29.05 23.13")
    doc = json.loads(CliRunner().invoke(app, args + ["--format", "json"]).stdout)
    row = doc["candidates"]["rows"][0]          # the same row, exact numbers
    assert (row["layout"], row["tokens_s_gpu"], row["step_ms"], row["mfu"]) == (
        layout, b.tokens_per_s_per_gpu, b.step_ms, b.mfu)
    assert row["peak_gib_per_rank"] == max(b.peak_gib)

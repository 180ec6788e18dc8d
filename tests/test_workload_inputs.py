"""Defects a new user found in the workload path (a ``[workload]`` table: model config +
GPU -> costs in ms, bytes per rank), each with its reproducer: suggestions, GPU figures
in their units, ``[schedule]`` keys, the flags that disagree with the workload,
``--mem-limit`` as a size, per-op overheads."""
from __future__ import annotations

from pathlib import Path

import pytest

from schedsim.util.suggest import closest, did_you_mean

# the small workload scenario and the CLI helpers, one home (test_workload_cli)
from test_workload_cli import SMALL, run, write  # noqa: E402


def one_error(r: object) -> str:
    """The one error line of a refused run (exit 2, no traceback), whitespace collapsed."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.count("error:") == 1, r.output
    return " ".join(r.output.split())


# -- did-you-mean: a prefix first ------------------------------------------------------
def test_suggestion_prefers_a_prefix_match(tmp_path: Path) -> None:
    """``gpu = "h100"`` suggested 'h800' (difflib's ratio); the user meant h100-sxm."""
    from schedsim.workload.hardware import GPUS

    assert closest("h100", GPUS) == "h100-sxm" and closest("H100", GPUS) == "h100-sxm"
    assert closest("a100", GPUS) == "a100-80gb" and closest("mi300", GPUS) == "mi300x"
    # the shortest of several prefixed names; no prefix: difflib as before
    assert closest("dualpip", ["dualpipev", "dualpipe"]) == "dualpipe"
    assert closest("h80", GPUS) == "h800" and closest("1fb1", ["1f1b", "gpipe"]) == "1f1b"
    assert closest("h", GPUS) is None and did_you_mean("zzz", GPUS) == ""
    r = run("simulate", write(tmp_path, SMALL.replace('"h100-sxm"', '"h100"')), "-q")
    assert "unknown gpu 'h100' (did you mean 'h100-sxm'?)" in one_error(r)


# -- GPU figures in their units, within what a real GPU has ----------------------------
@pytest.mark.parametrize("field,msg", [
    # HBM meant as GiB; peaks meant as FLOP/s; bandwidth meant as TB/s or Gb/s
    ("hbm_bytes = 80", "hbm_bytes = 80 is out of range for a real GPU: 1 GiB to 4 TiB, in "
     "bytes; h100-sxm has 85899345920 bytes (80 GiB)"),
    ("hbm_bytes = 80e9e9".replace("e9e9", "e18"), "hbm_bytes = 8e+19 is out of range for a "
     "real GPU: 1 GiB to 4 TiB, in bytes"),
    ("hbm_bytes = nan", "hbm_bytes = nan is out of range for a real GPU"),
    ("peak_tflops = { bf16 = 989e12 }", "peak_tflops.bf16 = 9.89e+14 is out of range for a "
     "real GPU: 1 to 20,000 TFLOP/s (dense); h100-sxm has 989.4 TFLOP/s"),
    ("hbm_bandwidth = 3.35", "hbm_bandwidth = 3.35 is out of range for a real GPU: 1e11 to "
     "1e14 bytes/s (100 GB/s to 100 TB/s); h100-sxm has 3.35e+12 bytes/s"),
    ("nvlink_bandwidth = inf", "nvlink_bandwidth = inf is out of range for a real GPU: 1e9 "
     "to 1e13 bytes/s per direction"),
    ("network_bandwidth = 400", "network_bandwidth = 400 is out of range for a real GPU: "
     "1e8 to 1e12 bytes/s per direction (0.8 to 8,000 Gb/s); h100-sxm has 5e+10 bytes/s"),
    ("gpus_per_node = 0", "gpus_per_node = 0 is out of range for a real GPU: 1 to 1,024 "
     "GPUs a node; h100-sxm has 8 GPUs"),
    # another tool's name for the capacity: the field, its unit and range
    ("memory = 80e9", "gpu h100-sxm: unknown key 'memory' (the field is hbm_bytes: 1 GiB to "
     "4 TiB, in bytes) (keys: name,"),
    ("hbm_byte = 3", "unknown key 'hbm_byte' (did you mean 'hbm_bytes'?)"),
])
def test_gpu_figure_outside_a_real_gpu_names_unit_and_range(tmp_path: Path, field: str,
                                                             msg: str) -> None:
    text = SMALL.replace('gpu = "h100-sxm"', f'gpu = {{ name = "h100-sxm", {field} }}')
    out = tmp_path / "t.json"
    line = one_error(run("simulate", write(tmp_path, text), "--json", out))
    assert msg in line and not out.exists(), line


def test_gpu_ranges_hold_every_preset_and_the_shipped_overrides() -> None:
    """The presets and the shipped scenarios' GPU tables lie within the ranges (the table
    is of real GPUs); a Hardware built directly is checked too."""
    from pydantic import ValidationError

    from schedsim.workload.hardware import GPU_RANGES, GPUS, Hardware, gpu_preset

    for name in GPUS:
        g = gpu_preset(name)
        assert all(GPU_RANGES["peak_tflops"][0] <= v <= GPU_RANGES["peak_tflops"][1]
                   for v in g.peak_tflops.values())
    gpu_preset("h100-sxm", hbm_bytes=103079215104, hbm_bandwidth=2.4e12)   # torchtitan's
    with pytest.raises(ValidationError, match="hbm_bytes = 8e\\+10 is out of range|"
                                              "hbm_bandwidth = 3 is out of range"):
        Hardware(name="custom", peak_tflops={"bf16": 100}, hbm_bytes=8e10,
                 hbm_bandwidth=3, nvlink_bandwidth=1e11, network_bandwidth=1e10)


# -- [schedule] keys -------------------------------------------------------------------
def test_unknown_schedule_key_named_with_did_you_mean(tmp_path: Path) -> None:
    """``microbatchs = 4`` beside a [workload] read "schedule '1f1b' takes no parameter
    'microbatchs' (it takes: none)", with no file and no hint of the key meant."""
    text = SMALL.replace('name = "1f1b"', 'name = "1f1b"\nmicrobatchs = 4')
    line = one_error(run("simulate", write(tmp_path, text), "-q"))
    assert line.startswith("error: ")
    assert ("w.toml: [schedule] unknown key 'microbatchs' (did you mean 'microbatches'?): "
            "schedule '1f1b' takes no parameter 'microbatchs' (it takes: none; comm policy "
            "'async': none; the table: name, ranks, microbatches, comm_policy, program, "
            "schedule_file, placement, stages, max_batch_ops)") in line
    # a generator's parameter misspelt in --param, a flag the schedule does not take:
    # the flag named
    line = one_error(run("simulate", "-s", "interleaved-1f1b", "-p", "4", "-m", "8",
                         "--param", "chunk=2", "-q"))
    assert ("Invalid value for '--param': chunk (did you mean 'chunks'?): schedule "
            "'interleaved-1f1b' takes no parameter 'chunk' (it takes: chunks,") in line
    line = one_error(run("simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--mem-limit", "3"))
    assert ("Invalid value for '--mem-limit': schedule '1f1b' takes no parameter "
            "'mem_limit' (it takes: none;") in line
    # beside --cost (which reads the rest first) the flag is still named, and the
    # source is the command line or the file, not "scenario" (it read "scenario:
    # [schedule] unknown key 'chunks'")
    for extra, flag, key in ((["--chunks", "2"], "chunks", "chunks"),
                             (["--mem-limit", "3"], "mem-limit", "mem_limit"),
                             (["--param", "chunk=2"], "param", "chunk")):
        line = one_error(run("simulate", "-s", "1f1b", "-p", "4", "-m", "8", *extra,
                             "--cost", "F=1,BW=2", "-q"))
        assert line.startswith(f"error: Invalid value for '--{flag}': ")
        assert f"schedule '1f1b' takes no parameter '{key}' (it takes: none;" in line
    text = SMALL.replace('name = "1f1b"', 'name = "1f1b"\nmicrobatchs = 4')
    line = one_error(run("simulate", write(tmp_path, text), "--cost", "F=1", "-q"))
    assert "w.toml: [schedule] unknown key 'microbatchs' (did you mean 'microbatches'?)" \
        in line
    # another policy's parameter and another tool's name keep their own messages
    line = one_error(run("simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--param",
                         "batch_p2p_comm=false", "-q"))
    assert "a parameter of the megatron comm policy" in line


# -- -p / -m against the workload ------------------------------------------------------
def test_flags_that_disagree_with_the_workload_name_the_flag(tmp_path: Path) -> None:
    """``simulate w.toml -p 8`` said "[schedule] ranks = 8 but [workload] pp = 4", a key the
    file does not have: the value came from -p, so the flag is named; a file's own key
    still names the key."""
    from schedsim.errors import FlagError
    from schedsim.scenario_flags import build_scenario

    p = write(tmp_path, SMALL)
    line = one_error(run("simulate", p, "-p", "8", "-q"))
    assert ("Invalid value for '--ranks' / '-p': 8 but the scenario's [workload] pp = 4 "
            "(its pipeline ranks): drop the flag, or change pp") in line
    line = one_error(run("simulate", p, "-m", "8", "-q"))
    assert ("Invalid value for '--microbatches' / '-m': 8 but the workload runs "
            "global_batch_size / (micro_batch_size x dp) = 16 / (1 x 1) = 16: drop the "
            "flag, or change global_batch_size") in line
    with pytest.raises(FlagError) as e:
        build_scenario(p, microbatches=8)
    assert e.value.flag == "microbatches"
    assert run("simulate", p, "-p", "4", "-m", "16", "-q").exit_code == 0
    own = write(tmp_path, SMALL.replace('name = "1f1b"', 'name = "1f1b"\nranks = 8'), "o.toml")
    line = one_error(run("simulate", own, "-q"))
    assert "o.toml: [schedule] ranks = 8 but [workload] pp = 4: drop one" in line


# -- --mem-limit as a size -------------------------------------------------------------
def test_mem_limit_size_converts_through_the_workload(tmp_path: Path) -> None:
    """``--mem-limit 76GiB`` was refused (a float option). A size is bytes per GPU: per
    rank (bytes - static - receive buffers - a backward's working set) / one microbatch's
    stored activations, the tightest rank's; the planners get one limit per rank and the
    workload's F/B/W deltas (tests/test_workload_mem_limit_planners.py); a bare number
    keeps its meaning (the paper's deltas, one limit)."""
    from schedsim.program.ir import Placement
    from schedsim.scenario import load_scenario
    from schedsim.scenario_flags import build_scenario
    from schedsim.workload.derive import derive
    from schedsim.workload.table import mem_limit_microbatches

    p = write(tmp_path, SMALL.replace('"1f1b"', '"zb-1p"'))
    w = load_scenario(p).workload_model()
    d = derive(w, Placement(kind="loop", ranks=4, stages=4))
    base = [s.total + r + b.working for s, r, b in zip(d.static, d.recv_bytes, d.stage_bytes)]
    act = [b.stored for b in d.stage_bytes]
    # the closed form: room for exactly 3 microbatches on the tightest rank
    nbytes = max(b + 3 * a for b, a in zip(base, act))
    assert mem_limit_microbatches(w, "zb-1p", {}, nbytes) == pytest.approx(3, rel=1e-12)
    want = [(30 * 2 ** 30 - b) / a for b, a in zip(base, act)]
    sc = build_scenario(p, mem_limit="30GiB")
    assert sc._mem_limit == pytest.approx(min(want), rel=1e-12) and min(want) > 1
    assert sc._mem_per_rank == pytest.approx(want, rel=1e-12)
    prog = sc.build_program()
    assert prog.params["mem_limit"] == pytest.approx(want, rel=1e-12)
    assert prog.params["mem_deltas"] == list(sc._mem_deltas)
    a = run("simulate", p, "--mem-limit", "30GiB", "-q")
    b = run("simulate", p, "--mem-limit", repr(min(want)), "-q")
    assert a.exit_code == b.exit_code == 0, a.output
    assert a.output != b.output
    assert a.output != run("simulate", p, "--mem-limit", "76GiB", "-q").output
    # zbv: a rank's microbatch is two chunk forwards of its larger chunk
    v = mem_limit_microbatches(w.model_copy(update={"chunks": 2}), "zbv", {}, 40 * 2 ** 30)
    dv = derive(w.model_copy(update={"chunks": 2}), Placement(kind="v", ranks=4, stages=8))
    sb = dv.stage_bytes
    assert v == pytest.approx(min((40 * 2 ** 30 - s.total - r - max(
        sb[q].working, sb[7 - q].working)) / (2 * max(sb[q].stored, sb[7 - q].stored))
        for q, (s, r) in enumerate(zip(dv.static, dv.recv_bytes))), rel=1e-12)
    # the same size in the file
    f = write(tmp_path, SMALL.replace('name = "1f1b"', 'name = "zb-1p"\nmem_limit = "30GiB"'),
              "f.toml")
    assert load_scenario(f)._mem_limit == pytest.approx(min(want), rel=1e-12)


def test_mem_limit_size_refusals_name_the_flag(tmp_path: Path) -> None:
    p = write(tmp_path, SMALL.replace('"1f1b"', '"zb-1p"'))
    line = one_error(run("simulate", p, "--mem-limit", "20GiB", "-q"))
    assert ("Invalid value for '--mem-limit': 20GiB: rank 3's static bytes, buffers, "
            "backward working set (19.03 GiB) leave 0.9711 GiB of 20 GiB, less than one microbatch's "
            "activations (3.642 GiB): give more memory, or a number of microbatches") in line
    line = one_error(run("simulate", "-s", "zb-1p", "-p", "4", "-m", "8", "--mem-limit",
                         "76GiB", "-q"))
    assert ("Invalid value for '--mem-limit': 76GiB is bytes per GPU, which only a "
            "scenario's [workload] (model and GPU) converts") in line
    line = one_error(run("simulate", p, "--mem-limit", "76Gx", "-q"))
    assert "Invalid value for '--mem-limit': size '76Gx': unknown unit 'Gx'" in line
    # a bare number: microbatches' worth, refused by the planner as before
    line = one_error(run("simulate", "-s", "zb-1p", "-p", "4", "-m", "8", "--mem-limit",
                         "0.5", "-q"))
    assert "zb-1p: --mem-limit must be a finite number >= 1" in line
    f = write(tmp_path, SMALL.replace('name = "1f1b"', 'name = "zb-1p"\nmem_limit = "abc"'),
              "f.toml")
    assert "f.toml: [schedule] mem_limit 'abc': give a number > 0" in one_error(
        run("simulate", f, "-q"))


# -- -s on a workload scenario with chunks ---------------------------------------------
def test_another_schedule_on_a_chunked_workload_reads_the_stage_rule() -> None:
    """``simulate llama3-70b-h100.toml -s 1f1b`` said "'1f1b' takes no parameter
    'chunks'": the [workload]'s chunks, handed to interleaved-1f1b, had been written into
    [schedule] and came back when the scenario was read again under -s. Now the real
    rule is named, and the file's own schedule runs as before."""
    from conftest import SCHEDULES

    llama = SCHEDULES / "llama3-70b-h100.toml"
    line = one_error(run("simulate", llama, "-s", "1f1b", "-q"))
    assert ("the schedule has 4 stages on 4 ranks but the workload has pp = 4 and pp x "
            "chunks = 20: set pp = 4 and chunks = 1") in line
    r = run("simulate", llama, "-q")
    assert r.exit_code == 0 and "peak 49.46 GiB of 80 GiB (fits)" in " ".join(r.output.split())


# -- per-op overheads: non-negative, finite --------------------------------------------
_OVERHEAD = "a finite number of ms from 0 to 1,000,000"


# 1e300 ran, printing 300-digit times; 1e308 overflowed the op costs: "'F': Input should
# be a finite number; 'B': ..." without the key
@pytest.mark.parametrize("value,shown", [("-1", "-1"), ("-0.001", "-0.001"), ("nan", "nan"),
                                         ("inf", "inf"), ("1e300", "1e+300"),
                                         ("1e308", "1e+308"), ("1000000.5", "1000000.5")])
def test_overhead_ms_bounded_in_the_file(tmp_path: Path, value: str, shown: str) -> None:
    text = SMALL.replace("pp = 4", f"pp = 4\noverhead_ms = {value}")
    line = one_error(run("simulate", write(tmp_path, text), "-q"))
    assert (f"w.toml: [workload]: overhead_ms = {shown} is out of range: give "
            f"{_OVERHEAD}") in line


def test_overhead_ms_at_its_bound_runs() -> None:
    """1e6 ms (the bound, :data:`~schedsim.workload.layout.MAX_OVERHEAD_MS`) runs: the
    makespan is longer by a whole number of overheads (one per compute piece on the
    critical path), at least one per F and B of 1F1B's (m + p - 1) = 19 slots."""
    from schedsim.workload import Workload, simulate_workload
    from schedsim.workload.layout import MAX_OVERHEAD_MS

    w = Workload(model="llama3.1-8b", gpu="h100-sxm", seq=4096, global_batch_size=16, tp=2,
                 pp=4, overhead_ms=MAX_OVERHEAD_MS)
    a = simulate_workload(w, "1f1b").makespan_ms
    b = simulate_workload(w.model_copy(update={"overhead_ms": 0.0}), "1f1b").makespan_ms
    pieces = (a - b) / MAX_OVERHEAD_MS
    assert MAX_OVERHEAD_MS == 1e6 and pieces == pytest.approx(round(pieces), abs=1e-6)
    assert round(pieces) >= 2 * 19


def test_overhead_and_efficiencies_bounded_on_a_copied_workload() -> None:
    """``simulate_workload(w.model_copy(update={"overhead_ms": -1.0}), ...)`` (a copy is
    not validated) ended in a pydantic traceback from BlockCosts, and a small negative
    overhead ran with costs below the roofline: check() bounds the per-op figures."""
    from schedsim.workload import Workload, WorkloadError, simulate_workload

    w = Workload(model="llama3.1-8b", gpu="h100-sxm", seq=4096, global_batch_size=16, tp=2,
                 pp=4)
    for key, v, allowed in (("overhead_ms", -1.0, _OVERHEAD),
                            ("overhead_ms", -1e-3, _OVERHEAD),
                            ("overhead_ms", float("nan"), _OVERHEAD),
                            ("overhead_ms", float("inf"), _OVERHEAD),
                            ("overhead_ms", 1e300, _OVERHEAD),
                            ("efficiency", 0.0, "a number > 0 and <= 1"),
                            ("comm_efficiency", 1.5, "a number > 0 and <= 1")):
        with pytest.raises(WorkloadError) as e:
            simulate_workload(w.model_copy(update={key: v}), "1f1b")
        assert e.value.rule == "sizes"
        assert str(e.value) == f"{key} = {v!r} is out of range: give {allowed}"
    # zero overhead is allowed: the step is the roofline's alone, shorter than the default
    a = simulate_workload(w.model_copy(update={"overhead_ms": 0.0}), "1f1b").step_ms
    assert 0 < a < simulate_workload(w, "1f1b").step_ms


def test_mem_limit_text_beside_a_stage_model_keeps_its_costs(tmp_path: Path) -> None:
    """A ``[model]`` scenario whose mem_limit is text ("4", a number of microbatches)
    still derives its costs from the stage model, and runs as with the number 4."""
    from schedsim.scenario import load_scenario

    base = '[schedule]\nname = "zb-1p"\nranks = 4\nmicrobatches = 8\n{}\n[model]\nlayers = 2\n'
    a = load_scenario(write(tmp_path, base.format('mem_limit = "4"'), "a.toml"))
    b = load_scenario(write(tmp_path, base.format("mem_limit = 4"), "b.toml"))
    assert a.stage_costs() is not None and a._mem_limit == 4.0
    from schedsim.sim.simulate import simulate

    ta = simulate(a.build_program(), a.costs, a.link, a.comm)
    tb = simulate(b.build_program(), b.costs, b.link, b.comm)
    assert ta.makespan == tb.makespan > 0


# -- head dimensions: whole, and query heads grouped over the key/value heads ----------
_HEADS = ('model = { hidden_size = 2048, num_hidden_layers = 4, num_attention_heads = 30, '
          'num_key_value_heads = 6, intermediate_size = 8192, vocab_size = 32000EXTRA }')


def test_head_dim_must_be_whole_unless_given(tmp_path: Path) -> None:
    """hidden 2048 over 30 heads ran with a head dim of 68 (68.27 floored): as in Hugging
    Face, hidden_size / num_attention_heads must be whole unless head_dim is given, and
    num_key_value_heads must divide num_attention_heads."""
    from schedsim.workload.model import load_model

    def text(extra: str = "", old: str = "30") -> str:
        return SMALL.replace('model = "llama3.1-8b"', _HEADS.replace("= 30", f"= {old}")
                             .replace("EXTRA", extra))

    out = tmp_path / "t.json"
    line = one_error(run("simulate", write(tmp_path, text()), "--json", out))
    assert ("w.toml: [workload]: model config hidden_size = 2048 is not a multiple of "
            "num_attention_heads = 30 (a head dimension of 68.27): give head_dim, or heads "
            "that divide hidden_size") in line and not out.exists()
    line = one_error(run("simulate", write(tmp_path, text(old="32")), "-q"))
    assert ("model config num_attention_heads = 32 is not a multiple of "
            "num_key_value_heads = 6: give key/value heads that divide the attention "
            "heads") in line
    # head_dim given (Qwen3 / Gemma style): taken as is; 30 heads over tp = 2 run
    assert run("simulate", write(tmp_path, text(", head_dim = 64")), "-q").exit_code == 0
    # every preset holds (qwen3-30b-a3b gives head_dim; deepseek-v3 divides 7168 by 128)
    from schedsim.workload.presets import MODELS

    assert [load_model(m).kv_channels for m in MODELS] == [128, 128, 128, 56, 128, 128]


# -- a required key misspelt -----------------------------------------------------------
def test_a_misspelt_required_key_is_named_with_the_key_meant(tmp_path: Path) -> None:
    """``sequence = 4096`` for ``seq`` read "[workload]: 'seq' is required", never naming
    the unknown key (an optional key's typo got "did you mean"): the unknown key comes
    first, suggested from the missing keys, the other missing ones named."""
    text = SMALL.replace("seq = 4096", "sequence = 4096")
    line = one_error(run("simulate", write(tmp_path, text), "-q"))
    assert ("w.toml: [workload]: unknown key 'sequence' (did you mean 'seq'?) (keys: model, "
            "gpu, seq,") in line
    line = one_error(run("simulate", write(tmp_path, text.replace(
        "global_batch_size = 16", "gbs = 16")), "-q"))
    assert ("[workload]: unknown key 'sequence' (did you mean 'seq'?); 'global_batch_size' "
            "is required (keys:") in line
    # no required key missing: the closest of all keys, as before
    line = one_error(run("simulate", write(tmp_path, SMALL + "sequence = 4096\n"), "-q"))
    assert "unknown key 'sequence' (did you mean 'sequence_parallel'?)" in line
    # a choice the word begins, only where nothing else is close
    assert closest("sequence", ["seq", "tp"]) == "seq" and closest("tpx", ["tp"]) == "tp"
    assert closest("s", ["seq"]) is None and closest("seqq", ["seq", "sequence"]) == "seq"


def test_one_workload_flag_without_a_workload_reads_in_the_singular() -> None:
    line = one_error(run("simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--model",
                         "llama3.1-8b"))
    assert line.startswith("error: --model changes a scenario's [workload] table and this "
                           "run has none: give a scenario with one")

"""The [workload] table through the command line: the step line, costs, memory in GiB,
the Timeline's workload object, compare, --model/--gpu, and bad input (one line, exit
2, no traceback, no output file)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SCHEDULES
from typer.testing import CliRunner
from workload_scenarios import SMALL

from schedsim.cli import app
from schedsim.scenario import load_scenario
from schedsim.timeline import Timeline
from schedsim.util.units import with_unit

runner = CliRunner()
LLAMA = SCHEDULES / "llama3-70b-h100.toml"



def run(*args: str) -> object:
    return runner.invoke(app, [str(a) for a in args], terminal_width=200)


def write(tmp_path: Path, text: str, name: str = "w.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_simulate_step_line_and_json(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    r = run("simulate", LLAMA, "-q", "--json", out)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "tokens/s/GPU" in text and "MFU" in text and "peak 49.46 GiB of 80 GiB (fits)" in text
    tl = Timeline.read_json(out)
    w = tl.workload
    assert tl.unit == "ms" and w["model"] == "llama3.1-70b" and w["gpus"] == 64
    assert w["step_ms"] == pytest.approx(w["makespan_ms"] + w["step_boundary_ms"])
    assert w["makespan_ms"] == pytest.approx(tl.makespan)
    assert w["tokens_per_s_per_gpu"] == pytest.approx(128 * 8192 / (w["step_ms"] / 1e3) / 64)
    # the byte model in the JSON gives the same peaks (memory in GiB from the file)
    r2 = run("memory", out, "--json", tmp_path / "m.json")
    assert r2.exit_code == 0 and "GiB" in r2.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert [x["peak"] for x in m["ranks"]] == w["peak_memory_bytes"]


def test_peak_and_hbm_at_one_precision(tmp_path: Path) -> None:
    """The step line and ``memory``'s verdict print the peak and the HBM by one rule
    (:func:`schedsim.util.units.fmt_gib_pair`): 27e9 bytes of HBM is 25.15 GiB (it read
    "of 25" beside "peak 27.5")."""
    small = SMALL.replace('gpu = "h100-sxm"', 'gpu = { name = "h100-sxm", hbm_bytes = 27e9 }')
    out = tmp_path / "t.json"
    r = run("simulate", write(tmp_path, small), "-q", "--json", out)
    assert r.exit_code == 0, r.output
    assert ("peak 27.54 GiB of 25.15 GiB (does NOT fit: 27.54 GiB > 25.15 GiB)"
            in " ".join(r.output.split())), r.output
    r = run("memory", out)
    assert r.exit_code == 0 and "peak 27.54 GiB of 25.15 GiB HBM: does NOT fit" in " ".join(
        r.output.split()), r.output


def test_timeline_workload_object_checked_strictly(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert run("simulate", write(tmp_path, SMALL), "-q", "--json", out).exit_code == 0
    d = json.loads(out.read_text())
    for bad in ({"mfu": "high"}, {"peak_memory_bytes": [1.0]}, {"extra_key": 1}):
        e = dict(d, workload={**d["workload"], **bad})
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(e))
        r = run("render", p, "--out", tmp_path / "x.png")
        assert r.exit_code == 2 and "workload" in r.output, r.output
        assert not (tmp_path / "x.png").exists()


def test_flags_change_the_workload(tmp_path: Path) -> None:
    a = run("simulate", LLAMA, "-q")
    b = run("simulate", LLAMA, "-q", "--gpu", "h200")
    assert a.exit_code == b.exit_code == 0
    assert "of 80 " in " ".join(a.output.split()) and "of 141 " in " ".join(b.output.split())
    r = run("simulate", write(tmp_path, SMALL), "-q", "--model", "mixtral-8x7b")
    assert r.exit_code == 0, r.output
    r = run("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "--gpu", "h200")
    assert r.exit_code == 2 and "[workload]" in r.output


def test_a_bad_model_or_gpu_flag_names_the_flag(tmp_path: Path, monkeypatch) -> None:
    """`simulate llama3-70b-h100.toml --model m.json` (a JSON list) read "command line:
    [workload]: ...: a model config is a JSON object", naming neither the flag nor the
    file; every refusal of the flag's own value is now "--model: ..." / "--gpu: ...", and
    one the flag's value meets in the scenario names the flag and its value."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "empty.json").write_text("")
    cases = [
        (["--model", "list.json"],
         f"error: --model: {tmp_path / 'list.json'}: a model config is a JSON object of "
         "config.json keys"),
        (["--model", "empty.json"],
         f"error: --model: {tmp_path / 'empty.json'}: not JSON: Expecting value: line 1 "
         "column 1 (char 0)"),
        (["--model", str(tmp_path)],
         f"error: --model: {tmp_path}: is a directory; give a model config"),
        (["--gpu", "h100"],
         "error: --gpu: unknown gpu 'h100' (did you mean 'h100-sxm'?): expected one of "
         "a100-80gb, h100-sxm, h800, h200, b200, mi300x"),
        (["--model", "llama3.1-8b"],     # 32 layers against the file's pp 4 x chunks 5
         "error: --model llama3.1-8b: 32 layers do not fill pp x chunks = 4 x 5 = 20 "
         "stages evenly: give a layout (a per-stage list or a Megatron layout string such "
         "as 'Et*1|...|L') or other pp/chunks"),
    ]
    for flags, line in cases:
        r = run("simulate", LLAMA, "-q", *flags, "--json", tmp_path / "t.json")
        assert r.exit_code == 2, r.output
        assert r.output.strip() == line
        assert not (tmp_path / "t.json").exists()


def test_costs_command(tmp_path: Path) -> None:
    r = run("costs", LLAMA, "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    b = json.loads((tmp_path / "c.json").read_text())
    assert len(b["stages"]) == 20 and b["stages"][0]["embedding"] and b["stages"][-1]["head"]
    assert [s["rank"] for s in b["stages"][:5]] == [0, 1, 2, 3, 0]
    assert "tensor + sequence parallel, selective recompute" in " ".join(r.output.split())
    sc = load_scenario(LLAMA)
    from schedsim.program.ir import Op

    assert b["stages"][3]["ms"]["F"] == sc.costs.cost(Op("F", 3, 0))
    assert run("costs", "-s", "1f1b", "-p", "2", "-m", "2").exit_code == 2


def test_costs_takes_the_table_options(tmp_path: Path) -> None:
    """``costs -q`` (the README: -q on every command that prints a table) and ``--format
    csv``: it said 'No such option: -q'. -q: the lines without the table; csv: the
    table's rows on stdout, one per stage, the F ms of --json."""
    p = write(tmp_path, SMALL)
    full, quiet = run("costs", p), run("costs", p, "-q")
    assert quiet.exit_code == 0 and "┃" in full.stdout and "┃" not in quiet.stdout
    assert quiet.stdout.splitlines() == full.stdout.splitlines()[-len(
        quiet.stdout.splitlines()):] and "rank 3: static" in quiet.stdout
    r = run("costs", p, "--format", "csv", "--json", tmp_path / "c.json")
    b = json.loads((tmp_path / "c.json").read_text())
    rows = r.stdout.splitlines()
    assert rows[0] == "stage,rank,layers,f_ms,b_ms,w_ms,bw_ms,tflop,act_gib,stash_gib"
    assert [float(x.split(",")[3]) for x in rows[1:]] == [s["ms"]["F"] for s in b["stages"]]


def test_compare_with_a_workload(tmp_path: Path) -> None:
    r = run("compare", "--scenario", write(tmp_path, SMALL), "--schedules",
            "1f1b,zbv,interleaved-1f1b", "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "c.json").read_text())
    assert [x["schedule"] for x in rows] == ["1f1b", "zbv", "interleaved-1f1b"]
    assert [x["stages"] for x in rows] == [4, 8, 8]
    assert all(x["step_ms"] > 0 and 0 < x["mfu"] < 1 for x in rows)


def test_compare_with_a_workload_draws_its_gantt(tmp_path: Path, monkeypatch) -> None:
    """``compare --gantt --memory`` of a [workload]: one chart and one memory panel (GiB)
    per schedule on one time axis, as plain compare draws it (it wrote no file, exit 0)."""
    import schedsim.plot

    figs = []
    save = schedsim.plot.save_figure
    monkeypatch.setattr(schedsim.plot, "save_figure", lambda f, p: (figs.append(f),
                                                                     save(f, p)))
    png, js = tmp_path / "cmp.png", tmp_path / "c.json"
    r = run("compare", write(tmp_path, SMALL), "--schedules", "1f1b,zbv", "--gantt", png,
            "--memory", "--json", js)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = json.loads(js.read_text())
    axes = figs[0].get_axes()
    assert [a.get_title(loc="left") for a in axes[::2]] == [
        f"{x['schedule']}: step {with_unit(x['step_ms'], 'ms')}, bubble "
        f"{x['bubble_ratio']:.3f}"
        for x in rows]
    assert [a.get_ylabel() for a in axes[1::2]] == ["memory per rank\n(GiB)"] * 2
    assert len({a.get_xlim() for a in axes}) == 1


BAD = [
    ('model = "llama3.1-8b"', 'model = { hidden_size = 64, num_hidden_layer = 2 }',
     "unknown model config key 'num_hidden_layer'"),
    ("tp = 2", "tp = 3", "attention heads do not split over tp = 3"),
    ('model = "llama3.1-8b"', 'model = "mixtral-8x7b"\nep = 3\ndp = 3',
     "8 experts do not split over ep = 3"),
    ("pp = 4", "pp = 3", "32 layers do not fill pp x chunks"),
    ("global_batch_size = 16", "global_batch_size = 10\ndp = 4",
     "global_batch_size = 10 is not a multiple of micro_batch_size x dp"),
    ("tp = 2", "tp = 2\ncp = 2", "context parallelism is not built"),
    ("seq = 4096", "seq = 4096\nsequence_lenght = 1", "unknown key 'sequence_lenght'"),
    ('gpu = "h100-sxm"', 'gpu = "h100"', "unknown gpu 'h100' (did you mean 'h100-sxm'?)"),
    # a GPU override: a bad dict key named as a key (not pydantic's 'peak_tflops.fp9.[key]'),
    # a validator's message without pydantic's "'': Value error,"
    ('gpu = "h100-sxm"', 'gpu = { name = "h100-sxm", peak_tflops = { fp9 = 3 } }',
     "gpu h100-sxm: key 'fp9' of 'peak_tflops': Input should be 'fp32', 'tf32', 'bf16', "
     "'fp16' or 'fp8'"),
    ('gpu = "h100-sxm"', 'gpu = { name = "h100-sxm", peak_tflops = { bf16 = -1 } }',
     "gpu h100-sxm: peak_tflops.bf16 = -1 is out of range for a real GPU: 1 to 20,000 "
     "TFLOP/s (dense); h100-sxm has 989.4 TFLOP/s"),
    ('gpu = "h100-sxm"', 'gpu = { name = "h100-sxm", peak_tflops = { bf16 = "x" } }',
     "gpu h100-sxm: 'peak_tflops.bf16': Input should be a valid number, unable to parse "
     "string as a number (got str 'x')"),
    ('gpu = "h100-sxm"', 'gpu = { name = "h100-sxm", hbm = 3 }',
     "gpu h100-sxm: unknown key 'hbm' (the field is hbm_bytes: 1 GiB to 4 TiB, in bytes) "
     "(keys: name,"),
    # strict types, as the other tables: a quoted number or a boolean is not coerced
    ("tp = 2", 'tp = "2"', "'tp': Input should be a valid integer (got str '2')"),
    ("seq = 4096", 'seq = "4096"', "'seq': Input should be a valid integer (got str '4096')"),
    ("seq = 4096", 'seq = 4096\nefficiency = "0.5"',
     "'efficiency': Input should be a valid number (got str '0.5')"),
    ("seq = 4096", "seq = 4096\nzero = true",
     "'zero': Input should be a valid integer (got bool True)"),
    ("seq = 4096", 'seq = 4096\nnum_gpus = "16"',
     "'num_gpus': Input should be a valid integer (got str '16')"),
    # a model figure out of range: the key, the value, the range
    ('model = "llama3.1-8b"', 'model = { hidden_size = 64, num_hidden_layers = -2, '
     'num_attention_heads = 4, intermediate_size = 128, vocab_size = 100 }',
     "w.toml: [workload]: model config num_hidden_layers = -2 is out of range: give a "
     "whole number from 1 to 16,384"),
    # the workload's costs are in ms: another [costs] unit printed them as slots
    ("pp = 4", 'pp = 4\n[costs]\nunit = "slot"',
     "[costs] unit = 'slot' beside a [workload]: the workload derives its costs in ms "
     "(a kind typed in [costs] is read in ms too); remove unit from [costs]"),
]


@pytest.mark.parametrize("old,new,msg", BAD)
def test_bad_workload_one_line_exit_2(tmp_path: Path, old: str, new: str, msg: str) -> None:
    p = write(tmp_path, SMALL.replace(old, new))
    out = tmp_path / "t.json"
    r = run("simulate", p, "--json", out)
    assert r.exit_code == 2, r.output
    assert msg in " ".join(r.output.split()) and "Traceback" not in r.output
    assert r.output.startswith("error: ") and r.output.count("error:") == 1, r.output
    assert not out.exists()


def test_costs_unit_ms_agrees_with_a_workload(tmp_path: Path) -> None:
    """``[costs] unit = "ms"`` (what a calibrate cost file writes) agrees with the
    workload's unit: the same run as without it."""
    a = run("simulate", write(tmp_path, SMALL + '[costs]\nunit = "ms"\n'), "-q")
    b = run("simulate", write(tmp_path, SMALL, "p.toml"), "-q")
    assert a.exit_code == 0, a.output
    assert a.output.splitlines()[1:] == b.output.splitlines()[1:]
    assert "makespan 1170 ms" in a.output


def test_workload_and_model_tables_exclusive(tmp_path: Path) -> None:
    r = run("simulate", write(tmp_path, SMALL + "\n[model]\nlayers = 2\n"))
    assert r.exit_code == 2 and "[workload] and [model]" in r.output


def test_schedule_sizes_must_agree(tmp_path: Path) -> None:
    r = run("simulate", write(tmp_path, SMALL.replace('name = "1f1b"',
                                                      'name = "1f1b"\nmicrobatches = 7')))
    assert r.exit_code == 2 and "microbatches = 7" in r.output
    r = run("simulate", write(tmp_path, SMALL), "-p", "8")
    assert r.exit_code == 2 and "Invalid value for '--ranks' / '-p': 8 but" in r.output


def test_model_config_json_beside_the_scenario(tmp_path: Path) -> None:
    """A Hugging Face config.json path is read relative to the scenario's folder, its
    bookkeeping keys ignored; the result equals the preset it copies."""
    from schedsim.workload.presets import MODELS

    cfg = {k: v for k, v in MODELS["llama3.1-8b"].items() if k not in ("name", "source")}
    cfg.update(architectures=["LlamaForCausalLM"], torch_dtype="bfloat16", rope_theta=5e5,
               rms_norm_eps=1e-5, max_position_embeddings=131072, bos_token_id=128000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text(json.dumps(cfg))
    p = write(tmp_path, SMALL.replace('model = "llama3.1-8b"', 'model = "sub/config.json"'))
    a, b = run("simulate", p, "-q"), run("simulate", write(tmp_path, SMALL, "p.toml"), "-q")
    assert a.exit_code == 0, a.output
    assert a.output.splitlines()[1:] == b.output.splitlines()[1:]


def test_model_flags_without_a_workload_table_say_where_to_go() -> None:
    """``--model``/``--gpu`` on a run with no [workload] table (flags only): one line naming
    the scenario to write and the flags-only command (plan), exit 2."""
    r = run("simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--model", "llama3.1-8b",
            "--gpu", "h100-sxm")
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert line.startswith("error: --model and --gpu change a scenario's [workload] table")
    assert "schedules/llama3-70b-h100.toml" in line and "'schedsim plan --model M" in line
    assert r.output.count("error:") == 1


def test_costs_names_every_stage_in_its_pieces_lines(tmp_path: Path) -> None:
    """Stages with the same per-layer pieces share one line that names them all (a new
    user read stage 2 as missing: the line of stages 1 and 2 said "stage 1")."""
    from schedsim.util.text import number_runs

    r = run("costs", write(tmp_path, SMALL), "-q")
    assert r.exit_code == 0, r.output
    heads = [ln.split(" pieces,")[0] for ln in r.stdout.splitlines() if " pieces," in ln]
    assert heads == ["stage 0", "stages 1-2", "stage 3"]
    assert number_runs([8, 0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and number_runs([]) == ""

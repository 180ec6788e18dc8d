"""The reserved and allocated peaks of a workload's step come from one stream of
allocations (schedsim/workload/reserved.py): per rank, reserved >= allocated always, also
when the caching allocator runs out of memory (the failure is reported beside the peaks,
not as a smaller reserved figure)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedsim.workload.layout import Workload
from schedsim.workload.run import simulate_workload

GiB = 2 ** 30
ROOT = Path(__file__).resolve().parent.parent


def _check_one_stream(res) -> None:
    """The invariants of one result with an allocator replay."""
    hbm = res.hbm_bytes
    rr = res.allocator
    assert rr is not None and res.peak_reserved_bytes is not None
    assert len(rr) == len(res.peak_memory_bytes) == len(res.peak_reserved_bytes)
    for q, (r, alloc, reserved) in enumerate(zip(rr, res.peak_memory_bytes,
                                                   res.peak_reserved_bytes)):
        # one stream: segments cover the blocks, the blocks the bytes asked
        assert r.peak_reserved >= r.peak_allocated >= r.peak_requested > 0, q
        # the figures the step line prints, per rank
        assert reserved >= alloc - 1, (q, reserved / GiB, alloc / GiB)
        if r.oom:
            # where it stopped: what it had reserved, a request that no segment could
            # take within the HBM, and the uncapped figure above the HBM
            assert 0 < r.oom_request and r.oom_allocated <= r.oom_reserved <= hbm
            assert r.oom_step >= 0 and reserved > hbm   # 0: in the static blocks
        else:
            assert r.oom_request == r.oom_reserved == r.oom_step == 0
            assert r.peak_reserved <= hbm and reserved == r.peak_reserved
    assert res.fits == (not any(r.oom for r in rr))
    line = res.line()
    assert line.count("(") == line.count(")") == 1, line     # one clause, no nesting
    assert ("does NOT fit: rank " in line) == (not res.fits), line


@st.composite
def workloads(draw):
    pp = draw(st.sampled_from([1, 2, 4]))
    chunks = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    framework = draw(st.sampled_from(["torchtitan", "megatron"]))
    layers = pp * chunks * draw(st.integers(1, 2))
    model = {"name": "tiny", "hidden_size": draw(st.sampled_from([512, 1024])),
             "num_hidden_layers": layers, "num_attention_heads": 8,
             "num_key_value_heads": draw(st.sampled_from([2, 8])),
             "intermediate_size": draw(st.sampled_from([1536, 2816])),
             "vocab_size": draw(st.sampled_from([8192, 32000]))}
    mbs = draw(st.sampled_from([1, 2]))
    kw = dict(model=model, gpu="h100-sxm", seq=draw(st.sampled_from([1024, 2048])),
              micro_batch_size=mbs, global_batch_size=mbs * pp * draw(st.integers(1, 2)),
              tp=draw(st.sampled_from([1, 2])), pp=pp, dp=1, chunks=chunks,
              recompute=draw(st.sampled_from(["none", "selective", "full"])),
              framework=framework,
              allocator=draw(st.sampled_from(["caching", "expandable"])))
    if framework == "torchtitan":
        kw.update(zero=draw(st.sampled_from([2, 3])), sequence_parallel=kw["tp"] > 1,
                  recv_buffers="per-microbatch", vocab_divisor=1)
    else:
        kw.update(zero=draw(st.sampled_from([0, 1])))
    schedule = ("1f1b" if pp == 1 or chunks == 1 else "interleaved-1f1b")
    return Workload(**kw), schedule


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.floats(0.1, 1.6))
def test_reserved_covers_allocated_per_rank(case, scale):
    """Random small workloads, on an HBM from a tenth of the uncapped reserved peak to
    well above it: per rank the reserved peak is at least the allocated one, whether the
    allocator fits, releases its cache to fit, or runs out of memory."""
    w, schedule = case
    free = simulate_workload(w, schedule)
    _check_one_stream(free)
    hbm = max(1.0, scale * max(free.peak_reserved_bytes))
    res = simulate_workload(w.model_copy(update={"gpu": w.gpu.model_copy(
        update={"hbm_bytes": hbm})}), schedule)
    _check_one_stream(res)
    # the peaks are the stream's whatever the capacity: an out-of-memory rank reports
    # the uncapped replay's figures
    assert res.peak_memory_bytes == free.peak_memory_bytes
    for r, f in zip(res.allocator, free.allocator):
        if r.oom:
            assert (r.peak_reserved, r.peak_allocated, r.peak_requested) == (
                f.peak_reserved, f.peak_allocated, f.peak_requested)


def test_torchtitan_405b_on_60_gib_reports_the_failure():
    """The reproduction: torchtitan's 405B 1F1B on 60 GiB. It printed ``peak 61.51 GiB
    allocated, 61.46 GiB reserved`` (the reserved bytes where the replay stopped); now
    the reserved peak is the stream's, as on 96 GiB (70.99 GiB), and the line names the
    failure: ranks 0-4 and 7 run out of memory, ranks 5 and 6 fit by releasing cached
    segments (below their uncapped figures)."""
    from schedsim.scenario import parse_scenario
    import tomllib

    text = (ROOT / "schedules" / "torchtitan-405b-1f1b.toml").read_text()
    assert "hbm_bytes = 103079215104" in text
    small = tomllib.loads(text.replace("hbm_bytes = 103079215104", "hbm_bytes = 64424509440"))
    big = tomllib.loads(text)
    res = {}
    for name, data in (("60", small), ("96", big)):
        sc = parse_scenario(data, source=name)
        res[name] = simulate_workload(sc.workload_model(), sc.schedule.name)
    tight, free = res["60"], res["96"]
    _check_one_stream(tight)
    assert tight.peak_memory_bytes == free.peak_memory_bytes
    assert max(tight.peak_memory_bytes) / GiB == pytest.approx(61.51, abs=0.005)
    assert max(tight.peak_reserved_bytes) / GiB == pytest.approx(70.99, abs=0.005)
    assert max(tight.peak_reserved_bytes) == max(free.peak_reserved_bytes)
    assert [r.oom for r in tight.allocator] == [True] * 5 + [False] * 2 + [True]
    for q in (5, 6):
        assert tight.peak_memory_bytes[q] <= tight.peak_reserved_bytes[q] <= 60 * GiB
        assert tight.peak_reserved_bytes[q] < free.peak_reserved_bytes[q]
    r0 = tight.allocator[0]
    assert (r0.oom_step, r0.oom_request) == (2, 0.8125 * GiB)
    assert r0.oom_reserved / GiB == pytest.approx(59.74, abs=0.005)
    line = tight.line()
    assert ("peak 61.51 GiB allocated, 70.99 GiB reserved, of 60 GiB (does NOT fit: rank 0 "
            "out of memory in step 2, 0.8125 GiB asked with 59.74 GiB reserved; 6 of 8 ranks "
            "out of memory)") in line, line
    assert "fits" not in re.sub("does NOT fit", "", line)
    assert free.line().endswith("peak 61.51 GiB allocated, 70.99 GiB reserved, of 96 GiB "
                                "(fits)")


def test_memory_command_prints_the_streams_allocated_beside_its_reserved(tmp_path):
    """Megatron, full recompute, the caching allocator: the last stage's stream frees
    the head's kept tensors before its layers' backward, so its peak is below the byte
    model's; ``simulate``'s table and ``memory`` (text and ``--json``) print the stream's
    allocated peak beside its reserved one, as the Timeline's ``peak_memory_bytes``."""
    import json

    from typer.testing import CliRunner

    from schedsim.cli import app

    toml = tmp_path / "m.toml"
    toml.write_text('[schedule]\nname = "1f1b"\n[workload]\nmodel = "llama3.1-8b"\n'
                    'gpu = "h100-sxm"\nseq = 4096\nglobal_batch_size = 16\ntp = 2\npp = 4\n'
                    'recompute = "full"\nallocator = "caching"\n')
    out, mem = tmp_path / "t.json", tmp_path / "m.json"
    runner = CliRunner()
    r = runner.invoke(app, ["simulate", str(toml), "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    w = json.loads(out.read_text())["workload"]
    r = runner.invoke(app, ["memory", str(out), "--json", str(mem)], terminal_width=200)
    assert r.exit_code == 0, r.output
    ranks = json.loads(mem.read_text())["ranks"]
    assert [x["peak"] for x in ranks] == w["peak_memory_bytes"]
    assert all(x["peak_reserved"] >= x["peak"] for x in ranks)
    # the byte model's own peak is above the stream's on the last rank alone
    from schedsim.analysis.memory import workload_memory
    from schedsim.timeline import Timeline

    agg = [m.peak for m in workload_memory(Timeline.read_json(out))]
    assert agg[:3] == pytest.approx(w["peak_memory_bytes"][:3], rel=1e-6)
    assert agg[3] > w["peak_memory_bytes"][3]

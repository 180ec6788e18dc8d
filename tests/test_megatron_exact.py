"""The ``megatron`` policy against megatron.core itself: every recorded run, launch for
launch and wait for wait.

``tests/data/megatron/{1f1b,interleaved}.json.gz`` hold what megatron.core's
``forward_backward_pipelining_without_interleaving`` / ``..._with_interleaving`` issued per
rank (NVIDIA/Megatron-LM ``core_r0.19.0``, the tree of the megatron-core 0.19.2 wheel), run
in-process with stand-in stages and a fake ``torch.distributed`` by
``benchmarks/record_megatron.py`` (by hand; CI has no megatron-core): every combination of
``batch_p2p_comm``, ``overlap_p2p_comm``, ``overlap_p2p_comm_warmup_flush``,
``deallocate_pipeline_outputs`` and ``variable_seq_lengths`` that Megatron accepts, 1F1B on
p = 2..8 with m in {1, p-1, p, p+1, 2p+1}, interleaved on p = 2..8 with v = 2 (and 3 up to
p = 4), m = p, 2p, (3p), p+1 and 2p+1, N = p or p+1.
"""
from __future__ import annotations

import gzip
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from schedsim.errors import ProgramError
from schedsim.generators import generate
from schedsim.program.lower import lower
from schedsim.program.megatron import MEGATRON_COMMIT
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

DATA = Path(__file__).parent / "data" / "megatron"
KNOBS = ("batch_p2p_comm", "overlap_p2p_comm", "overlap_p2p_comm_warmup_flush",
         "deallocate_pipeline_outputs", "variable_seq_lengths")


@lru_cache(maxsize=None)
def recording(name: str) -> dict:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def schedule(p: int, m: int, v: int | None, n: int | None):
    if v is None:
        return generate("1f1b", p, m)
    return generate("interleaved-1f1b", p, m, chunks=v, variant="megatron", group_size=n)


def tokens(prog) -> list[str]:
    return [line.split(": ", 1)[1] for line in prog.to_text().splitlines()]


def test_recordings_pin_the_commit_and_cover_every_combination() -> None:
    """Both recordings name the pinned tree; each holds every accepted knob combination
    (1F1B: 8, no overlap; interleaved: 16) on every shape, and the runs Megatron issues
    the same program for share one."""
    for name, combos, shapes in (("1f1b", 8, 34), ("interleaved", 16, 42)):
        doc = recording(name)
        assert MEGATRON_COMMIT in doc["source"] and "megatron-core 0.19.2" in doc["source"]
        flags = {tuple(r["flags"][k] for k in KNOBS) for r in doc["runs"]}
        assert len(flags) == combos
        got = {(r["p"], r["m"], r["v"], r["group_size"]) for r in doc["runs"]}
        assert len(got) == shapes and len(doc["runs"]) == combos * shapes
        assert {p for p, *_ in got} == set(range(2, 9))


@pytest.mark.parametrize("name", ["1f1b", "interleaved"])
def test_every_recorded_run_equals_the_policy(name: str) -> None:
    """For every recorded run: the policy's program, with the run's knobs as --param
    values, is megatron.core's token for token on every rank: compute, each launch (bare
    isend/irecv or one batch_isend_irecv) and each wait (a batch's one work, or each
    request), including the shape round of variable_seq_lengths."""
    doc = recording(name)
    for run in doc["runs"]:
        prog = lower(schedule(run["p"], run["m"], run["v"], run["group_size"]), "megatron",
                     **run["flags"])
        want = doc["programs"][run["program"]]
        assert tokens(prog) == want, (run["p"], run["m"], run["v"], run["flags"])


def test_two_ranks_crossed_exactly_where_recorded() -> None:
    """2-rank interleaving: where the recording found sends and receives that NCCL's
    launch-order matching would cross (batched calls, or the always-batched shape round),
    simulating the program fails on the first of them, named; everywhere else it runs
    (rendezvous sends of 1 MB tensors, the 24-byte shape messages eager as NCCL's small
    messages)."""
    costs, link = CostModel(F=1, BW=2, message_bytes=1e6), LinkModel(latency=0.1)
    comm = CommModel(semantics="rendezvous", eager_threshold_bytes=64)
    crossed = clean = 0
    for run in recording("interleaved")["runs"]:
        if run["p"] != 2:
            continue
        prog = lower(schedule(2, run["m"], run["v"], run["group_size"]), "megatron",
                     **run["flags"])
        if not run["crossed"]:
            assert simulate(prog, costs, link, comm).deadlock is None
            clean += 1
            continue
        send, recv = run["crossed"][0].split("~")
        with pytest.raises(ProgramError) as e:
            simulate(prog, costs, link, comm)
        msg = str(e.value)
        assert re.search(rf"send on link 0->1 is rank 0, instr \d+ \([^)]*\b{send}\b", msg)
        assert re.search(rf"recv is rank 1, instr \d+ \([^)]*\b{recv}\b", msg)
        crossed += 1
    assert (crossed, clean) == (48, 112)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_shape_round_costs_one_more_latency_per_hop(p: int) -> None:
    """One microbatch through p ranks under rendezvous, F=1, BW=2, latency L=0.5: the
    tensor alone crosses each of the 2(p-1) hops once, p(F+BW) + 2(p-1)L; with
    variable_seq_lengths each hop is preceded by its blocking shape round (24 bytes, one
    more L), p(F+BW) + 4(p-1)L -- batched or not."""
    costs, link = CostModel(F=1, BW=2), LinkModel(latency=0.5)
    comm = CommModel(semantics="rendezvous")
    for batch in (True, False):
        for var, hops in ((False, 2), (True, 4)):
            prog = lower(generate("1f1b", p, 1), "megatron", batch_p2p_comm=batch,
                         variable_seq_lengths=var)
            tl = simulate(prog, costs, link, comm)
            assert tl.makespan == p * 3 + hops * (p - 1) * 0.5
            shapes = [m for m in tl.messages if m.kind in ("FS", "BS")]
            assert len(shapes) == (2 * (p - 1) if var else 0)
            assert all(m.bytes == 24 for m in shapes)


def test_shape_tokens_round_trip_and_refusals(tmp_path: Path) -> None:
    """Shape-message tokens parse back to the same program and Timeline JSON with FS/BS
    messages loads; torch's CSV has no shape action: one line, exit 2."""
    from typer.testing import CliRunner

    from schedsim.cli import app
    from schedsim.program.tokens import parse_program_text
    from schedsim.timeline import Timeline

    prog = lower(generate("1f1b", 3, 2), "megatron", variable_seq_lengths=True)
    assert [[str(i) for i in row] for row in parse_program_text(prog.to_text())] == \
        [[str(i) for i in row] for row in prog.ranks]
    assert "1RECV_FS0" in prog.to_text() and "2SEND_BS1" in prog.to_text()
    tl = simulate(prog, CostModel(F=1, BW=2), LinkModel(latency=0.5),
                  CommModel(semantics="eager"))
    out = tmp_path / "tl.json"
    tl.write_json(out)
    back = Timeline.read_json(out)
    assert sorted({m.kind for m in back.messages}) == ["B", "BS", "F", "FS"]
    r = CliRunner().invoke(app, ["generate", "1f1b", "-p", "2", "-m", "2", "--comm-policy",
                                 "megatron", "--param", "variable_seq_lengths=true",
                                 "--format", "torch-csv-comms"])
    assert r.exit_code == 2 and "shape message" in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1


def test_replay_moves_the_shape_messages() -> None:
    """A real 2-process gloo run of the variable_seq_lengths program: every shape message
    moves (3 int64 = 24 bytes, one per tensor message) and the gradients match the
    single-process reference."""
    from collections import Counter

    from schedsim.replay.config import spec_from_scenario
    from schedsim.replay.launch import launch
    from schedsim.scenario import parse_scenario
    from schedsim.timeline import Timeline

    sc = parse_scenario({"schedule": {"name": "1f1b", "ranks": 2, "microbatches": 3,
                                      "comm_policy": "megatron", "batch_p2p_comm": False,
                                      "variable_seq_lengths": True},
                         "replay": {"hidden": 16, "seq": 4, "microbatch_size": 2,
                                    "heads": 2}})
    tl = Timeline.model_validate(launch(spec_from_scenario(sc, check_grads=True,
                                                           timeout=90.0), 2)["timeline"])
    assert tl.grad_check["passed"], tl.grad_check
    assert Counter(m.kind for m in tl.messages) == {"F": 3, "B": 3, "FS": 3, "BS": 3}
    assert {m.bytes for m in tl.messages if m.kind in ("FS", "BS")} == {24}

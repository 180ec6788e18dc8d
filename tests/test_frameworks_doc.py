"""docs/frameworks.md stays true: every command in it runs, prints the program text or
makespan shown after it, and the shared-stream table holds the simulator's numbers."""
from __future__ import annotations

import re
import shlex

import pytest
from conftest import ROOT
from doc_examples import examples
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.generators import generate
from schedsim.program.lower import lower
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

DOC = ROOT / "docs" / "frameworks.md"
runner = CliRunner()


BLOCKS = examples(DOC)


@pytest.mark.parametrize("cmds,shown", BLOCKS, ids=[b[0][0][9:40] for b in BLOCKS])
def test_commands_print_what_the_doc_shows(cmds: list[str], shown: list[str]) -> None:
    stdout = ""
    for cmd in cmds:
        r = runner.invoke(app, shlex.split(cmd)[1:], env={"COLUMNS": "200"})
        assert r.exit_code == 0, (cmd, r.output)
        stdout += r.stdout
    for line in shown:
        assert line in stdout, line


def test_every_example_is_checked() -> None:
    """Eight command blocks, each followed by the output it prints."""
    assert len(BLOCKS) == 8 and all(shown for _, shown in BLOCKS)


ROWS = {
    "1f1b, `torch` (Schedule1F1B)": ("1f1b", {}, "torch", {}),
    "1f1b, `megatron`": ("1f1b", {}, "megatron", {}),
    "1f1b, `megatron`, `batch_p2p_comm=false`": ("1f1b", {}, "megatron",
                                                 {"batch_p2p_comm": False}),
    "interleaved-1f1b, `torch`": ("interleaved-1f1b", {}, "torch", {}),
    "interleaved-1f1b, `torch`, `defer_pp_recv=true`": ("interleaved-1f1b", {}, "torch",
                                                        {"defer_pp_recv": True}),
    "interleaved-1f1b --variant megatron, `megatron`": (
        "interleaved-1f1b", {"variant": "megatron"}, "megatron", {}),
    "same, `batch_p2p_comm=false`": ("interleaved-1f1b", {"variant": "megatron"},
                                     "megatron", {"batch_p2p_comm": False}),
    "same, `overlap_p2p_comm=true`": ("interleaved-1f1b", {"variant": "megatron"},
                                      "megatron", {"overlap_p2p_comm": True}),
    "same, and `deallocate_pipeline_outputs=true`": (
        "interleaved-1f1b", {"variant": "megatron"}, "megatron",
        {"overlap_p2p_comm": True, "deallocate_pipeline_outputs": True}),
    "same, and `overlap_p2p_comm_warmup_flush=true`": (
        "interleaved-1f1b", {"variant": "megatron"}, "megatron",
        {"overlap_p2p_comm": True, "overlap_p2p_comm_warmup_flush": True}),
    "same as the batched row, `variable_seq_lengths=true`": (
        "interleaved-1f1b", {"variant": "megatron"}, "megatron",
        {"variable_seq_lengths": True}),
}


def test_shared_stream_table() -> None:
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", DOC.read_text(),
                      flags=re.M)
    table = {r[0]: r[1:] for r in rows if r[0] in ROWS}
    assert set(table) == set(ROWS)
    for label, (name, kw, policy, params) in ROWS.items():
        prog = lower(generate(name, 4, 8, **kw), policy, **params)
        for stream, cell in zip(("none", "per-peer", "per-rank"), table[label]):
            tl = simulate(prog, CostModel(F=1, BW=2), LinkModel(latency=0.5),
                          CommModel(semantics="rendezvous", comm_stream=stream),
                          raise_on_deadlock=False)
            got = "deadlock" if tl.deadlock else f"{tl.makespan:g}"
            assert got == cell.strip(), (label, stream)
    eager = lower(generate("interleaved-1f1b", 4, 8), "torch", defer_pp_recv=True)
    assert simulate(eager, CostModel(F=1, BW=2), LinkModel(latency=0.5),
                    CommModel(semantics="eager", comm_stream="per-peer")).makespan == 64

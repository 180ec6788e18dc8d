"""The command line alike everywhere (issue 27): -h and --version on every command, -q
on the commands that print tables, other tools' names answered with schedsim's, --backend
nccl refused before any rank starts, help grouped into panels."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from schedsim import __version__
from schedsim.cli import app

COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands]


def _run(args: list[str], code: int = 0):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == code, r.output
    return r


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_short_help_and_version(cmd: str) -> None:
    assert "Usage: schedsim" in _run([cmd, "-h"]).stdout
    assert _run([cmd, "--version"]).stdout.strip() == f"schedsim {__version__}"


def test_top_level_version_and_help() -> None:
    assert _run(["--version"]).stdout.strip() == f"schedsim {__version__}"
    assert "Commands" in _run(["-h"]).stdout


def test_q_prints_the_summary_without_the_table() -> None:
    args = ["stalls", "schedules/dualpipe-issue-t10-t12.toml", "--rank", "5"]
    full, quiet = _run(args).stdout, _run(args + ["-q"]).stdout
    assert "┃" in full and "┃" not in quiet
    assert quiet.splitlines() == full.splitlines()[:2]


@pytest.mark.parametrize("args,says", [
    (["simulate", "-s", "megatron-interleaved", "-p", "4", "-m", "8"],
     "schedsim's is -s interleaved-1f1b --variant megatron"),
    (["simulate", "-s", "1f1b", "-p", "4", "-m", "8", "--param", "num_microbatches=8"],
     "'num_microbatches' is Megatron-LM's / torch's name: schedsim calls it microbatches"),
])
def test_other_tools_names_get_schedsims(args: list[str], says: str) -> None:
    assert says in _run(args, 2).stderr


def test_megatron_keys_in_a_scenario_file(tmp_path) -> None:
    p = tmp_path / "m.toml"
    p.write_text('[schedule]\nname = "1f1b"\npipeline_model_parallel_size = 4\n')
    assert "schedsim calls it ranks (--ranks/-p)" in _run(["simulate", str(p)], 2).stderr


def test_nccl_without_gpus_is_refused_before_any_rank(monkeypatch) -> None:
    import schedsim.replay.config as config
    import schedsim.replay.launch as launch

    monkeypatch.setattr(config, "require_gpus", lambda n, python=None: (_ for _ in ()).throw(
        config.ScenarioError(f"--backend nccl runs one rank per CUDA GPU: {n} needed, this "
                             f"machine has 0")))
    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a rank started"))
    r = _run(["replay", "-s", "1f1b", "-p", "2", "-m", "2", "--backend", "nccl"], 2)
    assert "2 needed, this machine has 0" in r.stderr


def test_require_gpus_counts_in_a_child_process(tmp_path) -> None:
    """The count comes from a child (the launcher does not import torch): a stand-in
    python that reports 1 GPU refuses 2 ranks and accepts 1."""
    from schedsim.errors import ScenarioError
    from schedsim.replay.config import require_gpus

    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\necho 1\n")
    fake.chmod(0o755)
    require_gpus(1, str(fake))
    with pytest.raises(ScenarioError, match="2 needed, this machine has 1"):
        require_gpus(2, str(fake))


def test_help_is_grouped_into_panels() -> None:
    out = CliRunner().invoke(app, ["simulate", "-h"], env={"COLUMNS": "120"}).stdout
    for panel in ("Schedule", "Costs and links", "Comm", "Outputs", "Gantt chart", "Run"):
        assert f"╭─ {panel} " in out


def test_render_takes_gantt_as_its_output_flag(tmp_path) -> None:
    js, png = tmp_path / "t.json", tmp_path / "t.png"
    _run(["simulate", "-s", "1f1b", "-p", "2", "-m", "2", "--json", str(js), "-q"])
    _run(["render", str(js), "--gantt", str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG"

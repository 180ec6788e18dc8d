"""check-collectives on the user's own autograd Functions (issue 27): three operators as
users write them, checked in small gloo groups (float64, every run with a timeout).

This module is also what the check's processes load (``FILE.py:NAME``): keep its top
level to definitions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from schedsim.replay.collective_api import check_collective, function_spec  # noqa: E402

TIMEOUT = 120.0
HERE = Path(__file__).resolve()


class AllReduce(torch.autograd.Function):
    """A hand-written AllReduce as often written in notes on TP: all-reduce in forward
    and in backward (its test on 4 ranks reports x.grad = 4)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class CopyToModelParallel(torch.autograd.Function):
    """Megatron's f (megatron/core/tensor_parallel/mappings.py): identity forward,
    all-reduce backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class ReduceFromModelParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class NoCopy(torch.autograd.Function):
    """An f forgotten: identity both ways."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def domino_reduce(z):
    """Domino's row-parallel output (microsoft/DeepSpeedExamples, Domino's
    ``RowParallelLinear``): a raw in-place all-reduce outside autograd, no backward."""
    dist.all_reduce(z)
    return z


def test_function_spec_names_the_file() -> None:
    assert function_spec(AllReduce) == f"{HERE}:AllReduce"
    assert function_spec("mypkg.tp:AllReduce") == "mypkg.tp:AllReduce"
    from schedsim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="MODULE:NAME"):
        function_spec("mypkg.tp.AllReduce")
    with pytest.raises(ScenarioError, match="module level"):
        function_spec(lambda z: z)


def test_allreduce_both_ways_scales_by_tp() -> None:
    """Forward and backward all-reduce: every gradient tp x the replicated loss's (the
    summed loss's gradient, scale 1 there)."""
    res = check_collective(AllReduce, tp=4, timeout=TIMEOUT)
    assert res.verdict == "all-reduce twice" and res.bugs == ["all-reduce twice"]
    assert abs(res.scale - 4.0) <= 1e-9
    for name in ("W1", "b1", "W2", "x"):
        assert abs(res.tensors[name]["replicated"] - 4.0) <= 1e-9
        assert abs(res.tensors[name]["summed"] - 1.0) <= 1e-9
    assert res.ops["g"] == {"forward": "all-reduce", "backward": "all-reduce",
                            "inplace_untracked": False}
    assert any("all-reduce twice" in w for w in res.why) and res.hazards == []


def test_megatron_f_and_g_are_correct() -> None:
    res = check_collective(ReduceFromModelParallel, tp=2, f=CopyToModelParallel,
                           timeout=TIMEOUT)
    assert res.verdict == "correct" and res.bugs == [] and abs(res.scale - 1.0) <= 1e-9
    assert all(abs(r["summed"] - 0.5) <= 1e-9 for r in res.tensors.values())
    assert res.ops["f"]["backward"] == "all-reduce" and res.ops["g"]["backward"] == \
        "identity"


def test_missing_backward_all_reduce_of_f() -> None:
    res = check_collective(ReduceFromModelParallel, tp=2, f=NoCopy, timeout=TIMEOUT)
    assert res.verdict == "missing backward all-reduce"
    assert all(abs(res.tensors[k]["replicated"] - 1.0) <= 1e-9 for k in ("W1", "b1", "W2"))
    assert res.tensors["x"]["replicated"] is None
    assert abs(res.tensors["x"]["ranks_sum_to"] - 1.0) <= 1e-9


def test_domino_forward_only_all_reduce_through_the_cli(tmp_path) -> None:
    """Domino's raw forward all-reduce in a column->row block: scale 1, because autograd
    never sees the in-place sum, so its backward is the identity that g needs; the same
    operator on a tensor autograd saved corrupts the gradient (the hazard)."""
    from typer.testing import CliRunner

    from schedsim.cli import app

    out = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["check-collectives", "--function",
                                 f"{HERE}:domino_reduce", "--tp", "2", "--json", str(out),
                                 "--timeout", str(TIMEOUT)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["verdict"] == "correct" and abs(res["scale"] - 1.0) <= 1e-9
    assert res["ops"]["g"] == {"forward": "all-reduce", "backward": "identity",
                               "inplace_untracked": True}
    assert any("outside autograd" in w and "identity" in w for w in res["why"])
    assert len(res["hazards"]) == 1 and "in-place on a saved tensor" in res["hazards"][0]
    assert "verdict: correct (scale 1)" in r.stdout


def test_bad_function_is_refused_before_any_process() -> None:
    from typer.testing import CliRunner

    from schedsim.cli import app

    r = CliRunner().invoke(app, ["check-collectives", "--function", "nope.py:f"])
    assert r.exit_code == 2 and "no file nope.py" in r.stderr

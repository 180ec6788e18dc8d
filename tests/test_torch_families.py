"""torch.distributed.pipelining families and Megatron's interleaved 1F1B: per-rank compute
orders action by action against torch's own schedule classes (built live), Megatron's
rules, closed-form bubbles, and the CLI's errors for invalid combinations."""
from __future__ import annotations

import pytest
import torch_ref
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScheduleError
from schedsim.generators import GENERATORS, generate, names
from schedsim.generators.basic import gpipe, one_f_one_b
from schedsim.generators.torch_family import (
    interleaved_1f1b,
    interleaved_zb,
    looped_bfs,
    megatron_schedule_table,
    zbv_torch,
)
from schedsim.program.lower import lower
from schedsim.program.tokens import format_op
from schedsim.program.validate import validate_schedule
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

runner = CliRunner()

GRID = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p, 3 * p)]


def toks(schedule) -> list[list[str]]:
    return [[format_op(op) for op in row] for row in schedule.ranks]


def zbv_torch_variant(p: int, m: int):
    """`zbv --variant torch` as registered."""
    return generate("zbv", p, m, variant="torch")


OURS = {
    "GPipe": (1, gpipe),
    "Interleaved1F1B": (2, interleaved_1f1b),
    "LoopedBFS": (2, looped_bfs),
    "InterleavedZeroBubble": (2, interleaved_zb),
    "ZBVZeroBubble": (2, zbv_torch_variant),
    "DualPipeV": (2, lambda p, m: generate("dualpipev", p, m).schedule()),
}


@pytest.mark.parametrize("name", list(OURS))
def test_compute_order_equals_torch(name: str) -> None:
    """Every (p, m) of the grid: torch's pipeline_order (idle cells and REDUCE_GRAD
    dropped) equals ours action by action; where torch refuses, so do we."""
    k, fn = OURS[name]
    compared = 0
    for p, m in GRID:
        want = torch_ref.torch_compute(name, p, m, k)
        if want is None:
            with pytest.raises(ScheduleError):
                fn(p, m)
            continue
        got = toks(fn(p, m))
        for r in range(p):
            assert got[r] == want[r], f"{name} p={p} m={m} rank {r}"
        compared += 1
    # torch accepts the whole grid except DualPipeV with m = p (it needs m >= 2p)
    assert compared == (6 if name == "DualPipeV" else 9)


def test_zbv_torch_is_the_registered_variant() -> None:
    for p, m in ((2, 3), (4, 8), (3, 10)):
        assert generate("zbv", p, m, variant="torch").ranks == zbv_torch(p, m).ranks


@pytest.mark.parametrize("p,m", GRID)
def test_torch_1f1b_pipeline_order_is_off_by_one_on_last_rank(p: int, m: int) -> None:
    """torch's Schedule1F1B.pipeline_order table (not its runtime) starts the last rank
    at F1 and ends at F(m): an off-by-one. Every other rank equals our 1f1b, which
    equals the runtime (see test_policies)."""
    want = torch_ref.torch_compute("1F1B", p, m, 1)
    ours = toks(one_f_one_b(p, m))
    assert want[:-1] == ours[:-1]
    last = p - 1
    assert ours[-1] == [t for i in range(m) for t in (f"{last}F{i}", f"{last}BW{i}")]
    assert want[-1] == [t for i in range(m) for t in (f"{last}F{i + 1}", f"{last}BW{i}")]


SWEEP = [(fam, p, m, k) for fam, ks in (("Interleaved1F1B", (2, 3)),
                                        ("InterleavedZeroBubble", (2,)),
                                        ("LoopedBFS", (3,)), ("ZBVZeroBubble", (2,)))
         for k in ks for p in range(1, 5) for m in range(1, 2 * p + 3)]
FNS = {"Interleaved1F1B": interleaved_1f1b, "InterleavedZeroBubble": interleaved_zb,
       "LoopedBFS": looped_bfs}


def test_torch_rules_and_orders_beyond_the_grid() -> None:
    """Small p, any m (not only multiples of p), 2-3 chunks: torch refuses exactly what we
    refuse (the rounds rule m % max(1, m // p) == 0), and otherwise the orders are equal,
    valid, and finish under data semantics."""
    refused = 0
    for fam, p, m, k in SWEEP:
        want = torch_ref.torch_compute(fam, p, m, k)
        make = (lambda: zbv_torch(p, m)) if fam == "ZBVZeroBubble" else \
            (lambda: FNS[fam](p, m, chunks=k))
        if want is None:
            with pytest.raises(ScheduleError, match="rounds"):
                make()
            refused += 1
            continue
        s = make()
        assert toks(s) == want, (fam, p, m, k)
        validate_schedule(s)
        tl = simulate(lower(s), CostModel(F=1, B=2, W=1), LinkModel(),
                      CommModel(semantics="data"))
        assert len(tl.spans) == s.num_ops()
    # (p, m) = (2, 5), (3, 7), (4, 9): 2 rounds, m odd; interleaved 1F1B with 2 and 3
    # chunks, interleaved ZB with 2
    assert refused == 9


# -- Megatron-LM's interleaved order ---------------------------------------------------
def test_megatron_schedule_table_matches_its_docstring() -> None:
    """Megatron's comment: PP2 N3 M5 with VP2 -> microbatch 0 1 2 0 1 2 3 4 3 4, model
    chunk 0 0 0 1 1 1 0 0 1 1."""
    mb, chunk = zip(*megatron_schedule_table(5, 2, 3))
    assert mb == (0, 1, 2, 0, 1, 2, 3, 4, 3, 4)
    assert chunk == (0, 0, 0, 1, 1, 1, 0, 0, 1, 1)


def test_megatron_order_hand_derived() -> None:
    """p=2, m=5, N=3, 2 chunks. Rank 0: warmup 2(p-1) + (v-1)N = 5 forwards of the table,
    then F(k+5), BW(k) for k < 5 (BW(k) runs chunk v-1-chunk(k)), then BW(5..9)."""
    s = interleaved_1f1b(2, 5, variant="megatron", group_size=3)
    assert toks(s)[0] == ("0F0 0F1 0F2 2F0 2F1 2F2 2BW0 0F3 2BW1 0F4 2BW2 2F3 0BW0 2F4 "
                          "0BW1 0BW2 2BW3 2BW4 0BW3 0BW4").split()
    assert toks(s)[1][:5] == "1F0 1F1 1F2 3F0 3BW0".split()    # warmup 0 + (v-1)N = 3
    validate_schedule(s)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 12, 3), (3, 9, 2)])
def test_megatron_equals_torch_when_group_is_p(p: int, m: int, v: int) -> None:
    """With m a multiple of p, torch's rounds hold p microbatches, Megatron's default group
    N = p: the two orders are the same."""
    assert interleaved_1f1b(p, m, v, "megatron").ranks == interleaved_1f1b(p, m, v).ranks


def test_megatron_group_size_equal_to_torch_round() -> None:
    """p=4, m=10: torch runs 2 rounds of 5; Megatron with N=5 gives the same order, while
    Megatron's default N=4 leaves a last group of 2 < p and is refused."""
    assert interleaved_1f1b(4, 10, variant="megatron", group_size=5).ranks == \
        interleaved_1f1b(4, 10).ranks
    with pytest.raises(ScheduleError, match=r"m % N = 10 % 4 = 2.*valid group_size for "
                                            r"m = 10: 4\b|m % N = 10 % 4 = 2"):
        interleaved_1f1b(4, 10, variant="megatron")


@pytest.mark.parametrize("kw,needle", [
    (dict(ranks=6, microbatches=3, variant="megatron"),
     "impossible with 3 microbatches on 6 ranks"),
    (dict(ranks=4, microbatches=8, variant="megatron", group_size=3),
     "group_size N = 3 must lie in [p, m] = [4, 8]"),
    (dict(ranks=4, microbatches=8, variant="megatron", group_size=9),
     "group_size N = 9 must lie in [p, m] = [4, 8]"),
    (dict(ranks=4, microbatches=10, variant="megatron"), "m % N = 10 % 4 = 2"),
    (dict(ranks=1, microbatches=4, variant="megatron"), "needs ranks >= 2"),
    (dict(ranks=4, microbatches=8, group_size=4), "add --variant megatron"),
    (dict(ranks=4, microbatches=8, variant="deepspeed"), "unknown --variant 'deepspeed'"),
    (dict(ranks=4, microbatches=8, chunks=1), "--chunks must be an integer >= 2"),
    (dict(ranks=4, microbatches=9), "not a multiple of 2"),
])
def test_interleaved_rules(kw: dict, needle: str) -> None:
    with pytest.raises(ScheduleError) as e:
        interleaved_1f1b(**kw)
    assert needle in str(e.value)


def test_megatron_p6_m3_explains_why() -> None:
    with pytest.raises(ScheduleError) as e:
        interleaved_1f1b(6, 3, variant="megatron")
    msg = str(e.value)
    assert "p <= N <= m" in msg and "fill the 6-rank pipeline" in msg and "m >= p = 6" in msg


# -- closed forms under data semantics ----------------------------------------------------
COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 1)]


@pytest.mark.parametrize("F,B,W", COSTS)
def test_closed_form_bubbles(F: float, B: float, W: float) -> None:
    """Per-chunk costs F, B, W (BW = B+W); p ranks, v chunks, m a multiple of p:

    - interleaved 1F1B (torch and Megatron): makespan m v (F+BW) + (p-1)(F+BW), i.e.
      1F1B's bubble divided by v (Narayanan et al., SC'21, Sec. 2.2);
    - looped BFS: the same bubble (p-1)(F+BW);
    - interleaved ZB (torch): (p-1)(F+B-W), ZB-H1's bubble at chunk granularity;
    - torch ZB-V, m >= 2p: (p-1)(F+B-W).
    Every rank idles exactly the bubble."""
    costs = CostModel(F=F, B=B, W=W)
    BW = B + W
    for p in (2, 3, 4):
        for v in (2, 3):
            for m in (p, 2 * p, 3 * p):
                ideal = m * v * (F + BW)
                cases = [(interleaved_1f1b(p, m, v), (p - 1) * (F + BW)),
                         (interleaved_1f1b(p, m, v, "megatron"), (p - 1) * (F + BW)),
                         (looped_bfs(p, m, v), (p - 1) * (F + BW)),
                         (interleaved_zb(p, m, v), (p - 1) * (F + B - W))]
                if v == 2 and m >= 2 * p:
                    cases.append((zbv_torch(p, m), (p - 1) * (F + B - W)))
                for s, bubble in cases:
                    tl = simulate(lower(s), costs, LinkModel(), CommModel(semantics="data"))
                    assert tl.makespan == pytest.approx(ideal + bubble), (s.name, p, v, m)
                    assert [r.idle for r in tl.per_rank] == pytest.approx([bubble] * p)


# -- CLI ------------------------------------------------------------------------------------
def test_list_shows_every_family_with_constraints() -> None:
    r = runner.invoke(app, ["list"], env={"COLUMNS": "3000"})    # wide: no wrapping
    assert r.exit_code == 0, r.output
    rows = r.stdout.split("├")          # one table row (block of lines) per schedule
    for name in names():
        g = GENERATORS[name]
        block = next(b for b in rows if f"│ {name} " in b)
        assert f"constraints: {g.constraints}" in block, name
        assert f"placement: {g.placement}" in block, name
    assert "p=6, m=3 is impossible" in GENERATORS["interleaved-1f1b"].constraints


@pytest.mark.parametrize("args,needle", [
    (["-s", "interleaved-1f1b", "-p", "6", "-m", "3", "--variant", "megatron"],
     "impossible with 3 microbatches on 6 ranks"),
    (["-s", "interleaved-1f1b", "-p", "4", "-m", "10", "--variant", "megatron"],
     "m % N = 10 % 4 = 2"),
    (["-s", "interleaved-1f1b", "-p", "4", "-m", "8", "--variant", "megatron", "--param",
      "group_size=9"], "must lie in [p, m] = [4, 8]"),
    (["-s", "interleaved-1f1b", "-p", "4", "-m", "9"], "rounds = max(1, m // p) = 2"),
    (["-s", "interleaved-1f1b", "-p", "4", "-m", "8", "--chunks", "1"], "--chunks must be"),
    (["-s", "interleaved-1f1b", "-p", "4", "-m", "8", "--variant", "x"], "unknown --variant"),
    (["-s", "interleaved-1f1b", "-p", "4", "-m", "8", "--param", "group_size=4"],
     "add --variant megatron"),
    (["-s", "interleaved-zb", "-p", "4", "-m", "9"], "nearby valid m: 6, 7, 8, 10"),
    (["-s", "looped-bfs", "-p", "4", "-m", "8", "--chunks", "0"], "--chunks must be"),
    (["-s", "looped-bfs", "-p", "4", "-m", "8", "--variant", "torch"],
     "takes no parameter 'variant'"),
    (["-s", "1f1b", "-p", "4", "-m", "8", "--comm-policy", "nccl"],
     "unknown comm policy 'nccl'"),
])
def test_invalid_combinations_exit_2(args: list[str], needle: str, tmp_path) -> None:
    out = tmp_path / "tl.json"
    r = runner.invoke(app, ["simulate", *args, "--json", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error:") and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not out.exists()
    g = runner.invoke(app, ["generate", args[1], *args[2:], "--out", str(tmp_path / "x.csv"),
                            "--format", "torch-csv"])
    assert g.exit_code == 2 and needle in g.stderr and not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("policy", ["async", "torch", "commit"])
def test_cli_simulate_with_policy(policy: str) -> None:
    r = runner.invoke(app, ["simulate", "-s", "interleaved-1f1b", "-p", "4", "-m", "8",
                            "--comm-policy", policy, "--semantics", "eager"])
    assert r.exit_code == 0, r.output
    assert "makespan 57 slot" in r.stdout     # 8*2*3 + 3*3 (F=B=W=1, zero latency)


def test_megatron_error_in_a_real_process() -> None:
    """Through the console entry point: exit 2, one line on stderr, no traceback."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "schedsim", "simulate", "-s",
                        "interleaved-1f1b", "-p", "6", "-m", "3", "--variant", "megatron"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert "impossible with 3 microbatches on 6 ranks" in p.stderr

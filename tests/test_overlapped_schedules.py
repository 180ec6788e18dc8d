"""The overlapped 1F1B family (``1f1b-overlap``, ``interleaved-overlap``): orders against
Victarry/PP-Schedule-Visualization's own generators (tests/data/refs/victarry), the
steady-state closed form, the FB cost from a MoE stage model against 1F1B at equal work,
the delayed weight gradient, and ``schedsim list`` / ``compare``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScheduleError
from schedsim.generators import build_program, generate
from schedsim.program.tokens import format_op
from schedsim.scenario import load_scenario
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

REFS = Path(__file__).parent / "data" / "refs" / "victarry" / "overlap_orders.json"
runner = CliRunner()


def _cases() -> list[dict]:
    return json.loads(REFS.read_text())["cases"]


@pytest.mark.parametrize("case", _cases(),
                         ids=lambda c: f"{c['schedule']}-p{c['ranks']}-m{c['microbatches']}")
def test_order_equals_victarry(case: dict) -> None:
    """Op for op the order Victarry's script builds (warmup forwards, (F;BW) pairs,
    cooldown backwards), wherever both accept the (p, m); m % p == 1 with m > p is
    refused here by Megatron's group rule, which the script does not check."""
    kw = {"chunks": case["chunks"]} if "chunks" in case else {}
    try:
        s = generate(case["schedule"], case["ranks"], case["microbatches"], **kw)
    except ScheduleError as e:
        assert "m % N" in str(e) and case["schedule"] == "interleaved-overlap"
        return
    assert [[format_op(o) for o in row] for row in s.ranks] == case["rows"]


def _run(name: str, p: int, m: int, costs: CostModel, **kw) -> float:
    return simulate(build_program(name, p, m, **kw), costs, LinkModel(), CommModel()).makespan


@pytest.mark.parametrize("p,m", [(1, 5), (2, 3), (3, 7), (4, 8), (4, 13), (6, 6), (5, 17)])
@pytest.mark.parametrize("F,BW,FB", [(1, 2, 3), (1, 2, 2), (1, 2, 2.5), (2, 3, 3.25),
                                     (1, 1, 1.5)])
def test_steady_state_closed_form(p: int, m: int, F: float, BW: float, FB: float) -> None:
    """Under ``data`` semantics with free comm and max(F, BW) <= FB <= F + BW, the last
    rank (warmup 1) never idles once it starts: ``(p-1) F`` to fill the pipe, then ``F,
    (m-1) x FB, BW`` on it, then ``(p-1) BW`` back to rank 0:
    makespan = p (F + BW) + (m - 1) FB; 1F1B's is (m + p - 1)(F + BW), so the pairs save
    (m - 1)(F + BW - FB) at equal work (FB = F + BW: equal makespans)."""
    c = CostModel(F=F, BW=BW, FB=FB)
    assert _run("1f1b-overlap", p, m, c) == pytest.approx(p * (F + BW) + (m - 1) * FB)
    assert _run("1f1b", p, m, c) == pytest.approx((m + p - 1) * (F + BW))


def test_moe_fb_from_the_pieces_vs_1f1b() -> None:
    """schedules/1f1b-overlap-moe.toml (2 MoE layers per stage, overlap = "megatron",
    ms): the FB pair is costed from its pieces: its compute (the F's and BW's, 7 + 12)
    with every all-to-all hidden (4 of 0.3565 per part: 2.852 ms), so FB = 19 against
    F + BW = 8.426 + 13.426 = 21.852; bubble and step time against 1F1B on the same
    model (equal work: the same F and BW on every rank), and the closed form."""
    sc = load_scenario("schedules/1f1b-overlap-moe.toml")
    sco = sc.stage_costs()
    f, bw, fb = sco.op("F"), sco.op("BW"), sco.fb()
    assert (f.compute, bw.compute) == (7, 12)
    assert fb.cost == pytest.approx(f.compute + bw.compute) and fb.exposed == 0
    assert fb.collective == pytest.approx(f.collective + bw.collective)
    a2a = [p for p in fb.pieces if p.piece.collective == "all-to-all"]
    assert len(a2a) == 8
    p, m = 4, 8
    ov = simulate(sc.build_program(), sc.costs, sc.link, sc.comm)
    one = sc.model_copy(update={"schedule": sc.schedule.model_copy(update={"name": "1f1b"})})
    base = simulate(one.build_program(), one.costs, one.link, one.comm)
    F, BW = f.cost, bw.cost
    assert ov.makespan == pytest.approx(p * (F + BW) + (m - 1) * fb.cost)     # 220.41 ms
    assert base.makespan == pytest.approx((m + p - 1) * (F + BW))            # 240.38 ms
    busy = lambda tl: sum(s.end - s.start for s in tl.spans)  # noqa: E731
    # equal work: the pairs do the same F and BW, in less time per pair
    assert busy(base) == pytest.approx(p * m * (F + BW))
    warm = [min(m, 2 * (p - 1 - r) + 1) for r in range(p)]
    assert busy(ov) == pytest.approx(sum(w * (F + BW) + (m - w) * fb.cost for w in warm))
    bubble = lambda tl: 1 - busy(tl) / (p * tl.makespan)  # noqa: E731
    assert bubble(ov) == pytest.approx(0.259, abs=5e-4)
    assert bubble(base) == pytest.approx(0.273, abs=5e-4)


def test_delay_wgrad_pairs_f_with_b_and_runs_w_after() -> None:
    """--param delay_wgrad=true: each pair is FB(F, B) followed by that backward's W;
    unpaired backwards stay BW; with FB = F + B, B + W = BW the step is 1F1B-overlap's
    with FB = F + BW."""
    s = generate("1f1b-overlap", 3, 7, delay_wgrad=True)
    row = [format_op(o) for o in s.ranks[0]]
    assert row[:7] == ["0F0", "0F1", "0F2", "0F3", "0F4", "(0F5;0B0)", "0W0"]
    assert row[-5:] == ["0BW2", "0BW3", "0BW4", "0BW5", "0BW6"]
    c = CostModel(F=1, B=1, W=1, BW=2, FB=2)
    assert _run("1f1b-overlap", 3, 7, c, delay_wgrad=True) == \
        _run("1f1b-overlap", 3, 7, CostModel(F=1, BW=2, FB=3))


def test_interleaved_overlap_runs_and_beats_interleaved() -> None:
    """Every accepted (p, m) runs to the end (no deadlock) under rendezvous with the
    async policy; with FB < F + BW it is faster than Megatron's interleaved 1F1B and at
    FB = F + BW never slower by more than the one extra warmup forward costs."""
    for p in (2, 3, 4):
        for m in range(p, 3 * p + 2):
            try:
                prog = build_program("interleaved-overlap", p, m, chunks=2)
            except ScheduleError:
                continue
            costs = CostModel(F=1, BW=2, FB=2.25)
            tl = simulate(prog, costs, LinkModel(latency=0.1), CommModel(semantics="rendezvous"))
            ref = simulate(build_program("interleaved-1f1b", p, m, chunks=2, variant="megatron"),
                           costs, LinkModel(latency=0.1), CommModel(semantics="rendezvous"))
            assert tl.makespan < ref.makespan
    with pytest.raises(ScheduleError, match="interleaved-overlap: .*m >= p"):
        generate("interleaved-overlap", 4, 3, chunks=2)
    with pytest.raises(ScheduleError, match="--chunks must be >= 2"):
        generate("interleaved-overlap", 4, 8, chunks=1)


def test_list_and_compare_show_them() -> None:
    """``schedsim list`` names both with their source; ``compare`` runs them next to
    1F1B, interleaved and DualPipe(V) with bubble and peak memory."""
    r = runner.invoke(app, ["list"])
    assert r.exit_code == 0
    flat = " ".join(r.stdout.split())
    for name in ("1f1b-overlap", "interleaved-overlap"):
        assert name in r.stdout
    assert "Victarry" in flat and "combined_1f1b" in flat
    r = runner.invoke(app, ["compare", "-p", "4", "-m", "8", "--cost", "F=1,B=1,W=1,BW=2,FB=2.5",
                            "--schedules", "1f1b,1f1b-overlap,interleaved-1f1b,"
                            "interleaved-overlap,dualpipev"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:]]
            for ln in r.stdout.splitlines() if ln.startswith("│")}
    # makespan; peak activation (microbatches, per rank): 1F1B-overlap holds its doubled
    # warmup, 2(p-1-r) + 2 on rank r (8 on rank 0 against 1F1B's 4)
    want = {"1f1b": ("33", "1..4"), "1f1b-overlap": ("29.5", "2..8"),
            "interleaved-1f1b": ("28.5", "2.5..5.5"), "interleaved-overlap": ("25.75", "3..6"),
            "dualpipev": ("24.5", "4.5")}
    assert {k: (v[2], v[6]) for k, v in rows.items()} == want


def test_compare_model_overlap_takes_megatron() -> None:
    """``compare --model-overlap none,megatron`` on the MoE scenario: 1F1B gains nothing
    (no pairs), 1F1B-overlap gains (m-1)(F + BW - FB) = 7 x 2.852 = 19.97 ms of its 240.38
    (8.3%); an unknown mode names the known ones."""
    args = ["compare", "--scenario", "schedules/1f1b-overlap-moe.toml", "--ranks", "4",
            "--microbatches", "8", "--schedules", "1f1b,1f1b-overlap"]
    r = runner.invoke(app, [*args, "--model-overlap", "none,megatron"],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "1f1b: makespan 240.4 ms (none) -> 240.4 ms (megatron): gain 0 ms (0.0%)" in out
    assert ("1f1b-overlap: makespan 240.4 ms (none) -> 220.4 ms (megatron): gain 19.97 ms "
            "(8.3%)") in out
    r = runner.invoke(app, [*args, "--model-overlap", "none,combined"])
    assert r.exit_code == 2 and "none, domino, fb, megatron" in r.stderr


def test_overlap_sweep_from_python_matches_the_closed_form() -> None:
    """``schedsim.api.compare_overlaps`` (the library's ``compare --model-overlap``): on
    the MoE scenario at 4 ranks x 8 microbatches 1F1B gains nothing under ``megatron``
    (no pairs) and 1F1B-overlap gains (m - 1)(F + BW - FB) of the megatron mode's own
    costs; the first mode's records carry no gain; a single mode is refused."""
    import pytest

    import schedsim.api as api
    from schedsim.errors import ScenarioError

    sc = api.scenario("schedules/1f1b-overlap-moe.toml", ranks=4, microbatches=8)
    res = api.compare_overlaps(sc, "none,megatron", "1f1b,1f1b-overlap")
    assert res.modes == ["none", "megatron"] and res.unit == "ms"
    assert [(r["schedule"], r["overlap"]) for r in res.records] == [
        ("1f1b", "none"), ("1f1b-overlap", "none"), ("1f1b", "megatron"),
        ("1f1b-overlap", "megatron")]
    assert all("gain_over_none" not in r for r in res.records[:2])
    one, over = res.records[2:]
    assert one["gain_over_none"] == pytest.approx(0, abs=1e-9)
    assert over["gain_over_none"] == pytest.approx(7 * (over["F"] + over["BW"] - over["FB"]))
    with pytest.raises(ScenarioError, match="two or more of none, domino, fb, megatron"):
        api.compare_overlaps(sc, ["fb"])

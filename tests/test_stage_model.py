"""The stage model: derived op costs equal their closed forms (no overlap), Domino's
overlap equals a hand-computed timeline, DualPipe's F&B overlap is cheaper than F + BW,
and the derived costs flow into the simulation under the typed ones."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from schedsim.errors import ScenarioError
from schedsim.program.ir import Op
from schedsim.scenario import parse_scenario
from schedsim.sim.overlap import COLLECTIVE, COMPUTE, Piece, schedule
from schedsim.sim.stage_costs import StageCosts, phase_pieces
from schedsim.sim.stage_model import StageModel


def ar(n, nbytes, bw, alpha):
    """nccl-tests all-reduce time, written out: 2(n-1) alpha + 2(n-1)/n S/busbw."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bw


def ag(n, nbytes, bw, alpha):
    """All-gather, reduce-scatter and all-to-all: (n-1) alpha + (n-1)/n S/busbw."""
    return (n - 1) * alpha + (n - 1) / n * nbytes / bw


def model(**kw):
    base = dict(layers=2, tp=4, activation_bytes=3e6,
                attention=dict(F=1.0, B=1.5, W=0.5), mlp=dict(F=1.0, B=2.0, W=0.75),
                links=dict(intra=dict(bandwidth=2e6, latency=0.01),
                           inter=dict(bandwidth=1e6, latency=0.05)))
    base.update(kw)
    return StageModel.model_validate(base)


def test_dense_tp_no_overlap_closed_forms():
    """tp=4, 2 layers, attention and MLP 1.0 each in F: F = 2 (1 + AR + 1 + AR)."""
    sc = StageCosts(model())
    AR = ar(4, 3e6, 2e6, 0.01)
    assert sc.op("F").cost == pytest.approx(2 * (1 + AR + 1 + AR), rel=1e-12)
    assert sc.op("B").cost == pytest.approx(2 * (2.0 + AR + 1.5 + AR), rel=1e-12)
    assert sc.op("W").cost == pytest.approx(2 * (0.5 + 0.75), rel=1e-12)
    assert sc.op("W").collective == 0          # W: no collective
    assert sc.op("BW").cost == pytest.approx(sc.op("B").cost + sc.op("W").cost, rel=1e-12)
    assert sc.fb().cost == pytest.approx(sc.op("F").cost + sc.op("BW").cost, rel=1e-12)
    f = sc.op("F")
    assert f.compute == 4.0 and f.exposed == pytest.approx(4 * AR, rel=1e-12)
    names = [p.piece.name for p in f.pieces]
    assert names == ["attention", "proj all-reduce", "mlp", "fc2 all-reduce"] * 2
    bnames = [p.piece.name for p in sc.op("B").pieces]
    assert bnames == ["mlp", "fc1 dgrad all-reduce", "attention", "qkv dgrad all-reduce"] * 2


def test_sequence_parallel_all_gather_reduce_scatter():
    sc = StageCosts(model(sequence_parallel=True))
    AG = ag(4, 3e6, 2e6, 0.01)
    assert sc.op("F").cost == pytest.approx(2 * (AG + 1 + AG + AG + 1 + AG), rel=1e-12)
    kinds = [p.piece.collective for p in sc.op("F").pieces if p.piece.collective]
    assert kinds == ["all-gather", "reduce-scatter"] * 4
    kinds = [p.piece.collective for p in sc.op("B").pieces if p.piece.collective]
    assert kinds == ["all-gather", "reduce-scatter"] * 4
    assert StageModel(tp=4, sequence_parallel=True, activation_bytes=8.0).message_bytes() == 2.0


def test_moe_all_to_all_on_the_ep_group_and_inter_node_link():
    """tp 2 x ep 8 spans 16 GPUs > 8 per node: the all-to-alls run on the inter link with
    S = activation x topk; the attention's TP all-reduce stays intra-node."""
    sc = StageCosts(model(tp=2, moe=True, ep=8, topk=2))
    AR = ar(2, 3e6, 2e6, 0.01)
    A2A = ag(8, 3e6 * 2, 1e6, 0.05)
    assert sc.op("F").cost == pytest.approx(2 * (1 + AR + A2A + 1 + A2A), rel=1e-12)
    names = [p.piece.name for p in sc.op("F").pieces][:5]
    assert names == ["attention", "proj all-reduce", "dispatch all-to-all", "experts",
                     "combine all-to-all"]
    assert sc.op("B").cost == pytest.approx(2 * (A2A + 2.0 + A2A + 1.5 + AR), rel=1e-12)
    with pytest.raises(ValueError, match="set moe = true"):
        StageModel(ep=4)


def test_group_of_one_has_no_collective():
    sc = StageCosts(model(tp=1))
    assert sc.op("F").cost == 4.0 and sc.op("F").collective == 0
    assert all(p.piece.stream == COMPUTE for p in sc.op("F").pieces)


def test_domino_hand_computed_timeline():
    """1 layer, tp 2, attention and MLP 2.0 in F, S/busbw = 3 (alpha 0): halves of 1.0
    compute and 1.5 all-reduce. By hand: a0 [0,1], AR_a0 [1,2.5], a1 [1,2], AR_a1
    [2.5,4], m0 [2.5,3.5], AR_m0 [4,5.5], m1 [4,5], AR_m1 [5.5,7] -> F = 7; no overlap
    2 + 3 + 2 + 3 = 10; compute only 4."""
    m = StageModel(layers=1, tp=2, activation_bytes=3.0, overlap="domino",
                   attention=dict(F=2.0), mlp=dict(F=2.0),
                   links=dict(intra=dict(bandwidth=1.0)))
    f = StageCosts(m).op("F")
    got = [(p.piece.name, p.piece.half, p.start, p.end) for p in f.pieces]
    assert sorted(got, key=lambda g: (g[2], g[0])) == [
        ("attention", 0, 0.0, 1.0), ("attention", 1, 1.0, 2.0),
        ("proj all-reduce", 0, 1.0, 2.5), ("mlp", 0, 2.5, 3.5),
        ("proj all-reduce", 1, 2.5, 4.0), ("fc2 all-reduce", 0, 4.0, 5.5),
        ("mlp", 1, 4.0, 5.0), ("fc2 all-reduce", 1, 5.5, 7.0)]
    none = StageCosts(m.model_copy(update={"overlap": "none"})).op("F")
    assert (f.compute, f.cost, none.cost) == (4.0, 7.0, 10.0)
    assert f.compute < f.cost < none.cost        # strictly between


def test_domino_strictly_between_for_the_tp4_example():
    none, dom = StageCosts(model()), StageCosts(model(overlap="domino"))
    for k in ("F", "B"):
        assert none.op(k).compute < dom.op(k).cost < none.op(k).cost
    # Domino's backward also hides the input-gradient all-reduce behind W
    assert dom.op("BW").cost < none.op("BW").cost
    assert dom.op("W").cost == none.op("W").cost


def test_fb_overlap_hides_collectives_behind_the_other_part():
    m = model(tp=1, moe=True, ep=16, topk=4, activation_bytes=14.7e6, layers=4,
              attention=dict(F=1.5, B=1.5, W=1.0), mlp=dict(F=2.0, B=2.0, W=1.5),
              links=dict(intra=dict(bandwidth=160e6, latency=0.005),
                         inter=dict(bandwidth=50e6, latency=0.02)))
    fb = StageCosts(m.model_copy(update={"overlap": "fb"}))
    none = StageCosts(m)
    f, bw = fb.op("F").cost, fb.op("BW").cost
    assert (f, bw) == (none.op("F").cost, none.op("BW").cost)   # alone: as none
    assert fb.fb().cost < f + bw == pytest.approx(none.fb().cost)
    assert fb.fb().cost >= fb.fb().compute == fb.op("F").compute + fb.op("BW").compute
    assert fb.fb(back="B").cost < f + fb.op("B").cost
    # the overlapped pair's pieces: both parts, streams never double-booked
    _check_streams(fb.fb())


def _check_streams(oc):
    for stream in (COMPUTE, COLLECTIVE):
        iv = sorted((p.start, p.end) for p in oc.pieces if p.piece.stream == stream)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(iv, iv[1:]))
    ends = [p.end for p in oc.pieces]
    for p in oc.pieces:
        for d in p.piece.deps:
            assert ends[d] <= p.start + 1e-12


def test_scheduler_chain_sum_and_parallel_chains():
    c = [Piece("a", COMPUTE, 1.0), Piece("x", COLLECTIVE, 2.0, (0,)),
         Piece("b", COMPUTE, 3.0, (1,))]
    assert schedule(c).cost == 6.0
    two = c + [Piece("a", COMPUTE, 1.0), Piece("x", COLLECTIVE, 2.0, (3,)),
               Piece("b", COMPUTE, 3.0, (4,))]
    oc = schedule(two)
    # a a' [0,2], x [1,3], x' [3,5] (one collective stream), b [3,6], b' [6,9]
    assert (oc.cost, oc.compute, oc.exposed) == (9.0, 8.0, 1.0)
    assert [(p.start, p.end) for p in oc.pieces] == [(0, 1), (1, 3), (3, 6), (1, 2),
                                                     (3, 5), (6, 9)]
    with pytest.raises(ValueError, match="not before it"):
        schedule([Piece("a", COMPUTE, 1.0, (0,))])


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 3), tp=st.sampled_from([1, 2, 8]), sp=st.booleans(),
       moe=st.booleans(), fa=st.floats(0.0, 3.0), fm=st.floats(0.0, 3.0),
       bw=st.floats(0.1, 10.0), alpha=st.floats(0.0, 0.5),
       kind=st.sampled_from(["F", "B", "BW"]))
def test_overlap_bounds(layers, tp, sp, moe, fa, fm, bw, alpha, kind):
    """Every mode's pieces respect their dependencies and streams; the cost is at least
    the compute and the longest dependency path, at most the sum of all pieces of the
    none chain; without latency, splitting never costs more than not overlapping."""
    m = StageModel(layers=layers, tp=tp, sequence_parallel=sp, moe=moe,
                   ep=4 if moe else 1, activation_bytes=1.0,
                   attention=dict(F=fa, B=fa, W=fa / 2), mlp=dict(F=fm, B=fm, W=fm / 2),
                   links=dict(intra=dict(bandwidth=bw, latency=alpha),
                              inter=dict(bandwidth=bw / 2, latency=alpha)))
    none = StageCosts(m).op(kind)
    assert none.cost == pytest.approx(sum(p.piece.duration for p in none.pieces))
    for mode in ("domino", "fb"):
        sc = StageCosts(m.model_copy(update={"overlap": mode}))
        oc = sc.op(kind) if mode == "domino" else sc.fb(back="BW")
        _check_streams(oc)
        assert oc.cost >= oc.compute - 1e-9
    dom = StageCosts(m.model_copy(update={"overlap": "domino"})).op(kind)
    if alpha == 0.0:
        assert dom.cost <= none.cost + 1e-9


def test_phase_pieces_rejects_fb_kind():
    with pytest.raises(ValueError, match="unknown op kind"):
        phase_pieces(StageModel(), None, "FB")


# -- the scenario: derived costs under typed ones ----------------------------------------
def scenario(costs=None, **model_kw):
    data = {"schedule": {"name": "1f1b", "ranks": 2, "microbatches": 4},
            "model": {"layers": 2, "tp": 4, "activation_bytes": 3e6,
                      "attention": {"F": 1.0, "B": 1.5, "W": 0.5},
                      "mlp": {"F": 1.0, "B": 2.0, "W": 0.75},
                      "links": {"intra": {"bandwidth": 2e6, "latency": 0.01}}, **model_kw}}
    if costs is not None:
        data["costs"] = costs
    return parse_scenario(data)


def test_derived_costs_replace_defaults_and_typed_ones_win():
    sc = scenario()
    d = sc.stage_costs()
    c = sc.costs
    assert c.cost(Op("F", 0, 0)) == d.op("F").cost
    assert c.cost(Op("BW", 1, 3)) == d.op("BW").cost
    assert c.cost(Op.fb(Op("F", 0, 0), Op("BW", 1, 1))) == d.fb().cost
    assert c.bytes_of(0) == 3e6                      # activation bytes -> messages
    typed = scenario(costs={"F": 2.0, "stage": {"1": {"W": 9.0}}, "message_bytes": 5.0})
    tc = typed.costs
    assert tc.cost(Op("F", 1, 0)) == 2.0 and tc.cost(Op("W", 1, 0)) == 9.0
    assert tc.cost(Op("W", 0, 0)) == d.op("W").cost
    # BW derived only while B and W are untyped; FB only while its parts are
    assert tc.cost(Op("BW", 0, 0)) == d.op("BW").cost
    assert tc.cost(Op("BW", 1, 0)) == d.op("B").cost + 9.0
    assert tc.cost(Op.fb(Op("F", 0, 0), Op("BW", 0, 0))) == 2.0 + d.op("BW").cost
    assert tc.bytes_of(0) == 5.0
    assert scenario(costs={"FB": 3.0}).costs.cost(Op.fb(Op("F", 0, 0), Op("B", 0, 1))) == 3.0
    fast = sc.costs.cost_fn()
    for op in (Op("F", 1, 2), Op("W", 0, 0), Op.fb(Op("F", 0, 0), Op("B", 1, 1))):
        assert fast(op) == sc.costs.cost(op)


def test_per_stage_overrides():
    sc = scenario(stage={"1": {"layers": 3}})
    d = sc.stage_costs()
    assert d.varies and d.op("F", 1).cost == pytest.approx(1.5 * d.op("F", 0).cost)
    fast = sc.costs.cost_fn()
    assert fast(Op("F", 1, 0)) == d.op("F", 1).cost and fast(Op("F", 0, 0)) == d.op("F").cost
    fb = Op.fb(Op("F", 0, 0), Op("BW", 1, 1))
    assert fast(fb) == d.fb(0, 1).cost == d.op("F", 0).cost + d.op("BW", 1).cost
    with pytest.raises(ScenarioError, match=r"\[model.stage.5\]"):
        scenario(stage={"5": {"layers": 1}}).build_program()


def test_bad_model_keys_are_named():
    with pytest.raises(ScenarioError, match="unknown key 'model.layres'.*allowed: layers"):
        scenario(layres=3)
    with pytest.raises(ScenarioError, match="set moe = true"):
        scenario(ep=2)
    with pytest.raises(ScenarioError, match="model.overlap"):
        scenario(overlap="both")

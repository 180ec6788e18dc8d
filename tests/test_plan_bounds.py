"""The planner's makespan bound is a true lower bound: it never exceeds a simulated
makespan (any schedule, costs, semantics, link) and equals the closed forms where they
are exact."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedsim.errors import ScheduleError
from schedsim.generators import build_program, names
from schedsim.plan.bounds import ProgramShape, makespan_lower_bound
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

SCHEDULES = names()
cost = st.floats(min_value=0.05, max_value=3.0, allow_nan=False)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SCHEDULES), p=st.integers(2, 5), m=st.integers(1, 12),
       f=cost, b=cost, w=cost, fb=st.one_of(st.none(), cost), lat=st.floats(0, 0.5),
       sem=st.sampled_from(["data", "eager", "rendezvous"]),
       stage_f=st.lists(cost, min_size=0, max_size=10))
def test_lower_bound_never_exceeds_the_simulated_makespan(name, p, m, f, b, w, fb, lat,
                                                          sem, stage_f):
    try:
        prog = build_program(name, p, m)
    except ScheduleError:
        return
    S = prog.placement.stages
    costs = CostModel(F=f, B=b, W=w, FB=fb,
                      stage={s: {"F": v} for s, v in enumerate(stage_f[:S])})
    tl = simulate(prog, costs, LinkModel(latency=lat, bandwidth=1e3),
                  CommModel(semantics=sem), raise_on_deadlock=False)
    if tl.deadlock is not None:
        return
    assert makespan_lower_bound(prog, costs) <= tl.makespan + 1e-9


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (3, 7)])
def test_lower_bound_is_the_1f1b_and_gpipe_closed_forms(p, m):
    costs = CostModel(F=1.0, B=1.5, W=0.5, BW=2.0)
    # 1F1B and GPipe: (p - 1)(F + BW) + m (F + BW) (Narayanan et al., SC'21, Sec. 2.2)
    for name in ("1f1b", "gpipe"):
        prog = build_program(name, p, m)
        assert makespan_lower_bound(prog, costs) == pytest.approx((p - 1 + m) * 3.0)
        assert simulate(prog, costs).makespan == pytest.approx((p - 1 + m) * 3.0)


def test_lower_bound_of_a_zero_bubble_order():
    # ZB-H1, B = W = F: the last rank waits (p-1) F, then works m (F + B + W)
    p, m = 4, 8
    costs = CostModel(F=1.0, B=1.0, W=1.0)
    prog = build_program("zb-h1", p, m)
    assert makespan_lower_bound(prog, costs) == pytest.approx((p - 1) + 3 * m)


def test_grouped_bound_equals_the_per_op_bound_with_microbatch_overrides():
    prog = build_program("interleaved-1f1b", 4, 8, chunks=2)
    costs = CostModel(F=1.0, B=2.0, W=1.0,
                      overrides=[{"stage": 5, "mb": 3, "kind": "F", "cost": 50.0}])
    shape = ProgramShape(prog)
    tl = simulate(prog, costs)
    assert shape.lower_bound(costs) <= tl.makespan + 1e-9
    assert shape.lower_bound(costs) > shape.lower_bound(CostModel(F=1.0, B=2.0, W=1.0))


@pytest.mark.parametrize("name", ["zb-1p", "zb-2p", "zbv"])
def test_a_cost_aware_order_keeps_its_ops_per_rank(name):
    # the bound of a cost-aware generator reads its unit-cost program: valid because the
    # costs change the order of a rank's ops, not which ops it runs
    unit = ProgramShape(build_program(name, 4, 12))
    for costs in (CostModel(F=1.0, B=3.0, W=0.2), CostModel(F=2.5, B=0.5, W=2.0)):
        planned = ProgramShape(build_program(name, 4, 12, costs=costs))
        assert (planned.groups == unit.groups).all() and (planned.count == unit.count).all()

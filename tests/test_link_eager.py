"""Per-link eager thresholds (``[[link.links]] eager_threshold_bytes``): the rule of
:meth:`CommModel.eager_messages`, and the "hangs on two nodes, not on one" scenarios of
docs/comm-semantics.md."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SCHEDULES
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import DeadlockError
from schedsim.scenario import load_scenario
from schedsim.sim.costs import CommModel, LinkModel, LinkOverride
from schedsim.sim.simulate import simulate

runner = CliRunner()


def test_eager_messages_rule() -> None:
    nbytes = np.array([10.0, 10.0, 100.0, 100.0])
    src, dst = np.array([0, 1, 0, 1]), np.array([1, 0, 1, 0])
    link = LinkModel(links=[LinkOverride(src=0, dst=1, eager_threshold_bytes=50)])
    rv = CommModel(semantics="rendezvous")
    # no [comm] threshold: only the overridden link 0->1 is eager, up to 50 bytes
    assert rv.eager_messages(link, nbytes, src, dst).tolist() == [True, False, False, False]
    # [comm] 200 bytes: every message eager, except that link 0->1 allows only 50
    rv2 = CommModel(semantics="rendezvous", eager_threshold_bytes=200)
    assert rv2.eager_messages(link, nbytes, src, dst).tolist() == [True, True, False, True]
    # a threshold of 0 makes the link rendezvous for any message with bytes
    zero = LinkModel(links=[LinkOverride(src=1, dst=0, eager_threshold_bytes=0)])
    assert rv2.eager_messages(zero, nbytes, src, dst).tolist() == [True, False, True, False]
    for sem in ("data", "eager"):
        assert CommModel(semantics=sem).eager_messages(link, nbytes, src, dst).all()


def _run(name: str):
    sc = load_scenario(SCHEDULES / name)
    return simulate(sc.build_program(), sc.costs, sc.link, sc.comm)


def test_one_node_completes_two_nodes_hang() -> None:
    tl = _run("crossed-sends-one-node.toml")
    # 15 slots of compute on the critical chain plus six 0.05 hops
    assert tl.makespan == pytest.approx(15.3)
    assert all(m.send_done <= m.arrival for m in tl.messages)     # sends completed eagerly
    with pytest.raises(DeadlockError) as e:
        _run("crossed-sends-two-nodes.toml")
    msg = str(e.value)
    assert "WAIT[2SEND_F0]" in msg and "WAIT[1SEND_F1]" in msg
    assert "Blocked ranks: 0, 1." in msg


def test_only_the_network_link_needs_the_receiver() -> None:
    """Raising only link 0->1's threshold leaves 1->0 rendezvous: 1SEND_F1 (on 1->0)
    still waits for 2RECV_F1 while rank 0 no longer waits on its own send, so the run
    completes; the other way round as well."""
    sc = load_scenario(SCHEDULES / "crossed-sends-two-nodes.toml")
    prog = sc.build_program()
    for keep in ((0, 1), (1, 0)):
        links = [o for o in sc.link.links if (o.src, o.dst) != keep]
        tl = simulate(prog, sc.costs, sc.link.model_copy(update={"links": links}), sc.comm)
        assert tl.deadlock is None and tl.makespan > 15.3


def test_analyses_use_the_link_threshold() -> None:
    r = runner.invoke(app, ["critical-path", str(SCHEDULES / "crossed-sends-one-node.toml")])
    assert r.exit_code == 0, r.output
    assert "makespan 15.3" in r.output
    bad = SCHEDULES / "crossed-sends-two-nodes.toml"
    r = runner.invoke(app, ["simulate", str(bad), "-q"])
    assert r.exit_code == 3


def test_bad_threshold_is_named(tmp_path) -> None:
    p = tmp_path / "s.toml"
    p.write_text('[schedule]\nname = "1f1b"\nranks = 2\nmicrobatches = 2\n'
                 '[link]\nlinks = [{ src = 0, dst = 1, eager_threshold_bytes = -1 }]\n')
    r = runner.invoke(app, ["simulate", str(p), "-q"])
    assert r.exit_code == 2 and "eager_threshold_bytes" in r.output

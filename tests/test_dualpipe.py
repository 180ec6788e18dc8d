"""DualPipe / DualPipeV programs against deepseek-ai/DualPipe's recorded step() traces, and
the general rule for other (ranks, microbatches)."""
from __future__ import annotations

import json

import pytest
from conftest import FIGURE_COSTS, ref_path

from schedsim import CommModel, CostModel, ScheduleError, build_program, generate, simulate
from schedsim.program.ir import Batch, Commit, Compute
from schedsim.program.routing import route
from schedsim.program.validate import validate_schedule

REF_FILES = ["dualpipe_pp4_mb10.json", "dualpipe_pp8_mb20.json",
             "dualpipev_pp4_mb10.json", "dualpipev_pp8_mb20.json"]


def _ref_events(d: dict) -> list[list[tuple]]:
    """Per rank: the ref's events as comparable tuples (chunk = direction/module,
    mb = global microbatch; COMMIT carries the ops it launches)."""
    out = []
    for evs in d["ranks"]:
        row = []
        for e in evs:
            op = e["op"]
            if op == "F":
                row.append(("F", e["chunk"], e["global_mb"]))
            elif op == "B":
                row.append(("B" if e["zb"] else "BW", e["chunk"], e["global_mb"]))
            elif op == "W":
                row.append(("W", e["chunk"], e["global_mb"]))
            elif op == "FB":
                row.append(("FB", e["f"]["chunk"], e["f"]["global_mb"], e["b"]["chunk"],
                            e["b"]["global_mb"]))
            elif op == "COMMIT_WAIT":
                row.append(("COMMIT", tuple(tuple(o) for o in e["ops"])))
            else:
                row.append((op, e["chunk"], e["global_mb"], e["peer"]))
        out.append(row)
    return out


def _our_events(prog) -> list[list[tuple]]:
    pl = prog.placement
    out = []
    for r, row in enumerate(prog.ranks):
        evs, pending = [], []
        for ins in row:
            if isinstance(ins, Compute):
                op = ins.op
                if op.kind == "FB":
                    f, b = op.parts
                    evs.append(("FB", pl.chunk_of(f.stage, f.mb), f.mb,
                                pl.chunk_of(b.stage, b.mb), b.mb))
                else:
                    evs.append((op.kind, pl.chunk_of(op.stage, op.mb), op.mb))
            elif isinstance(ins, Commit):
                evs.append(("COMMIT", tuple(pending)))
                pending = []
            else:      # DualPipe appends P2P ops and launches them as one batch
                assert isinstance(ins, Batch)
                for c in ins.comms:
                    key = c.message_key()
                    mb = key[2]
                    src, dst = route(key, pl.rank_of)
                    peer = dst if c.is_send else src
                    chunk = pl.chunk_of(c.stage, c.mb)
                    evs.append((c.kind, chunk, mb, peer))
                    # the ref lists a batch's ops as [op, peer, chunk, mb-within-direction]
                    local_mb = mb - (prog.microbatches // 2 if pl.kind == "dual" and chunk
                                     else 0)
                    pending.append((c.kind, peer, chunk, local_mb))
        out.append(evs)
    return out


@pytest.mark.parametrize("name", REF_FILES)
def test_program_equals_reference_trace(name: str) -> None:
    """Same compute order (zb B / W / overlapped FB), same P2P appends, same commit batches."""
    d = json.loads(ref_path("dualpipe", name).read_text())
    prog = generate(d["schedule"], d["num_ranks"], d["num_microbatches"])
    ref, ours = _ref_events(d), _our_events(prog)
    assert len(ours) == len(ref)
    for r, (a, b) in enumerate(zip(ref, ours)):
        for i, (x, y) in enumerate(zip(a, b)):
            assert x == y, f"{name} rank {r} event {i}: ref {x} vs ours {y}"
        assert len(a) == len(b), f"{name} rank {r}: {len(a)} ref events, {len(b)} ours"


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 12), (6, 12), (6, 20), (8, 16),
                                 (10, 24), (12, 24)])
def test_dualpipe_general_rule(P: int, M: int) -> None:
    """For valid (P, M) not in the refs: the schedule is complete and valid, each
    (stage, mb) is backed by exactly one of BW or B+W, #W == #zero-bubble B, and with the
    README's costs the per-rank idle equals the README formula (PP/2-1)(F&B+B-3W)."""
    prog = generate("dualpipe", P, M)
    validate_schedule(prog.schedule())
    for row in prog.ranks:
        ops = [i.op for i in row if isinstance(i, Compute)]
        zb = sum(1 for o in ops if o.kind == "B")
        assert zb == sum(1 for o in ops if o.kind == "W")
        atoms = [a for o in ops for a in o.atoms()]
        assert sum(a.kind == "F" for a in atoms) == M   # M/2 per direction, 2 directions
    for costs in (FIGURE_COSTS, dict(F=2, B=2, W=1, BW=3, FB=5)):
        tl = simulate(prog, CostModel(**costs))
        expected_idle = (P // 2 - 1) * (costs["FB"] + costs["BW"] - 3 * costs["W"])
        assert [r.idle for r in tl.per_rank] == [expected_idle] * P
        assert [r.busy for r in tl.per_rank] == [M * (costs["F"] + costs["BW"])] * P


@pytest.mark.parametrize("P,M", [(2, 4), (3, 6), (4, 8), (5, 13), (8, 16)])
def test_dualpipev_general_rule(P: int, M: int) -> None:
    prog = generate("dualpipev", P, M)
    validate_schedule(prog.schedule())
    for sem in ("data", "eager", "rendezvous"):
        tl = simulate(prog, CostModel(**FIGURE_COSTS), comm=CommModel(semantics=sem))
        assert tl.deadlock is None
        assert all(r.busy == 6 * M for r in tl.per_rank)   # 2 chunks x (F + B + W) per mb


def test_figure_slots() -> None:
    """The DualPipe README figure: makespan 66, 6 idle slots per rank; rank 5 runs the
    input-gradient B of mb 0 in T10 and its W in T11; rank 4 runs mb 0's full backward in
    T12 (T12-T13)."""
    tl = simulate(build_program("dualpipe", 8, 20), CostModel(**FIGURE_COSTS))
    assert tl.makespan == 66
    assert [r.idle for r in tl.per_rank] == [6] * 8
    b = tl.find_span(5, "B", 0)
    w = tl.find_span(5, "W", 0)
    bw = tl.find_span(4, "BW", 0)
    assert (b.start, b.end, w.start, w.end) == (10, 11, 11, 12)
    assert (bw.start, bw.end, bw.kind) == (12, 14, "BW")


@pytest.mark.parametrize("sem", ["eager", "rendezvous"])
def test_figure_under_commit_batches(sem: str) -> None:
    """Under the program's real commit batches, rank 5's W of mb 0 waits one slot (its
    COMMIT also holds a recv whose data arrives at 12) but the makespan does not move."""
    tl = simulate(build_program("dualpipe", 8, 20), CostModel(**FIGURE_COSTS),
                  comm=CommModel(semantics=sem))
    w = tl.find_span(5, "W", 0)
    assert (w.start, tl.makespan) == (12, 66)


@pytest.mark.parametrize("P,M,rule", [(3, 12, "even number of ranks"),
                                      (4, 9, "even number of microbatches"),
                                      (4, 6, ">= 2 x ranks")])
def test_dualpipe_constraints(P: int, M: int, rule: str) -> None:
    with pytest.raises(ScheduleError, match=rule):
        generate("dualpipe", P, M)


def test_dualpipev_constraint() -> None:
    with pytest.raises(ScheduleError, match=">= 2 x ranks"):
        generate("dualpipev", 4, 7)


def test_no_overlap_variant_splits_fb() -> None:
    """overlap=False runs each F&B pair as F then BW (DualPipe without an
    overlapped_forward_backward module): same ops, no FB."""
    prog = generate("dualpipe", 4, 8, overlap=False)
    kinds = {i.op.kind for row in prog.ranks for i in row if isinstance(i, Compute)}
    assert "FB" not in kinds and kinds == {"F", "B", "W", "BW"}
    validate_schedule(prog.schedule())

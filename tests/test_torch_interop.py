"""torch action strings and CSV (both directions, checked with torch's own reader and
writer), strict parsing, the generate -> CSV -> load -> simulate round trip, our JSON
schedule format, and schedule validation messages naming the first offending action."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch_ref
from conftest import SCHEDULES
from torch.distributed.pipelining.schedules import _Action
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ParseError, ProgramError, ScheduleError
from schedsim.generators import generate
from schedsim.generators.torch_family import interleaved_1f1b, zbv_torch
from schedsim.interop.schedule_files import load_schedule_file
from schedsim.interop.torch_format import (
    format_torch_action,
    parse_torch_action,
    parse_torch_csv,
    program_to_torch_csv,
    read_torch_csv,
    read_torch_csv_program,
    schedule_to_torch_csv,
)
from schedsim.program.ir import Comm, Commit, Op, Placement, Program, Schedule, Wait
from schedsim.program.lower import lower
from schedsim.program.ops import launched
from schedsim.program.tokens import format_instr, format_op
from schedsim.program.torch_runtime import add_send_recv, runtime_flat
from schedsim.program.validate import validate_schedule
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.simulate import simulate

runner = CliRunner()


# -- action strings ---------------------------------------------------------------------
@pytest.mark.parametrize("text,ours", [
    ("0F1", "0F1"), ("2I0", "2B0"), ("2W0", "2W0"), ("1B3", "1BW3"),
    ("3SEND_F1", "3SEND_F1"), ("4RECV_B0", "4RECV_B0"), ("2RECV_F7", "2RECV_F7"),
    ("1SEND_B2", "1SEND_B2"), ("(0F3;3B1)OVERLAP_F_B", "(0F3;3BW1)"),
    ("(0F3;3I1)OVERLAP_F_B", "(0F3;3B1)"), (" 12F10 ", "12F10"),
])
def test_action_strings(text: str, ours: str) -> None:
    x = parse_torch_action(text)
    assert (format_instr(x) if isinstance(x, Op) else str(x)) == ours
    assert format_torch_action(x) == text.strip()
    assert str(_Action.from_str(text)) == format_torch_action(x)     # torch agrees


@pytest.mark.parametrize("text", ["", "   ", "0REDUCE_GRAD", "3UNSHARD", "1RESHARD"])
def test_idle_and_bookkeeping_cells_are_dropped(text: str) -> None:
    assert parse_torch_action(text) is None


@pytest.mark.parametrize("cell", ["0F0junk", "F0", "0X1", "0F", "0f1", "-1F0", "0SEND_F",
                                  "0BW1", "(0F1;1F2)OVERLAP_F_B", "(0F1;1B2)", "0F1 0F2"])
def test_strict_parsing_names_the_cell(cell: str) -> None:
    text = f"0F0,0F1\n1F0,1F1,{cell}\n"
    with pytest.raises(ParseError) as e:
        parse_torch_csv(text, "s.csv")
    msg = str(e.value)
    assert msg.startswith(f"s.csv: row 2 (rank 1), column 3: bad action {cell!r}")
    assert "expected one torch action" in msg or "OVERLAP_F_B pairs" in msg


def test_csv_columns_skip_idle_cells() -> None:
    rows, cols = parse_torch_csv("0F0,,0F1,0REDUCE_GRAD\n,1F0,1F1\n\n")
    assert [[format_instr(x) for x in r] for r in rows] == [["0F0", "0F1"], ["1F0", "1F1"]]
    assert cols == [[1, 3], [2, 3]]


# -- torch reads ours, we read torch's -----------------------------------------------------
FAMILIES = [("Interleaved1F1B", "interleaved-1f1b", {}, "loop"),
            ("LoopedBFS", "looped-bfs", {}, "loop"),
            ("InterleavedZeroBubble", "interleaved-zb", {}, "loop"),
            ("ZBVZeroBubble", "zbv", {"variant": "torch"}, "v"),
            ("DualPipeV", "dualpipev", {}, "v")]


def ours(name: str, kw: dict, p: int, m: int) -> Schedule:
    if name == "zbv":
        return zbv_torch(p, m)
    out = generate(name, p, m, **kw)
    return out.schedule() if hasattr(out, "has_comm") else out


def toks(rows) -> list[list[str]]:
    return [[format_op(x) if isinstance(x, Op) else str(x) for x in row] for row in rows]


@pytest.mark.parametrize("torch_name,name,kw,placement", FAMILIES,
                         ids=[f[0] for f in FAMILIES])
def test_torch_loads_our_csv(torch_name, name, kw, placement, tmp_path: Path) -> None:
    """torch's _PipelineScheduleRuntime._load_csv reads our compute-only CSV (and lowers
    it exactly as our torch policy does) and our compute+comms CSV."""
    p, m = 4, 8
    s = ours(name, kw, p, m)
    f = tmp_path / "c.csv"
    f.write_text(schedule_to_torch_csv(s))
    rt = torch_ref.runtime_on_mock_stages(p, m, 2)
    rt._load_csv(str(f), format="compute_only")
    got = [[torch_ref.token(a) for a in rt.pipeline_order[r]] for r in range(p)]
    assert got == toks(s.ranks)
    with_comms = [[torch_ref.token(a) for a in rt.pipeline_order_with_comms[r]
                   if a.computation_type.value not in torch_ref.BOOKKEEPING]
                  for r in range(p)]
    assert with_comms == toks(add_send_recv(s))
    g = tmp_path / "cc.csv"
    prog = lower(s, "torch")
    g.write_text(program_to_torch_csv(prog))
    rt2 = torch_ref.runtime_on_mock_stages(p, m, 2)
    rt2._load_csv(str(g), format="compute_comms")
    assert [[torch_ref.token(a) for a in rt2.pipeline_order_with_comms[r]] for r in range(p)] \
        == [[format_instr(i) for i in row if not isinstance(i, Wait)] for row in prog.ranks]


@pytest.mark.parametrize("torch_name,name,kw,placement", FAMILIES,
                         ids=[f[0] for f in FAMILIES])
def test_we_load_torch_csv(torch_name, name, kw, placement, tmp_path: Path) -> None:
    """torch's _dump_csv (idle cells, REDUCE_GRAD/UNSHARD/RESHARD included) reads back as
    our generator's schedule, and its compute+comms dump as our torch-policy program."""
    p, m = 4, 8
    sched = torch_ref.torch_schedule(torch_name, p, m, 2)
    f, g = tmp_path / "c.csv", tmp_path / "cc.csv"
    sched._dump_csv(str(f), format="compute_only")
    sched._dump_csv(str(g), format="compute_comms")
    assert ",," in f.read_text() or torch_name == "DualPipeV"     # idle cells present
    assert "REDUCE_GRAD" in g.read_text()
    want = ours(name, kw, p, m)
    got = read_torch_csv(f, placement=placement)
    assert got.ranks == want.ranks and got.placement == want.placement
    assert got.microbatches == m
    prog = read_torch_csv_program(g, placement=placement)
    assert prog is not None and prog.ranks == lower(want, "torch").ranks
    assert read_torch_csv_program(f, placement=placement) is None


def test_wrong_placement_names_the_right_one(tmp_path: Path) -> None:
    f = tmp_path / "zbv.csv"
    f.write_text(schedule_to_torch_csv(zbv_torch(4, 8)))
    with pytest.raises(ScheduleError) as e:
        read_torch_csv(f)                                   # loop by default
    assert "row 1 (rank 0) runs stage 7, which the loop placement puts on rank 3" in \
        str(e.value) and "pass --placement v" in str(e.value)
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f)])
    assert r.exit_code == 2 and "pass --placement v" in r.stderr
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f), "--placement", "v"])
    assert r.exit_code == 0, r.output


def test_comms_csv_missing_recv_is_a_program_error(tmp_path: Path) -> None:
    f = tmp_path / "c.csv"
    f.write_text("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n")   # no 1RECV_F0
    prog = read_torch_csv_program(f)
    with pytest.raises(ProgramError, match="never posts 1RECV_F0"):
        simulate(prog, CostModel(), LinkModel(), CommModel(semantics="eager"))


# -- round trip ------------------------------------------------------------------------------
RT = [("1f1b", {}, "loop"), ("gpipe", {}, "loop"), ("interleaved-1f1b", {}, "loop"),
      ("interleaved-1f1b", {"variant": "megatron"}, "loop"), ("looped-bfs", {}, "loop"),
      ("interleaved-zb", {}, "loop"), ("zbv", {"variant": "torch"}, "v"),
      ("dualpipev", {}, "v"), ("dualpipe", {}, "dual")]


@pytest.mark.parametrize("name,kw,placement", RT, ids=[f"{n}{kw}" for n, kw, _ in RT])
def test_round_trip_same_timeline(name, kw, placement, tmp_path: Path) -> None:
    """generate -> torch CSV -> load -> simulate gives the same Timeline (spans, messages)
    as simulating the generated schedule: compute-only CSV under the async policy, and the
    compute+comms CSV of the torch-policy program."""
    s = ours(name, kw, 4, 8)
    costs, link = CostModel(F=1, B=2, W=1), LinkModel(latency=0.5)
    comm = CommModel(semantics="eager")
    f, g = tmp_path / "c.csv", tmp_path / "cc.csv"
    f.write_text(schedule_to_torch_csv(s))
    back = read_torch_csv(f, placement=placement)
    assert back.ranks == s.ranks
    a = simulate(lower(s), costs, link, comm)
    b = simulate(lower(back), costs, link, comm)
    assert a.spans == b.spans and a.messages == b.messages and a.makespan == b.makespan
    # compute+comms: the program torch's _PipelineScheduleRuntime runs comes back exactly
    prog = Program.from_flat(runtime_flat(s.placement, add_send_recv(s)), name=s.name,
                             placement=s.placement, microbatches=s.microbatches)
    g.write_text(program_to_torch_csv(prog))
    back_prog = read_torch_csv_program(g, placement=placement)
    assert back_prog.ranks == prog.ranks
    c = simulate(prog, costs, link, comm)
    d = simulate(back_prog, costs, link, comm)
    assert c.spans == d.spans and c.messages == d.messages
    # the torch policy's own program: the same posts; for 1F1B/GPipe torch's single-stage
    # loops batch and wait differently, which torch's CSV format cannot say
    tp = lower(s, "torch")
    g.write_text(program_to_torch_csv(tp))
    flat = lambda prog: [[str(x) for i in row if not isinstance(i, (Wait, Commit))  # noqa
                          for x in (launched(i) or (i.op,))] for row in prog.ranks]
    assert flat(read_torch_csv_program(g, placement=placement)) == flat(tp)
    assert (tp.ranks == prog.ranks) == (name not in ("1f1b", "gpipe"))


def test_cli_round_trip(tmp_path: Path) -> None:
    """Through the CLI, as a user would: generate --format torch-csv / torch-csv-comms,
    then simulate --schedule-file; the Timeline JSON spans equal the direct run's."""
    def run(*args) -> dict:
        out = tmp_path / "tl.json"
        r = runner.invoke(app, ["simulate", *map(str, args), "--json", str(out), "-q",
                                "--semantics", "eager", "--latency", "0.5"])
        assert r.exit_code == 0, r.output
        return json.loads(out.read_text())

    for fmt, policy in (("torch-csv", "async"), ("torch-csv-comms", "torch")):
        csv_file = tmp_path / f"{fmt}.csv"
        r = runner.invoke(app, ["generate", "zbv", "-p", "4", "-m", "8", "--variant",
                                "torch", "--comm-policy", policy, "--format", fmt,
                                "--out", str(csv_file)])
        assert r.exit_code == 0, r.output
        direct = run("-s", "zbv", "-p", 4, "-m", 8, "--variant", "torch", "--comm-policy",
                     policy)
        loaded = run("--schedule-file", csv_file, "--placement", "v")
        assert loaded["spans"] == direct["spans"] and loaded["makespan"] == direct["makespan"]


@pytest.mark.parametrize("fmt,policy", [("torch-csv", "async"),
                                        ("torch-csv-comms", "torch")])
def test_dualpipe_csv_round_trip(fmt: str, policy: str, tmp_path: Path) -> None:
    """DualPipe's CSV names each stage on two rows (one per direction); --placement dual
    (microbatches inferred or given) reads it back as the generated schedule. Before,
    generate wrote it and simulate refused it ("unknown placement 'dual'")."""
    def run(*args) -> dict:
        out = tmp_path / "tl.json"
        r = runner.invoke(app, ["simulate", *map(str, args), "--json", str(out), "-q",
                                "--semantics", "eager", "--latency", "0.5"])
        assert r.exit_code == 0, r.output
        return json.loads(out.read_text())

    f = tmp_path / "dp.csv"
    r = runner.invoke(app, ["generate", "dualpipe", "-p", "4", "-m", "8", "--comm-policy",
                            policy, "--format", fmt, "--out", str(f)])
    assert r.exit_code == 0, r.output
    rows = [[c for c in row.split(",") if "SEND" not in c and "RECV" not in c]
            for row in f.read_text().splitlines()]
    assert rows[0][:4] == ["0F0", "0F1", "0F2", "3F4"]      # stage 3 of direction 1 on
    assert rows[3][:4] == ["0F4", "0F5", "0F6", "3F0"]      # rank 0, stage 0 on rank 3
    direct = run("-s", "dualpipe", "-p", 4, "-m", 8, "--comm-policy", policy)
    for extra in ([], ["-m", 8]):
        loaded = run("--schedule-file", f, "--placement", "dual", *extra)
        assert loaded["spans"] == direct["spans"] and loaded["makespan"] == direct["makespan"]
    back = read_torch_csv(f, placement="dual")
    assert back.placement == Placement(kind="dual", ranks=4, stages=4, microbatches=8)
    # the file is torch's action list under both policies: each F&B pair one
    # OVERLAP_F_B action (the torch runtime runs it as F then B, which it reads back as)
    assert back.ranks == generate("dualpipe", 4, 8).schedule().ranks
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f)])     # loop by default
    assert r.exit_code == 2 and "row 1 (rank 0) runs stage 3, which the loop placement " \
        "puts on rank 3; the file follows the dual placement: pass --placement dual" \
        in r.stderr
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f), "--placement", "dual",
                            "-m", "10"])
    assert r.exit_code == 2 and "runs stage 3 for microbatch 4 (direction 0 of 10 " \
        "microbatches)" in r.stderr and "pass --microbatches 8" in r.stderr
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f), "--placement", "custom"])
    assert r.exit_code == 2 and "expected loop, v or dual" in r.stderr


def test_dualpipe_csv_cells_are_torch_actions(tmp_path: Path) -> None:
    """Every cell of the DualPipe CSV is an action torch parses (torch cannot run the
    file: its stages live on one rank each)."""
    text = schedule_to_torch_csv(generate("dualpipe", 4, 8).schedule())
    for cell in (c for row in text.splitlines() for c in row.split(",")):
        assert str(_Action.from_str(cell)) == cell


def test_cli_bad_csv_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("0F0,0F1,0I0\n1F0,1F0junk\n")
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "row 2 (rank 1), column 2: bad action '1F0junk'" in r.stderr
    assert "Traceback" not in r.output


# -- our JSON schedule format ---------------------------------------------------------------
def test_handwritten_json_example() -> None:
    """schedules/handwritten-zb-2x4.json: hand derivation at unit costs: rank 1 runs
    F B F B ... [1, 9] then its four W [9, 13]; rank 0 ends with W3 at 12 -> makespan 13,
    against (m + p - 1)(F + BW) = 15 for 1F1B."""
    s = load_schedule_file(SCHEDULES / "handwritten-zb-2x4.json")
    validate_schedule(s)
    tl = simulate(lower(s), CostModel(), LinkModel(), CommModel(semantics="data"))
    assert tl.makespan == 13.0 and [r.last_end for r in tl.per_rank] == [12.0, 13.0]
    r = runner.invoke(app, ["simulate", "--schedule-file",
                            str(SCHEDULES / "handwritten-zb-2x4.json")])
    assert r.exit_code == 0 and "makespan 13 slot" in r.stdout


def test_json_round_trip(tmp_path: Path) -> None:
    s = interleaved_1f1b(4, 8, variant="megatron")
    f = tmp_path / "s.json"
    f.write_text(s.model_dump_json(indent=1))
    d = json.loads(f.read_text())
    assert d["placement"]["kind"] == "loop" and d["ranks"][0][:3] == ["0F0", "0F1", "0F2"]
    back = load_schedule_file(f)
    assert back.ranks == s.ranks and back.placement == s.placement
    assert back.params["variant"] == "megatron"


def test_json_schedule_is_validated_on_load(tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"placement": {"kind": "loop", "ranks": 2, "stages": 2},
                             "microbatches": 1,
                             "ranks": [["0F0", "0BW0"], ["1F0", "1B0"]]}))
    with pytest.raises(ScheduleError) as e:
        load_schedule_file(f)
    assert str(e.value) == (f"{f}: rank 1, op 1 (1B0): missing op: stage 1 mb 0 has no W "
                            f"for this B (expected on rank 1)")
    r = runner.invoke(app, ["simulate", "--schedule-file", str(f)])
    assert r.exit_code == 2 and "has no W for this B" in r.stderr


# -- validation: every rule names its first offending action --------------------------------
PL = Placement(kind="loop", ranks=2, stages=2)


def sched(r0: str, r1: str, m: int = 1, pl: Placement = PL) -> Schedule:
    return Schedule(placement=pl, microbatches=m, ranks=[r0.split(), r1.split()])


@pytest.mark.parametrize("r0,r1,m,needle", [
    ("0F0 0F1 0BW0 0BW1", "1F0 1BW0 1F1 1F0 1BW1", 2,
     "rank 1, op 3 (1F0): duplicate F of stage 1 mb 0 (first at rank 1, op 0 (1F0))"),
    ("0F0 0BW0", "1F0 1F1 1BW0", 2, "rank 1, op 1 (1F1): missing op: stage 1 mb 1 has no "
     "BW (or B and W)"),
    ("0F0 0B0 0W0", "1F0 1B0", 1, "rank 1, op 1 (1B0): missing op: stage 1 mb 0 has no W "
     "for this B"),
    ("0F0 0W0", "1F0 1BW0", 1, "rank 0, op 1 (0W0): missing op: stage 0 mb 0 has no B for "
     "this W"),
    ("0F0 0W0 0BW0", "1F0 1BW0", 1, "rank 0, op 1 (0W0): stage 0 mb 0 has both BW and a "
     "split B/W (rank 0, op 2 (0BW0))"),
    ("0F0 0B0 0BW0 0W0", "1F0 1BW0", 1, "rank 0, op 1 (0B0): stage 0 mb 0 has both BW and "
     "a split B/W (rank 0, op 2 (0BW0))"),
    ("0F0 0BW0 0B0 0W0", "1F0 1BW0", 1, "rank 0, op 1 (0BW0): stage 0 mb 0 has both BW and "
     "a split B/W (rank 0, op 2 (0B0))"),
    ("0F0 0BW0", "1BW0", 1, "rank 1, op 0 (1BW0): missing op: stage 1 mb 0 has no F"),
    ("0F0 0BW0", "1BW0 1F0", 1, "rank 1, op 0 (1BW0) comes before the forward of stage 1 "
     "mb 0 it needs (rank 1, op 1 (1F0))"),
    ("0F0 0W0 0B0", "1F0 1BW0", 1, "rank 0, op 1 (0W0) comes before the input-gradient "
     "backward of stage 0 mb 0 it needs (rank 0, op 2 (0B0))"),
    ("0F0 1F0 0BW0", "1BW0", 1, "rank 0, op 1 (1F0): stage 1 (mb 0) runs on rank 1"),
    ("0F0 0BW0 0F3", "1F0 1BW0", 1, "rank 0, op 2 (0F3): stage must be in [0, 2) and "
     "microbatch in [0, 1)"),
    ("0F0 0BW0", "", 1, "missing op: stage 1 mb 0 has no F (expected on rank 1)"),
])
def test_validation_names_first_offending_action(r0, r1, m, needle) -> None:
    with pytest.raises(ScheduleError) as e:
        validate_schedule(sched(r0, r1, m))
    assert needle in str(e.value)


def test_csv_validation_names_the_cell(tmp_path: Path) -> None:
    """Read from a torch CSV, the first offending action is named by its cell and torch
    spelling (idle cells counted in the column)."""
    cases = [
        ("0F0,,0I0,0W0\n1F0,1B0,1B0\n", "row 2 (rank 1), column 3 (1B0): duplicate BW"),
        ("0F0,0I0\n,1F0,1B0\n", "row 1 (rank 0), column 2 (0I0): missing op: stage 0 mb 0 "
         "has no W"),
        ("0B0,0F0\n1F0,1B0\n", "row 1 (rank 0), column 1 (0B0) comes before the forward "
         "of stage 0 mb 0 it needs (" + str(tmp_path / "v.csv") + ": row 1 (rank 0), "
         "column 2 (0F0))"),
    ]
    for text, needle in cases:
        f = tmp_path / "v.csv"
        f.write_text(text)
        with pytest.raises(ScheduleError) as e:
            read_torch_csv(f)
        assert needle in str(e.value)
        assert str(e.value).startswith(str(f))


def test_every_generated_schedule_is_validated() -> None:
    """Scenario.build_program validates generated schedules: a generator bug would be a
    clear ScheduleError, not a bad timeline. (Checked by injecting a broken generator.)"""
    from schedsim.generators import GENERATORS, register
    from schedsim.scenario import parse_scenario

    @register("broken-for-test", summary="-", constraints="-", placement="loop",
              source="test")
    def broken(ranks: int, microbatches: int) -> Schedule:
        return sched("0F0 0BW0", "1F0", 1)

    try:
        sc = parse_scenario({"schedule": {"name": "broken-for-test", "ranks": 2,
                                          "microbatches": 1}})
        with pytest.raises(ScheduleError, match=r"rank 1, op 0 \(1F0\): missing op"):
            sc.build_program()
    finally:
        GENERATORS.pop("broken-for-test")


def test_comm_tokens_in_csv_are_our_comm_ops() -> None:
    rows, _ = parse_torch_csv("0F0,0SEND_F0\n1RECV_F0,1F0\n")
    assert rows[0][1] == Comm("SEND_F", 0, 0) and rows[1][0] == Comm("RECV_F", 1, 0)


@pytest.mark.parametrize("extra", [[], ["--param", "overlap_f_b=true"]])
def test_dualpipev_comms_csv_is_torchs_action_list(extra: list[str], tmp_path: Path) -> None:
    """``generate dualpipev --comm-policy torch --format torch-csv-comms`` writes torch's
    own action list: each overlapped pair one ``(a;b)OVERLAP_F_B`` cell, cell for cell
    what ``ScheduleDualPipeV._dump_csv(format="compute_comms")`` writes (bookkeeping
    dropped), whether or not a custom function runs the pair (``overlap_f_b`` changes how
    the runtime runs it, not the list). Since the torch policy split each pair into its
    two parts (commit 9822bf8) the file held the parts and torch read back a list without
    ``OVERLAP_F_B``. Reading the file back gives the torch policy's program."""
    p, m = 4, 8
    f, g = tmp_path / "ours.csv", tmp_path / "torch.csv"
    r = runner.invoke(app, ["generate", "dualpipev", "-p", str(p), "-m", str(m),
                            "--comm-policy", "torch", *extra, "--format", "torch-csv-comms",
                            "--out", str(f)])
    assert r.exit_code == 0, r.output
    torch_ref.torch_schedule("DualPipeV", p, m, 2)._dump_csv(str(g), format="compute_comms")
    theirs = [[c for c in row.split(",") if c and not any(b in c for b in torch_ref.BOOKKEEPING)]
              for row in g.read_text().splitlines()]
    ours_rows = [row.split(",") for row in f.read_text().splitlines()]
    assert ours_rows == theirs
    assert sum(c.endswith("OVERLAP_F_B") for row in ours_rows for c in row) > 0
    s = ours("dualpipev", {}, p, m)
    assert read_torch_csv_program(f, placement="v").ranks == lower(s, "torch").ranks

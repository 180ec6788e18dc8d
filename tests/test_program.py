"""Program text form, schedule validation and the static checks of the compile step."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from schedsim import (
    CommModel,
    Op,
    ParseError,
    Placement,
    Program,
    ProgramError,
    Schedule,
    ScheduleError,
    build_program,
    generate,
    simulate,
    validate_schedule,
)
from schedsim.program.ir import Batch, Comm, Commit, Compute, Post, Wait
from schedsim.program.tokens import format_instr, parse_instr, parse_program_text
from schedsim.scenario import program_from_rows


def program(text: str, ranks: int, stages: int, mbs: int, placement: str = "loop") -> Program:
    return Program(placement=Placement(kind=placement, ranks=ranks, stages=stages),
                   microbatches=mbs, ranks=parse_program_text(text))


comm_st = st.builds(Comm, st.sampled_from(["SEND_F", "RECV_F", "SEND_B", "RECV_B"]),
                    st.integers(0, 99), st.integers(0, 999))
op_st = st.builds(Op, st.sampled_from(["F", "B", "W", "BW"]), st.integers(0, 99),
                  st.integers(0, 999))
instr_st = st.one_of(
    st.builds(Compute, op_st), st.builds(Post, comm_st), st.just(Commit()),
    st.builds(Wait, st.lists(comm_st, min_size=1, max_size=3, unique=True).map(tuple)),
    st.builds(Batch, st.lists(comm_st, min_size=1, max_size=4, unique=True).map(tuple)),
    st.builds(lambda f, b: Compute(Op.fb(f, b)),
              st.builds(Op, st.just("F"), st.integers(0, 9), st.integers(0, 9)),
              st.builds(Op, st.sampled_from(["B", "BW"]), st.integers(0, 9),
                        st.integers(0, 9))))


@given(instr_st)
def test_token_round_trip(ins) -> None:
    assert parse_instr(format_instr(ins)) == ins


@pytest.mark.parametrize("tok,expected", [
    ("0F1", Compute(Op("F", 0, 1))), ("12BW3", Compute(Op("BW", 12, 3))),
    ("(0F3;3BW1)OVERLAP_F_B", Compute(Op.fb(Op("F", 0, 3), Op("BW", 3, 1)))),
    ("2SEND_F0", Post(Comm("SEND_F", 2, 0))), ("COMMIT", Commit()),
    ("WAIT[1SEND_F2+1RECV_B0]", Wait((Comm("SEND_F", 1, 2), Comm("RECV_B", 1, 0))))])
def test_tokens(tok, expected) -> None:
    assert parse_instr(tok) == expected


@pytest.mark.parametrize("bad", ["0F0junk", "F0", "0X1", "0SEND_F", "WAIT[]", "commit",
                                 "(0F1;2W1)"])
def test_bad_tokens(bad: str) -> None:
    with pytest.raises(ParseError, match="bad"):
        parse_instr(bad)


def test_program_text_errors_name_line_and_token() -> None:
    with pytest.raises(ParseError, match="line 2, token 3"):
        parse_program_text("rank 0: 0F0\nrank 1: 1F0 1F1 1F2x\n")
    with pytest.raises(ParseError, match="out of order"):
        parse_program_text("rank 1: 0F0\n")


def test_program_text_round_trip() -> None:
    prog = generate("dualpipe", 4, 8)
    rows = parse_program_text(prog.to_text())
    assert rows == prog.ranks
    again = program_from_rows(rows, "dual", microbatches=8)
    assert again.ranks == prog.ranks
    js = Program.model_validate_json(prog.model_dump_json())
    assert js.ranks == prog.ranks and js.placement == prog.placement


@pytest.mark.parametrize("name,kind", [("1f1b", "loop"), ("interleaved-1f1b", "loop"),
                                       ("zbv", "v"), ("v-half", "v"), ("dualpipev", "v"),
                                       ("dualpipe", "dual")])
def test_program_text_reads_back_under_its_own_placement(tmp_path, name, kind) -> None:
    """A program text ``generate`` wrote reads back under the placement its ops run under
    (no ``--placement``), and simulates to the same makespan."""
    from schedsim import lower
    from schedsim.scenario import load_program_file

    prog = generate(name, 4, 8)
    prog = prog if isinstance(prog, Program) else lower(prog)
    path = tmp_path / f"{name}.txt"
    path.write_text(prog.to_text())
    again = load_program_file(path)
    assert again.placement.kind == kind and again.placement == prog.placement
    comm = CommModel(semantics="rendezvous")
    assert simulate(again, comm=comm).makespan == simulate(prog, comm=comm).makespan


def test_an_op_out_of_every_placement_is_named() -> None:
    """Ops that no placement puts where the text has them: the loop placement's check
    names the first one."""
    with pytest.raises(ProgramError, match=r"\(1F0\): stage 1 \(mb 0\) runs on rank 1 under "
                                           r"loop placement, not on rank 0"):
        simulate(program_from_rows(parse_program_text("1F0\n0F0\n"), None, microbatches=2),
                 comm=CommModel())


def test_compute_only_text_is_lowered() -> None:
    prog = program_from_rows(parse_program_text("0F0 0F1\n1F0 1F1\n"), "loop")
    assert prog.has_comm()
    assert simulate(prog, comm=CommModel(semantics="rendezvous")).makespan == 3


@pytest.mark.parametrize("text,placement,stages,match", [
    ("0F0 0SEND_F0 0F1 0SEND_F1\n1RECV_F1 1RECV_F0 WAIT[1RECV_F0] 1F0 WAIT[1RECV_F1] 1F1",
     "loop", 2, r"1st send on link 0->1 is 0SEND_F0 \(rank 0, instr 1\) but the 1st recv "
     r"is 1RECV_F1 \(rank 1, instr 0\)"),
    ("0F0 0SEND_F0 0F1 0SEND_F1\n1RECV_F0 COMMIT 1F0", "loop", 2,
     r"0SEND_F1 \(rank 0, instr 3\): unmatched send: rank 1 never posts the matching recv"),
    ("0F0 0SEND_F0\n1RECV_F0 1F0", "loop", 2, "never waits for 1RECV_F0"),
    ("0F0\n1F0", "loop", 2, "never posts 1RECV_F0"),
    ("0F0 0SEND_F0 1RECV_F0\n1RECV_F0 COMMIT 1F0", "loop", 2, "belongs to rank 1"),
    ("0SEND_F0 0F0\n1RECV_F0 COMMIT 1F0", "loop", 2, "sends 0SEND_F0 before the op"),
    ("0F0 0SEND_F0 WAIT[0SEND_F1]\n1RECV_F0 COMMIT 1F0", "loop", 2, "has not posted"),
    ("0F0 0SEND_F0\n1RECV_F0 COMMIT 1F0 1SEND_F0 2F0", "v", 4, "hand-off is local"),
    ("0F0 0SEND_F0 1F0\n1RECV_F0 COMMIT 1F0", "v", 4,
     r"rank 0, instr 2 \(1F0\): stage 1 \(mb 0\) runs on rank 1"),
    ("0F0 0SEND_F0 0SEND_F0\n1RECV_F0 COMMIT 1F0", "loop", 2, "posted twice"),
])
def test_program_errors(text, placement, stages, match) -> None:
    prog = program(text, 2, stages, 2, placement)
    with pytest.raises(ProgramError, match=match):
        simulate(prog, comm=CommModel(semantics="eager"))


def test_validate_schedule_errors() -> None:
    pl = Placement(kind="loop", ranks=2, stages=2)
    ok = [[Op("F", 0, 0), Op("BW", 0, 0)], [Op("F", 1, 0), Op("BW", 1, 0)]]
    validate_schedule(Schedule(placement=pl, microbatches=1, ranks=ok))
    cases = [
        ([[Op("F", 0, 0), Op("BW", 0, 0)], [Op("F", 1, 0)]], "missing op: stage 1 mb 0 has "
         "no BW"),
        ([[Op("F", 0, 0), Op("BW", 0, 0), Op("F", 0, 0)], ok[1]], "rank 0, op 2 .0F0.: "
         "duplicate F"),
        ([[Op("BW", 0, 0), Op("F", 0, 0)], ok[1]], r"rank 0, op 0 \(0BW0\) comes before the "
         "forward"),
        ([[Op("F", 0, 0), Op("BW", 0, 0), Op("F", 1, 0)], ok[1]], "runs on rank 1"),
        ([[Op("F", 0, 0), Op("B", 0, 0)], ok[1]], "has no W"),
        ([[Op("F", 0, 0), Op("BW", 0, 0)], [Op("F", 1, 0), Op("BW", 1, 1)]], "microbatch"),
    ]
    for rows, match in cases:
        with pytest.raises(ScheduleError, match=match):
            validate_schedule(Schedule(placement=pl, microbatches=1, ranks=rows))


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 8), ("gpipe", 3, 5), ("dualpipe", 4, 8),
                                      ("dualpipev", 4, 8)])
def test_generated_schedules_validate(name: str, p: int, m: int) -> None:
    validate_schedule(build_program(name, p, m).schedule())


def test_forward_only_is_valid() -> None:
    pl = Placement(kind="loop", ranks=2, stages=4)
    s = Schedule(placement=pl, microbatches=2,
                 ranks=[[Op("F", 0, 0), Op("F", 0, 1), Op("F", 2, 0), Op("F", 2, 1)],
                        [Op("F", 1, 0), Op("F", 1, 1), Op("F", 3, 0), Op("F", 3, 1)]])
    validate_schedule(s)


def test_placements() -> None:
    v = Placement(kind="v", ranks=4, stages=8)
    assert [v.rank_of(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [v.chunk_of(s) for s in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    d = Placement(kind="dual", ranks=4, stages=4, microbatches=8)
    assert (d.rank_of(0, 3), d.rank_of(0, 4), d.chunk_of(2, 5)) == (0, 3, 1)
    lp = Placement(kind="loop", ranks=3, stages=6)
    assert lp.stages_of(1) == [1, 4] and lp.chunk_of(4) == 1
    with pytest.raises(ScheduleError, match="multiple of ranks"):
        Placement(kind="loop", ranks=4, stages=6)
    with pytest.raises(ScheduleError, match="2 x ranks"):
        Placement(kind="v", ranks=4, stages=4)


@pytest.mark.parametrize("sem", ["data", "eager"])
def test_duplicate_compute_is_an_error(sem: str) -> None:
    prog = program("0F0 0F0\n1F0", 2, 2, 1)
    with pytest.raises(ProgramError, match="runs a second time"):
        simulate(prog, comm=CommModel(semantics=sem))


def test_data_semantics_still_checks_the_comm_instructions() -> None:
    """Under data semantics the comm instructions are ignored for timing, but a wrong one
    (a WAIT on a token never posted) is still an error."""
    prog = program("0F0 0SEND_F0 WAIT[0SEND_F1]\n1RECV_F0 COMMIT 1F0", 2, 2, 2)
    with pytest.raises(ProgramError, match="has not posted"):
        simulate(prog, comm=CommModel(semantics="data"))


def test_out_of_range_op_is_a_program_error() -> None:
    prog = program("0F0 0SEND_F0\n1RECV_F0 COMMIT 1F0 3F0", 2, 2, 1)
    with pytest.raises(ProgramError, match=r"stage must be in \[0, 2\)"):
        simulate(prog, comm=CommModel(semantics="eager"))

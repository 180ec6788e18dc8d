"""``schedsim stalls``, ``align``, ``critical-path``, ``query`` and ``lint``: explain a run.

Every command takes a scenario (TOML file and/or the same flags as ``simulate``), runs it
through the simulator and explains the result; ``--json FILE`` writes the full records.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from schedsim.cli import app
from schedsim.cli.tables import DataTable, data_format, num_time
from schedsim.cli.common import (
    console,
    fail,
    fail_deadlock,
    handle_errors,
    scenario_command,
    warn_costs,
)
from schedsim.errors import ScenarioError
from schedsim.util.text import rich_escape
from schedsim.util.units import unit_text, unit_title

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from rich.table import Table
    from schedsim.scenario import Scenario
    from schedsim.sim.costs import CommModel

JsonOpt = Annotated[Optional[Path], typer.Option(
    "--json", help="Write the records as JSON (atomically; - for stdout).",
    rich_help_panel="Outputs")]
#: rows ``align`` prints unless --limit / --all say otherwise
ALIGN_LIMIT = 40

def run_scenario(sc: Scenario, comm: CommModel | None = None):
    """``(program, timeline)`` of a command's input: a scenario simulated (deadlocks are
    returned, not raised), or a Timeline JSON as it is (:mod:`schedsim.cli.inputs`)."""
    from schedsim.scenario import Scenario
    from schedsim.cli.inputs import run_input

    prog, tl = run_input(sc, comm)
    if isinstance(sc, Scenario):        # a timeline input ran with costs of its own
        warn_costs(sc, tl)
    return prog, tl


def check_rank(rank: int | None, tl: Any) -> None:
    """Raise :class:`ScenarioError` unless ``rank`` is None or one of ``tl``'s ranks."""
    if rank is not None and not 0 <= rank < tl.ranks:
        raise ScenarioError(f"--rank {rank}: this run has ranks 0 to {tl.ranks - 1}")


def write_json(path: Path | None, data: Any) -> None:
    """Write ``data`` (or what the callable ``data`` returns, built only when ``path`` is
    given) to ``path`` as indented JSON, atomically; nothing when ``path`` is None."""
    from schedsim.util.files import atomic_write_text

    if path is not None:
        if callable(data):
            data = data()
        atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def _title(tl) -> str:
    return rich_escape(f"{tl.schedule}: {tl.ranks} ranks x {tl.microbatches} microbatches, "
                       f"{tl.semantics} semantics"
                       + ("" if tl.comm_stream == "none" else f", {tl.comm_stream} stream"))


@app.command()
@handle_errors(tables=True)
@scenario_command(timelines=True)
def stalls(
    sc: Scenario,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Only this rank.")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", min=1, help="Print at most this many rows (the longest stalls; --format csv/json "
        "print every row).")
    ] = ALIGN_LIMIT,
    show_all: Annotated[bool, typer.Option(
        "--all", help="Print every stall (no --limit).")] = False,
    json_out: JsonOpt = None,
) -> None:
    """Classify every idle interval of every rank and say why it happened.

    The first line says how much of the run is idle, by cause, and the longest stall;
    the table gives each stall with its cause and the instruction and peer behind it
    (at most --limit rows: the longest stalls, in rank and time order; --all prints
    every one). Causes: warmup, cooldown, wait-recv (input not arrived: which message,
    from which rank, made by which op), wait-send (send not accepted, rendezvous),
    wait-batch (a commit-and-wait held by a member the next op does not need),
    head-of-line (transfer queued behind another), transfer, deadlock, host. --json
    writes every stall: a list of {rank, start, end, cause, detail, index, instruction,
    comms}.

    Example:
      schedsim stalls schedules/dualpipe-issue-t10-t12.toml --semantics eager \\
        --rank 5
    """
    from rich.markup import escape
    from schedsim.analysis.stalls import attribute_stalls, stalls_headline

    prog, tl = run_scenario(sc)
    check_rank(rank, tl)
    st = attribute_stalls(tl, prog)
    write_json(json_out, lambda: [s.to_dict() for s in st])
    console.print(escape(stalls_headline(st, tl, rank)), highlight=False, soft_wrap=True)
    if rank is not None:
        console.print(escape(stalls_headline(st, tl)), highlight=False, soft_wrap=True)
    shown = [s for s in st if rank is None or s.rank == rank]
    n = len(shown)
    if not (show_all or data_format()) and n > limit:
        keep = set(map(id, sorted(shown, key=lambda s: -s.duration)[:limit]))
        shown = [s for s in shown if id(s) in keep]
    t = DataTable("stalls", title=unit_title(f"stalls of {_title(tl)}", tl.unit),
                  show_lines=False)
    for col in ("rank", "start", "end", "len", "cause", "detail"):
        t.add_column(col, justify="right" if col in ("rank", "start", "end", "len") else
                     "left", overflow="fold")
    for s in shown:
        t.add_row(str(s.rank), *(num_time(x) for x in (s.start, s.end, s.duration)),
                  s.cause, escape(s.detail))
    console.print(t)
    if len(shown) < n:
        console.print(f"the {len(shown)} longest of {n} stalls shown (--all prints every "
                      f"stall, --json writes them all)", highlight=False)
    if tl.deadlock is not None:
        fail_deadlock(tl, sc)


@app.command()
@handle_errors(tables=True)
@scenario_command(timelines=True)
def align(
    sc: Scenario,
    rank: Annotated[Optional[int], typer.Option(
        "--rank", help="Only messages sent or received by this rank.")] = None,
    flagged: Annotated[bool, typer.Option(
        "--flagged", help="Only messages with a flag (late-send, late-recv, queued).")
    ] = False,
    late_threshold: Annotated[float, typer.Option(
        "--late-threshold", help="Flag sends posted more than this after their data was "
        "ready.")] = 0.0,
    limit: Annotated[int, typer.Option(
        "--limit", min=1, help="Print at most this many rows (the first in data-ready "
        "order; --format csv/json print every row).")] = ALIGN_LIMIT,
    show_all: Annotated[bool, typer.Option(
        "--all", help="Print every row (no --limit).")] = False,
    json_out: JsonOpt = None,
) -> None:
    """Send/recv alignment: per message, data ready, send posted, recv posted, transfer,
    recv done and consumer start, flagging late posts.

    With whole-number costs, data ready at 11 reads "end T10" and a consumer starting at
    12 "T12" (the slot diagrams of the papers). The table shows the first --limit rows
    (in data-ready order) of those --rank/--flagged select, and says how many it left
    out; --all prints them all; --json always writes every message.

    Example:
      schedsim align schedules/dualpipe-issue-t10-t12.toml \\
        --semantics rendezvous --rank 5
    """
    from rich.markup import escape
    from schedsim.analysis.align import ALIGN_COLUMNS, alignment, is_slotted, row_cells

    _, tl = run_scenario(sc)
    check_rank(rank, tl)
    rows = alignment(tl, late_threshold)
    write_json(json_out, lambda: [r.to_dict() for r in rows])
    n_flagged = sum(1 for r in rows if r.flags)
    if rank is not None:
        rows = [r for r in rows if rank in (r.src, r.dst)]
    if flagged:
        rows = [r for r in rows if r.flags]
    shown = rows if show_all or data_format() else rows[:limit]
    slotted = is_slotted(tl)
    t = DataTable("alignment", title=unit_title(f"send/recv alignment of {_title(tl)}", tl.unit))
    for col in ALIGN_COLUMNS:
        t.add_column(col, overflow="fold")
    for r in shown:
        t.add_row(*[escape(c) for c in row_cells(r, slotted)])
    console.print(t)
    if len(shown) < len(rows):
        console.print(f"first {len(shown)} of {len(rows)} rows shown (--all prints every "
                      f"row, --flagged only flagged ones, --json writes every message)",
                      highlight=False)
    console.print(f"{n_flagged} of {len(tl.messages)} messages flagged", highlight=False)
    if tl.deadlock is not None:
        fail_deadlock(tl, sc)


@app.command("critical-path")
@handle_errors(tables=True)
@scenario_command(timelines=True)
def critical_path_cmd(
    sc: Scenario,
    slack: Annotated[bool, typer.Option(
        "--slack", help="Also print every op's slack (time it can slip before the "
        "makespan moves).")] = False,
    show_all: Annotated[bool, typer.Option(
        "--all", help="One row per step (op, post, message, wait) instead of one per run "
        "of ops on a rank.")] = False,
    json_out: JsonOpt = None,
) -> None:
    """The chain of ops, messages and waits that sets the makespan, and each op's slack.

    The first lines say how much of the makespan the path computes and how much it
    waits, and its route over the ranks; the table has one row per run of consecutive
    ops on one rank and the messages/waits that led into it (--all: one row per step).
    Built from the dependency graph of the run (program order, data, posts, partner
    posts, link FIFO, comm streams) by one longest-path pass in topological order.
    --json writes {"makespan", "path": [...], "slack": [...]}.

    Example:
      schedsim critical-path schedules/dualpipe-figure.toml --semantics rendezvous
    """
    from rich.markup import escape
    from schedsim.analysis._simulated import simulate_compiled
    from schedsim.analysis.critical import (
        critical_path,
        op_slack,
        path_headline,
        slack_values,
    )
    from schedsim.analysis.graph import build_graph
    from schedsim.cli.inputs import TimelineInput

    if isinstance(sc, TimelineInput):       # a run already: analysed as it is
        prog, tl = run_scenario(sc)
        gi = None
    else:
        prog = sc.build_program()
        tl, gi = simulate_compiled(prog, sc.costs, sc.link, sc.comm)
    if tl.deadlock is not None:
        fail_deadlock(tl, sc)
    G = build_graph(tl, sc.build_program() if prog is None else prog, sc.link, sc.comm,
                    compiled=gi)
    del gi
    path = critical_path(G)
    sl = slack_values(G)
    write_json(json_out, lambda: {"makespan": tl.makespan,
                                  "path": [s.to_dict() for s in path],
                                  "slack": [o.to_dict() for o in op_slack(G)]})
    head, route = path_headline(path, tl.makespan, int((sl == 0).sum()), len(sl),
                                unit=tl.unit)
    for line in (f"critical path of {_title(tl)}: {head}", route):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(_path_table(path, show_all, tl.unit))
    if slack:
        ts = DataTable("slack", title=unit_title("slack per op", tl.unit))
        for col in ("rank", "op", "instr", "start", "end", "slack"):
            ts.add_column(col, justify="right")
        for o in op_slack(G):
            ts.add_row(str(o.rank), escape(o.op), str(o.index), num_time(o.start),
                       num_time(o.end), num_time(o.slack))
        console.print(ts)


def _path_table(path: list, show_all: bool, unit: str) -> Table:
    """The critical path as a table: one row per step, or per run of ops on a rank (its
    times in ``unit``, said in the title)."""
    from rich.markup import escape
    from schedsim.analysis.critical import segments

    if show_all:
        t = DataTable("steps", title=unit_title("critical path, every step", unit))
        for col in ("step", "rank", "what", "start", "end", "detail"):
            t.add_column(col, overflow="fold")
        for s in path:
            t.add_row(s.kind, "-" if s.rank is None else str(s.rank),
                      escape(s.what + ("" if s.index is None else f" (instr {s.index})")),
                      num_time(s.start), num_time(s.end), escape(s.detail))
        return t
    t = DataTable("critical_path",
                  title=f"critical path by runs of ops on one rank ({unit_text(unit)}; --all: "
                        f"every step)")
    for col in ("rank", "ops", "first", "last", "start", "end", "entered via"):
        t.add_column(col, overflow="fold", justify="right" if col in (
            "rank", "ops", "start", "end") else "left")
    for g in segments(path):
        via = ", ".join(f"msg {v.what}" if v.kind == "message" else
                        "its inputs" if v.kind == "wait" and v.index == g.ops[0].index
                        else f"{v.what} (instr {v.index})" if v.kind == "wait" else v.what
                        for v in g.via)
        t.add_row(str(g.rank), str(len(g.ops)), escape(g.ops[0].what),
                  escape(g.ops[-1].what), num_time(g.start), num_time(g.end), escape(via))
    return t


_SELECTOR_HELP = ("Selector: terms 'rank=N mb=N stage=N chunk=N index=N' and a kind F, B, "
                  "W, BW, FB, SEND_F, RECV_F, SEND_B, RECV_B, or a program token (5W0, "
                  "5SEND_B0). Must name exactly one instruction.")


@app.command()
@handle_errors(tables=True)
@scenario_command
def query(
    sc: Scenario,
    effect: Annotated[str, typer.Option(
        "--effect", help="The op (its start) or comm op (its completion) that may be "
        "delayed. " + _SELECTOR_HELP)] = "",
    cause: Annotated[Optional[list[str]], typer.Option(
        "--cause", help="What may delay it (repeatable: freed together). A comm op frees "
        "its message, an op costs 0. Not the effect itself (nor, for a comm op effect, "
        "its message). " + _SELECTOR_HELP)] = None,
    all_semantics: Annotated[bool, typer.Option(
        "--all-semantics", help="Answer under data, eager and rendezvous side by side "
        "(same as --semantics all).")] = False,
    json_out: JsonOpt = None,
) -> None:
    """Does CAUSE delay EFFECT? By how much, through which waits, and does the makespan
    move?

    The delay is measured by re-simulating with the cause made free (a message: each
    side completes when posted; under data semantics: no link cost; an op: zero cost),
    so indirect effects count. --semantics all answers under data, eager and
    rendezvous side by side. --json writes one record per semantics: semantics,
    effect_start, counterfactual_start (an op's start, a comm op's completion, as
    effect_event says), delay, makespan, makespan_delta, binding_wait, chain. A cause
    that is the effect itself (its instruction, or its message for a comm op effect) is
    an error (exit 2).

    Selector grammar: space-separated terms, any order, case-insensitive:
    rank=N mb=N stage=N chunk=N index=N, one kind (F B W BW FB SEND_F RECV_F SEND_B
    RECV_B), or a program token (5W0, 5SEND_B0, (2F15;5BW1)). A comm op is named as the
    rank that posts it names it: "rank=5 SEND_B mb=0" is rank 5's send of the input
    gradient of stage 5, mb 0.

    Example:
      schedsim query schedules/dualpipe-issue-t10-t12.toml --semantics all \\
        --effect "rank=5 W mb=0" --cause "rank=5 SEND_B mb=0"
    """
    from rich.markup import escape
    from schedsim.analysis.query import SEMANTICS, answer
    from schedsim.analysis.query_text import details, headline
    from schedsim.analysis.select import select

    if not effect:
        raise ScenarioError("query needs --effect SELECTOR (e.g. --effect \"rank=5 W mb=0\")")
    if not cause:
        raise ScenarioError("query needs at least one --cause SELECTOR (e.g. --cause "
                            "\"rank=5 SEND_B mb=0\")")
    prog = sc.build_program()
    eff = select(prog, effect, "--effect")
    causes = [select(prog, c, "--cause") for c in cause]
    sems = list(SEMANTICS) if all_semantics else [sc.comm.semantics]
    answers = []
    for sem in sems:
        comm = sc.comm.model_copy(update={"semantics": sem})
        answers.append(answer(prog, eff, causes, sc.costs, sc.link, comm))
    write_json(json_out, [a.to_dict() for a in answers])
    data_t = next((a.effect_start for a in answers if a.semantics == "data"), None)
    for a in answers:
        for line in headline(a, data_t, sc.costs.unit):
            console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(_query_table(answers, causes, eff, sc.costs.unit))
    for a in answers:
        lines = details(a, sc.costs.unit)
        if lines:
            console.print(f"{a.semantics}:", highlight=False)
        for line in lines:
            console.print(escape(line), highlight=False, soft_wrap=True)


def _query_table(answers: list, causes: list, eff: Any, unit: str) -> Table:
    """The table of ``query``: one row per semantics (effect time, against data, with the
    cause free, delay, with both co-causes free, makespan and its delta)."""
    t = DataTable("answers",
                  title=rich_escape(unit_title(f"does {' + '.join(str(c) for c in causes)} "
                                               f"delay {eff}?", unit)))
    data_t = next((a.effect_start for a in answers if a.semantics == "data"), None)
    cols = ["semantics", "effect at"] + (["vs data"] if data_t is not None and
                                         len(answers) > 1 else [])
    joint = any(a.co_causes for a in answers)
    for col in cols + ["cause free", "delay"] + (["both free"] if joint
                                                  else []) + ["makespan", "makespan delta"]:
        t.add_column(col, justify="left" if col == "semantics" else "right")
    for a in answers:
        vs = ([] if len(cols) == 2 else
              [num_time(None if a.effect_start is None else a.effect_start - data_t)])
        co = [num_time(a.joint_delay)] if joint else []
        t.add_row(a.semantics, num_time(a.effect_start), *vs, num_time(a.counterfactual_start),
                  "deadlock" if a.deadlock else num_time(a.delay), *co, num_time(a.makespan),
                  num_time(a.makespan_delta))
    return t


@app.command()
@handle_errors(tables=True)
@scenario_command
def lint(
    sc: Scenario,
    late_threshold: Annotated[float, typer.Option(
        "--late-threshold", help="Report sends posted more than this after their data "
        "was ready.")] = 0.0,
    show_all: Annotated[bool, typer.Option(
        "--all", help="One row per finding instead of one per group of alike findings.")
    ] = False,
    json_out: JsonOpt = None,
) -> None:
    """Lint a program: late sends, unrelated recvs holding a batch, crossed posting
    orders between two ranks (positional mismatch, deadlock, comm-stream risk), and the
    deadlock of its run (the wait-for cycle).

    The timed rules run the program under the scenario's semantics (eager when it says
    data, since data semantics ignores comm instructions). Findings alike but for their
    ranks and microbatches (same rule, severity and pattern) print as one row with their
    count, ranks and an example; --all prints one row each; --json writes every finding.
    Exit code: 0 (findings or not) when the run completes, 3 when it deadlocks (after
    printing the findings and writing --json), 2 for bad input.

    Example:
      schedsim lint schedules/crossed-sends.toml
    """
    from rich.markup import escape
    from schedsim.analysis.lint import examples, group_findings, lint as run_lint, rank_ranges

    prog = sc.build_program()
    comm = sc.comm if sc.comm.semantics != "data" else \
        sc.comm.model_copy(update={"semantics": "eager"})
    _, tl = run_scenario(sc, comm)
    found = run_lint(prog, tl, late_threshold, lazy_init=sc.comm.lazy_init)
    write_json(json_out, lambda: [f.to_dict() for f in found])
    groups = group_findings(found)
    t = DataTable("findings",
                  title=f"lint of {rich_escape(prog.name)} ({comm.semantics} run"
                        + ("" if comm.comm_stream == "none" else f", {comm.comm_stream} stream")
                        + (", deadlocks" if tl.deadlock is not None else "")
                        + f"; times in {unit_text(tl.unit)})")
    if show_all:
        for col in ("severity", "rule", "rank", "instr", "cost", "finding"):
            t.add_column(col, overflow="fold")
        for f in found:
            t.add_row(f.severity, f.rule, str(f.rank), str(f.index), num_time(f.cost),
                      escape(f.message))
    else:
        for col in ("severity", "rule", "count", "ranks", "cost", "finding"):
            t.add_column(col, overflow="fold", justify="right" if col in ("count", "cost")
                         else "left")
        for g in groups:
            first = g.findings[0]
            text = first.message
            if g.count > 1:
                more = ", ".join(f"rank {f.rank} instr {f.index}" for f in examples(g))
                text = (f"{g.pattern}, e.g. {first.message} (also {more}"
                        + (", ..." if g.count > 4 else "") + ")")
            t.add_row(g.severity, g.rule, str(g.count), rank_ranges(g.ranks),
                      num_time(g.cost), escape(text))
    console.print(t)
    by: dict[str, int] = {}
    for f in found:
        by[f.rule] = by.get(f.rule, 0) + 1
    console.print(f"{len(found)} finding{'' if len(found) == 1 else 's'}"
                  + (f" in {len(groups)} group{'' if len(groups) == 1 else 's'}"
                     if len(groups) < len(found) and not show_all else "")
                  + (": " + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
                     if by else "")
                  + (" (--all: one row each)" if len(groups) < len(found) and not show_all
                     else ""), highlight=False)
    if tl.deadlock is not None:
        dead = next(f for f in found if f.rule == "deadlock")
        fail(dead.message.split(":", 1)[0] + " (the deadlock finding says what each rank "
             "waits for)", 3)

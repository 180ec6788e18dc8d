"""``schedsim check-trace``: the engine checked against profiler traces, and the two-error
report ``replay --compare`` shares (:func:`report`).

check-trace: import the traces (:func:`schedsim.interop.kineto.import_traces`),
calibrate ``--exact`` from them, simulate the program they show, compare; and the same
program with a cost model (fitted from the traces, or ``--costs-file``). Prints the
semantics error and the cost-model error (:mod:`schedsim.replay.check`); traces that hold
several profiler steps are checked step by step (each step's own fit, or the cost file),
the median step heading the report and the JSON, the per-step errors with their median and
range after it (:func:`schedsim.replay.check.steps_errors`); ``--json FILE``
writes ``{"semantics_error": {makespan, mean_start, max_start}, "cost_model_error":
{...}, ...}``; ``--out-dir DIR`` writes ``NAME-measured.json``, ``NAME-exact.json`` (the
semantics prediction), ``NAME-predicted.json`` (the cost-model prediction),
``NAME-errors.json``, ``NAME-program.txt`` and ``NAME-overlay.png`` (semantics
prediction over the measurement).
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from schedsim.cli import app
from schedsim.cli.common import console, fail, handle_errors
from schedsim.util.units import with_unit

SEMANTICS_HELP = ("Comm semantics of the predictions: rendezvous (default: gloo and NCCL "
                  "sends complete only once the receiver posted, measured) or eager.")


def check_semantics(semantics: str) -> str:
    """The ``--semantics`` of predictions checked against a measured run
    (:func:`schedsim.program.vocab.check_semantics`; ScenarioError: exit 2)."""
    from schedsim.program.vocab import check_semantics as check

    return check(semantics, measured=True)


def report(errors: Any, measured: Any) -> None:
    """Print the two errors (:class:`~schedsim.replay.check.TwoErrors`) and what the
    measured sends say about the backend's semantics."""
    from schedsim.replay.check import send_waits_before_recv

    for line in errors.lines():
        console.print(line, highlight=False, soft_wrap=True)
    late, total = send_waits_before_recv(measured)
    if total:
        console.print(semantics_line(late, total, measured.semantics), highlight=False,
                      soft_wrap=True)


def semantics_line(late: int, total: int, backend: str) -> str:
    """What the measured sends say about the backend: of the ``total`` sends whose wait
    began before the matching recv was posted, ``late`` completed only after it (as
    under rendezvous), the others before it (as under eager)."""
    like = ("rendezvous" if late == total else "eager" if late == 0 else
            f"neither semantics throughout: {late} send{'s' if late != 1 else ''} like "
            f"rendezvous, {total - late} like eager")
    return (f"sends: {late} of {total} whose wait began before the matching recv was "
            f"posted completed only after it ({backend} behaved like {like} here)")


def draw(errors: Any, measured: Any, path: Path, outs: Any) -> None:
    """The semantics prediction over the measurement (:func:`schedsim.plot.overlay`)."""
    from schedsim.plot.overlay import write_overlay

    write_overlay(errors.exact_prediction, measured, outs.path(path),
                  title=f"{measured.schedule}: engine ({errors.comm_semantics}, the run's "
                        f"own durations) vs measured ({measured.semantics}, "
                        f"{measured.ranks} ranks)")


def costs_file_model(costs_file: Path, semantics: str) -> tuple[Any, Any, Any]:
    """``(costs, link, comm)`` of a cost file, the comm model with ``semantics`` and the
    file's launch cost, host cost and host times."""
    from schedsim.scenario import apply_costs_file, parse_scenario
    from schedsim.sim.costs import CommModel

    sc = apply_costs_file(parse_scenario({"schedule": {"name": "gpipe", "ranks": 1,
                                                        "microbatches": 1}}), costs_file)
    return sc.costs, sc.link, CommModel(semantics=semantics, launch_cost=sc.comm.launch_cost,
                                        host_cost=sc.comm.host_cost, host=sc.comm.host)


@app.command("check-trace")
@handle_errors
def check_trace(
    traces: Annotated[list[Path], typer.Argument(
        help="Per-rank Kineto/Chrome trace files of one run (every rank).",
        show_default=False)],
    semantics: Annotated[str, typer.Option("--semantics", help=SEMANTICS_HELP)
                         ] = "rendezvous",
    costs_file: Annotated[Optional[Path], typer.Option(
        "--costs-file", help="Cost file for the cost-model error (default: costs fitted "
        "from the traces: median per stage, link fit, mean launch cost).")] = None,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write both errors as JSON (fractions of the measured makespan).")
    ] = None,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out-dir", help="Folder (created if missing) for NAME-measured.json, "
        "NAME-exact.json, NAME-predicted.json, NAME-errors.json, NAME-program.txt, "
        "NAME-overlay.png.")] = None,
    placement: Annotated[Optional[str], typer.Option(
        "--placement", help="loop | v | dual (default: inferred).")] = None,
    step: Annotated[Optional[int], typer.Option(
        "--step", help="Check only profiler step N (ProfilerStep#N) of traces that hold "
        "several (default: every step, headed by the median one).")] = None,
    name: Annotated[str, typer.Option("--name", help="Schedule name (output file names).")
                    ] = "imported",
) -> None:
    """Check the simulator against profiler traces: the semantics error (the trace's
    program simulated with its own measured durations) and the cost-model error. Traces
    that hold several profiler steps: every step, headed by the median one.

    Example:
      schedsim check-trace prof/rank0.json prof/rank1.json --json errors.json
    """
    from schedsim.cli.outputs import folder, write_errors
    from schedsim.errors import ScenarioError
    from schedsim.interop.kineto import import_steps, import_traces
    from schedsim.interop.kineto_steps import median_step
    from schedsim.replay.check import steps_errors, two_errors
    from schedsim.replay.fit import timeline_program
    from schedsim.util.files import output_group

    check_semantics(semantics)
    if placement is not None and placement not in ("loop", "v", "dual"):
        fail(f"unknown --placement {placement!r}: expected loop, v or dual")
    files = _out_dir_files(out_dir, name, json_out)
    if step is None:        # every profiler step; the median one heads the report
        steps = import_steps(list(traces), placement=placement, name=name)
        many = len(steps) > 1
        keep = median_step(steps) if many else next(iter(steps))
        tl = steps[keep]
    else:
        many, tl = False, import_traces(list(traces), placement=placement, name=name,
                                        step=step)
    prog = timeline_program(tl)
    if prog is None:
        raise ScenarioError("check-trace needs the traces of every rank (missing: rank(s) "
                            + ", ".join(map(str, getattr(tl, "missing_ranks", []))) + ")")
    model = None if costs_file is None else costs_file_model(costs_file, semantics)
    p2p = getattr(tl, "p2p", {})
    console.print(f"{name}: {tl.ranks} ranks, {tl.stages} stages, {tl.microbatches} "
                  f"microbatches, {len(tl.spans)} ops, {p2p.get('paired', 0)} of "
                  f"{p2p.get('messages', 0)} messages paired; measured makespan "
                  f"{with_unit(tl.makespan, tl.unit)}", highlight=False, soft_wrap=True)
    if many:
        console.print(f"{len(steps)} profiler steps: the errors below are of step "
                      f"{keep}, the median makespan, then over every step",
                      highlight=False, soft_wrap=True)
    for note in getattr(tl, "import_notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    kw: Any = {"semantics": semantics, "model": model}
    errors = steps_errors(steps, prog, **kw) if many else two_errors(tl, prog, **kw)
    report(errors, tl)
    with folder(out_dir) if out_dir is not None else nullcontext(), output_group() as outs:
        if json_out is not None:
            write_errors(json_out, errors, outs)
        if out_dir is not None:
            _write_all(files, tl, prog, errors, outs)


def _out_dir_files(out_dir: Path | None, name: str, json_out: Path | None) -> list[Path]:
    """check-trace's --out-dir files (claimed and checked before any work, with the
    --json beside or inside them), [] without --out-dir."""
    from schedsim.cli.outputs import check_folder, check_outputs, check_outputs_in, out_dir_files

    kinds = ("measured.json", "exact.json", "predicted.json", "errors.json", "program.txt",
             "overlay.png")
    files = out_dir_files(out_dir, name, kinds) if out_dir is not None else []
    check_outputs_in(out_dir, json_out)
    if out_dir is not None:
        check_folder(out_dir, "--out-dir")
        if out_dir.is_dir():
            check_outputs(*files)
    return files


def _write_all(f: list[Path], tl: Any, prog: Any, errors: Any, outs: Any) -> None:
    """check-trace's --out-dir files (module docstring), through the output group."""
    from schedsim.cli.outputs import program_text, write_errors

    tl.write_json(outs.path(f[0]))
    errors.exact_prediction.write_json(outs.path(f[1]))
    errors.cost_prediction.write_json(outs.path(f[2]))
    write_errors(f[3], errors, outs)
    outs.path(f[4]).write_text(program_text(prog))
    draw(errors, tl, f[5], outs)

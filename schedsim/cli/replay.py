"""``schedsim replay``, ``schedsim calibrate`` and ``schedsim import-trace``.

This module imports without torch: the launcher starts the ranks as child processes
(``python -m schedsim.replay``), and a missing torch is reported as one line, exit 2.
Exit codes: 0 ok, 1 the replay failed (a rank raised or timed out — the message names it
— or the gradient check failed), 2 bad input, 128 + N when stopped by signal N (143 for
SIGTERM, 129 for SIGHUP; every rank is killed and the temporary folder removed).

Before any process starts: the program is simulated under rendezvous semantics (how gloo
and NCCL sends behave) and refused if it deadlocks (``--no-precheck`` skips that), and
every output path (``--json``, ``--gantt``, ``--out-dir`` and its files, ``--profile-dir``,
``calibrate --out``) is checked, so a typo fails at once instead of after the run. The
outputs of one command are written together or not at all
(:func:`schedsim.util.files.output_group`).

Hidden testing aid: ``replay --inject-fault RANK[:INDEX[:raise|hang]]`` makes rank RANK
raise (``raise``, the default) or hang forever (``hang``) when it reaches instruction
INDEX (default 0; the rank's program length = the implicit ``END``) of the first measured
step. RANK must be a rank of the program and INDEX within that rank's program, else exit
2. It exercises the failure paths: a raise stops every rank at once and names the rank, a
hang is stopped at ``--timeout``.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer
from rich.table import Table

from schedsim.cli import app
from schedsim.cli.common import (
    PROGRAM_FLAGS,
    console,
    fail,
    handle_errors,
    key_values,
    scenario_command,
    write_text_out,
)
from schedsim.errors import ScenarioError
from schedsim.scenario import Scenario
from schedsim.util.text import rich_escape

NprocOpt = Annotated[Optional[int], typer.Option(
    "--nproc", help="Local processes to start (default: the program's ranks).")]
BackendOpt = Annotated[Optional[str], typer.Option(
    "--backend", help="gloo (CPU) | nccl (one GPU per rank); default: \\[replay] backend or "
    "gloo.")]
TimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", help="Seconds for the whole run, process start included (default: "
    "\\[replay] timeout or 120). Every rank is stopped when it passes.")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a \\[replay] key, KEY=VALUE (repeatable), e.g. --set hidden=128 "
    "--set dtype=float64.")]


def _with_replay_keys(sc: Scenario, set_: list[str] | None) -> Scenario:
    """``sc`` with ``--set KEY=VALUE`` applied to its ``[replay]`` table (torch needed)."""
    from schedsim.replay.config import require_torch

    require_torch()
    table = {**sc.replay, **key_values(set_, "--set", ", e.g. hidden=128")}
    return sc.model_copy(update={"replay": table})


def _check_nproc(spec: Any, nproc: int | None) -> int:
    ranks, tp = spec.program["placement"]["ranks"], spec.config.tp
    p = ranks * tp          # one process per rank and TP rank
    if nproc is not None and nproc != p:
        what = (f"{ranks} ranks (one process per rank)" if tp == 1 else
                f"{ranks} ranks x tp {tp} = {p} processes")
        raise ScenarioError(f"--nproc {nproc} does not match the program's {what}: use "
                            f"--nproc {p}")
    return p


def _check_outputs(*files: Path | None, figures: tuple[Path | None, ...] = ()) -> None:
    """Check output files (and figure formats) before any work: a typo fails at once."""
    from schedsim.cli.render import check_figure_path
    from schedsim.util.files import check_output_path

    for f in figures:
        if f is not None:
            check_figure_path(f)
    for f in (*files, *figures):
        if f is not None and str(f) != "-":
            check_output_path(f)


def _check_folder(path: Path, flag: str) -> None:
    """Raise :class:`ScenarioError` unless ``path`` is a folder or can be made one: its
    nearest existing ancestor is a writable folder (a file in the way is named)."""
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    if not p.is_dir():
        where = "is a file" if p == path else f"cannot be created: {p} is a file"
        raise ScenarioError(f"{flag} {path}: {where}; give a folder (created if missing)")
    if p == path:       # it exists: its files are checked one by one
        return
    try:        # os.access says yes to root, and to /proc: try making the folder
        os.rmdir(tempfile.mkdtemp(prefix=".schedsim-", dir=p))
    except OSError as e:
        raise ScenarioError(f"{flag} {path}: cannot create a folder in {p} "
                            f"({e.strerror})") from None


@contextmanager
def _folder(path: Path) -> Iterator[Path]:
    """Create ``path`` (and missing parents) for the outputs written in the block; on an
    exception remove the folders created here again (empty if the block's outputs go
    through an :func:`~schedsim.util.files.output_group` opened inside it)."""
    created = []
    p = path
    while not p.exists() and p.parent != p:
        created.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for d in created:           # deepest first
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _print_grad_check(gc: dict[str, Any]) -> None:
    t = Table(title=f"gradient check vs single-process reference ({gc['dtype']}, tolerance "
                    f"{gc['tolerance']:g})")
    for col in ("stage", "copies", "max rel error"):
        t.add_column(col, justify="right")
    for s in gc["per_stage"]:
        t.add_row(str(s["stage"]), str(s["copies"]), f"{s['max_rel_error']:.2e}")
    console.print(t)
    console.print(f"loss {gc['loss']:.6g} (reference {gc['ref_loss']:.6g}, rel error "
                  f"{gc['loss_rel_error']:.2e}) — gradient check "
                  f"[bold]{'passed' if gc['passed'] else 'FAILED'}[/]", highlight=False,
                  soft_wrap=True)


@app.command()
@handle_errors
@scenario_command(flags=PROGRAM_FLAGS)
def replay(
    sc: Scenario,
    nproc: NprocOpt = None,
    backend: BackendOpt = None,
    check_grads: Annotated[bool, typer.Option(
        "--check-grads", help="Compare loss and every parameter gradient with a "
        "single-process reference; exit 1 above tolerance.")] = False,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write the measured Timeline JSON (with grad_check, backend, "
        "world_size).")] = None,
    gantt: Annotated[Optional[Path], typer.Option(
        "--gantt", help="Write a Gantt chart of the measured timeline.")] = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Calibrate, replay, simulate with the calibrated costs, link and "
        "launch cost; print makespan error = (predicted - measured) / measured and the "
        "mean per-op start error (% of the measured makespan); write both timelines, the "
        "cost file and the overlay figure to --out-dir.")] = False,
    costs_file: Annotated[Optional[Path], typer.Option(
        "--costs-file", help="With --compare: predict with this cost file instead of "
        "calibrating.")] = None,
    out_dir: Annotated[Path, typer.Option(
        "--out-dir", help="With --compare: folder for NAME-measured.json, "
        "NAME-predicted.json, NAME-costs.toml, NAME-overlay.png (created if missing, as "
        "--profile-dir is).")] = Path("."),
    semantics: Annotated[str, typer.Option(
        "--semantics", help="With --compare: comm semantics of the prediction.")] = "eager",
    timeout: TimeoutOpt = None,
    set_: SetOpt = None,
    profile_dir: Annotated[Optional[Path], typer.Option(
        "--profile-dir", help="Record the measured step with torch.profiler; write "
        "DIR/rank{r}.json (read back with 'schedsim import-trace').")] = None,
    no_precheck: Annotated[bool, typer.Option(
        "--no-precheck", help="Run even a program that deadlocks under rendezvous "
        "semantics (refused by default: gloo/NCCL would hang until --timeout).")] = False,
    inject_fault: Annotated[Optional[str], typer.Option(
        "--inject-fault", hidden=True, help="Testing aid: RANK[:INDEX[:raise|hang]] "
        "(module docstring).")] = None,
) -> None:
    """Run a schedule for real on torch.distributed (local processes) and measure it.

    Examples:
      schedsim replay schedules/replay-1f1b.toml --check-grads --json measured.json
      schedsim replay --schedule dualpipe --ranks 4 --microbatches 8 --check-grads
      schedsim replay schedules/replay-1f1b.toml --compare --out-dir out/

    Exit codes: 0 ok, 1 a rank failed or timed out (named) or the gradient check failed,
    2 bad input (also: a program that deadlocks under rendezvous semantics, refused
    before any process starts unless --no-precheck; an output path that cannot be
    written), 128+N stopped by signal N (143: SIGTERM).
    """
    from schedsim.cli.simulate import print_summary
    from schedsim.replay.config import Fault, ReplayError, spec_from_scenario
    from schedsim.replay.launch import launch
    from schedsim.timeline import Timeline
    from schedsim.util.files import output_group

    sc = _with_replay_keys(sc, set_)
    if costs_file is not None and not compare:
        fail("--costs-file goes with --compare (for simulate, use 'schedsim simulate "
             "--costs-file')")
    if semantics not in ("data", "eager", "rendezvous"):
        fail(f"unknown --semantics {semantics!r}: expected data, eager or rendezvous")
    _check_outputs(json_out, figures=(gantt,))
    if profile_dir is not None:
        _check_folder(profile_dir, "--profile-dir")
    spec = spec_from_scenario(sc, backend=backend, timeout=timeout, check_grads=check_grads,
                              calibrate=compare and costs_file is None,
                              profile_dir=str(profile_dir.resolve()) if profile_dir else None,
                              fault=Fault.parse(inject_fault) if inject_fault else None,
                              precheck=not no_precheck)
    if profile_dir is not None and profile_dir.is_dir():
        _check_outputs(*(profile_dir / f"rank{r}.json"
                         for r in range(spec.program["placement"]["ranks"])))
    if compare:
        _check_folder(out_dir, "--out-dir")
        if out_dir.is_dir():
            _check_outputs(*_compare_files(out_dir, spec.program["name"],
                                           costs_file is None))
    if costs_file is not None:
        from schedsim.scenario import apply_costs_file

        predict_sc = apply_costs_file(sc, costs_file)
    n = _check_nproc(spec, nproc)
    res = launch(spec, n)
    tl = Timeline.model_validate(res["timeline"])
    print_summary(tl)
    steps = res["timeline"].get("step_makespans") or []
    if len(steps) > 1:
        console.print(f"{len(steps)} measured steps, makespans "
                      f"{', '.join(f'{x:.4g}' for x in steps)} ms: kept step "
                      f"{res['timeline']['step']} (the median)", highlight=False,
                      soft_wrap=True)
    gc = res["timeline"].get("grad_check")
    if gc is not None:
        _print_grad_check(gc)
    written: list[Path] = []
    # all outputs appear together, or none does (nor a folder made for them)
    with _folder(out_dir) if compare else nullcontext(), output_group() as outs:
        if json_out:
            tl.write_json(outs.path(json_out))
        if gantt:
            from schedsim.plot import gantt as draw, save_figure

            save_figure(draw(tl), outs.path(gantt))
        if compare:
            written = _compare(sc if costs_file is None else predict_sc, spec, res, tl,
                               out_dir, semantics, calibrated=costs_file is None, outs=outs)
    if written:
        console.print("wrote " + ", ".join(map(str, written)), highlight=False,
                      soft_wrap=True, markup=False)
    if gc is not None and not gc["passed"]:
        raise ReplayError(f"gradient check failed: max relative error "
                          f"{gc['max_rel_error']:.2e} > tolerance {gc['tolerance']:g}")


def _compare_files(out_dir: Path, name: str, calibrated: bool) -> list[Path]:
    """The files ``--compare`` writes to ``out_dir``, in order."""
    kinds = ["measured.json", "predicted.json"] + (["costs.toml"] if calibrated else [])
    return [out_dir / f"{name}-{k}" for k in kinds + ["overlay.png"]]


def _compare(sc: Any, spec: Any, res: dict[str, Any], measured: Any, out_dir: Path,
             semantics: str, calibrated: bool, outs: Any = None) -> list[Path]:
    """Simulate the program with the calibrated (or given) costs, link and launch cost;
    print the prediction error (also without the launch cost, to show its share) and write
    the timelines, the cost file and the overlay through the output group ``outs`` (None:
    a group of their own). Returns the paths written (once the group commits)."""
    from schedsim.analysis.accuracy import compare_metrics, summary_line
    from schedsim.plot.overlay import write_overlay
    from schedsim.program.ir import Program
    from schedsim.replay.calibrate import Calibration
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate
    from schedsim.util.files import output_group

    if outs is None:
        with output_group() as group:
            return _compare(sc, spec, res, measured, out_dir, semantics, calibrated, group)

    prog = Program.model_validate(spec.program)
    name = prog.name
    files = _compare_files(out_dir, name, calibrated)
    f_meas, f_pred, f_over = files[0], files[1], files[-1]
    if calibrated:
        cal = Calibration.model_validate(res["calibration"])
        costs, link = cal.cost_model(), cal.link_model()
        comm = cal.comm_model(semantics)
        outs.path(files[2]).write_text(cal.to_toml(name))
    else:
        costs, link = sc.costs, sc.link
        comm = CommModel(semantics=semantics, launch_cost=sc.comm.launch_cost)
    pred = simulate(prog, costs, link, comm)
    m = compare_metrics(pred, measured)
    measured.write_json(outs.path(f_meas))
    pred.write_json(outs.path(f_pred))
    lc = comm.launch_cost if semantics != "data" else 0.0
    write_overlay(pred, measured, outs.path(f_over),
                  title=f"{name}: predicted ({semantics}, "
                        f"{'calibrated' if calibrated else 'given'} costs, launch cost "
                        f"{lc:.3g} {costs.unit}/batch) vs measured "
                        f"({measured.semantics}, {measured.ranks} ranks)")
    console.print(summary_line(m, measured.unit), highlight=False, soft_wrap=True,
                  markup=False)
    if lc > 0:
        m0 = compare_metrics(simulate(prog, costs, link, comm.model_copy(
            update={"launch_cost": 0.0})), measured)
        console.print(f"launch cost {lc:.3g} {rich_escape(costs.unit)} per batch; without it: "
                      f"makespan "
                      f"{m0['makespan_predicted']:.4g} {measured.unit} (error "
                      f"{m0['makespan_error_pct']:+.1f}%), mean start error "
                      f"{m0['mean_start_error_pct']:.1f}%", highlight=False, soft_wrap=True)
    return files


@app.command()
@handle_errors
@scenario_command(flags=PROGRAM_FLAGS)
def calibrate(
    sc: Scenario,
    nproc: NprocOpt = None,
    backend: BackendOpt = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", help="Cost file to write (default: stdout).")] = None,
    repeats: Annotated[int, typer.Option(
        "--repeats", min=1, help="Timed rounds per op and per message size.")] = 5,
    timeout: TimeoutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Measure per-stage F, B, W, BW, FB costs, link latency/bandwidth and the host time
    of launching a batch of sends/recvs on the real ranks; write a cost file for
    'schedsim simulate --costs-file'.

    Example:
      schedsim calibrate schedules/replay-1f1b.toml --out costs.toml
      schedsim simulate schedules/replay-1f1b.toml --costs-file costs.toml --semantics eager
    """
    from schedsim.replay.calibrate import Calibration
    from schedsim.replay.config import spec_from_scenario
    from schedsim.replay.launch import launch

    sc = _with_replay_keys(sc, set_)
    _check_outputs(out)
    spec = spec_from_scenario(sc, backend=backend, timeout=timeout, calibrate=True,
                              replay=False, calib_repeats=repeats)
    res = launch(spec, _check_nproc(spec, nproc))
    cal = Calibration.model_validate(res["calibration"])
    t = Table(title=f"measured costs (ms, median of {repeats}) on {cal.backend}, "
                    f"{cal.world_size} ranks")
    for col in ("stage", "F", "B", "W", "BW", "FB"):
        t.add_column(col, justify="right")
    for s in sorted(cal.stages):
        c = cal.stages[s]
        t.add_row(str(s), *(f"{c[k]:.4g}" for k in ("F", "B", "W", "BW", "FB")))
    lat, bw = cal.link()
    name = spec.program.get("name", "")
    if out is not None:
        console.print(t)
        console.print(f"link: latency {lat:.4g} ms, bandwidth "
                      f"{'inf' if bw == float('inf') else f'{bw:.4g} bytes/ms'}; launch "
                      f"cost {cal.launch_cost():.4g} ms per batch", highlight=False)
    write_text_out(out, cal.to_toml(name))


@app.command("import-trace")
@handle_errors
def import_trace(
    traces: Annotated[list[Path], typer.Argument(
        help="Per-rank Kineto/Chrome trace files (rank from the file's distributedInfo, "
        "else argument order); a subset of the ranks gives a partial timeline.",
        show_default=False)],
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write the measured Timeline JSON.")] = None,
    gantt: Annotated[Optional[Path], typer.Option(
        "--gantt", help="Write a Gantt chart.")] = None,
    placement: Annotated[Optional[str], typer.Option(
        "--placement", help="loop | v | dual (default: inferred from where stages ran).")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="Schedule name in the Timeline.")
                    ] = "imported",
) -> None:
    """Read torch.profiler traces (schedsim replay's 'schedsim:<token>' ranges, torch
    pipelining's 'PP:<action>' ranges) into a measured Timeline.

    Example:
      schedsim replay schedules/replay-1f1b.toml --profile-dir prof/
      schedsim import-trace prof/rank*.json --json imported.json --gantt imported.png
    """
    from schedsim.cli.simulate import print_summary
    from schedsim.interop.kineto import import_traces
    from schedsim.util.files import output_group

    if placement is not None and placement not in ("loop", "v", "dual"):
        fail(f"unknown --placement {placement!r}: expected loop, v or dual")
    _check_outputs(json_out, figures=(gantt,))
    tl = import_traces(list(traces), placement=placement, name=name)
    print_summary(tl)
    missing = getattr(tl, "missing_ranks", None)
    if missing:
        console.print(f"note: no trace of rank(s) {', '.join(map(str, missing))}: a partial "
                      f"timeline (their rows are empty and the bubble figures count them "
                      f"as idle)", highlight=False, soft_wrap=True, markup=False)
    with output_group() as outs:
        if json_out:
            tl.write_json(outs.path(json_out))
        if gantt:
            from schedsim.plot import gantt as draw, save_figure

            save_figure(draw(tl), outs.path(gantt))

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

``replay --compare`` (like ``check-trace``, :mod:`schedsim.cli.check`) prints two errors,
the semantics error and the cost-model error (:mod:`schedsim.replay.check`);
``calibrate --from-timeline`` fits a cost file to a measured Timeline without running
anything (:mod:`schedsim.replay.fit`); ``import-trace`` reads profiler traces
(:mod:`schedsim.interop.kineto`). docs/traces.md is the user's guide.

Hidden testing aid: ``replay --inject-fault RANK[:INDEX[:raise|hang]]`` makes rank RANK
raise (``raise``, the default) or hang forever (``hang``) when it reaches instruction
INDEX (default 0; the rank's program length = the implicit ``END``) of the first measured
step. RANK must be a rank of the program and INDEX within that rank's program, else exit
2. It exercises the failure paths: a raise stops every rank at once and names the rank, a
hang is stopped at ``--timeout``.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


from schedsim.cli import app
from schedsim.cli.tables import DataTable
from schedsim.cli.records import options_record
from schedsim.cli.common import (
    PROGRAM_FLAGS,
    Phases,
    console,
    fail,
    handle_errors,
    key_values,
    scenario_command,
    write_text_out,
)
from schedsim.cli.outputs import check_folder, check_outputs, folder, out_dir_files
from schedsim.cli.replay_options import (
    BackendOpt,
    CheckGradsOpt,
    CompareIsolatedOpt,
    CompareOpt,
    ContendedOpt,
    CostsOutOpt,
    ExactOpt,
    FromTimelineOpt,
    FromTraceOpt,
    ImportGanttOpt,
    ImportJsonOpt,
    ImportPlacementOpt,
    InjectFaultOpt,
    IsolatedOpt,
    NameOpt,
    NoPrecheckOpt,
    NprocOpt,
    OutDirOpt,
    ProfileDirOpt,
    ProgramOutOpt,
    RepeatsOpt,
    ReplayCostsFileOpt,
    ReplayGanttOpt,
    ReplayJsonOpt,
    ReplaySemanticsOpt,
    SetOpt,
    SpreadOpt,
    StepOpt,
    StepsOpt,
    TimeoutOpt,
    TracesArg,
    WarmupOpt,
)
from schedsim.errors import ScenarioError
from schedsim.util.text import rich_escape
from schedsim.util.units import fmt_time, with_unit

if TYPE_CHECKING:   # for annotations; imported where used (a light start-up)
    from schedsim.scenario import Scenario


def _with_replay_keys(sc: Scenario, set_: list[str] | None, **keys: Any) -> Scenario:
    """``sc`` with ``--set KEY=VALUE`` and the given ``keys`` (None: not given) applied
    to its ``[replay]`` table (torch needed)."""
    from schedsim.replay.config import require_torch

    require_torch()
    table = {**sc.replay, **key_values(set_, "--set", ", e.g. hidden=128"),
             **{k: v for k, v in keys.items() if v is not None}}
    return sc.model_copy(update={"replay": table})


def _print_grad_check(gc: dict[str, Any]) -> None:
    t = DataTable("gradient_check",
                  title=f"gradient check vs single-process reference ({gc['dtype']}, tolerance "
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


@dataclass(frozen=True)
class ReplayOptions:
    """The options of ``schedsim replay`` after the shared program flags (each one its
    flag, in --help order)."""

    nproc: NprocOpt = None
    backend: BackendOpt = None
    check_grads: CheckGradsOpt = False
    json_out: ReplayJsonOpt = None
    gantt: ReplayGanttOpt = None
    compare: CompareOpt = False
    costs_file: ReplayCostsFileOpt = None
    out_dir: OutDirOpt = None
    semantics: ReplaySemanticsOpt = None
    isolated: CompareIsolatedOpt = False
    contended: ContendedOpt = None
    steps: StepsOpt = None
    warmup: WarmupOpt = None
    timeout: TimeoutOpt = None
    set_: SetOpt = None
    profile_dir: ProfileDirOpt = None
    no_precheck: NoPrecheckOpt = False
    inject_fault: InjectFaultOpt = None


@app.command()
@handle_errors(tables=True)
@scenario_command(flags=PROGRAM_FLAGS)
@options_record(ReplayOptions)
def replay(sc: Scenario, o: ReplayOptions) -> None:
    """Run a schedule for real on torch.distributed (local processes) and measure it.

    Examples:
      schedsim replay schedules/replay-1f1b.toml --check-grads --json meas.json
      schedsim replay --schedule dualpipe --ranks 4 --microbatches 8 --check-grads
      schedsim replay schedules/replay-1f1b.toml --compare --out-dir out/

    Exit codes: 0 ok, 1 a rank failed or timed out (named) or the gradient check failed,
    2 bad input (also: a program that deadlocks under rendezvous semantics, refused
    before any process starts unless --no-precheck; an output path that cannot be
    written), 128+N stopped by signal N (143: SIGTERM).
    """
    from schedsim.replay.config import ReplayError
    from schedsim.replay.launch import launch
    from schedsim.timeline import Timeline

    from schedsim.cli.from_measured import check_nproc, contended_default, warn_contention

    sc = _with_replay_keys(sc, o.set_, steps=o.steps, warmup=o.warmup)
    semantics = _compare_flags(o.compare, o.costs_file, o.semantics, o.isolated)
    if o.contended is not None and not o.compare:
        fail("--contended / --no-contended go with --compare (they set how it calibrates)")
    out_dir = Path(".") if o.compare and o.out_dir is None else o.out_dir
    spec = _replay_spec(sc, o.json_out, o.gantt, out_dir, o.profile_dir, compare=o.compare,
                        calibrate=o.compare and o.costs_file is None, backend=o.backend,
                        timeout=o.timeout, check_grads=o.check_grads,
                        calib_isolated=o.isolated, fault=o.inject_fault,
                        precheck=not o.no_precheck)
    spec.calib_contended = contended_default(spec, o.contended, o.isolated)
    warn_contention(check_nproc(spec, o.nproc))
    if o.costs_file is not None:
        from schedsim.scenario import apply_costs_file

        sc = apply_costs_file(sc, o.costs_file)
    n = check_nproc(spec, o.nproc)
    with Phases() as ph:
        calibrating = "calibrating, then " if o.compare and o.costs_file is None else ""
        ph.step(f"{calibrating}replaying on {n} ranks")
        res = launch(spec, n)
    tl = Timeline.model_validate(res["timeline"])
    _print_run(res, tl)
    written = _write_replay(sc, spec, res, tl, (o.json_out, o.gantt, out_dir),
                            semantics if o.compare else None,
                            calibrated=o.costs_file is None)
    if written:
        console.print("wrote " + ", ".join(map(str, written)), highlight=False,
                      soft_wrap=True, markup=False)
    gc = res["timeline"].get("grad_check")
    if gc is not None and not gc["passed"]:
        raise ReplayError(f"gradient check failed: max relative error "
                          f"{gc['max_rel_error']:.2e} > tolerance {gc['tolerance']:g}")


def _replay_spec(sc: Scenario, json_out: Path | None, gantt: Path | None,
                 out_dir: Path | None, profile_dir: Path | None, *, compare: bool,
                 calibrate: bool, fault: str | None, **settings: Any) -> Any:
    """The replay's :class:`~schedsim.replay.config.ReplaySpec` (``settings``: its
    keyword arguments), after checking every output path the run will write (exit 2
    before any process starts)."""
    from schedsim.replay.config import Fault, spec_from_scenario

    check_outputs(json_out, figures=(gantt,))
    if profile_dir is not None:
        check_folder(profile_dir, "--profile-dir")
    spec = spec_from_scenario(sc, calibrate=calibrate,
                              profile_dir=str(profile_dir.resolve()) if profile_dir else None,
                              fault=Fault.parse(fault) if fault else None, **settings)
    _check_dirs(spec, profile_dir, out_dir, compare, calibrate)
    return spec


def _write_replay(sc: Scenario, spec: Any, res: dict[str, Any], tl: Any,
                  outputs: tuple[Path | None, Path | None, Path | None],
                  semantics: str | None, calibrated: bool) -> list[Path]:
    """Write the replay's outputs (``outputs``: --json, --gantt, --out-dir), all together
    or none (nor a folder made for them); with --compare (``semantics`` given) the
    prediction and both errors too. Returns the --out-dir files written."""
    from schedsim.util.files import output_group

    json_out, gantt, out_dir = outputs
    with folder(out_dir) if out_dir is not None else nullcontext(), output_group() as outs:
        if json_out:
            tl.write_json(outs.path(json_out))
        if gantt:
            from schedsim.plot import gantt as draw, save_figure

            save_figure(draw(tl), outs.path(gantt))
        if semantics is not None:
            return _compare(sc, spec, res, tl, out_dir, semantics, calibrated=calibrated,
                            outs=outs)
        if out_dir is not None:
            written = _compare_files(out_dir, spec.program["name"], False, False)
            tl.write_json(outs.path(written[0]))
            return written
    return []

def _compare_flags(compare: bool, costs_file: Path | None, semantics: str | None,
                   isolated: bool) -> str:
    """The prediction's semantics; exits 2 for a --compare flag without --compare."""
    from schedsim.cli.check import check_semantics

    if costs_file is not None and not compare:
        fail("--costs-file goes with --compare (for simulate, use 'schedsim simulate "
             "--costs-file')")
    if (semantics is not None or isolated) and not compare:
        fail(f"{'--semantics' if semantics is not None else '--isolated'} goes with "
             f"--compare (it sets how the prediction is made)")
    return check_semantics(semantics or "rendezvous")


def _check_dirs(spec: Any, profile_dir: Path | None, out_dir: Path | None, compare: bool,
                calibrated: bool) -> None:
    """Check the files the run will write in --profile-dir and --out-dir, before it."""
    if profile_dir is not None and profile_dir.is_dir():
        check_outputs(*(profile_dir / f"rank{r}.json"
                        for r in range(spec.program["placement"]["ranks"])))
    if out_dir is not None:
        check_folder(out_dir, "--out-dir")
        if out_dir.is_dir():
            check_outputs(*_compare_files(out_dir, spec.program["name"], compare,
                                          calibrated))


def _print_run(res: dict[str, Any], tl: Any) -> None:
    """The measured summary, the steps kept and the gradient check."""
    from schedsim.cli.simulate import print_summary

    print_summary(tl)
    steps = res["timeline"].get("step_makespans") or []
    if len(steps) > 1:
        console.print(f"{len(steps)} measured steps, makespans "
                      f"{', '.join(fmt_time(x) for x in steps)} ms: kept step "
                      f"{res['timeline']['step']} (the median)", highlight=False,
                      soft_wrap=True)
    gc = res["timeline"].get("grad_check")
    if gc is not None:
        _print_grad_check(gc)


def _compare_files(out_dir: Path, name: str, compare: bool = True,
                   calibrated: bool = True) -> list[Path]:
    """The files ``--out-dir`` receives, in order: the measured timeline; with
    ``--compare`` the prediction, the cost file (when calibrated), the errors and the
    overlay."""
    kinds = ["measured.json"]
    if compare:
        kinds += ["predicted.json"] + (["costs.toml"] if calibrated else []) + \
            ["errors.json", "overlay.png"]
    return out_dir_files(out_dir, name, kinds)


def _compare(sc: Any, spec: Any, res: dict[str, Any], measured: Any, out_dir: Path,
             semantics: str, calibrated: bool, outs: Any = None) -> list[Path]:
    """Both errors of the measured run (:func:`schedsim.replay.check.two_errors`; the
    cost model: the calibrated (or given) costs, link and launch cost); print them (and
    the cost-model prediction also without the launch cost, to show its share) and write
    the timelines, the cost file, the errors and the overlay through the output group
    ``outs`` (None: a group of their own). Returns the paths written."""
    from schedsim.analysis.accuracy import compare_metrics, summary_line
    from schedsim.cli.check import report
    from schedsim.cli.outputs import write_errors
    from schedsim.plot.overlay import write_overlay
    from schedsim.program.ir import Program
    from schedsim.replay.check import two_errors
    from schedsim.sim.costs import CommModel
    from schedsim.sim.simulate import simulate
    from schedsim.util.files import output_group

    if outs is None:
        with output_group() as group:
            return _compare(sc, spec, res, measured, out_dir, semantics, calibrated, group)
    prog = Program.model_validate(spec.program)
    name = prog.name
    files = _compare_files(out_dir, name, True, calibrated)
    if calibrated:
        from schedsim.replay.contended import calibrated_model

        costs, link, comm, text, spread = calibrated_model(res["calibration"], prog,
                                                           semantics, name)
        outs.path(files[2]).write_text(text)
        for line in spread:
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    else:
        costs, link = sc.costs, sc.link
        comm = CommModel(semantics=semantics, launch_cost=sc.comm.launch_cost,
                         host_cost=sc.comm.host_cost)
    errors = two_errors(measured, prog, semantics=semantics, model=(costs, link, comm))
    errors.step_makespans = getattr(measured, "step_makespans", None)
    pred = errors.cost_prediction
    measured.write_json(outs.path(files[0]))
    pred.write_json(outs.path(files[1]))
    write_errors(files[-2], errors, outs)
    lc = comm.launch_cost if semantics != "data" else 0.0
    write_overlay(pred, measured, outs.path(files[-1]),
                  title=f"{name}: predicted ({semantics}, "
                        f"{'calibrated' if calibrated else 'given'} costs, launch cost "
                        f"{with_unit(lc, costs.unit)}/batch) vs measured "
                        f"({measured.semantics}, {measured.ranks} ranks)")
    console.print(summary_line(compare_metrics(pred, measured), measured.unit),
                  highlight=False, soft_wrap=True, markup=False)
    if lc > 0:
        m0 = compare_metrics(simulate(prog, costs, link, comm.model_copy(
            update={"launch_cost": 0.0})), measured)
        console.print(f"launch cost {rich_escape(with_unit(lc, costs.unit))} per batch; "
                      f"without it: makespan "
                      f"{with_unit(m0['makespan_predicted'], measured.unit)} (error "
                      f"{m0['makespan_error_pct']:+.1f}%), mean start error "
                      f"{m0['mean_start_error_pct']:.1f}%", highlight=False, soft_wrap=True)
    report(errors, measured)
    return files


@dataclass(frozen=True)
class CalibrateOptions:
    """The options of ``schedsim calibrate`` after the shared program flags (each one its
    flag, in --help order)."""

    nproc: NprocOpt = None
    backend: BackendOpt = None
    out: CostsOutOpt = None
    repeats: RepeatsOpt = None
    spread: SpreadOpt = None
    isolated: IsolatedOpt = False
    contended: ContendedOpt = None
    from_timeline: FromTimelineOpt = None
    from_trace: FromTraceOpt = None
    exact: ExactOpt = False
    timeout: TimeoutOpt = None
    set_: SetOpt = None


@app.command()
@handle_errors(tables=True)
@scenario_command(flags=PROGRAM_FLAGS, timelines=True)
@options_record(CalibrateOptions)
def calibrate(sc: Scenario, o: CalibrateOptions) -> None:
    """Measure per-stage F, B, W, BW, FB costs, link latency/bandwidth and the host time
    of launching a batch of sends/recvs on the real ranks (or fit them to a measured
    timeline); write a cost file for 'schedsim simulate --costs-file'.

    Examples:
      schedsim calibrate schedules/replay-1f1b.toml --out costs.toml
      schedsim simulate schedules/replay-1f1b.toml --costs-file costs.toml
      schedsim calibrate --from-timeline measured.json --exact --out exact.toml
      schedsim calibrate --from-trace train.json --out model.toml
    """
    from schedsim.cli.inputs import TimelineInput

    if o.from_trace is not None:
        from schedsim.cli.from_measured import calibrate_from_trace

        if sc is not None or o.from_timeline is not None or o.exact:
            fail("--from-trace reads a piece trace alone: drop the scenario, "
                 "--from-timeline and --exact")
        return calibrate_from_trace(o.from_trace, o.out)
    if isinstance(sc, TimelineInput):
        given = [f for f, v in (("--nproc", o.nproc), ("--backend", o.backend),
                                ("--repeats", o.repeats), ("--spread", o.spread),
                                ("--isolated", o.isolated or None),
                                ("--contended", o.contended), ("--timeout", o.timeout),
                                ("--set", o.set_)) if v is not None]
        if given:
            fail(f"{', '.join(given)} cannot apply to --from-timeline (nothing is run)")
        from schedsim.cli.from_measured import calibrate_timeline

        return calibrate_timeline(sc, o.out, o.exact)
    if o.exact:
        fail("--exact goes with --from-timeline (a run's own durations)")
    from schedsim.cli.from_measured import calibrate_run

    calibrate_run(_with_replay_keys(sc, o.set_), o.out, nproc=o.nproc, backend=o.backend,
                  timeout=o.timeout, repeats=o.repeats, isolated=o.isolated,
                  contended=o.contended, spread=o.spread)


@app.command("import-trace")
@handle_errors(tables=True)
def import_trace(
    traces: TracesArg,
    json_out: ImportJsonOpt = None,
    gantt: ImportGanttOpt = None,
    program_out: ProgramOutOpt = None,
    placement: ImportPlacementOpt = None,
    step: StepOpt = None,
    name: NameOpt = "imported",
) -> None:
    """Read torch.profiler traces of a pipeline-parallel step (torch pipelining's
    'PP:<action>' or 'Forward N'/'Backward N' ranges, schedsim replay's
    'schedsim:<token>' ranges, with their c10d/gloo/NCCL P2P events) into a measured
    Timeline and the program it ran.

    Examples:
      schedsim replay schedules/replay-1f1b.toml --profile-dir prof/
      schedsim import-trace prof/rank*.json --json imported.json \\
        --program-out prog.txt
    """
    from schedsim.cli.outputs import program_text
    from schedsim.cli.simulate import print_summary
    from schedsim.interop.kineto import import_traces
    from schedsim.replay.fit import timeline_program
    from schedsim.util.files import output_group

    if placement is not None and placement not in ("loop", "v", "dual"):
        fail(f"unknown --placement {placement!r}: expected loop, v or dual")
    check_outputs(json_out, program_out, figures=(gantt,))
    tl = import_traces(list(traces), placement=placement, name=name, step=step)
    prog = timeline_program(tl)
    if program_out is not None and prog is None:
        fail("--program-out needs the traces of every rank (missing: rank(s) "
             + ", ".join(map(str, getattr(tl, "missing_ranks", []))) + ")")
    if program_out is not None and prog.placement.kind == "custom":
        fail("--program-out: the traces' placement is a custom stage -> rank table, which "
             "program text cannot carry; use --json (it holds the program)")
    print_summary(tl)
    if getattr(tl, "trace_source", "") == "pieces":
        from schedsim.cli.from_measured import print_pieces
        from schedsim.interop.kineto import read_piece_trace

        print_pieces(read_piece_trace(traces[0]))
    p2p = getattr(tl, "p2p", {})
    console.print(f"{p2p.get('messages', 0)} messages, {p2p.get('paired', 0)} paired (both "
                  f"sides traced), from {p2p.get('calls', 0)} P2P calls; executor: "
                  f"{getattr(tl, 'trace_source', '?')}", highlight=False, soft_wrap=True)
    for note in getattr(tl, "import_notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    with output_group() as outs:
        if json_out:
            tl.write_json(outs.path(json_out))
        if program_out:
            outs.path(program_out).write_text(program_text(prog))
        if gantt:
            from schedsim.plot import gantt as draw, save_figure

            save_figure(draw(tl), outs.path(gantt))

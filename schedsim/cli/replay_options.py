"""The options of ``schedsim replay``, ``calibrate`` and ``import-trace``
(:mod:`schedsim.cli.replay`), one declaration each; the scenario flags they share with the
other commands live in :mod:`schedsim.cli.common`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

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

ContendedOpt = Annotated[Optional[bool], typer.Option(
    "--contended/--no-contended", help="Calibrate by running steps of the program itself "
    "on the real ranks (messages timed while the ranks compute, compute while messages "
    "move), fitted like a measured timeline; --no-contended: benchmarks of ops, a "
    "ping-pong and launches. Default: contended on CPU gloo, benchmarks elsewhere.")]
StepsOpt = Annotated[Optional[int], typer.Option(
    "--steps", min=1, help="Measured steps (default: \\[replay] steps or 5); the one with "
    "the median makespan is kept, and --compare reports the cost-model error over all of "
    "them (median, min, max).")]
WarmupOpt = Annotated[Optional[int], typer.Option(
    "--warmup", min=0, help="Untimed steps before the measured ones (default: \\[replay] "
    "warmup or 1).")]

# -- replay ----------------------------------------------------------------------------
CheckGradsOpt = Annotated[bool, typer.Option(
    "--check-grads", help="Compare loss and every parameter gradient with a "
    "single-process reference; exit 1 above tolerance.")]
ReplayJsonOpt = Annotated[Optional[Path], typer.Option(
    "--json", help="Write the measured Timeline JSON (with grad_check, backend, "
    "world_size).")]
ReplayGanttOpt = Annotated[Optional[Path], typer.Option(
    "--gantt", help="Write a Gantt chart of the measured timeline.")]
CompareOpt = Annotated[bool, typer.Option(
    "--compare", help="Calibrate (ranks together, as the replay runs them), replay, and "
    "print two errors: the semantics error (the program simulated with the run's own "
    "measured durations) and the cost-model error (simulated with the calibrated costs, "
    "link and launch cost); write the timelines, the cost file, the errors and the overlay "
    "figure to --out-dir.")]
ReplayCostsFileOpt = Annotated[Optional[Path], typer.Option(
    "--costs-file", help="With --compare: predict with this cost file instead of "
    "calibrating.")]
OutDirOpt = Annotated[Optional[Path], typer.Option(
    "--out-dir", help="Folder (created if missing) for NAME-measured.json; with --compare "
    "also NAME-predicted.json, NAME-costs.toml, NAME-errors.json, NAME-overlay.png "
    "(default with --compare: the current folder).")]
ReplaySemanticsOpt = Annotated[Optional[str], typer.Option(
    "--semantics", help="With --compare: comm semantics of the predictions (rendezvous, "
    "the default, is how gloo behaves, measured; or eager).")]
CompareIsolatedOpt = Annotated[bool, typer.Option(
    "--isolated", help="With --compare: calibrate the ranks one at a time (uncontended) "
    "instead of together.")]
ProfileDirOpt = Annotated[Optional[Path], typer.Option(
    "--profile-dir", help="Record the measured step with torch.profiler; write "
    "DIR/rank{r}.json (read back with 'schedsim import-trace').")]
NoPrecheckOpt = Annotated[bool, typer.Option(
    "--no-precheck", help="Run even a program that deadlocks under rendezvous semantics "
    "(refused by default: gloo/NCCL would hang until --timeout).")]
InjectFaultOpt = Annotated[Optional[str], typer.Option(
    "--inject-fault", hidden=True, help="Testing aid: RANK[:INDEX[:raise|hang]] "
    "(schedsim.cli.replay's docstring).")]

# -- calibrate -------------------------------------------------------------------------
CostsOutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Cost file to write (default: stdout).")]
RepeatsOpt = Annotated[Optional[int], typer.Option(
    "--repeats", min=1, help="Contended: calibration steps of the program (default 21); "
    "benchmarks: timed rounds per op and per message size (default 5).")]
SpreadOpt = Annotated[Optional[float], typer.Option(
    "--spread", min=0.0, help="Contended: spread the calibration steps over about SECONDS "
    "s (a pause of SECONDS / (repeats - 1) before each step after the first), so that they "
    "sample the machine's speed over time, not one moment of it; 0: one after another "
    "(default 5, with 21 steps; docs/traces.md, 'From a separate run').",
    metavar="SECONDS")]
IsolatedOpt = Annotated[bool, typer.Option(
    "--isolated", help="Measure the ranks' op costs one rank at a time (uncontended); "
    "default: all ranks together, as the replay runs them.")]
FromTimelineOpt = Annotated[Optional[Path], typer.Option(
    "--from-timeline", help="Fit the costs to a measured Timeline JSON (a replay's --json, "
    "import-trace's --json) instead of running the ranks.")]
FromTraceOpt = Annotated[Optional[Path], typer.Option(
    "--from-trace", help="Per-piece costs for the stage model from a stage-internal piece "
    "trace (Kineto 'BLOCK(F|B|W)' ranges with their kernels, e.g. DeepSeek's profile-data): "
    "write a \\[model] table instead of running the ranks.")]
ExactOpt = Annotated[bool, typer.Option(
    "--exact", help="With --from-timeline: write every op's own measured duration, every "
    "message's measured transfer and every instruction's host time, so that a simulation "
    "reproduces the run up to the engine's semantics.")]

# -- import-trace ----------------------------------------------------------------------
TracesArg = Annotated[list[Path], typer.Argument(
    help="Per-rank Kineto/Chrome trace files (rank from the file's distributedInfo, else "
    "argument order); a subset of the ranks gives a partial timeline.",
    show_default=False)]
ImportJsonOpt = Annotated[Optional[Path], typer.Option(
    "--json", help="Write the measured Timeline JSON (with the program it ran).")]
ImportGanttOpt = Annotated[Optional[Path], typer.Option(
    "--gantt", help="Write a Gantt chart.")]
ProgramOutOpt = Annotated[Optional[Path], typer.Option(
    "--program-out", help="Write the program the traces show (program text: one line per "
    "rank, torch's launches and waits), to simulate the same run.")]
ImportPlacementOpt = Annotated[Optional[str], typer.Option(
    "--placement", help="loop | v | dual (default: inferred from where stages ran).")]
StepOpt = Annotated[Optional[int], typer.Option(
    "--step", help="Profiler step N (ProfilerStep#N) of traces that hold several.")]
NameOpt = Annotated[str, typer.Option("--name", help="Schedule name in the Timeline.")]

"""What each rank's process runs: :func:`run_rank` (under ``schedsim replay``'s own
launcher or under ``torchrun``; both set ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and, for NCCL, ``LOCAL_RANK``).

Sequence: process group (timeout = the time left to the deadline) -> clock offsets ->
optional calibration -> ``warmup`` untimed steps -> ``steps`` measured steps (each after
a barrier; one with ``--profile-dir``) -> gather records (and the last step's gradients
and losses) on rank 0 -> rank 0 keeps the step with the median makespan as the measured
Timeline (``step``, ``step_makespans`` record the choice), runs the gradient check and
writes ``result.json``. A rank that fails writes
``error-rank{r}.json`` (``{rank, origin, message}``), prints one line and exits 1.

Every wait of a rank has the run's deadline, but a rank can also hang where no timeout
reaches (a compute op, a collective inside the backend, the ``hang`` testing fault). So a
watchdog thread ends the process (exit 1, one line naming the rank) :data:`GRACE_S`
seconds after the deadline, whether or not anything else stops it: under ``schedsim
replay`` the launcher kills the ranks at the deadline already (this is the fallback when
the launcher itself was killed outright); under ``torchrun`` it is what stops a hung rank,
after which torchrun stops the others.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from schedsim.errors import SchedsimError
from schedsim.replay.config import JobSpec, ReplayError
from schedsim.util.files import atomic_write_text
from schedsim.util.units import with_unit

#: seconds after the run's deadline at which a rank's watchdog ends its process
GRACE_S = 2.0


def _env_int(name: str) -> int:
    v = os.environ.get(name)
    if v is None:
        raise ReplayError(f"{name} is not set: run under 'schedsim replay --nproc P' or "
                          f"torchrun, which set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
    return int(v)


def start_watchdog(deadline: float, rank: Any, grace: float = GRACE_S) -> None:
    """End this process (``os._exit(1)``, after one line on stderr) ``grace`` seconds after
    the wall-clock ``deadline`` if it is still running then (a daemon thread: it never
    keeps a finished process alive)."""
    import threading

    def fire() -> None:
        while (left := deadline + grace - time.time()) > 0:
            time.sleep(min(left, 1.0))
        print(f"schedsim replay: rank {rank}: still running {with_unit(grace, 's')} after the "
              f"run's "
              f"deadline (hung where no timeout reaches?): stopping this rank", file=sys.stderr,
              flush=True)
        os._exit(1)

    threading.Thread(target=fire, name="schedsim-watchdog", daemon=True).start()


#: seconds between two looks of the launcher watchdog at this process's parent
PARENT_POLL_S = 0.25
_PR_SET_PDEATHSIG = 1


def die_with_launcher(launcher_pid: int | None = None) -> None:
    """End this rank when the process that started it dies, even by SIGKILL.

    Linux: ask the kernel for SIGKILL on the parent's death (``prctl(PR_SET_PDEATHSIG)``,
    as torchrun's workers do). Everywhere: a daemon thread that checks every
    :data:`PARENT_POLL_S` s that the parent is still ``launcher_pid`` (default: the
    ``SCHEDSIM_LAUNCHER_PID`` the launcher set; nothing when neither is known) and ends
    the process (``os._exit(1)``) once it is not (reparented: the launcher is gone), which
    also covers a launcher that died before the request. So no rank outlives its launcher
    by more than a fraction of a second, instead of running to its own deadline."""
    import signal
    import threading

    from schedsim.replay.launch import ENV_LAUNCHER_PID

    if launcher_pid is None:
        v = os.environ.get(ENV_LAUNCHER_PID, "")
        launcher_pid = int(v) if v.isdigit() else None
    if launcher_pid is None:
        return
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):     # pragma: no cover - no libc prctl
            pass

    def watch() -> None:
        while os.getppid() == launcher_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    if os.getppid() != launcher_pid:        # it died before the request took effect
        os._exit(1)
    threading.Thread(target=watch, name="schedsim-launcher-watch", daemon=True).start()


def run_rank(spec: JobSpec) -> dict[str, Any] | None:
    """Run this process's rank of ``spec``. Returns rank 0's result dict (None on other
    ranks). Raises on failure (see :func:`main_worker` for the reporting). Starts the
    watchdog (module docstring): call it only in a process of its own."""
    import torch
    import torch.distributed as dist

    from schedsim.program.ir import Program
    from schedsim.replay.executor import RankExecutor
    from schedsim.replay.launch import init_group
    from schedsim.replay.timing import Clock, estimate_offsets, same_host

    cfg = spec.config
    deadline = spec.deadline or (time.time() + cfg.timeout)
    torch.set_num_threads(cfg.threads)
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    start_watchdog(deadline, rank)
    device = _rank_device(cfg, rank)
    # nccl: the rank's own GPU as device_id; gloo may share GPUs (P2P staged via the host)
    init_group(cfg.backend, rank, world, max(deadline - time.time(), 1.0),
               device if cfg.backend == "nccl" else None)
    try:
        program = Program.model_validate(spec.program)
        tp = cfg.tp
        if world != program.placement.ranks * tp:
            raise ReplayError(f"the program has {program.placement.ranks} ranks x tp {tp} "
                              f"but {world} processes were started: use --nproc "
                              f"{program.placement.ranks * tp}")
        dist.barrier()
        mode = spec.clock
        if mode == "auto":
            mode = "shared" if same_host() else "estimate"
        wire = device if cfg.backend == "nccl" else torch.device("cpu")
        offset = estimate_offsets(device=wire) if mode == "estimate" else 0
        clock = Clock(device)
        tpc = None
        if tp > 1:      # tensor-parallel stages: schedsim.replay.tp_run
            from schedsim.replay.tp_run import make_context

            tpc = make_context(cfg, rank, program.placement.ranks, clock.stamp)
        ex = RankExecutor(program, rank // tp, cfg, device, clock,
                          profile=spec.profile_dir is not None, tp=tpc)
        calib, recs = None, None
        if spec.calibrate and spec.calib_contended and spec.replay and tpc is None:
            calib, recs = _interleaved_steps(spec, ex, deadline, clock, offset, rank,
                                             program, world)
        elif spec.calibrate and spec.calib_contended:
            calib = _calibration_steps(spec, ex, deadline, clock, offset, rank, program,
                                       world)
        elif spec.calibrate:
            from schedsim.replay.measure import calibrate_rank

            calib = calibrate_rank(ex, spec)
        result: dict[str, Any] | None = None
        if spec.replay:
            if recs is None:
                recs = _measure_steps(spec, ex, deadline, clock, offset, rank,
                                      tpc is not None)
            grads = ({k: [g.detach().cpu() for g in gs] for k, gs in ex.grads().items()}
                     if spec.check_grads else None)
            got: list[Any] = [None] * world if rank == 0 else []
            dist.gather_object((recs, grads, ex.losses, offset),
                               got if rank == 0 else None, dst=0)
            if rank == 0:
                result = {"timeline": _result_timeline(spec, program, got, device, mode,
                                                       len(recs))}
        if rank == 0:
            result = result or {}
            if calib is not None:
                result["calibration"] = calib
            if spec.out_dir:
                atomic_write_text(Path(spec.out_dir) / "result.json", json.dumps(result))
        return result if rank == 0 else None
    finally:
        try:
            dist.destroy_process_group()
        except Exception:   # noqa: BLE001 - a failed run may leave the group broken
            pass


def _rank_device(cfg: Any, rank: int) -> Any:
    """This rank's ``torch.device`` (made current for CUDA). Raises ReplayError when
    CUDA is asked for and torch sees no GPU."""
    import torch

    if cfg.device_type != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ReplayError(f"{'backend nccl' if cfg.backend == 'nccl' else 'device cuda'} "
                          f"needs CUDA GPUs, and torch sees none: use --backend gloo "
                          f"(device cpu)")
    local = int(os.environ.get("LOCAL_RANK", rank))
    # nccl: one GPU per rank; gloo: the ranks may share GPUs (P2P staged via the host)
    device = torch.device("cuda", local if cfg.backend == "nccl"
                          else local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _measure_steps(spec: JobSpec, ex: Any, deadline: float, clock: Any, offset: int,
                   rank: int, tp: bool) -> list[dict[str, Any]]:
    """``warmup`` untimed steps, then the measured ones (one under ``--profile-dir``),
    each after a barrier; the fault (if any) goes to the first measured step. Returns
    each measured step's records resolved to the shared clock
    (:func:`~schedsim.replay.timing.resolve_records`)."""
    import torch.distributed as dist

    from schedsim.replay.timing import resolve_records

    for _ in range(spec.config.warmup):
        dist.barrier()
        ex.step(deadline)
        ex.zero_grad()
    recs = []
    for k in range(1 if spec.profile_dir else spec.config.steps):
        if k:
            ex.zero_grad()
        dist.barrier()
        fault = spec.fault if k == 0 else None
        if spec.profile_dir:
            rec = _profiled_step(spec.profile_dir, ex, deadline, fault, rank)
        else:
            rec = ex.step(deadline, fault)
        recs.append(resolve_records(rec, clock, offset))
        if tp:
            from schedsim.replay.tp_run import resolve_collectives

            recs[-1]["collectives"] = resolve_collectives(rec["collectives"],
                                                          clock.resolve, offset)
    return recs


def _calibration_steps(spec: JobSpec, ex: Any, deadline: float, clock: Any, offset: int,
                       rank: int, program: Any, world: int) -> dict[str, Any] | None:
    """Contended calibration (``spec.calib_contended``): one untimed step, then
    ``calib_repeats`` steps of the program itself, each after a barrier and, after the
    first, ``calib_pause`` seconds of sleep (the steps spread over time); rank 0 returns
    ``{"contended": True, "steps": [Timeline JSON, ...], "backend", "world_size"}``
    (fitted by :mod:`schedsim.replay.contended`), the other ranks None."""
    import torch.distributed as dist

    from schedsim.replay.timing import resolve_records

    dist.barrier()
    ex.step(deadline)
    recs, began = [], []
    for k in range(spec.calib_repeats):
        ex.zero_grad()
        dist.barrier()
        if k and spec.calib_pause > 0:
            time.sleep(min(spec.calib_pause, max(deadline - time.time(), 0.0)))
        began.append(time.time())
        recs.append(resolve_records(ex.step(deadline), clock, offset))
    ex.zero_grad()
    out = _calibration_result(spec, recs, program, rank, world)
    if out is not None:     # rank 0: the seconds from the first step's start to the last's
        out["span_s"] = began[-1] - began[0]
    return out


def _interleaved_steps(spec: JobSpec, ex: Any, deadline: float, clock: Any, offset: int,
                       rank: int, program: Any, world: int
                       ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``replay --compare``'s contended calibration and measured steps taking turns
    (calibration, measured, calibration, ...; the surplus of either kind first, so the
    gradients left are a measured step's), after ``max(warmup, 1)`` untimed steps, each
    step after a zero_grad and a barrier: on a shared machine the load drifts within a
    minute, and steps in turns see the same drift. The fault (if any) goes to the first
    measured step; under ``--profile-dir`` the one measured step is profiled. Returns
    ``(calibration result as _calibration_steps, this rank's measured records)``."""
    import torch.distributed as dist

    from schedsim.replay.timing import resolve_records

    order = step_order(spec.calib_repeats, 1 if spec.profile_dir else spec.config.steps)
    for _ in range(max(spec.config.warmup, 1)):
        dist.barrier()
        ex.step(deadline)
        ex.zero_grad()
    cal, recs = [], []
    for what in order:
        ex.zero_grad()
        dist.barrier()
        if what == "c":
            cal.append(resolve_records(ex.step(deadline), clock, offset))
            continue
        fault = spec.fault if not recs else None
        rec = (_profiled_step(spec.profile_dir, ex, deadline, fault, rank)
               if spec.profile_dir else ex.step(deadline, fault))
        recs.append(resolve_records(rec, clock, offset))
    return _calibration_result(spec, cal, program, rank, world), recs


def step_order(calibration: int, measured: int) -> str:
    """The order of :func:`_interleaved_steps`: ``"c"`` a calibration step, ``"m"`` a
    measured one; the surplus of either kind first, then pairs ``"cm"``, so the run
    ends on a measured step. ``step_order(5, 5) == "cmcmcmcmcm"``."""
    both = min(calibration, measured)
    return "c" * (calibration - both) + "m" * (measured - both) + "cm" * both


def _calibration_result(spec: JobSpec, recs: list[dict[str, Any]], program: Any,
                        rank: int, world: int) -> dict[str, Any] | None:
    """Gather every rank's calibration step records on rank 0 and return there
    ``{"contended": True, "steps": [Timeline JSON, ...], "backend", "world_size",
    "workload"}``; None on the other ranks."""
    import torch.distributed as dist

    from schedsim.replay.timing import measured_timeline

    got: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(recs, got if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    backend = spec.config.backend
    steps = [json.loads(measured_timeline(program, [g[k] for g in got],
                                          backend=backend).to_json())
             for k in range(len(recs))]
    return {"contended": True, "steps": steps, "backend": backend, "world_size": world,
            "workload": spec.config.model_dump(include={"workload", "hidden",
                                                        "layers_per_stage", "seq",
                                                        "microbatch_size", "dtype"})}


def _profiled_step(profile_dir: str, ex: Any, deadline: float, fault: Any,
                   rank: int) -> dict[str, Any]:
    """One step under the torch profiler; its trace goes to
    ``profile_dir/rank{rank}.json``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if ex.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        rec = ex.step(deadline, fault)
    Path(profile_dir).mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(Path(profile_dir) / f"rank{rank}.json"))
    return rec


def _result_timeline(spec: JobSpec, program: Any, got: list[Any], device: Any, mode: str,
                     steps: int) -> dict[str, Any]:
    """Rank 0: the measured Timeline (JSON dict) from every rank's gathered ``(records,
    grads, losses, clock offset)``: the step with the median makespan (``step``,
    ``step_makespans`` record the choice), with the gradient check and, under TP, the
    per-TP-rank pieces."""
    from schedsim.replay.timing import measured_timeline

    cfg, tp = spec.config, spec.config.tp
    extra: dict[str, Any] = {"world_size": len(got), "device": str(device.type),
                             "clock": mode, "clock_offsets_ns": [g[3] for g in got]}
    every = got
    rep_err = 0.0
    if tp > 1:      # one entry per pipeline rank: TP rank 0, grads unsharded
        from schedsim.replay.tp_run import pp_view, replica_error

        extra.update(tp=tp, tp_comm=cfg.tp_comm)
        rep_err = replica_error(got, cfg) if spec.check_grads else 0.0
        got = pp_view(got, cfg)
    if spec.check_grads:
        from schedsim.replay.gradcheck import grad_check

        extra["grad_check"] = grad_check(
            cfg, program.placement.stages, program.microbatches,
            [g[1] for g in got], [g[2] for g in got], device)
        if tp > 1:   # the TP ranks' copies of a replicated gradient agree
            gc = extra["grad_check"]
            gc["tp_replica_rel_error"] = rep_err
            gc["max_rel_error"] = max(gc["max_rel_error"], rep_err)
            gc["passed"] = bool(gc["passed"] and rep_err <= gc["tolerance"])
    # several measured steps: keep the one with the median makespan
    from schedsim.interop.kineto_steps import median_index

    tls = [measured_timeline(program, [g[0][k] for g in got], backend=cfg.backend)
           for k in range(steps)]
    keep = median_index([t.makespan for t in tls])
    if tp > 1:
        from schedsim.replay.tp_run import measured_pieces

        extra["pieces"] = measured_pieces([g[0][keep] for g in every], tp,
                                          min(g[0][keep]["begin"] for g in got))
    tl = measured_timeline(program, [g[0][keep] for g in got], backend=cfg.backend,
                           step=keep, step_makespans=[t.makespan for t in tls], **extra)
    return json.loads(tl.to_json())


#: what the backends raise on a rank whose peer has died (gloo's tcp pair, NCCL's
#: watchdog): a consequence of another rank's failure, not where the run failed
LOST_PEER = ("Connection closed by peer", "Connection reset by peer",
             "remote worker crashing", "NCCL communicator was aborted")


def lost_peer(message: str) -> bool:
    """Whether a backend's error ``message`` says that a peer went away
    (:data:`LOST_PEER`): such a rank's error is reported with ``origin = False``, so the
    launcher names the rank that died first (killed by a signal, or its exit code)."""
    return any(s in message for s in LOST_PEER)


def report_failure(spec: JobSpec | None, exc: BaseException) -> None:
    """Write ``error-rank{r}.json`` (if the spec has an out_dir) and print one line."""
    try:
        from schedsim.replay.executor import InjectedFault, RankFailure
    except ImportError:                 # no torch: nothing of the executor can have failed
        InjectedFault = RankFailure = ()     # type: ignore[assignment,misc]

    rank = os.environ.get("RANK", "?")
    origin = not isinstance(exc, RankFailure) or exc.origin   # type: ignore[union-attr]
    if origin and lost_peer(str(exc)):
        origin = False      # a peer died first: the launcher names it (its signal or code)
    if isinstance(exc, (RankFailure, InjectedFault, ReplayError)):
        msg = str(exc)
    else:
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"
    if not msg.startswith(f"rank {rank}"):
        msg = f"rank {rank}: {msg}"
    if spec is not None and spec.out_dir:
        try:
            atomic_write_text(Path(spec.out_dir) / f"error-rank{rank}.json",
                              json.dumps({"rank": int(rank) if rank.isdigit() else -1,
                                          "origin": origin, "message": msg,
                                          "time": time.time()}))
        except (OSError, SchedsimError):     # the launcher names a silent rank anyway
            pass
    print(f"schedsim replay: {msg}", file=sys.stderr, flush=True)


def main_worker(spec_path: str) -> int:
    """Entry of a rank started by :mod:`schedsim.replay.launch`. Returns the exit code."""
    spec = None
    try:
        die_with_launcher()
        spec = JobSpec.model_validate_json(Path(spec_path).read_text())
        if spec.task == "check-collectives":
            from schedsim.replay.collectives_check import check_rank

            start_watchdog(spec.deadline or time.time() + spec.config.timeout,
                           os.environ.get("RANK", "?"))
            if spec.functions:      # the user's operators
                from schedsim.replay import user_collective as user

                fns = spec.functions
                check_rank(spec, lambda d, tp: user.run_rank(fns, d, tp),
                           lambda n, got: user.summarize(n, got, fns))
            else:
                check_rank(spec)
        else:
            run_rank(spec)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then exit 1
        report_failure(spec, e)
        return 1

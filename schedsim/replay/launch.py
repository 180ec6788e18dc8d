"""Start P local ranks, watch them, stop them all on the first failure. Imports without
torch (the parent process never imports it).

Each rank is ``python -m schedsim.replay --spec FILE`` in its own session (process group),
with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and ``MASTER_ADDR=127.0.0.1`` plus
``MASTER_PORT`` in its environment, its output in a log file. The launcher binds the
rendezvous socket on ``127.0.0.1`` itself and hands it to rank 0 (:func:`store_socket`),
so the store listens on the loopback address only; every rank joins through
:func:`init_group`. At most ``procs`` processes
(:mod:`schedsim.util.limits`, default 64) are started. The parent polls every 20
ms. The run ends when every rank exited 0; or when one exits non-zero — then every other
rank's process group is killed (SIGKILL) at once; or at the deadline (``timeout`` seconds
after launch, process start-up included) — then all are killed. Every child is reaped
before :func:`launch` returns or raises, so none survives, whatever happened: also on
KeyboardInterrupt (SIGINT) and on SIGTERM / SIGHUP (what ``timeout``, Slurm and ``kill``
send, and a closed terminal), which :func:`launch` turns into :class:`Interrupted` (exit
128 + signal number, e.g. 143) after stopping every rank and removing the run's temporary
folder. The signals are blocked while a rank is being started and during the clean-up,
so neither can be cut short. If this process is killed outright (SIGKILL), its ranks
die with it within a second (:func:`schedsim.replay.worker.die_with_launcher`: the
parent-death signal, and a watchdog for the launcher's pid) and the next replay removes
the run's temporary folder (``schedsim-replay-{host}-{pid}-*``, :func:`sweep_stale_runs`);
as a last line of defence each rank stops itself shortly after the deadline.

Which rank failed and why: a failing rank writes ``error-rank{r}.json``; a rank whose own
work raised is reported before ranks that only saw a peer's connection drop; a rank that
died without a report is named with its exit code and the last line of its output, one
ended by a signal the launcher did not send (the OOM killer's SIGKILL) with that signal.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schedsim.replay.config import JobSpec, ReplayError

POLL_S = 0.02
#: signals that stop a replay like Ctrl-C does (SIGINT stays Python's KeyboardInterrupt)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def realtime() -> bool:
    """Whether this process runs at a real-time priority (``SCHED_FIFO``/``SCHED_RR``,
    inherited by the ranks it starts): then no ordinary process can take the ranks'
    cores, whatever the load."""
    get = getattr(os, "sched_getscheduler", None)
    try:
        return get is not None and get(0) in (os.SCHED_FIFO, os.SCHED_RR)
    except OSError:
        return False


def contention(procs: int) -> str:
    """Why measured times will include waiting for a CPU, or "": more processes than
    CPUs (``os.cpu_count``), or, unless this process runs at a real-time priority
    (:func:`realtime`), a 1-minute load average above the CPUs the run leaves free
    (other processes compete for the cores; ``nice`` does not keep them off when the
    kernel groups processes by session, ``/proc/sys/kernel/sched_autogroup_enabled``:
    docs/traces.md, separate runs)."""
    cpus = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if procs > cpus:
        return (f"{procs} ranks on {cpus} CPUs: ranks share cores, so the measured times "
                f"include waiting for a CPU (use at most {cpus} ranks, or a larger machine)")
    if load > cpus - procs + 0.5 and not realtime():
        return (f"load average {load:.1f} on {cpus} CPUs before starting {procs} ranks: "
                f"other processes compete for the cores, so the measured times include "
                f"waiting for a CPU and vary from run to run (nice does not prevent it; "
                f"as root, 'chrt -f 1 schedsim ...' does)")
    return ""


class Interrupted(ReplayError):
    """The launcher got SIGTERM or SIGHUP; every rank was stopped. ``exit_code`` is the
    shell's convention for a death by that signal (128 + its number: 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"replay interrupted by {name}: every rank was stopped and the "
                         f"run's temporary files removed")
        self.signum = signum
        self.exit_code = 128 + signum


class _Signals:
    """SIGINT / SIGTERM / SIGHUP during :func:`launch`: raise KeyboardInterrupt /
    :class:`Interrupted` at once, or, inside a :meth:`deferred` section (starting a rank,
    the clean-up), once the section is over, so a rank is never half-registered and the
    clean-up never cut short. (Blocking the signals instead would leak the blocked mask
    into the ranks, which inherit it.) Installed only in the main thread, where Python
    runs signal handlers."""

    def __init__(self) -> None:
        import threading

        self.previous: dict[int, Any] = {}
        self.pending: int | None = None
        self.defer = False
        if threading.current_thread() is not threading.main_thread():
            return
        for s in (signal.SIGINT, *STOP_SIGNALS):
            cur = signal.getsignal(s)
            if s == signal.SIGINT and cur is not signal.default_int_handler:
                continue     # SIGINT ignored or handled by the caller: leave it alone
            self.previous[s] = signal.signal(s, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.defer:
            self.pending = self.pending or signum
        else:
            self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(signum)

    def deferred(self) -> "_Deferred":
        return _Deferred(self)

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}


class _Deferred:
    def __init__(self, sig: _Signals) -> None:
        self.sig = sig

    def __enter__(self) -> None:
        self.sig.defer = True

    def __exit__(self, *exc: Any) -> None:
        self.sig.defer = False
        pending, self.sig.pending = self.sig.pending, None
        if pending is not None and exc[0] is None:
            self.sig._raise(pending)


#: where the ranks rendezvous: the loopback address, so nothing off this host reaches
#: the store (rank 0's TCPStore serves the socket the launcher bound here)
MASTER_ADDR = "127.0.0.1"
#: environment variables a rank reads (set by :func:`launch`)
ENV_STORE_FD = "SCHEDSIM_STORE_FD"
ENV_LAUNCHER_PID = "SCHEDSIM_LAUNCHER_PID"
#: prefix of the run's temporary folder, followed by ``{host}-{pid}-`` of the launcher
TMP_PREFIX = "schedsim-replay-"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((MASTER_ADDR, 0))
        return s.getsockname()[1]


def store_socket() -> socket.socket:
    """A TCP socket bound to :data:`MASTER_ADDR` on a free port and listening: rank 0
    inherits it and serves the rendezvous store on it (``TCPStore(master_listen_fd=)``),
    so the store listens on the loopback address only, and no other process can take
    the port between choosing it and binding it (a race ``free_port`` has)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((MASTER_ADDR, 0))
    s.listen(128)
    s.set_inheritable(True)
    return s


def init_group(backend: str, rank: int, world: int, timeout_s: float,
               device: Any = None) -> None:
    """``torch.distributed.init_process_group`` for a rank process. Every process
    :func:`launch` starts must join through this (a plain ``env://`` rank 0 would try to
    bind the port the launcher already holds): rank 0 serves the rendezvous store on the
    socket the launcher bound to the loopback address (``SCHEDSIM_STORE_FD``,
    :func:`store_socket`), the others connect to it. Outside :func:`launch` (no
    ``SCHEDSIM_LAUNCHER_PID``, e.g. under ``torchrun``) the usual ``env://`` rendezvous.
    ``device``: a CUDA device is passed on as ``device_id``."""
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    kw: dict[str, Any] = ({"device_id": device} if device is not None
                          and getattr(device, "type", "") == "cuda" else {})
    fd = os.environ.get(ENV_STORE_FD)
    if ENV_LAUNCHER_PID in os.environ and (rank != 0 or fd):
        kw["store"] = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
            timeout, master_listen_fd=int(fd) if rank == 0 else None)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **kw)
    except (RuntimeError, OSError) as e:
        if "address already in use" not in str(e).lower():
            raise
        addr, port = os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?")
        raise ReplayError(f"rank {rank}: the rendezvous port MASTER_PORT={port} on {addr} is "
                          f"already in use (another job holds it): set MASTER_PORT, or "
                          f"torchrun's --master-port, to a free port") from None


def sweep_stale_runs(tmp: str | None = None) -> int:
    """Remove the temporary folders of earlier replays on this host whose launcher no
    longer runs (killed with SIGKILL, which no handler sees; its ranks died with it:
    :func:`schedsim.replay.worker.die_with_launcher`). Returns how many were removed."""
    from schedsim.util.files import is_stale

    n = 0
    root = Path(tmp or tempfile.gettempdir())
    for d in root.glob(TMP_PREFIX + "*"):
        if d.is_dir() and is_stale(d.name[len(TMP_PREFIX):]):
            shutil.rmtree(d, ignore_errors=True)
            n += 1
    return n


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every still-running child's process group, then reap all children."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:   # pragma: no cover - SIGKILL cannot be ignored
            p.kill()
            p.wait()


def _signalled(procs: list[subprocess.Popen], ours: set[int],
               logs: list[Path]) -> str | None:
    """The first rank a signal ended that the launcher did not send, as a message with
    the last line of its output (SIGKILL: the out-of-memory killer or a ``kill -9``;
    SIGABRT / SIGSEGV: a crash inside torch or the backend); None if there is none."""
    why = {signal.SIGKILL: "the out-of-memory killer or a 'kill -9'",
           signal.SIGABRT: "an abort inside torch or the backend",
           signal.SIGSEGV: "a crash inside torch or the backend"}
    for r, p in enumerate(procs):
        rc = p.returncode
        if rc is not None and rc < 0 and r not in ours:
            try:
                sig = signal.Signals(-rc)
                name = f"{sig.name} (signal {-rc}"
                name += f"; {why[sig]})" if sig in why else ")"
            except ValueError:
                name = f"signal {-rc}"
            last = _last_line(logs[r]) if r < len(logs) else ""
            return f"rank {r} was killed by {name}" + (f": {last}" if last else "")
    return None


def _failure_message(out: Path, procs: list[subprocess.Popen], logs: list[Path],
                     timed_out: bool, timeout: float, ours: set[int] | None = None) -> str:
    ours = set() if ours is None else ours
    errors = []
    for f in out.glob("error-rank*.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    errors.sort(key=lambda e: (not e.get("origin", True), e.get("time", 0.0)))
    reported = {e["rank"] for e in errors}
    if errors and errors[0].get("origin", True):
        first = errors[0]
        others = sorted(reported - {first["rank"]})
        tail = f" (then rank(s) {', '.join(map(str, others))} failed too)" if others else ""
        return f"{first['message']}{tail}"
    killed = _signalled(procs, ours, logs)
    if killed is not None:
        tail = (f" (then rank(s) {', '.join(map(str, sorted(reported)))} failed too)"
                if reported else "")
        return killed + tail
    bad = [(r, p.returncode) for r, p in enumerate(procs)
           if r not in reported and p.returncode not in (0, None) and p.returncode >= 0]
    if bad:
        r, rc = bad[0]
        return f"rank {r} exited with code {rc}: {_last_line(logs[r]) or 'no output'}"
    silent = [r for r, p in enumerate(procs) if r not in reported and p.returncode != 0
              and (r in ours or (p.returncode or 0) >= 0)]
    if timed_out or silent:
        from schedsim.util.units import with_unit

        msg = f"timed out after {with_unit(timeout, 's')}"
        if silent:
            msg += (f": rank(s) {', '.join(map(str, silent))} did not finish and reported "
                    f"nothing (hung?)")
        if errors:
            msg += f"; {errors[0]['message']}"
        return msg + " (raise --timeout if the run is just slow)"
    if errors:
        return errors[0]["message"]
    return "the replay failed without a report"   # pragma: no cover


def _start_ranks(procs: list[subprocess.Popen], logs: list[Path], nproc: int,
                 spec_path: Path, store: socket.socket, sig: _Signals,
                 python: str | None, threads: int) -> None:
    """Start the ``nproc`` rank processes of the run whose spec is ``spec_path``, each in
    a session of its own with its log ``rank{r}.log`` beside the spec; rank 0 inherits
    the rendezvous ``store`` socket. Each process (and log) is appended to ``procs``
    (``logs``) as it starts, so the caller's clean-up stops whatever did start."""
    port = store.getsockname()[1]
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=MASTER_ADDR,
                   MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads),
                   **{ENV_LAUNCHER_PID: str(os.getpid())})
        if r == 0:
            env[ENV_STORE_FD] = str(store.fileno())
        log = spec_path.parent / f"rank{r}.log"
        logs.append(log)
        # a signal arriving while the child is being started acts once it is in
        # ``procs`` (so the clean-up kills it)
        with sig.deferred(), open(log, "wb") as fh:
            procs.append(subprocess.Popen(
                [python or sys.executable, "-m", "schedsim.replay", "--spec",
                 str(spec_path)], env=env, stdout=fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                pass_fds=(store.fileno(),) if r == 0 else ()))


def _wait_ranks(procs: list[subprocess.Popen], until: float) -> tuple[bool, bool]:
    """Poll the ranks every :data:`POLL_S` s until all exited 0, one exited otherwise, or
    the wall clock reaches ``until``. Returns ``(failed, timed_out)``."""
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            return True, False
        if all(c == 0 for c in codes):
            return False, False
        if time.time() >= until:
            return False, True
        time.sleep(POLL_S)


def launch(spec: JobSpec, nproc: int, timeout: float | None = None,
           python: str | None = None) -> dict[str, Any]:
    """Run ``spec`` on ``nproc`` local processes; return rank 0's result dict.

    Raises :class:`ReplayError` naming the failed rank and the reason (exception,
    timeout) after every child has been stopped and reaped.
    """
    from schedsim.util.files import temp_tag
    from schedsim.util.limits import check

    check("procs", nproc, f"a replay on {nproc:,} local processes")
    timeout = timeout if timeout is not None else spec.config.timeout
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    out: Path | None = None
    store: socket.socket | None = None
    sig = _Signals()
    try:
        sweep_stale_runs()
        out = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{temp_tag()}-"))
        start = time.time()
        # ranks give up (and report where they wait) a little before the parent kills
        margin = min(1.0, 0.1 * timeout)
        spec = spec.model_copy(update={"out_dir": str(out),
                                       "deadline": start + timeout - margin})
        spec_path = out / "spec.json"
        spec_path.write_text(spec.model_dump_json())
        store = store_socket()
        _start_ranks(procs, logs, nproc, spec_path, store, sig, python,
                     spec.config.threads)
        store.close()           # rank 0 holds it now
        store = None
        failed, timed_out = _wait_ranks(procs, start + timeout - 0.2 * margin)
        if failed or timed_out:
            time.sleep(POLL_S)          # let a rank that is reporting finish its file
            # ranks the launcher stops (their signal is not news)
            ours = {r for r, p in enumerate(procs) if p.poll() is None}
            _kill(procs)
            raise ReplayError("replay failed: " + _failure_message(out, procs, logs,
                                                                   timed_out, timeout, ours))
        try:
            return json.loads((out / "result.json").read_text())
        except (OSError, ValueError):
            raise ReplayError(f"replay failed: rank 0 wrote no result "
                              f"({_last_line(logs[0]) or 'no output'})") from None
    finally:
        # no signal may cut the clean-up short; one that arrives meanwhile is raised
        # afterwards (unless an exception is already on its way out)
        sig.defer = True
        try:
            if store is not None:
                store.close()
            _kill(procs)
            if out is not None:
                shutil.rmtree(out, ignore_errors=True)
        finally:
            sig.restore()
            sig.defer = False
        if sig.pending is not None and sys.exc_info()[0] is None:
            sig._raise(sig.pending)

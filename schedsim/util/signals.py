"""SIGTERM, SIGHUP and SIGINT as an exception, so ``finally`` blocks remove temporary files,
and never at a moment that would break an output or print a traceback.

What ``timeout``, Slurm, ``kill``, a closed terminal and Ctrl-C send would otherwise end
the process at once (or raise ``KeyboardInterrupt`` anywhere, even inside a ``finally``
that removes a temporary file) and leave temporary files or a traceback behind. Three
rules, one per moment of a run:

- **During a command's work** (:func:`stop_signals`) a stop signal raises
  :class:`~schedsim.errors.Stopped` (exit 128 + the signal number: 143 SIGTERM, 129
  SIGHUP, 130 SIGINT) in the main thread; every ``finally`` and ``with`` on the way out
  runs (:mod:`schedsim.util.files` removes its temporary files there).
- **Inside a critical section** (:func:`deferred_signals`: renaming outputs into place,
  removing temporary files, serialising a Timeline) the signal waits and is raised when
  the section ends, so a group of outputs is renamed whole or not at all and no clean-up
  is cut short. A wrapped exception (pydantic's serialiser wraps what a callback raised)
  is recognised through :func:`stop_requested`.
- **Inside a callback whose exceptions Python swallows** (a weakref or ``__del__``
  callback run by the garbage collector, e.g. matplotlib's transform tree) the raised
  :class:`Stopped` would be printed as "Exception ignored" and lost: the
  ``sys.unraisablehook`` installed by :func:`stop_signals` keeps it quiet and pending,
  and :func:`raise_if_stopped` raises it before the next commit of outputs (and at the
  end of the command at the latest).
- **Outside a command** (start-up, after the outputs were written, interpreter exit:
  :func:`stop_at_exit`, installed by the CLI's entry point) one line is printed and the
  process exits with 128 + N at once (``os._exit``: no "Exception ignored" from a
  half-finished interpreter shutdown).

The message names what was written (:func:`stop_message`). SIGKILL cannot be caught: the
next run that writes the same output removes what it left
(:func:`schedsim.util.files.sweep_stale`).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from schedsim.errors import Stopped

#: the signals turned into :class:`Stopped`
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT")
                     if hasattr(signal, n))


class _State:
    critical = 0                 # depth of deferred_signals blocks
    pending: int | None = None   # a signal that arrived inside one
    seen: int | None = None      # the last stop signal of this process
    written: list[str] = []      # outputs renamed into place by this process


def note_written(path: str) -> None:
    """Record that output ``path`` is in place, whole (:mod:`schedsim.util.files` calls
    it after each rename), for :func:`stop_message`."""
    _State.written.append(path)


def stop_requested() -> int | None:
    """The stop signal this process received (pending or raised), or None: an exception
    that wraps :class:`Stopped` (raised inside a library callback) is that stop."""
    return _State.pending or _State.seen


def stop_message(signum: int) -> str:
    """``stopped by NAME: ...`` saying what the run left: the outputs already renamed
    into place (whole), or that none was written and temporary files were removed."""
    name = signal.Signals(signum).name
    done = _State.written
    if done:
        shown = ", ".join(done[:4]) + (f" (+{len(done) - 4} more)" if len(done) > 4 else "")
        return f"stopped by {name} after writing {shown} (whole); temporary files removed"
    return f"stopped by {name}: temporary files removed, no output written"


def _stop(signum: int, frame: Any) -> None:
    _State.seen = signum
    if _State.critical:
        _State.pending = _State.pending or signum
        return
    raise Stopped(signum, stop_message(signum))


def raise_if_stopped() -> None:
    """Raise the pending :class:`Stopped` of a stop signal that was swallowed (outside a
    critical section), else nothing: :mod:`schedsim.util.files` calls it before renaming
    outputs into place, so a stop lost in a garbage-collector callback still stops the run
    before it commits."""
    if not _State.critical and _State.pending is not None:
        signum, _State.pending = _State.pending, None
        raise Stopped(signum, stop_message(signum))


def _quiet_stop_hook(previous: Any) -> Any:
    """A ``sys.unraisablehook`` that keeps a swallowed :class:`Stopped` pending (silently)
    and passes every other unraisable exception to ``previous``."""
    def hook(unraisable: Any) -> None:
        exc = getattr(unraisable, "exc_value", None)
        if isinstance(exc, Stopped):
            _State.pending = _State.pending or exc.signum
            return
        previous(unraisable)
    return hook


@contextmanager
def deferred_signals() -> Iterator[None]:
    """A critical section: a stop signal arriving inside waits until the block ends and is
    raised then (as :class:`Stopped`), unless the block raised first. Nests."""
    _State.critical += 1
    try:
        yield
    finally:
        _State.critical -= 1
    if not _State.critical and _State.pending is not None:
        signum, _State.pending = _State.pending, None
        raise Stopped(signum, stop_message(signum))


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP/SIGINT raise :class:`Stopped` inside the block (main thread only:
    elsewhere Python cannot install handlers and the block runs unchanged). A signal the
    caller ignores (``SIG_IGN``, e.g. under ``nohup``) stays ignored; the previous
    handlers are restored at the end, inside a critical section."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.pending = _State.seen = None      # a new run (in-process callers run many)
    _State.written = []
    previous = {}
    hook = sys.unraisablehook
    sys.unraisablehook = _quiet_stop_hook(hook)
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            previous[s] = signal.signal(s, _stop)
    try:
        yield
        raise_if_stopped()      # a stop swallowed after the last commit
    except KeyboardInterrupt:   # a KeyboardInterrupt raised by other code: exit 130
        raise Stopped(signal.SIGINT, stop_message(signal.SIGINT)) from None
    finally:
        with deferred_signals():
            for s, h in previous.items():
                signal.signal(s, h)
            sys.unraisablehook = hook


def _exit_now(signum: int, frame: Any) -> None:
    """Outside a command: one line and exit 128 + N at once."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    msg = f"error: {stop_message(signum)}\n".encode()
    try:
        os.write(2, msg)
    except OSError:
        pass
    os._exit(128 + signum)


def stop_at_exit() -> None:
    """Install :func:`_exit_now` for the stop signals outside :func:`stop_signals` (the
    CLI's entry point calls it first: start-up, the time after a command, interpreter
    exit), then unblock them (a signal a launcher held while the process started is
    taken now). Main thread only; ignored signals stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _exit_now)
    if hasattr(signal, "pthread_sigmask"):
        # a launcher may start us with the stop signals blocked (held until now): with
        # the handler in place they are taken from here on, a held one at once
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def quiet_worker() -> None:
    """The initializer of a worker process (``ProcessPoolExecutor(initializer=...)``): the
    parent alone reports a stop, once. Ctrl-C (SIGINT, sent to the whole process group) is
    ignored here, the parent stops the workers; SIGTERM and SIGHUP end the worker at once
    with no traceback (the default action), instead of the parent's handlers a forked
    worker inherits (each worker printing its own traceback or stop line)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL)


def quiet_pool(workers: int) -> Any:
    """A :class:`concurrent.futures.ProcessPoolExecutor` of ``workers`` processes started
    with :func:`quiet_worker` (a stop is the parent's to report, once)."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, initializer=quiet_worker)


@contextmanager
def worker_pool(workers: int) -> Iterator[Any]:
    """A :class:`concurrent.futures.ProcessPoolExecutor` of ``workers`` quiet processes
    (:func:`quiet_worker`). Left normally it waits for its tasks; left by an exception (a
    stop, an error) it ends the workers at once (SIGTERM) and cancels what has not run, so
    a stop neither waits for the running tasks nor leaves a process behind."""
    pool = quiet_pool(workers)
    try:
        yield pool
    except BaseException:
        terminate_pool(pool)
        raise
    pool.shutdown(wait=True)


def terminate_pool(pool: Any) -> None:
    """End ``pool``'s worker processes now (SIGTERM, then reaped) and cancel its queued
    tasks, inside a critical section (:func:`deferred_signals`)."""
    with deferred_signals():
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            if p.is_alive():
                p.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)

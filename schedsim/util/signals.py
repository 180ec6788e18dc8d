"""SIGTERM and SIGHUP as an exception, so ``finally`` blocks remove temporary files.

What ``timeout``, Slurm, ``kill`` and a closed terminal send would otherwise end the
process at once and leave the temporary files of its outputs behind. Inside
:func:`stop_signals` they raise :class:`~schedsim.errors.Stopped` (exit 128 + the signal
number) in the main thread instead; every ``finally`` and ``with`` on the way out runs
(:mod:`schedsim.util.files` removes its temporary files there). SIGKILL cannot be
caught: the next run that writes the same output removes what it left
(:func:`schedsim.util.files.sweep_stale`).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from schedsim.errors import Stopped

#: the signals turned into :class:`Stopped`
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _raise(signum: int, frame: Any) -> None:
    raise Stopped(signum)


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP raise :class:`Stopped` inside the block, and a KeyboardInterrupt
    (Ctrl-C) leaving it becomes one (exit 130) (main thread only: elsewhere
    Python cannot install handlers and the block runs unchanged). A signal the caller
    ignores (``SIG_IGN``, e.g. under ``nohup``) stays ignored; the previous handlers are
    restored at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            previous[s] = signal.signal(s, _raise)
    try:
        yield
    except KeyboardInterrupt:   # Ctrl-C: the same clean-up and one line, exit 130
        raise Stopped(signal.SIGINT) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)

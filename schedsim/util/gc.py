"""Garbage-collector control for building large object graphs."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large object graphs.

    Programs and timelines hold up to millions of small acyclic objects; generational GC
    passes over them cost more than the work itself. Reference counting still frees
    everything. On exit the objects alive are moved to the permanent generation
    (``gc.freeze``) before the collector is re-enabled (if it was on): otherwise the first
    collection afterwards would traverse every object made in the block, about as long
    as building them. Frozen objects are still freed by reference counting; only cyclic
    garbage among them would stay, and these structures have no cycles.
    """
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.enable()


#: whether :func:`pause_startup` paused the collector (and :func:`resume_startup` has not
#: resumed it yet)
_startup_paused = False


def pause_startup() -> None:
    """Pause the cyclic garbage collector for a command line's start-up (the console
    script, :func:`schedsim.cli.main`): importing about 500 modules, typer's parameters
    and their pydantic adapters make a few hundred thousand long-lived objects and no
    cyclic garbage worth collecting, and the collections they trigger traverse all of them
    again and again (about 30 M instructions, 2-3% of a small ``simulate``). Nothing when
    the collector is already off. :func:`resume_startup` turns it back on."""
    import gc

    global _startup_paused
    if gc.isenabled():
        gc.disable()
        _startup_paused = True


def resume_startup() -> None:
    """End :func:`pause_startup`'s pause, when the command itself starts
    (:func:`schedsim.cli.common.handle_errors`): the objects alive are moved to the
    permanent generation (``gc.freeze``: later collections do not traverse the modules'
    objects again), then the collector is re-enabled. Nothing without a pause (a test's
    ``CliRunner``, the Python API)."""
    import gc

    global _startup_paused
    if _startup_paused:
        _startup_paused = False
        gc.freeze()
        gc.enable()

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

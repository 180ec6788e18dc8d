"""Atomic output files: written to a temporary file beside the target, then renamed, so a
failed run never leaves a partial file behind."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success rename it to ``path``.

    The temporary file keeps the target's suffix (matplotlib picks the format from it).
    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)      # mkstemp makes 0600; give the usual file mode
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large object graphs.

    Programs and timelines hold up to millions of small acyclic objects; generational GC
    passes over them cost more than the work itself. Reference counting still frees
    everything; the collector is re-enabled (if it was on) on exit.
    """
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

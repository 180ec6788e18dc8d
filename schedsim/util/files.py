"""Atomic output files: written to a temporary file beside the target, then renamed, so a
failed run never leaves a partial file behind; :func:`output_group` does the same for
several files of one command."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def check_output_path(path: str | Path) -> Path:
    """``path`` as a Path if a file can be written there: its folder exists and a file
    can be created in it (tried: a temporary file is made and removed) and ``path`` is
    not itself a folder. Raises :class:`ScenarioError` naming the path
    (call it before long work, so a typo fails fast and nothing is half-written)."""
    from schedsim.errors import ScenarioError

    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise ScenarioError(f"{path}: is a directory; give a file name")
    if not parent.is_dir():
        raise ScenarioError(f"{path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ScenarioError(f"{path}: folder {parent} is not writable")
    try:        # os.access says yes to root, and to /proc or a read-only mount: try it
        fd, probe = tempfile.mkstemp(prefix=f".{path.stem}.", dir=parent)
    except OSError as e:
        raise ScenarioError(f"{path}: cannot write in folder {parent} "
                            f"({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    return path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success rename it to ``path``.

    The temporary file keeps the target's suffix (matplotlib picks the format from it).
    On an exception the temporary file is removed and ``path`` is left untouched. The
    folder must exist (it is not created: a typo in it is an error, not a new folder).
    Raises :class:`ScenarioError` naming ``path`` when it cannot be written.
    """
    from schedsim.errors import ScenarioError

    path = check_output_path(path)
    tmp = _temp_beside(path)
    try:
        yield Path(tmp)
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise ScenarioError(f"{path}: cannot write ({e.strerror})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


class OutputGroup:
    """Several output files that appear together or not at all.

    ``group.path(final)`` checks ``final`` and returns a temporary path beside it to write
    to; :meth:`commit` renames every temporary file to its final name (after all were
    written), :meth:`discard` removes them. Use :func:`output_group`.
    """

    def __init__(self) -> None:
        self._files: list[tuple[Path, Path]] = []

    def path(self, final: str | Path) -> Path:
        final = check_output_path(final)
        tmp = _temp_beside(final)
        os.unlink(tmp)          # writers create it; an unwritten output is simply skipped
        self._files.append((Path(tmp), final))
        return Path(tmp)

    def commit(self) -> None:
        for tmp, final in self._files:
            if tmp.exists():
                os.chmod(tmp, 0o666 & ~_umask())
                os.replace(tmp, final)
        self._files = []

    def discard(self) -> None:
        for tmp, _ in self._files:
            if tmp.exists():
                tmp.unlink()
        self._files = []


def _temp_beside(path: Path) -> str:
    """Create an empty temporary file next to ``path`` (same suffix, the usual file mode
    rather than mkstemp's 0600); raise :class:`ScenarioError` naming ``path`` if the
    folder refuses it."""
    from schedsim.errors import ScenarioError

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix,
                                   dir=path.parent)
    except OSError as e:
        raise ScenarioError(f"{path}: cannot write ({e.strerror})") from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return tmp


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextmanager
def output_group() -> Iterator[OutputGroup]:
    """Context in which outputs are written to temporary files and all renamed into place
    at the end; on an exception none of them appears."""
    group = OutputGroup()
    try:
        yield group
        group.commit()
    finally:
        group.discard()

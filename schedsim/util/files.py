"""Output files and the paths of one command.

- Atomic outputs: each is written to a temporary file beside the target, then renamed,
  so a failed run never leaves a partial file behind; :func:`output_group` does the same
  for several files of one command.
- Temporary files are named ``.{name}.{host}-{pid}-{random}.schedsim-tmp{suffix}``: they
  are removed on any exception, on SIGTERM/SIGHUP (the CLI turns those into an
  exception, :func:`schedsim.cli.common.handle_errors`), and, since SIGKILL cannot be
  caught, by the next run that writes the same output (:func:`sweep_stale`: a temporary
  file of this host whose process is gone is removed).
- One command's paths (:func:`io_session`): two outputs on one path, or an output that
  is one of the command's inputs, are refused before anything is written
  (:func:`claim_output`, :func:`note_input`).
"""
from __future__ import annotations

import contextvars
import glob
import os
import socket
import stat
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: suffix part that marks schedsim's temporary files (and folders)
TMP_MARK = ".schedsim-tmp"


def _host() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def temp_tag() -> str:
    """``{host}-{pid}``: the part of a temporary name that says which process owns it."""
    return f"{_host()}-{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def is_stale(tagged: str) -> bool:
    """Whether ``tagged``, the part of a temporary name that starts with its
    ``{host}-{pid}-`` tag (:func:`temp_tag`), names a process of this host that no longer
    runs."""
    host, _, rest = tagged.partition("-")
    pid = rest.split("-", 1)[0]
    return host == _host() and pid.isdigit() and not pid_alive(int(pid))


def _temp_prefix(path: Path) -> str:
    return f".{path.name[:100]}."


def sweep_stale(path: Path) -> int:
    """Remove the stale temporary files of output ``path`` (left by a run of this host
    killed with SIGKILL, which no handler sees). Returns how many were removed."""
    n = 0
    prefix = _temp_prefix(path)
    pattern = glob.escape(str(path.parent / prefix)) + "*" + TMP_MARK + "*"
    for f in glob.glob(pattern):
        if is_stale(Path(f).name[len(prefix):]):
            try:
                os.unlink(f)
                n += 1
            except OSError:
                pass
    return n


# -- the paths of one command ----------------------------------------------------------
class _Session:
    def __init__(self) -> None:
        self.outputs: dict[str, tuple[str, str]] = {}     # key -> (label, shown path)
        self.inputs: dict[str, str] = {}


_session: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "schedsim_io_session", default=None)


def _keys(path: str | Path) -> list[str]:
    """Keys naming the file ``path`` refers to: its real path, and its device and inode
    when it exists (a hard link or another spelling is the same file)."""
    p = os.fspath(path)
    keys = [os.path.normcase(os.path.realpath(p))]
    try:
        st = os.stat(p)
        keys.append(f"inode:{st.st_dev}:{st.st_ino}")
    except (OSError, ValueError):
        pass
    return keys


@contextmanager
def io_session() -> Iterator[None]:
    """A command's run: within it, outputs claimed and inputs read are cross-checked."""
    token = _session.set(_Session())
    try:
        yield
    finally:
        _session.reset(token)


def safe_file_name(name: str) -> str:
    """``name`` (a schedule's ``name``, ``--name``) as one plain file name for outputs
    built from it: path separators and NUL become ``_``, a name that is empty, ``.`` or
    ``..`` or starts with ``.`` gets a leading ``_``, so ``../../escaped`` and
    ``/etc/x`` stay inside the output folder (``_.._.._escaped``, ``_etc_x``)."""
    out = name.replace("/", "_").replace("\\", "_").replace("\x00", "_")
    if os.altsep:
        out = out.replace(os.altsep, "_")
    return f"_{out}" if not out or out.startswith(".") else out


def claim_output(path: str | Path | None, label: str) -> None:
    """Register output ``path`` of the flag ``label`` (e.g. ``--json``) in the current
    :func:`io_session` (nothing outside one; ``-`` is stdout). Raises
    :class:`ScenarioError` if another flag already writes that file, or the command reads
    it."""
    from schedsim.errors import ScenarioError

    sess = _session.get()
    if sess is None or path is None:
        return
    for k in (["<stdout>"] if str(path) == "-" else _keys(path)):
        other = sess.outputs.get(k)
        if other is not None and other[0] != label:
            fix = "give one of them a file name" if k == "<stdout>" else \
                "give each output its own file"
            raise ScenarioError(f"{other[0]} and {label} both write {other[1]}: {fix}")
        if k in sess.inputs:
            raise ScenarioError(f"{label} {path} is an input of this command: writing it "
                                f"would destroy the input; give another file name")
    for k in (["<stdout>"] if str(path) == "-" else _keys(path)):
        sess.outputs[k] = (label, "stdout" if str(path) == "-" else str(path))


def note_input(path: str | Path) -> None:
    """Register input ``path`` in the current :func:`io_session`. Raises
    :class:`ScenarioError` if an output of the command is that file."""
    from schedsim.errors import ScenarioError

    sess = _session.get()
    if sess is None:
        return
    keys = _keys(path)
    for k in keys:
        out = sess.outputs.get(k)
        if out is not None:
            raise ScenarioError(f"{out[0]} {out[1]} is an input of this command ({path}): "
                                f"writing it would destroy the input; give another file "
                                f"name")
    for k in keys:
        sess.inputs[k] = str(path)


def _check_not_input(path: Path) -> None:
    from schedsim.errors import ScenarioError

    sess = _session.get()
    if sess is not None and any(k in sess.inputs for k in _keys(path)):
        raise ScenarioError(f"{path} is an input of this command: writing it would destroy "
                            f"the input; give another file name")


def check_output_path(path: str | Path) -> Path:
    """``path`` as a Path if a file can be written there: its folder exists and a file
    can be created in it (tried: a temporary file is made and removed) and ``path`` is
    not itself a folder. Raises :class:`ScenarioError` naming the path
    (call it before long work, so a typo fails fast and nothing is half-written)."""
    from schedsim.errors import ScenarioError

    if "\x00" in str(path):
        raise ScenarioError(f"{str(path)[:80]!r}: a file name with a NUL byte")
    if str(path) == "-":        # stdout: written whole at the end (atomic_path, OutputGroup)
        return Path("-")
    path = Path(path)
    _check_not_input(path)
    if path.is_dir():
        raise ScenarioError(f"{path}: is a directory; give a file name")
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        # the rename below would replace a device, FIFO or socket (as root: /dev/null)
        raise ScenarioError(f"{path}: not a regular file (a device, pipe or socket): "
                            f"outputs are written whole and renamed into place; give a "
                            f"file name")
    if path.is_symlink():       # write through the link, as `>` does; keep the link
        path = Path(os.path.realpath(path))
    parent = path.parent
    if not parent.is_dir():
        raise ScenarioError(f"{path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ScenarioError(f"{path}: folder {parent} is not writable")
    sweep_stale(path)
    try:        # os.access says yes to root, and to /proc or a read-only mount: try it
        fd, probe = tempfile.mkstemp(prefix=f"{_temp_prefix(path)}{temp_tag()}-",
                                     suffix=TMP_MARK, dir=parent)
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

    from schedsim.util.signals import deferred_signals, note_written, raise_if_stopped

    path = check_output_path(path)
    tmp = ""
    try:
        with deferred_signals():        # made and known, or not made
            tmp = _temp_beside(path)
        yield Path(tmp)
        raise_if_stopped()              # a stop swallowed by a library callback
        with deferred_signals():        # renamed whole, and recorded, or not at all
            try:
                _commit(tmp, path)
            except OSError as e:
                raise ScenarioError(f"{path}: cannot write ({e.strerror})") from None
            if TMP_MARK not in path.name and str(path) != "-":   # no output: a temp, stdout
                note_written(str(path))
    finally:
        with deferred_signals():
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


class OutputGroup:
    """Several output files that appear together or not at all.

    ``group.path(final)`` checks ``final`` and returns a temporary path beside it to write
    to (ending in ``final``'s suffix; for stdout, ``-``, in ``suffix``: a writer that
    checks its file's suffix, e.g. a trace's ``.json``); :meth:`commit` renames every temporary file to its final name (after all were
    written), :meth:`discard` removes them. Use :func:`output_group`.
    """

    def __init__(self) -> None:
        self._files: list[tuple[Path, Path]] = []

    def path(self, final: str | Path, suffix: str = "") -> Path:
        from schedsim.util.signals import deferred_signals

        final = check_output_path(final)
        with deferred_signals():     # the name is recorded before a stop can leave it
            tmp = _temp_beside(final, suffix)
            os.unlink(tmp)      # writers create it; an unwritten output is simply skipped
            self._files.append((Path(tmp), final))
        return Path(tmp)

    def commit(self) -> None:
        """Rename every written temporary file into place, as one critical section (a
        stop signal waits until all are renamed: :mod:`schedsim.util.signals`)."""
        from schedsim.util.signals import deferred_signals, note_written, raise_if_stopped

        raise_if_stopped()      # a stop swallowed by a library callback: no rename
        with deferred_signals():
            for tmp, final in self._files:
                if tmp.exists():
                    os.chmod(tmp, 0o666 & ~_umask())
                    _commit(str(tmp), final)
                    if str(final) != "-":
                        note_written(str(final))
            self._files = []

    def discard(self) -> None:
        from schedsim.util.signals import deferred_signals

        with deferred_signals():
            for tmp, _ in self._files:
                if tmp.exists():
                    tmp.unlink()
            self._files = []


def _commit(tmp: str, final: Path) -> None:
    """Rename the written ``tmp`` to ``final``; ``final`` ``-`` is stdout: ``tmp``'s bytes
    are copied there (and ``tmp`` removed)."""
    if str(final) != "-":
        os.replace(tmp, final)
        return
    import shutil
    import sys

    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    with open(tmp, "rb") as f:
        if out is None:
            sys.stdout.write(f.read().decode("utf-8", "replace"))
        else:
            shutil.copyfileobj(f, out)
            out.flush()
    os.unlink(tmp)


def _temp_beside(path: Path, suffix: str = "") -> str:
    """Create an empty temporary file next to ``path`` (named as the module docstring
    says, ending in ``path``'s suffix, else ``suffix``, the usual file mode rather than
    mkstemp's 0600);
    raise :class:`ScenarioError` naming ``path`` if the
    folder refuses it."""
    from schedsim.errors import ScenarioError

    try:        # stdout ('-'): a temporary file of the temp folder
        fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(path)}{temp_tag()}-",
                                   suffix=TMP_MARK + (path.suffix or suffix),
                                   dir=None if str(path) == "-" else path.parent)
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

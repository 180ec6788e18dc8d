"""Reading input files safely: the one door every loader's file goes through.

:func:`read_input_bytes` / :func:`read_input_text` refuse, as one line naming the file
(:class:`~schedsim.errors.InputError`, exit 2):

- a path with a NUL byte, a missing file, a folder;
- anything but a regular file — a FIFO (reading it would block forever), ``/dev/zero``
  (endless), a socket or a terminal. The file is opened non-blocking, so even a FIFO
  without a writer returns at once;
- a file above the ``file_mb`` limit (:mod:`schedsim.util.limits`; at most that much is
  ever read, also when the file grows meanwhile, and a gzip file is decompressed to at
  most that much);
- for text: bytes that are not UTF-8 (a leading byte-order mark is dropped) or a NUL
  byte (binary data, e.g. ``/proc/self/environ``).

The path ``-`` is standard input (as an output's ``-`` is stdout): what is piped in,
at most the ``file_mb`` limit; a terminal (nothing piped) is refused, not waited on.

Every file read is noted as an input of the command (:func:`schedsim.util.files.note_input`),
so an output on the same path is refused. :func:`loading` wraps a whole loader: any
decoding, recursion, overflow or memory error left (TOML nested 5,000 deep, JSON nested
100,000 deep, an integer of 5,000 digits, a CSV field over 128 KiB) becomes an
:class:`~schedsim.errors.InputError` naming the file and the kind of file.
"""
from __future__ import annotations

import os
import stat
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from schedsim.errors import InputError, SchedsimError
from schedsim.util.text import excerpt

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _shown(path: str | Path) -> str:
    p = os.fspath(path)
    return excerpt(p, 200) if any(c in p for c in "\x00\n\r") else p


def read_input_bytes(path: str | Path, what: str = "input file", *,
                     gzip: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (module docstring for what is refused),
    decompressed when ``gzip`` is true and they are gzip data. ``what`` names the kind of
    file in messages (``"program text file"``)."""
    from schedsim.util.files import note_input
    from schedsim.util.limits import check, current

    if os.fspath(path) == STDIN:
        data = _read_stdin(what)
        return _gunzip(data, "<stdin>", current().file_bytes) \
            if gzip and data[:2] == b"\x1f\x8b" else data
    if "\x00" in os.fspath(path):
        raise InputError(f"{_shown(path)}: a file name with a NUL byte; give the {what}'s "
                         f"path")
    p = _shown(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.fspath(path), flags)
    except FileNotFoundError:
        raise InputError(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory; give a {what}") from None
    except OSError as e:
        raise InputError(f"{p}: cannot open the {what} ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{p}: is a directory; give a {what}")
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise InputError(f"{p}: is {kind}, not a regular file; give a {what}")
    with os.fdopen(fd, "rb") as f:
        cap = current().file_bytes
        check("file_mb", -(-st.st_size // (1024 * 1024)), f"{p} ({st.st_size:,} bytes)")
        try:        # in pieces: read(cap + 1) would allocate the whole cap at once
            parts, size = [], 0
            while size <= cap:
                piece = f.read(min(max(st.st_size + 1, 65536), cap + 1 - size))
                if not piece:
                    break
                parts.append(piece)
                size += len(piece)
            data = b"".join(parts)
        except OSError as e:
            raise InputError(f"{p}: cannot read the {what} ({e.strerror or e})") from None
    if len(data) > cap:
        check("file_mb", cap // (1024 * 1024) + 1, f"{p} (more than {cap:,} bytes)")
    note_input(path)
    if gzip and data[:2] == b"\x1f\x8b":
        data = _gunzip(data, p, cap)
    return data


#: the input path that means standard input (as an output ``-`` means stdout)
STDIN = "-"


def _read_stdin(what: str) -> bytes:
    """The bytes piped to standard input, for an input given as ``-``: at most the
    ``file_mb`` limit; refused (one line) when stdin is a terminal (nothing piped: reading
    would wait for typing) or closed."""
    import sys

    from schedsim.util.limits import check, current

    stream = sys.stdin
    if stream is None or getattr(stream, "closed", False):
        raise InputError(f"-: stdin is closed; pipe the {what} in or give its file name")
    try:
        tty = stream.isatty()
    except (OSError, ValueError):
        tty = False
    if tty:
        raise InputError(f"-: stdin is a terminal; pipe the {what} in "
                         f"(cat FILE | schedsim ... -) or give its file name")
    cap = current().file_bytes
    raw = getattr(stream, "buffer", stream)
    parts: list[bytes] = []
    size = 0
    try:        # in pieces: read(cap + 1) would allocate the whole cap at once
        while size <= cap:
            piece = raw.read(min(65536, cap + 1 - size))
            if not piece:
                break
            piece = piece.encode("utf-8") if isinstance(piece, str) else piece
            parts.append(piece)
            size += len(piece)
    except (OSError, ValueError) as e:
        raise InputError(f"-: cannot read the {what} from stdin ({e})") from None
    data = b"".join(parts)
    if not data:
        raise InputError(f"-: stdin is empty; pipe the {what} in (cat FILE | schedsim "
                         f"... -) or give its file name")
    if len(data) > cap:
        check("file_mb", cap // (1024 * 1024) + 1, f"stdin (more than {cap:,} bytes)")
    return data


def _gunzip(data: bytes, path: str, cap: int) -> bytes:
    """Decompress gzip ``data`` (all members) to at most ``cap`` bytes."""
    from schedsim.util.limits import check

    out = bytearray()
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += d.decompress(rest, cap + 1 - len(out))
            if len(out) > cap or d.unconsumed_tail:
                check("file_mb", cap // (1024 * 1024) + 1,
                      f"{path} (decompressed: more than {cap:,} bytes)")
            if not d.eof:
                raise InputError(f"{path}: truncated gzip data")
            rest = d.unused_data
            if rest.strip(b"\x00") == b"":
                break
    except zlib.error as e:
        raise InputError(f"{path}: bad gzip data ({e})") from None
    return bytes(out)


def decode_text(data: bytes, path: str | Path, what: str = "input file") -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped). Raises
    :class:`InputError` naming ``path`` for bytes that are not UTF-8 or a NUL byte."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(f"{path}: not a {what} (not UTF-8 text: byte {e.start} on line "
                         f"{line})") from None
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise InputError(f"{path}: not a {what} (binary data: a NUL byte on line {line})")
    return text


def read_input_text(path: str | Path, what: str = "input file") -> str:
    """The UTF-8 text of the regular file ``path`` (module docstring)."""
    return decode_text(read_input_bytes(path, what), path, what)


#: errors a decoder raises on hostile input; :func:`loading` turns them into one line
DECODING_ERRORS: tuple[type[BaseException], ...] = (
    RecursionError, OverflowError, MemoryError, ValueError, UnicodeError)


def decoding_reason(e: BaseException) -> str:
    """A short reason for a decoding error ``e`` (no input echoed)."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, MemoryError):
        return "too large to hold in memory"
    if isinstance(e, OverflowError):
        return "a number out of range"
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "digits" in msg and "integer" in msg:
        return "an integer with too many digits"
    if "field larger than field limit" in msg:
        return "a CSV field over 128 KiB"
    return excerpt(msg, 120)[1:-1] if len(msg) > 120 else msg


@contextmanager
def loading(path: str | Path, what: str) -> Iterator[None]:
    """Run a loader of the file ``path`` (a ``what``, e.g. ``"scenario TOML"``): any
    error of :data:`DECODING_ERRORS` raised inside (other than a schedsim error) becomes
    an :class:`InputError` ``"{path}: cannot read this {what}: {reason}"``."""
    try:
        yield
    except SchedsimError:
        raise
    except DECODING_ERRORS as e:
        raise InputError(f"{_shown(path)}: cannot read this {what}: "
                         f"{decoding_reason(e)}") from None
    except Exception as e:   # csv.Error is not a ValueError
        import csv

        if isinstance(e, csv.Error):
            raise InputError(f"{_shown(path)}: cannot read this {what}: "
                             f"{decoding_reason(e)}") from None
        raise

"""The CLI's consoles and its one-line messages: ``error:`` (:func:`fail`) and
``warning:`` (:func:`warn`), with a typo suggestion for an unknown choice. Every string the
consoles render is terminal-safe (:func:`schedsim.util.text.terminal_safe`)."""
from __future__ import annotations

import io
import os
import re
import sys
from typing import Any

import typer
from schedsim.cli.tables import Console


class _TerminalSafeConsole(Console):
    """A rich console that writes every string it renders (printed text, table cells,
    titles, status lines) terminal-safe (:func:`schedsim.util.text.terminal_safe`): names
    that are valid data (a schedule ``name``, a ``title``, a file name) never reach the
    terminal as control sequences."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        from schedsim.util.text import terminal_safe

        return super().render_str(terminal_safe(text), **kwargs)


# emoji=False: ``:x:`` in a schedule name or quoted input stays text (schedsim.util.text)
console = _TerminalSafeConsole(emoji=False)
err_console = _TerminalSafeConsole(stderr=True, emoji=False)


#: characters of an error message printed at most (a message never copies bulk input)
MAX_MESSAGE = 900


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on stderr (one line, no traceback) and exit with ``code``.
    Quoted input in ``message`` is cut to a short excerpt, the message to
    :data:`MAX_MESSAGE` characters, and it is printed as text (no markup, no emoji)."""
    from rich.markup import escape

    from schedsim.util.text import shorten_quotes

    message = with_suggestion(message)
    if code == 2:               # bad input: one line, short quotes, of bounded length
        message = " ".join(shorten_quotes(message, 80).splitlines())
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"... ({len(message)} chars)"
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True,
                      highlight=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr (one line; the command goes on)."""
    from rich.markup import escape

    err_console.print(f"[bold yellow]warning:[/] {escape(message)}", soft_wrap=True,
                      highlight=False)


_UNKNOWN = re.compile(r"unknown ([\w -]+?) '([^']+)': expected one of ([^()]+?)(?: \(|$)")


def with_suggestion(message: str) -> str:
    """``message`` with a typo suggestion added when it is an "unknown X 'v': expected one
    of a, b, c" error (schedule names, comm policies, ...) that has a close match."""
    m = _UNKNOWN.search(message)
    if not m or "did you mean" in message:
        return message
    from schedsim.util.suggest import did_you_mean

    choices = [c.strip() for c in re.split(r",| or ", m.group(3)) if c.strip()]
    hint = did_you_mean(m.group(2), choices)
    return message[:m.end(2) + 1] + hint + message[m.end(2) + 1:] if hint else message


# -- a closed pipe (``schedsim simulate ... | head -1``) ---------------------------------
class _PipeSafeFile(io.FileIO):
    """The file descriptor under ``sys.stdout`` / ``sys.stderr``: once the reader of its
    pipe is gone (EPIPE, ``BrokenPipeError``), the descriptor is pointed at
    :data:`os.devnull` (``dup2``, the practice the Python docs give for SIGPIPE) and
    this write and every later one succeed there: the command goes on, writes its output
    files and exits with its own code, with no traceback and no ``Broken pipe`` error."""

    def write(self, b: Any) -> int:
        try:
            return super().write(b)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.fileno())
            finally:
                os.close(devnull)
            return memoryview(b).nbytes


def guard_closed_pipes() -> None:
    """Put ``sys.stdout`` and ``sys.stderr`` on a :class:`_PipeSafeFile` each (the same
    encoding, errors and buffering): text, rich consoles and bytes written to
    ``sys.stdout.buffer`` all go through it. For the ``schedsim`` process only
    (:func:`schedsim.cli.main`); a stream that is not a plain file descriptor (a test's
    capture, a notebook) is left as it is."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            stream.flush()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            continue
        raw = _PipeSafeFile(fd, "w", closefd=False)
        buffered = io.BufferedWriter(raw)
        setattr(sys, name, io.TextIOWrapper(
            buffered, encoding=stream.encoding, errors=stream.errors,
            line_buffering=stream.line_buffering,
            write_through=getattr(stream, "write_through", False)))

"""User text in messages, terminals and figures: short escaped excerpts, and escaping for
rich markup and matplotlib's mathtext.

Text from input files and flags (schedule names, units, titles, file names, a bad token)
is data, never markup: a schedule named ``[/]`` must not end rich's style stack, a title
``$\\frac{$`` must not reach matplotlib's mathtext parser, ``:x:`` must not become an
emoji (the CLI's consoles are built with ``emoji=False``, :mod:`schedsim.cli.common`), and
a bad input is quoted by at most :data:`EXCERPT_CHARS` characters (an error message must
not copy a megabyte line, nor a file that was never a schedsim input:
:func:`looks_like_program_text`). No schedsim imports; matplotlib is imported lazily.
"""
from __future__ import annotations

import re
from typing import Any

#: characters of bad input an error message quotes at most
EXCERPT_CHARS = 40

_PROGRAM_CHARS = re.compile(r"[0-9A-Z_()\[\];+]*")


def clip(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters (``...`` and the full length appended when
    longer), control characters escaped: for a key name or path a message quotes."""
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` quoted as Python's ``repr`` does (control characters, NUL and non-ASCII
    escaped), cut to about ``limit`` characters with ``...`` and the full length when
    longer: ``excerpt("x" * 5000)`` is ``'xxxx...xx'... (5000 chars)``."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"


#: a quoted part as ``repr`` writes it: the quote opens after a non-word character (not
#: the apostrophe of "rank 3's") and closes before one
_QUOTED = re.compile(r"(?<!\w)(?:'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")(?!\w)")


def shorten_quotes(message: str, limit: int = EXCERPT_CHARS) -> str:
    """``message`` with every quoted part (``'...'`` or ``"..."``, as ``repr`` writes
    them) longer than ``limit`` characters cut to an excerpt: a parser's message that
    quotes a whole bad token or cell stays one short line."""
    def cut(m: re.Match) -> str:
        q = m.group()
        if len(q) <= limit + 2:
            return q
        return f"{q[:limit + 1]}{q[0]}... ({len(q) - 2} chars)"
    return _QUOTED.sub(cut, message)


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ... ``11th``, ``12th``, ``13th``, ``21st``."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def looks_like_program_text(token: str) -> bool:
    """Whether ``token`` is made only of the characters program tokens use (digits, upper
    case, ``_ ( ) [ ] ; +``). Error messages quote a bad token only then: a path given as
    a program that is really ``/etc/shadow`` or ``/proc/self/environ`` is reported
    without echoing its content."""
    return _PROGRAM_CHARS.fullmatch(token) is not None


#: control characters a terminal acts on: C0 but tab and newline, DEL and C1 (ESC starts
#: the sequences that set a window title, clear the screen or move the cursor)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character a terminal or a font would act on written as
    its escape (``\\x1b``), tab and newline kept: a schedule named ``"\\x1b]0;x\\x07"``
    prints as that text instead of setting the window title, and matplotlib draws it
    without a missing-glyph warning."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def rich_escape(text: Any) -> str:
    """``text`` (any object, via ``str``) with rich markup escaped, for a string that
    rich renders as markup (``console.print``, a ``Table`` title or cell)."""
    from rich.markup import escape

    return escape(str(text))


def mpl_escape(text: Any) -> str:
    """``text`` with every ``$`` escaped, so matplotlib draws it literally instead of
    parsing mathtext (``$\\frac{$`` raises inside matplotlib otherwise)."""
    return str(text).replace("$", "\\$")


def literal_text(fig: Any) -> Any:
    """Make every text of the matplotlib figure ``fig`` literal (no mathtext: a ``$`` in
    a schedule name, title, unit or file name is drawn as ``$``; control characters as
    their escapes, :func:`terminal_safe`); returns ``fig``.

    Called on each figure schedsim builds (:mod:`schedsim.plot`) and before saving one,
    so user text needs no escaping at each ``set_title``/``text`` call."""
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        t.set_parse_math(False)
        s = t.get_text()
        if _CONTROL.search(s):
            t.set_text(terminal_safe(s))
    return fig


def number_runs(numbers: Any) -> str:
    """Whole numbers as their runs, ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (sorted,
    repeats dropped; ``""`` for none): a list of stages or ranks in one short line."""
    out: list[str] = []
    ns = sorted(set(numbers))
    i = 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else f"{ns[i]}-{ns[j]}")
        i = j + 1
    return ", ".join(out)

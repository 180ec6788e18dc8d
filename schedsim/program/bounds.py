"""Bounds on a program text before it is parsed (:mod:`schedsim.program.tokens`): the
thin layer every program file goes through (:func:`schedsim.program.text_file.load_program_file`),
so the parser never sees a number of thousands of digits, a token of megabytes, more
tokens than the work limit, or a file that is not a program at all."""
from __future__ import annotations

import re
from pathlib import Path

from schedsim.errors import ParseError

#: characters a program token may have at most (a WAIT or BATCH of many comm ops)
MAX_TOKEN = 4096
_TOKEN = re.compile(r"\S+")


def check_program_text(text: str, path: str | Path) -> None:
    """Refuse a program text before it is parsed unless every number has at most
    :data:`~schedsim.util.limits.MAX_DIGITS` digits, every token at most
    :data:`MAX_TOKEN` characters and the token count is within the ``instructions``
    limit; a file that starts with something other than a program token is refused
    without quoting it (a path given by mistake, ``/etc/shadow``, must not be echoed).
    Raises
    :class:`ParseError` / :class:`~schedsim.errors.LimitError` naming ``path``."""
    from schedsim.util.limits import check, check_number_sizes
    from schedsim.util.text import looks_like_program_text

    body = re.sub(r"#[^\n]*", "", text)
    first = _TOKEN.search(re.sub(r"(?im)^\s*rank\s+\d+\s*:", "", body))
    if first is not None and not looks_like_program_text(first.group()):
        raise ParseError(f"{path}: not a program text file (its first token is not a "
                         f"program token; see 'schedsim generate NAME' for the format)")
    check_number_sizes(body, path)
    count = 0
    for t in _TOKEN.finditer(body):
        count += 1
        if t.end() - t.start() > MAX_TOKEN:
            line = body.count("\n", 0, t.start()) + 1
            raise ParseError(f"{path}: line {line}: a token of {t.end() - t.start():,} "
                             f"characters is not a program token")
    check("instructions", count, f"{path} with {count:,} tokens")

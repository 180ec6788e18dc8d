"""The program text form: torch-style action tokens with schedsim's kinds.

Grammar (one token, no spaces)::

    compute   {stage}{F|B|W|BW}{mb}          0F1  3BW0  2B4  2W4
    overlap   ({stage}F{mb};{stage}{B|BW}{mb})[OVERLAP_F_B]   (0F3;3BW1)
    comm      {stage}{SEND_F|RECV_F|SEND_B|RECV_B}{mb}      one launch of its own
                                              (dist.isend / dist.irecv); the stage is the one
                                              that sends or receives, as torch writes it
              {stage}{SEND_FS|RECV_FS|SEND_BS|RECV_BS}{mb}  the shape message of that
                                              tensor (Megatron's variable_seq_lengths)
    batch     BATCH[{comm}+{comm}...]         one launch of several (batch_isend_irecv)
    commit    COMMIT                          wait for all launched since the last COMMIT
    wait      WAIT[{comm}+{comm}...]          wait for the named posted comm ops

Unlike torch's own format, ``B`` here is the input-gradient backward and ``BW`` the full
backward (torch writes ``I`` and ``B``); :mod:`schedsim.interop.torch_format` converts.
A program file has one line per rank, optionally prefixed ``rank N:``; ``#`` starts a
comment.
"""
from __future__ import annotations

import re

from schedsim.errors import ParseError
from schedsim.program.ops import (
    Batch,
    Comm,
    Commit,
    Compute,
    Instr,
    Op,
    Post,
    Wait,
    format_instr,
    format_op,
)

#: formatting lives with the atoms (:mod:`schedsim.program.ops`); both directions are here
__all__ = ["parse_op", "parse_comm", "parse_instr", "parse_program_text", "format_op",
           "format_instr"]

_COMPUTE = re.compile(r"(\d+)(BW|F|B|W)(\d+)")
_COMM = re.compile(r"(\d+)((?:SEND|RECV)_[FB]S?)(\d+)")
_FB = re.compile(r"\((\d+)F(\d+);(\d+)(BW|B)(\d+)\)(?:OVERLAP_F_B)?")
_WAIT = re.compile(r"WAIT\[([^\]]*)\]")
_BATCH = re.compile(r"BATCH\[([^\]]*)\]")
_RANK = re.compile(r"\s*rank\s+(\d+)\s*:(.*)", re.IGNORECASE)

_EXPECTED = ("expected {stage}{F|B|W|BW}{mb}, (sF m;sBW m), {stage}{SEND_F|RECV_F|SEND_B|"
             "RECV_B}{mb}, BATCH[...], COMMIT or WAIT[...]")


def parse_op(tok: str) -> Op:
    """Parse a compute token (``0F1``, ``3BW0``, ``(0F3;3BW1)``) into an :class:`Op`.

    Raises :class:`ParseError` naming the token when it is not a compute token.
    """
    m = _COMPUTE.fullmatch(tok)
    if m:
        return Op(m.group(2), int(m.group(1)), int(m.group(3)))
    m = _FB.fullmatch(tok)
    if m:
        f = Op("F", int(m.group(1)), int(m.group(2)))
        b = Op(m.group(4), int(m.group(3)), int(m.group(5)))
        return Op.fb(f, b)
    raise ParseError(f"bad compute token {tok!r}: expected {{stage}}{{F|B|W|BW}}{{mb}} "
                     f"or (sFm;sBWm)")


def parse_comm(tok: str) -> Comm:
    """Parse a comm token (``2SEND_F0``) into a :class:`Comm`; :class:`ParseError` if not."""
    m = _COMM.fullmatch(tok)
    if not m:
        raise ParseError(f"bad comm token {tok!r}: expected {{stage}}{{SEND_F|RECV_F|"
                         f"SEND_B|RECV_B}}{{mb}}")
    return Comm(m.group(2), int(m.group(1)), int(m.group(3)))


def _comm_list(tok: str, what: str, body: str) -> tuple[Comm, ...]:
    if not body:
        raise ParseError(f"bad token {tok!r}: {what}[...] names no comm op")
    comms = tuple(parse_comm(t) for t in body.split("+"))
    if len(set(comms)) != len(comms):
        raise ParseError(f"bad token {tok!r}: {what}[...] names a comm op twice")
    return comms


def parse_instr(tok: str) -> Instr:
    """Parse any program token into an instruction. Raises :class:`ParseError`."""
    if tok == "COMMIT":
        return Commit()
    m = _COMM.fullmatch(tok)
    if m:
        return Post(Comm(m.group(2), int(m.group(1)), int(m.group(3))))
    m = _WAIT.fullmatch(tok)
    if m:
        return Wait(_comm_list(tok, "WAIT", m.group(1)))
    m = _BATCH.fullmatch(tok)
    if m:
        return Batch(_comm_list(tok, "BATCH", m.group(1)))
    try:
        return Compute(parse_op(tok))
    except ParseError:
        raise ParseError(f"bad token {tok!r}: {_EXPECTED}") from None


def parse_program_text(text: str) -> list[list[Instr]]:
    """Parse a program file: one line per rank (``rank N:`` prefix optional, in order).

    Blank lines and ``#`` comments are ignored. Raises :class:`ParseError` naming the line
    and token on a bad token, or a missing/duplicate/out-of-order ``rank N:`` prefix.
    """
    rows: list[list[Instr]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _RANK.fullmatch(line)
        if m:
            if int(m.group(1)) != len(rows):
                raise ParseError(f"line {lineno}: 'rank {m.group(1)}:' out of order, "
                                 f"expected rank {len(rows)}")
            line = m.group(2)
        row = []
        for col, tok in enumerate(line.split(), 1):
            try:
                row.append(parse_instr(tok))
            except ParseError as e:
                raise ParseError(f"line {lineno}, token {col}: {e}") from None
        rows.append(row)
    if not rows:
        raise ParseError("program text has no rank lines")
    return rows

"""The program text form: torch-style action tokens with schedsim's kinds.

Grammar (one token, no spaces)::

    compute   {stage}{F|B|W|BW}{mb}          0F1  3BW0  2B4  2W4
    overlap   ({stage}F{mb};{stage}{B|BW}{mb})[OVERLAP_F_B]   (0F3;3BW1)
    comm      {stage}{SEND_F|RECV_F|SEND_B|RECV_B}{mb}      one launch of its own
                                              (dist.isend / dist.irecv); the stage is the one
                                              that sends or receives, as torch writes it
              {stage}{SEND_FS|RECV_FS|SEND_BS|RECV_BS}{mb}  the shape message of that
                                              tensor (Megatron's variable_seq_lengths)
    skip edge {comm}>{stage} / {comm}<{stage}  the other stage of a skip edge (a send
                                              names where it goes, a recv where it comes
                                              from): 0SEND_F0>2  2RECV_F0<0
    identity  {comm}[:{tag}][@{bytes}]        optional on a post (bare or in a BATCH):
                                              the message's tag (activation, gradient,
                                              shape, other) and size (4194304, 4MiB,
                                              2.5MB; units B KiB MiB GiB KB MB GB), as
                                              this side posts it: 1SEND_B0:gradient@4MiB
    batch     BATCH[{comm}+{comm}...]         one launch of several (batch_isend_irecv)
    commit    COMMIT                          wait for all launched since the last COMMIT
    wait      WAIT[{comm}+{comm}...]          wait for the named posted comm ops

Unlike torch's own format, ``B`` here is the input-gradient backward and ``BW`` the full
backward (torch writes ``I`` and ``B``); :mod:`schedsim.interop.torch_format` converts.
A program file has one line per rank, optionally prefixed ``rank N:``; ``#`` starts a
comment.
"""
from __future__ import annotations

import math
import re

from schedsim.errors import ParseError
from schedsim.program.ops import (
    BYTE_UNITS,
    TAGS,
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
__all__ = ["parse_op", "parse_comm", "parse_post", "parse_instr", "parse_program_text", "format_op",
           "format_instr"]

_COMPUTE = re.compile(r"(\d+)(BW|F|B|W)(\d+)")
_COMM = re.compile(r"(\d+)((?:SEND|RECV)_[FB]S?)(\d+)")
_PEERED = re.compile(r"(\d+)((?:SEND|RECV)_[FB]S?)(\d+)(?:([<>])(\d+))?")
_POST = re.compile(r"(\d+)((?:SEND|RECV)_[FB]S?)(\d+)(?:([<>])(\d+))?(?::([a-z]+))?"
                   r"(?:@([0-9][0-9.]*(?:[eE][+]?[0-9]+)?)([A-Za-z]*))?")
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
    """Parse a comm token (``2SEND_F0``, or ``0SEND_F0>2`` on a skip edge) into a
    :class:`Comm`; :class:`ParseError` if not."""
    m = _PEERED.fullmatch(tok)
    if not m:
        raise ParseError(f"bad comm token {tok!r}: expected {{stage}}{{SEND_F|RECV_F|"
                         f"SEND_B|RECV_B}}{{mb}}, optionally >{{stage}} or <{{stage}}")
    return Comm(m.group(2), int(m.group(1)), int(m.group(3)),
                _peer(tok, m.group(2), m.group(4), m.group(5)))


def _peer(tok: str, kind: str, arrow: str | None, stage: str | None) -> int | None:
    if arrow is None:
        return None
    if (arrow == ">") != (kind[0] == "S"):
        raise ParseError(f"bad comm token {tok!r}: a send names the stage it sends to "
                         f"with '>', a recv the stage it receives from with '<'")
    return int(stage)


def parse_post(tok: str) -> Comm:
    """Parse a posted comm token with its optional identity suffix
    (``1SEND_B0:gradient@4MiB``, module docstring) into a :class:`Comm`.
    Raises :class:`ParseError` naming the token and the bad tag or size."""
    m = _POST.fullmatch(tok)
    if not m:
        return parse_comm(tok)
    tag, num, unit = m.group(6), m.group(7), m.group(8)
    if tag is not None and tag not in TAGS:
        raise ParseError(f"bad comm token {tok!r}: unknown tag {tag!r}, expected one of "
                         f"{', '.join(TAGS)}")
    nbytes = None
    if num is not None:
        if unit and unit not in BYTE_UNITS:
            raise ParseError(f"bad comm token {tok!r}: unknown bytes unit {unit!r}, "
                             f"expected one of {', '.join(BYTE_UNITS)}")
        try:
            nbytes = float(num) * BYTE_UNITS[unit or "B"]
        except ValueError:
            nbytes = math.inf
        if not math.isfinite(nbytes):
            raise ParseError(f"bad comm token {tok!r}: bad size {num + unit!r}, expected "
                             f"a finite number of bytes such as 4194304 or 4MiB")
    return Comm(m.group(2), int(m.group(1)), int(m.group(3)),
                _peer(tok, m.group(2), m.group(4), m.group(5)), tag, nbytes)


def _comm_list(tok: str, what: str, body: str) -> tuple[Comm, ...]:
    if not body:
        raise ParseError(f"bad token {tok!r}: {what}[...] names no comm op")
    if what == "BATCH":
        comms = tuple(parse_post(t) for t in body.split("+"))
    else:
        comms = tuple(_wait_member(tok, t) for t in body.split("+"))
    if len(set(comms)) != len(comms):
        raise ParseError(f"bad token {tok!r}: {what}[...] names a comm op twice")
    return comms


def _wait_member(tok: str, t: str) -> Comm:
    if _PEERED.fullmatch(t) is None and _POST.fullmatch(t) is not None:
        raise ParseError(f"bad token {tok!r}: a WAIT names posted ops without a tag or "
                         f"size ({t!r}); put them on the post")
    return parse_comm(t)


def parse_instr(tok: str) -> Instr:
    """Parse any program token into an instruction. Raises :class:`ParseError`."""
    if tok == "COMMIT":
        return Commit()
    m = _COMM.fullmatch(tok)
    if m:
        return Post(Comm(m.group(2), int(m.group(1)), int(m.group(3))))
    if _POST.fullmatch(tok):
        return Post(parse_post(tok))
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

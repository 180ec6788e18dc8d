"""Selectors: name one op or one comm op of a program in a few words.

Grammar (terms separated by spaces or commas, in any order, case-insensitive)::

    selector := term { term }
    term     := rank=N | mb=N | stage=N | chunk=N | index=N
              | F | B | W | BW | FB | SEND_F | RECV_F | SEND_B | RECV_B
              | SEND_FS | RECV_FS | SEND_BS | RECV_BS  (shape messages)
              | a program token: 5W0  5SEND_B0  (2F15;5BW1)

``rank`` is the rank that runs the instruction, ``index`` its position in that rank's
program, ``stage``/``mb``/``chunk`` describe the op (for an ``FB`` pair a term matches
either part; with a kind, the part of that kind). A comm op is named as the rank that
posts it names it (torch's convention): ``rank=5 SEND_B mb=0`` is the send of the input
gradient of stage 5, microbatch 0. Examples::

    rank=5 W mb=0          the weight backward of mb 0 on rank 5
    rank=4 RECV_B mb=0     rank 4's recv of that gradient
    5SEND_B0               the same send as a token
    rank=5 F mb=15         the FB pair whose forward part is mb 15

A selector must match exactly one instruction; otherwise :class:`ScenarioError` lists the
candidates.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from schedsim.analysis._rows import rank_rows
from schedsim.errors import ParseError, ScenarioError
from schedsim.program.ir import Comm, Compute, Op, Post, Program
from schedsim.program.ops import COMM_KINDS, COMPUTE_KINDS, launched
from schedsim.program.tokens import format_instr, parse_instr

KINDS = COMPUTE_KINDS + COMM_KINDS
_KEYS = ("rank", "mb", "stage", "chunk", "index")
_TERM = re.compile(r"(rank|mb|stage|chunk|index)\s*=\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Target:
    """One selected instruction: ``rank``, ``index`` and the op or comm it holds."""

    rank: int
    index: int
    op: Op | None = None
    comm: Comm | None = None

    @property
    def token(self) -> str:
        return format_instr(self.op if self.op is not None else Post(self.comm))

    @property
    def message_key(self) -> tuple[str, int, int] | None:
        return None if self.comm is None else self.comm.message_key()

    def __str__(self) -> str:
        return f"rank {self.rank} {self.token} (instr {self.index})"


@dataclass
class Selector:
    """A parsed selector (unset fields match anything)."""

    text: str
    kind: str | None = None
    rank: int | None = None
    mb: int | None = None
    stage: int | None = None
    chunk: int | None = None
    index: int | None = None
    token: object | None = None


def parse_selector(text: str) -> Selector:
    """Parse ``text`` (grammar in the module docstring). Raises :class:`ScenarioError`."""
    sel = Selector(text=text)
    terms = [t for t in re.split(r"[\s,]+", text.strip()) if t]
    # re-join "key = value" written with spaces
    joined: list[str] = []
    for t in terms:
        if joined and (t == "=" or joined[-1].endswith("=") or t.startswith("=")):
            joined[-1] += t
        else:
            joined.append(t)
    if not joined:
        raise ScenarioError("empty selector: expected e.g. \"rank=5 W mb=0\"")
    for t in joined:
        m = _TERM.fullmatch(t)
        if m:
            k = m.group(1).lower()
            if getattr(sel, k) is not None:
                raise ScenarioError(f"selector {text!r}: {k} given twice")
            setattr(sel, k, int(m.group(2)))
            continue
        up = t.upper()
        if up in KINDS:
            if sel.kind is not None:
                raise ScenarioError(f"selector {text!r}: two kinds ({sel.kind}, {up})")
            sel.kind = up
            continue
        try:
            sel.token = parse_instr(t)
        except ParseError:
            raise ScenarioError(
                f"selector {text!r}: cannot read {t!r}; expected rank=N, mb=N, stage=N, "
                f"chunk=N, index=N, a kind ({', '.join(KINDS)}) or a program token such as "
                f"5W0 or 5SEND_B0") from None
        if not isinstance(sel.token, (Compute, Post)):
            raise ScenarioError(f"selector {text!r}: {t!r} is not an op or comm token")
    return sel


def _op_matches(sel: Selector, op: Op, chunk_of) -> bool:
    if sel.kind == "FB":
        return op.kind == "FB" and any(_atom_ok(sel, a, chunk_of, kind=False)
                                       for a in op.parts)
    return any(_atom_ok(sel, a, chunk_of, kind=True) for a in op.atoms())


def _atom_ok(sel: Selector, a: Op, chunk_of, kind: bool) -> bool:
    if kind and sel.kind is not None and a.kind != sel.kind:
        return False
    if sel.mb is not None and a.mb != sel.mb:
        return False
    if sel.stage is not None and a.stage != sel.stage:
        return False
    if sel.chunk is not None and chunk_of(a.stage, a.mb) != sel.chunk:
        return False
    return True


def candidates(program: Program, sel: Selector) -> list[Target]:
    """Every instruction of ``program`` that ``sel`` matches."""
    chunk_of = program.placement.chunk_of
    out = []
    is_comm_kind = sel.kind is not None and "_" in sel.kind
    for r, row in rank_rows(program, sel.rank):
        for i, ins in enumerate(row):
            if sel.index is not None and i != sel.index:
                continue
            if isinstance(ins, Compute):
                if is_comm_kind or (sel.token is not None and ins != sel.token):
                    continue
                if _op_matches(sel, ins.op, chunk_of):
                    out.append(Target(r, i, op=ins.op))
                continue
            for c in launched(ins):      # a bare post or one op of a BATCH
                if sel.token is not None and (not isinstance(sel.token, Post)
                                              or c != sel.token.comm):
                    continue
                if sel.kind is not None and c.kind != sel.kind:
                    continue
                if sel.kind is None and sel.token is None:
                    continue      # a bare "rank=5 mb=0" names ops, not comms
                if sel.mb is not None and c.mb != sel.mb:
                    continue
                if sel.stage is not None and c.stage != sel.stage:
                    continue
                if sel.chunk is not None and chunk_of(c.stage, c.mb) != sel.chunk:
                    continue
                out.append(Target(r, i, comm=c))
    return out


def select(program: Program, text: str, what: str = "selector") -> Target:
    """The one instruction ``text`` names. Raises :class:`ScenarioError` (none or many)."""
    sel = parse_selector(text)
    found = candidates(program, sel)
    if not found:
        raise ScenarioError(f"{what} {text!r} matches no instruction of {program.name} "
                            f"(grammar: rank=N mb=N stage=N chunk=N index=N KIND, e.g. "
                            f"\"rank=5 W mb=0\")")
    if len(found) > 1:
        shown = "; ".join(str(t) for t in found[:8])
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        raise ScenarioError(f"{what} {text!r} matches {len(found)} instructions ({shown}"
                            f"{more}); add rank=, mb=, stage= or index= to pick one")
    return found[0]

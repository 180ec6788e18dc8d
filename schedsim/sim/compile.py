"""Compile a :class:`~schedsim.program.ir.Program` into the flat arrays the engine runs, with the
static checks that make a program well-formed.

Messages are matched as gloo and NCCL match P2P: per directed link (src -> dst), the k-th
send posted by src pairs with the k-th recv posted by dst, and both must name the same
message (kind, producing stage, microbatch). Every cross-rank input of a compute op must be
received and waited for before the op; every send must come after the op that produced
its data. Under ``data`` semantics the comm instructions are dropped and one implicit
message is made per cross-rank producer -> consumer edge.

Handles: message m has a send handle ``2m`` (owned by its source rank) and a recv handle
``2m+1`` (owned by its destination rank).

Compiled instruction tuples (per rank, in program order):

- ``(0, cost, span_id, (), send_handles)``: compute; ``send_handles`` is non-empty only
  under ``data`` semantics (the outputs it sends when it ends);
- ``(1, handles, units)``: one launch (a bare post, or a ``BATCH``'s ops);
- ``(2, handles, kind, index)``: block until every handle completed (``WAIT``/``COMMIT``/
  ``END``, and ``DATA`` before a compute op under ``data`` semantics).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from schedsim.errors import ProgramError
from schedsim.program.ir import Batch, Comm, Commit, Compute, Op, Post, Program, Wait
from schedsim.program.ops import recv_comm, send_comm
from schedsim.program.routing import COMM_SIDES, consumer_stage, needs, produces
from schedsim.program.tokens import format_instr
from schedsim.sim.costs import CommModel, CostModel, LinkModel

_COMPUTE, _POST, _WAIT = 0, 1, 2
_POST_KEY = COMM_SIDES


@dataclass
class Compiled:
    """Flat, index-based form of a program under one cost/link/comm setting."""

    program: Program
    data_mode: bool
    code: list[list[tuple]]
    # spans: (rank, op, instruction index)
    span_meta: list[tuple[int, Op, int]] = field(default_factory=list)
    # messages
    mkey: list[tuple[str, int, int]] = field(default_factory=list)
    msrc: list[int] = field(default_factory=list)
    mdst: list[int] = field(default_factory=list)
    mbytes: list[float] = field(default_factory=list)
    mlat: list[float] = field(default_factory=list)
    mocc: list[float] = field(default_factory=list)
    mlink: list[int] = field(default_factory=list)
    meager: list[bool] = field(default_factory=list)
    # measured sender completion, from the transfer's start (LinkModel.messages), or None
    msend: list[float | None] | None = None
    # instruction index of each handle's post (or producing/consuming compute, data mode)
    hindex: list[int] = field(default_factory=list)
    # posting order of each handle on its rank (ops of one batch in the order listed)
    hseq: list[int] = field(default_factory=list)
    # comm streams: unit -> (stream id, handles); handle -> unit
    unit_stream: list[int] = field(default_factory=list)
    unit_handles: list[tuple[int, ...]] = field(default_factory=list)
    hunit: list[int] = field(default_factory=list)
    num_streams: int = 0
    num_links: int = 0
    launch_cost: float = 0.0
    # per rank and code position, host time spent before it runs (CommModel.host, with
    # the launches' own time folded in; launch_cost is then 0); None: no such times
    delay: list[list[float]] | None = None

    @property
    def num_messages(self) -> int:
        return len(self.mkey)

    def instr_index(self, r: int, pc: int) -> int:
        """Program instruction index of compiled position ``pc`` on rank ``r``."""
        if pc >= len(self.code[r]):
            return len(self.program.ranks[r])
        ins = self.code[r][pc]
        if ins[0] == 0:
            return self.span_meta[ins[2]][2]
        if ins[0] == 1:
            return self.hindex[ins[1][0]]
        return ins[3]

    def handle_token(self, h: int) -> str:
        """Program token of a handle (``1RECV_F0``) for messages and diagnostics."""
        key = self.mkey[h >> 1]
        return str(send_comm(key) if h & 1 == 0 else recv_comm(key))


def _where(r: int, i: int, ins: object) -> str:
    return f"rank {r}, instr {i} ({format_instr(ins)})"


def _ordinal(k: int) -> str:
    return f"{k + 1}{'tsnrhtdd'[(k + 1) % 10 * ((k + 1) % 100 // 10 != 1) % 5::4] or 'th'}"


def compile_program(program: Program, costs: CostModel, link: LinkModel,
                    comm: CommModel) -> Compiled:
    """Check ``program`` and flatten it. Raises :class:`ProgramError` naming the first
    offending instruction (unmatched or mismatched send/recv, a recv never waited, a send
    before its data exists, a local hand-off posted as P2P, a wrong rank)."""
    pl = program.placement
    P = pl.ranks
    if len(program.ranks) != P:
        raise ProgramError(f"program has {len(program.ranks)} rank rows but the placement "
                           f"has {P} ranks")
    data_mode = comm.semantics == "data"
    cp = Compiled(program=program, data_mode=data_mode, code=[[] for _ in range(P)],
                  launch_cost=0.0 if data_mode else comm.launch_cost)
    if data_mode:
        if program.has_comm():     # the comm instructions are ignored, but must be right
            _compile_comm(Compiled(program=program, data_mode=False,
                                   code=[[] for _ in range(P)]), program, costs, comm)
        _compile_data(cp, program, costs)
    else:
        _compile_comm(cp, program, costs, comm)
    _message_arrays(cp, costs, link, comm)
    if comm.host and not data_mode:
        _host_delays(cp, comm)
    return cp


def _host_delays(cp: Compiled, comm: CommModel) -> None:
    """Fill ``cp.delay`` from ``comm.host``: per code position, the host time before it
    plus, for a launch, its own time (``launch_cost`` unless given)."""
    own = {(x.rank, x.index): x for x in comm.host}
    cp.delay = []
    for r, code in enumerate(cp.code):
        row = []
        for pc, ins in enumerate(code):
            x = own.get((r, cp.instr_index(r, pc)))
            d = x.before if x is not None else 0.0
            if ins[0] == _POST:
                d += x.launch if x is not None and x.launch is not None else cp.launch_cost
            row.append(d)
        cp.delay.append(row)
    cp.launch_cost = 0.0


def _message_arrays(cp: Compiled, costs: CostModel, link: LinkModel, comm: CommModel) -> None:
    """Fill bytes, latency, link occupancy, link id and eagerness of every message."""
    params: dict[tuple[int, int], tuple[float, float, int]] = {}
    for lk in set(zip(cp.msrc, cp.mdst)):
        lat, bw = link.params(*lk)
        params[lk] = (lat, bw, len(params))
    nbytes = [costs.bytes_of(k[1]) for k in cp.mkey]
    lks = [params[lk] for lk in zip(cp.msrc, cp.mdst)]
    cp.mbytes = nbytes
    cp.mlat = [p[0] for p in lks]
    cp.mocc = [0.0 if math.isinf(p[1]) else b / p[1] for p, b in zip(lks, nbytes)]
    if link.messages:       # measured transfer times: the whole delay, no link occupancy
        times = link.message_times()
        cp.msend = [None] * len(cp.mkey)
        for m, k in enumerate(cp.mkey):
            t = times.get(k)
            if t is not None:
                cp.mlat[m], cp.mocc[m], cp.msend[m] = t.time, 0.0, t.send
    cp.mlink = [p[2] for p in lks]
    is_eager = comm.is_eager
    cp.meager = [is_eager(b) for b in nbytes]
    cp.num_links = len(params)
    if len(cp.hunit) < 2 * len(cp.mkey):
        cp.hunit = [-1] * (2 * len(cp.mkey))


def _made_map(program: Program) -> dict[tuple[str, int, int], tuple[int, int]]:
    """Output key -> (rank, instruction index) of the op that produces it."""
    made: dict[tuple[str, int, int], tuple[int, int]] = {}
    for r, row in enumerate(program.ranks):
        for i, ins in enumerate(row):
            if type(ins) is Compute:
                for a in ins.op.atoms():
                    k = produces(a)
                    if k is not None:
                        if k in made:
                            q, j = made[k]
                            raise ProgramError(f"{_where(r, i, ins)}: runs a second time "
                                               f"(first at rank {q}, instr {j}; each op "
                                               f"runs once)")
                        made[k] = (r, i)
    return made


def _input_error(program: Program, r: int, i: int, ins: object,
                 need: tuple[str, int, int]) -> ProgramError:
    """The error for a same-rank input that is not available at instruction i."""
    src = _made_map(program).get(need)
    if src is None:
        what = "activation" if need[0] == "F" else "gradient"
        return ProgramError(f"{_where(r, i, ins)} needs the {what} of stage {need[1]} mb "
                            f"{need[2]}, which no op of the program produces")
    return ProgramError(f"{_where(r, i, ins)} comes before the op (instr {src[1]}) that "
                        f"produces its input")


def _compile_data(cp: Compiled, program: Program, costs: CostModel) -> None:
    S = program.placement.stages
    cost = costs.cost_fn()
    made = _made_map(program)
    key_m: dict[tuple[str, int, int], int] = {}
    outs: dict[tuple[int, int], list[int]] = {}
    code_pos: dict[tuple[int, int], int] = {}
    hindex = cp.hindex
    for r, row in enumerate(program.ranks):
        code = cp.code[r]
        for i, ins in enumerate(row):
            if type(ins) is not Compute:
                continue
            op = ins.op
            ins_h: list[int] = []
            for a in op.atoms():
                if not (0 <= a.stage < S and 0 <= a.mb < program.microbatches):
                    raise _range_error(r, i, ins, S, program.microbatches)
                for need in needs(a, S):
                    src = made.get(need)
                    if src is None or (src[0] == r and src[1] >= i):
                        raise _input_error(program, r, i, ins, need)
                    if src[0] == r:
                        continue
                    mk = need
                    m = key_m.get(mk)
                    if m is None:
                        m = key_m[mk] = len(cp.mkey)
                        cp.mkey.append(mk)
                        cp.msrc.append(src[0])
                        cp.mdst.append(r)
                        hindex += (src[1], i)
                        outs.setdefault(src, []).append(2 * m)
                    ins_h.append(2 * m + 1)
            sid = len(cp.span_meta)
            cp.span_meta.append((r, op, i))
            if ins_h:     # block until the inputs arrived (recorded as a DATA wait)
                code.append((_WAIT, tuple(ins_h), "DATA", i))
            code_pos[(r, i)] = len(code)
            code.append((_COMPUTE, cost(op), sid, (), ()))
    for src, hs in outs.items():
        code = cp.code[src[0]]
        j = code_pos[src]
        c = code[j]
        code[j] = (c[0], c[1], c[2], c[3], tuple(hs))


def _compile_comm(cp: Compiled, program: Program, costs: CostModel, comm: CommModel) -> None:
    """One pass over every rank's instructions: resolve posts to messages (created on
    first sight from either side), check producers and waits, emit code. Then check that
    each message was posted by both sides and that, per link, sends and recvs were posted
    in the same message order."""
    pl = program.placement
    S, P, M = pl.stages, pl.ranks, program.microbatches
    rank_of = pl.rank_fn()
    cost = costs.cost_fn()
    stream_mode = comm.comm_stream
    plain = stream_mode == "none"
    mkey, msrc, mdst, hindex, hunit = cp.mkey, cp.msrc, cp.mdst, cp.hindex, cp.hunit
    hseq = cp.hseq
    key_m: dict[tuple[str, int, int], int] = {}
    span_meta = cp.span_meta
    for r, row in enumerate(program.ranks):
        code = cp.code[r]
        made_here: set[tuple[str, int, int]] = set()   # outputs made so far on this rank
        waited: set[tuple[str, int, int]] = set()      # messages received and waited
        all_h: list[int] = []          # everything this rank posts (the END wait)
        committed = 0                  # all_h[committed:] is what the next COMMIT waits for
        for i, ins in enumerate(row):
            t = type(ins)
            if t is Post or t is Batch:    # one launch: isend/irecv or batch_isend_irecv
                run = []
                for c in (ins.comms if t is Batch else (ins.comm,)):
                    kk, side, off = _POST_KEY[c.kind]
                    mb = c.mb
                    key = (kk, c.stage + off, mb)
                    m = key_m.get(key)
                    if m is None:         # first sight of this message, from either side
                        ps = key[1]
                        to = consumer_stage(key)
                        if not (0 <= ps < S and 0 <= to < S and 0 <= mb < M):
                            raise _no_message(r, i, ins, ps, to, mb, S, M)
                        src, dst = rank_of(ps, mb), rank_of(to, mb)
                        if src == dst:
                            raise _local_handoff(r, i, ins, ps, to, src)
                        m = key_m[key] = len(mkey)
                        mkey.append(key)
                        msrc.append(src)
                        mdst.append(dst)
                        hindex += (-1, -1)
                        hunit += (-1, -1)
                        hseq += (-1, -1)
                    h = 2 * m + side
                    if (msrc[m] if side == 0 else mdst[m]) != r or hindex[h] >= 0:
                        raise _post_error(cp, r, i, c, m, h)
                    hindex[h] = i
                    hseq[h] = len(all_h) + len(run)
                    if side == 0 and key not in made_here:
                        raise ProgramError(f"{_where(r, i, ins)}: sends {c} before the op "
                                           f"that produces its data ran on this rank")
                    run.append(h)
                tr = tuple(run)
                all_h.extend(tr)
                if plain:
                    code.append((_POST, tr, ()))
                else:
                    _flush_run(cp, code, tr, stream_mode, r, P)
                continue
            if t is Compute:
                op = ins.op
                for a in (op.parts if op.parts else (op,)):
                    if not (0 <= a.stage < S and 0 <= a.mb < M):
                        raise _range_error(r, i, ins, S, M)
                    for need in needs(a, S):
                        if need in made_here:
                            continue
                        if need in waited:      # messages are always cross-rank
                            continue
                        raise _need_error(cp, program, key_m, rank_of, r, i, ins, need)
                    k = produces(a)
                    if k is not None:
                        if k in made_here:
                            raise ProgramError(f"{_where(r, i, ins)}: runs a second time on "
                                               f"this rank (each op runs once)")
                        made_here.add(k)
                sid = len(span_meta)
                span_meta.append((r, op, i))
                code.append((_COMPUTE, cost(op), sid, (), ()))
            elif t is Commit:
                hs = tuple(all_h[committed:])
                for h in hs:
                    if h & 1:
                        waited.add(mkey[h >> 1])
                code.append((_WAIT, hs, "COMMIT", i))
                committed = len(all_h)
            elif t is Wait:
                hs = []
                for c in ins.comms:
                    kk, side, off = _POST_KEY[c.kind]
                    m = key_m.get((kk, c.stage + off, c.mb))
                    h = -1 if m is None else 2 * m + side
                    if h < 0 or not 0 <= hindex[h] < i or (
                            msrc[m] if h & 1 == 0 else mdst[m]) != r:
                        raise ProgramError(f"{_where(r, i, ins)}: waits for {c}, which this "
                                           f"rank has not posted before")
                    if h & 1:
                        waited.add(mkey[m])
                    hs.append(h)
                code.append((_WAIT, tuple(hs), "WAIT", i))
            else:
                raise ProgramError(f"{_where(r, i, ins)}: unknown instruction")
        code.append((_WAIT, tuple(all_h), "END", len(row)))
    _check_matching(cp, program)
    cp.num_streams = P + P * P


def _range_error(r: int, i: int, ins: object, S: int, M: int) -> ProgramError:
    return ProgramError(f"{_where(r, i, ins)}: stage must be in [0, {S}) and microbatch in "
                        f"[0, {M})")


def _no_message(r: int, i: int, ins: object, s: int, to: int, mb: int, S: int,
                M: int) -> ProgramError:
    return ProgramError(f"{_where(r, i, ins)}: no such message (stages {s}->{to}, mb {mb}; "
                        f"the program has {S} stages and {M} microbatches)")


def _local_handoff(r: int, i: int, ins: object, s: int, to: int, rank: int) -> ProgramError:
    return ProgramError(f"{_where(r, i, ins)}: stages {s} and {to} are both on rank {rank}; "
                        f"the hand-off is local, remove this op")


def _post_error(cp: Compiled, r: int, i: int, c: Comm, m: int, h: int) -> ProgramError:
    own = cp.msrc[m] if h & 1 == 0 else cp.mdst[m]
    ins = cp.program.ranks[r][i]
    if own != r:
        return ProgramError(f"{_where(r, i, ins)}: {c} belongs to rank {own} (stage "
                            f"{c.stage} mb {c.mb} runs there)")
    return ProgramError(f"{_where(r, i, ins)}: {c} posted twice (first at instr "
                        f"{cp.hindex[h]})")


def _need_error(cp: Compiled, program: Program, key_m: dict, rank_of, r: int, i: int,
                ins: object, need: tuple[str, int, int]) -> ProgramError:
    """The error for an input that is not available to instruction i of rank r."""
    src_rank = rank_of(need[1], need[2])
    if src_rank == r:
        return _input_error(program, r, i, ins, need)
    rc = recv_comm(need)
    m = key_m.get(need)
    what = ("waits for" if m is not None and cp.mdst[m] == r
            and 0 <= cp.hindex[2 * m + 1] < i else "posts")
    return ProgramError(f"{_where(r, i, ins)} uses data from rank {src_rank} but the program "
                        f"never {what} {rc} before it (add the recv and a WAIT or COMMIT)")


def _check_matching(cp: Compiled, program: Program) -> None:
    """Every message posted by both sides, and on each directed link the k-th send and the
    k-th recv name the same message (all sends of a link come from one rank, all recvs go
    to one rank, so posting order is instruction order on that rank)."""
    hindex = cp.hindex
    by_link: dict[tuple[int, int], list[int]] = {}
    for m, lk in enumerate(zip(cp.msrc, cp.mdst)):
        if hindex[2 * m] < 0 or hindex[2 * m + 1] < 0:
            side = "send" if hindex[2 * m] >= 0 else "recv"
            r = cp.msrc[m] if side == "send" else cp.mdst[m]
            i = hindex[2 * m if side == "send" else 2 * m + 1]
            other, orank = ("recv", cp.mdst[m]) if side == "send" else ("send", cp.msrc[m])
            raise ProgramError(f"{_where(r, i, program.ranks[r][i])}: unmatched {side}: rank "
                               f"{orank} never posts the matching {other}")
        lst = by_link.get(lk)
        if lst is None:
            lst = by_link[lk] = []
        lst.append(m)
    for (src, dst), ms in by_link.items():
        hseq = cp.hseq
        so = sorted(ms, key=lambda m: hseq[2 * m])
        ro = sorted(ms, key=lambda m: hseq[2 * m + 1])
        if so == ro:
            continue
        for k, (a, b) in enumerate(zip(so, ro)):
            if a != b:
                si, ri = hindex[2 * a], hindex[2 * b + 1]
                raise ProgramError(
                    f"the {_ordinal(k)} send on link {src}->{dst} is "
                    f"{_where(src, si, program.ranks[src][si])} but the {_ordinal(k)} recv is "
                    f"{_where(dst, ri, program.ranks[dst][ri])}: P2P ops match in posting "
                    f"order per link, so both must name the same message")


def _flush_run(cp: Compiled, code: list, run: tuple[int, ...], stream_mode: str, r: int,
               P: int) -> None:
    """Append one launch; on a comm stream split it into per-stream units."""
    units: list[int] = []
    if stream_mode != "none":
        groups: dict[int, list[int]] = {}
        for h in run:
            peer = cp.mdst[h >> 1] if h & 1 == 0 else cp.msrc[h >> 1]
            sid = r if stream_mode == "per-rank" else P + r * P + peer
            groups.setdefault(sid, []).append(h)
        for sid, hs in groups.items():
            u = len(cp.unit_stream)
            cp.unit_stream.append(sid)
            cp.unit_handles.append(tuple(hs))
            for h in hs:
                cp.hunit[h] = u
            units.append(u)
    code.append((_POST, run, tuple(units)))

"""Compile a :class:`~schedsim.program.ir.Program` into the arrays the engine runs, with
the comm checks that make a program well-formed (its compute order is checked by
:mod:`schedsim.program.validate`).

Messages are matched as gloo and NCCL match P2P: per directed link (src -> dst), the k-th
send posted by src pairs with the k-th recv posted by dst, and both must name the same
message (kind, producing stage, microbatch). Every cross-rank input of a compute op must be
received and waited for before the op; every send must come after the op that produced its
data. Under ``data`` semantics the comm instructions are only checked; one implicit message
is made per cross-rank producer -> consumer edge.

The code is built from the program's flat form (:mod:`schedsim.program.flat`) by array
operations (:mod:`schedsim.sim.prep`) and one sequential pass
(:func:`schedsim.sim.compile_kernel.compile_comm_kernel`, run by numba for large programs
when it is installed). Handles: message m has a send handle
``2m`` (owned by its source rank) and a recv handle ``2m+1`` (its destination rank).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType

import numpy as np

from schedsim.errors import ProgramError
from schedsim.program.flat import FlatProgram, Opcode, index_dtype
from schedsim.program.ir import Program
from schedsim.program.ops import COMM_KINDS, Comm, recv_comm
from schedsim.program.routing import cross_stage_inputs, decode_codes
from schedsim.sim.compile_kernel import compile_comm_kernel
from schedsim.sim.compile_data import compile_data
from schedsim.sim.compiled import (
    Code,
    Compiled,
    Host,
    Links,
    Messages,
    Part,
    OPCODE,
    Units,
    links_of,
    message_keys,
)
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.identity import default_bytes
from schedsim.sim.kernel_records import PassInput, PassScratch, PassTables
from schedsim.sim.opcodes import STREAM_MODES, Err, Step
from schedsim.sim.prep import I64, Prep, compute_costs, instr_sizes, prep, where

def compile_program(program: Program, costs: CostModel, link: LinkModel,
                    comm: CommModel, flat: FlatProgram | None = None,
                    allow_unmatched: bool = False) -> Compiled:
    """Check ``program``'s comm and compile it. Raises :class:`ProgramError` naming the
    first offending instruction (unmatched or mismatched send/recv, sizes that differ
    between the two sides of a pair, a recv never waited, a send before its data exists,
    a local hand-off posted as P2P, a wrong rank). The compute order is not checked here
    (:func:`schedsim.program.validate.validate_program`). Pairs whose tags differ are
    silent swaps (:mod:`schedsim.sim.identity`): listed in ``Compiled.swaps``, the ops
    paired as the library pairs them.

    ``flat``: the program's flat form when the caller has it already. ``allow_unmatched``:
    compile a program with unmatched ops (under eager or rendezvous semantics) instead of
    raising, the sentence in ``Compiled.unmatched``: the caller runs it and reports what
    the op's never completing does to the other ranks (:func:`schedsim.sim.simulate.
    simulate_run`). The :class:`Compiled` is made once, at the end, from its records.
    """
    from schedsim.util.memory import large_blocks_unpooled

    pl = program.placement
    P = pl.ranks
    fl = flat if flat is not None else program.flat()
    large_blocks_unpooled(len(fl))          # a large compile frees its temporaries
    if fl.ranks != P:
        raise ProgramError(f"program has {fl.ranks} rank rows but the placement has {P} "
                           f"ranks")
    S, M = pl.stages, program.microbatches
    data_mode = comm.semantics == "data"
    host, pair_first = Host(), MappingProxyType({})
    if data_mode:
        pr = prep(fl, program)
        if fl.has_comm():      # the comm instructions are ignored, but must be right
            _compile_comm(program, fl, pr, costs, comm, with_costs=False)
        part = compile_data(fl, pr, costs)
    else:
        # without lazy init the pass computes the Prep and frees it before it runs
        pr = prep(fl, program) if comm.lazy_init else None
        part = _compile_comm(program, fl, pr, costs, comm, allow_unmatched=allow_unmatched)
        host = Host(launch_cost=comm.launch_cost, atomic=comm.group_semantics == "atomic")
        if comm.lazy_init:
            host = host._replace(lazy_init=True, init_cost=comm.init_cost)
            cinit, pair_first = _first_touch(fl, pr, part.code)
            part = part._replace(code=part.code._replace(cinit=cinit))
    decode = partial(decode_codes, stages=S, microbatches=M, skips=tuple(pl.skips))
    messages, links = _message_arrays(part.messages, decode, (P, S), costs, link, comm)
    if link.messages:
        links = _measured_messages(links, message_keys(*decode(messages.mcode)), link)
    if (comm.host or comm.host_cost) and not data_mode:
        host = _host_delays(host, part.code, P, comm)
    return Compiled(program=program, flat=fl, data_mode=data_mode, ranks=P, stages=S,
                    microbatches=M, code=part.code, span_gi=part.span_gi,
                    messages=messages, links=links, units=part.units, host=host,
                    pair_first=pair_first, swaps=part.swaps, unmatched=part.unmatched)


def _measured_messages(links: Links, keys: list[tuple], link: LinkModel) -> Links:
    """Measured transfer times (``LinkModel.messages``; ``keys``: every message's key):
    the whole delay from the transfer's start to arrival (no link occupancy) and, when
    given, the sender's completion."""
    times = link.message_times()
    msend = np.full(len(keys), -1.0)
    mlat, mocc = links.mlat.copy(), links.mocc.copy()
    for m, k in enumerate(keys):
        t = times.get(k)
        if t is not None:
            mlat[m], mocc[m] = t.time, 0.0
            if t.send is not None:
                msend[m] = t.send
    return links_of(mlat, mocc, links.mlink, links.meager, msend=msend,
                    num_links=links.num_links)


def _host_delays(host: Host, code: Code, P: int, comm: CommModel) -> Host:
    """``host`` with its ``delay`` from ``comm.host``: per step, the host time before it
    plus, for a launch, its own time (``launch_cost`` unless given); ``launch_cost``
    becomes 0. ``comm.host_cost`` is the host time before each instruction ``comm.host``
    does not list (charged at the instruction's first step)."""
    own = {(x.rank, x.index): x for x in comm.host}
    delay = np.zeros(len(code.cop))
    if comm.host_cost:
        first = np.ones(len(code.cop), dtype=bool)
        first[1:] = code.cipc[1:] != code.cipc[:-1]
        first[code.crptr[:-1][code.crptr[:-1] < len(first)]] = True
        delay[first] = comm.host_cost
    is_l = code.cop == Step.LAUNCH
    delay[is_l] += host.launch_cost
    for r in range(P):
        for g in range(int(code.crptr[r]), int(code.crptr[r + 1])):
            x = own.get((r, int(code.cipc[g])))
            if x is None:
                continue
            d = x.before
            if is_l[g]:
                d += x.launch if x.launch is not None else host.launch_cost
            delay[g] = d
    return host._replace(delay=delay, launch_cost=0.0)


def _key_ids(pr: Prep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compact ids of every key code the program names: ``(keys, member ids, atom input
    ids, atom output ids)`` (-1 stays -1). When the code space (``Prep.ncodes``: 2 x stages
    x microbatches, x 2 with shape messages, skip edges after them) is small next to the
    program, the codes are their own ids."""
    n = len(pr.mcode) + len(pr.a_in) + len(pr.a_out)
    space = pr.ncodes
    if space <= max(4 * n, 1 << 16):
        return np.arange(space, dtype=index_dtype(space)), pr.mcode, pr.a_in, pr.a_out
    allc = np.concatenate((pr.mcode, pr.a_in, pr.a_out))
    keys, inv = np.unique(allc, return_inverse=True)
    if len(keys) and keys[0] < 0:
        keys = keys[1:]
        inv = inv - 1
    inv = inv.astype(I64)
    n1, n2 = len(pr.mcode), len(pr.mcode) + len(pr.a_in)
    return keys, inv[:n1], inv[n1:n2], inv[n2:]


def _compile_comm(program: Program, fl: FlatProgram, pr: Prep | None, costs: CostModel,
                  comm: CommModel, with_costs: bool = True,
                  allow_unmatched: bool = False) -> Part:
    """The sequential pass (:func:`~schedsim.sim.compile_kernel.compile_comm_kernel`)
    plus the link-order check. ``pr``: the program's :class:`Prep`, or None: computed
    here and freed before the pass runs (a third of its memory at 10 M instructions),
    computed again only to word an error or to look at mismatched pairs."""
    from schedsim.sim.fast import executor

    kept = pr
    if pr is None:
        pr = prep(fl, program, pass_only=True)

    def get_prep() -> Prep:
        return kept if kept is not None else prep(fl, program)
    keys, mkey, a_in, a_out = _key_ids(pr)
    n, nmem, P = len(fl), len(pr.mcode), pr.P
    is_c = fl.code == Opcode.COMPUTE
    nc, nlaunch = instr_sizes(fl)
    scost = compute_costs(fl, costs, is_c) if with_costs and nc else np.zeros(nc)
    nk = len(keys)
    nsteps = n + P
    cap_h = 3 * nlaunch + (nmem - nlaunch) + 1
    dt = index_dtype(max(nsteps, cap_h, 2 * nk, nmem, 2 * P * P) + 1)
    kernel, xs = executor(compile_comm_kernel, n)
    side = pr.side
    inp = PassInput(
        ranks=P, stream_mode=int(STREAM_MODES[comm.comm_stream]), rptr=xs.ints(fl.rptr),
        icode=xs.ints(fl.code), mptr=xs.ints(fl.mptr), mkey=xs.ints(mkey),
        mside=xs.ints(side), msrc=xs.ints(pr.msrc), mdst=xs.ints(pr.mdst),
        aptr=xs.ints(pr.aptr),
        a_in=xs.ints(a_in), a_out=xs.ints(a_out), scost=xs.floats(scost))
    tables = PassTables(
        key_msg=xs.full(nk, -1, dt), msg_key=xs.empty(nk, dt), msg_src=xs.empty(nk, dt),
        msg_dst=xs.empty(nk, dt), made_rank=xs.full(nk, -1, dt), waited=xs.full(nk, 0, dt),
        hindex=xs.full(2 * nk, -1, dt), hseq=xs.full(2 * nk, -1, dt),
        hord=xs.full(2 * nk, -1, dt), link_posts=xs.full(2 * P * P, 0, dt))
    code = Code(crptr=xs.empty(P + 1, dt), cop=xs.empty(nsteps, OPCODE),
                cipc=xs.empty(nsteps, dt), cwk=xs.full(nsteps, -1, OPCODE),
                ccost=xs.emptyf(nsteps), cspan=xs.empty(nsteps, dt),
                chptr=xs.empty(nsteps + 1, dt), ch=xs.empty(cap_h, dt),
                cuptr=xs.empty(nsteps + 1 if comm.comm_stream != "none" else 0, dt),
                cinit=np.zeros(0, dt))
    units = Units(unit_stream=xs.empty(nlaunch + 1, dt),
                  unit_hptr=xs.full(nlaunch + 2, 0, dt), unit_h=xs.empty(nlaunch + 1, dt),
                  hunit=xs.full(2 * nk, -1, dt))
    scratch = PassScratch(posted=xs.empty(nlaunch + 1, dt), ugroup=xs.empty(max(P, 1)),
                          counts=xs.full(4, 0), err=xs.full(4, 0))
    # a shape message (FS/BS) is made by no compute op: its sender counts as its maker (the
    # program's order puts its launch after the op whose tensor it announces)
    if len(pr.mk) and int(pr.mk.max()) >= 2:       # any shape message (no temporaries else)
        shape = (pr.mk >= 2) & (pr.side == 0) & pr.mvalid
        for k, r in zip(np.asarray(mkey)[shape].tolist(), pr.msrc[shape].tolist()):
            tables.made_rank[k] = r
        del shape
    del pr, side
    kernel(inp=inp, tables=tables, code=code, units=units, scratch=scratch)
    del inp
    err = [int(x) for x in scratch.err]
    if err[0] != Err.OK:
        raise _comm_error(fl, get_prep(), err, mkey, a_in, tables)
    tb = PassTables(*(np.asarray(v, dtype=dt) for v in tables))
    part = _pass_part(code, units, tb, [int(x) for x in scratch.counts], keys, is_c, dt)
    nm = len(part.messages.mcode)
    return _check_matching(part, fl, tb.hord[:2 * nm], get_prep, costs,
                           partial(np.take, tb.key_msg, mkey), allow_unmatched)


def _pass_part(code: Code, units: Units, tb: PassTables, counts: list[int],
               keys: np.ndarray, is_c: np.ndarray, dt: type) -> Part:
    """The :class:`Part` of the compile pass's capacity arrays (``counts``: steps,
    handles in code, messages, units; ``tb``: its tables as arrays; ``keys``: key id ->
    key code; ``dt``: the index type)."""
    ns, nh, nm, nu = counts
    nuh = int(units.unit_hptr[nu])
    return Part(
        code=Code(crptr=np.asarray(code.crptr, dt), cop=np.asarray(code.cop[:ns], OPCODE),
                  cipc=np.asarray(code.cipc[:ns], dt), cwk=np.asarray(code.cwk[:ns], OPCODE),
                  ccost=np.asarray(code.ccost[:ns], np.float64),
                  cspan=np.asarray(code.cspan[:ns], dt),
                  chptr=np.asarray(code.chptr[:ns + 1], dt),
                  ch=np.asarray(code.ch[:nh], dt), cuptr=_head(code.cuptr, ns + 1, dt),
                  cinit=code.cinit),
        span_gi=np.flatnonzero(is_c).astype(dt),
        messages=Messages(mcode=keys[tb.msg_key[:nm]], msrc=tb.msg_src[:nm],
                          mdst=tb.msg_dst[:nm], mbytes=np.zeros(0),
                          hindex=tb.hindex[:2 * nm], hseq=tb.hseq[:2 * nm]),
        units=Units(unit_stream=_head(units.unit_stream, nu, dt),
                    unit_hptr=_head(units.unit_hptr, nu + 1, dt),
                    unit_h=_head(units.unit_h, nuh, dt),
                    hunit=np.asarray(units.hunit[:2 * nm], dt)))


def _head(a, k: int, dt: type) -> np.ndarray:
    """The first ``k`` entries of capacity array ``a`` as ``dt``: a copy when they are
    under half of it (the capacity is then freed: without comm streams the unit arrays
    hold one entry of millions), else a view."""
    out = np.asarray(a[:k], dt)
    return out.copy() if 2 * k < len(a) and out.base is not None else out


def _comm_error(fl: FlatProgram, pr: Prep, err: list[int], mkey: np.ndarray,
                a_in: np.ndarray, tables: PassTables) -> ProgramError:
    """The :class:`ProgramError` for an error code of the compile pass (``mkey``/``a_in``:
    key ids of the members and of the atoms' cross-rank inputs; ``tables``: the pass's
    message tables)."""
    code, r, i, j = err
    loc = where(fl, r, i)
    if code == Err.NEED:      # j is an atom: its cross-rank input was never received
        kind, ps = cross_stage_inputs(pr.a_kind[j:j + 1], pr.a_stage[j:j + 1], pr.S)
        need: tuple = (("F", "B")[int(kind[0])], int(ps[0]), int(pr.a_mb[j]))
        if pr.a_skip is not None and pr.a_skip[j] >= 0:      # a skip-edge input
            p, c = pr.skips[int(pr.a_skip[j])]
            mb = int(pr.a_mb[j])
            need = ("F", p, mb, c) if pr.a_kind[j] == 0 else ("B", c, mb, p)
        m = int(tables.key_msg[int(a_in[j])])
        posted = m >= 0 and 0 <= int(tables.hindex[2 * m + 1]) < i
        return ProgramError(f"{loc} uses data from rank {int(pr.a_in_rank[j])} but the "
                            f"program never {'waits for' if posted else 'posts'} "
                            f"{recv_comm(need)} before it (add the recv and a WAIT or "
                            f"COMMIT)")
    c = Comm(COMM_KINDS[int(fl.ckind[j])], int(fl.cstage[j]), int(fl.cmb[j]))
    if code == Err.NO_MESSAGE:
        return ProgramError(f"{loc}: no such message (stages {int(pr.ps[j])}->"
                            f"{int(pr.cs[j])}, mb {c.mb}; the program has {pr.S} stages and "
                            f"{pr.M} microbatches)")
    if code == Err.LOCAL:
        return ProgramError(f"{loc}: stages {int(pr.ps[j])} and {int(pr.cs[j])} are both "
                            f"on rank {int(pr.msrc[j])}; the hand-off is local, remove this "
                            f"op")
    if code == Err.POST:
        own = int(pr.msrc[j] if pr.side[j] == 0 else pr.mdst[j])
        if own != r:
            return ProgramError(f"{loc}: {c} belongs to rank {own} (stage {c.stage} mb "
                                f"{c.mb} runs there)")
        m = int(tables.key_msg[int(mkey[j])])
        first = int(tables.hindex[2 * m + int(pr.side[j])])
        return ProgramError(f"{loc}: {c} posted twice (first at instr {first})")
    if code == Err.SEND_EARLY:
        return ProgramError(f"{loc}: sends {c} before the op that produces its data ran "
                            f"on this rank")
    return ProgramError(f"{loc}: waits for {c}, which this rank has not posted before")


def _check_matching(part: Part, fl: FlatProgram, hord: np.ndarray,
                    get_prep: Callable[[], Prep], costs: CostModel,
                    member_messages: Callable[[], np.ndarray],
                    allow_unmatched: bool = False) -> Part:
    """``part`` after the link-order check: every message posted by both sides, and on
    each directed link the k-th send and the k-th recv agree (:mod:`schedsim.sim.
    identity`: the same bytes; the same tag, else a silent swap, recorded in ``swaps``
    and the pair re-made as the library makes it; tag and bytes equal: the same
    message). ``hord``: each handle's k on its link (from the compile pass); when every
    pair names one message and no post names an identity there is nothing to look at.
    ``member_messages()``: the message id of every member (made only when there is
    something to look at: an array of the members' size)."""
    from schedsim.sim.identity import (
        check_pairs,
        member_where,
        ordinal,
        pair_members,
        swap_of,
        unmatched_text,
    )

    nm = len(part.messages.mcode)
    if nm == 0:
        return part
    hi = part.messages.hindex.reshape(-1, 2)
    if (fl.ctag is None and np.all(hi >= 0)
            and np.array_equal(hord[0::2], hord[1::2])):
        return part
    pr = get_prep()
    msg_of_member = member_messages()
    pairs = pair_members(fl, pr)
    swaps = tuple(check_pairs(fl, pr, costs, pairs))
    ma, mb_ = msg_of_member[pairs.js], msg_of_member[pairs.jr]
    tag_same = np.ones(len(ma), bool)
    if swaps:
        from schedsim.sim.identity import member_identity

        tag = member_identity(fl, pr, costs)[0]
        tag_same = tag[pairs.js] == tag[pairs.jr]
    bad = np.flatnonzero((ma != mb_) & tag_same)
    if len(pairs.unmatched) and (not allow_unmatched or len(bad) or swaps):
        raise ProgramError(unmatched_text(fl, pr, int(pairs.unmatched[0])))
    if len(bad):
        p = int(bad[0])
        k, src, dst = int(pairs.k[p]), int(pairs.src[p]), int(pairs.dst[p])
        a, b = int(pairs.js[p]), int(pairs.jr[p])
        raise ProgramError(
            f"the {ordinal(k)} send on link {src}->{dst} is {member_where(fl, a)} but "
            f"the {ordinal(k)} recv is {member_where(fl, b)}: P2P ops match in posting "
            f"order per link, so both must name the same message")
    unmatched = None
    if len(pairs.unmatched):
        unmatched = unmatched_text(fl, pr, int(pairs.unmatched[0]))
    part = part._replace(swaps=swaps, unmatched=unmatched,
                         messages=part.messages._replace(
                             mbytes_given=_given_bytes(fl, nm, msg_of_member)))
    perm = swap_of(fl, pr, pairs, msg_of_member)
    if perm is not None:
        part = _repair(part, perm, ma, mb_)
    return part


def _given_bytes(fl: FlatProgram, nm: int, msg_of_member: np.ndarray) -> np.ndarray | None:
    """Each of the ``nm`` messages' bytes as its posts name them (both sides agree,
    checked), -1 where neither names any; None when no post names any."""
    if fl.cbytes is None:
        return None
    give = np.flatnonzero(fl.cbytes >= 0)
    out = np.full(nm, -1.0)
    out[msg_of_member[give]] = fl.cbytes[give]
    return out


def _repair(part: Part, perm: np.ndarray, ma: np.ndarray, mb_: np.ndarray) -> Part:
    """Re-pair the handles as the comm library pairs them (silent swaps): the recv paired
    with message a's send becomes a's recv handle; ``messages.mrcode`` keeps what each
    recv named."""
    def moved(old: np.ndarray) -> np.ndarray:
        new = old.copy()
        new[perm] = old
        return new

    ms = part.messages
    mrcode = ms.mcode.copy()
    mrcode[ma] = ms.mcode[mb_]
    return part._replace(
        code=part.code._replace(ch=perm[part.code.ch].astype(part.code.ch.dtype)),
        units=part.units._replace(unit_h=perm[part.units.unit_h].astype(part.code.ch.dtype),
                                  hunit=moved(part.units.hunit)),
        messages=ms._replace(hindex=moved(ms.hindex), hseq=moved(ms.hseq), mrcode=mrcode))


def _message_arrays(ms: Messages, decode: Callable, shape: tuple[int, int],
                    costs: CostModel, link: LinkModel, comm: CommModel
                    ) -> tuple[Messages, Links]:
    """``ms`` with every message's bytes, and its :class:`Links`: latency, link
    occupancy, link id (``src * ranks + dst``) and eagerness (``decode``: key codes ->
    kind, producing stage, consuming stage, mb; ``shape``: ranks, stages)."""
    P, S = shape
    mk, ps = decode(ms.mcode)[:2]
    nbytes = default_bytes(costs, mk, ps, S)
    lk = ms.msrc * P + ms.mdst
    used = np.zeros(P * P, bool)
    used[lk] = True
    lat_t = np.zeros(P * P)
    bw_t = np.full(P * P, np.inf)
    for u in np.flatnonzero(used).tolist():
        lat_t[u], bw_t[u] = link.params(u // P, u % P)
    if ms.mbytes_given is not None:
        nbytes = np.where(ms.mbytes_given >= 0, ms.mbytes_given, nbytes)
    mbw = bw_t[lk]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mocc = np.where(np.isinf(mbw), 0.0, nbytes / np.where(np.isinf(mbw), 1.0, mbw))
    links = links_of(lat_t[lk], mocc, lk,
                     comm.eager_messages(link, nbytes, ms.msrc, ms.mdst).astype(lk.dtype),
                     num_links=P * P)
    return ms._replace(mbytes=nbytes), links


def _first_touch(fl: FlatProgram, pr: Prep, code: Code
                 ) -> tuple[np.ndarray, Mapping[int, Mapping[int, int]]]:
    """Lazy communicator init: ``(cinit, pair_first)``: each rank's first bare post to
    each peer marked with the rank pair's id (``cinit``, per step), and where each side
    first touches each pair (``pair_first[pair][rank] = instruction index``)."""
    P = fl.ranks
    cinit = np.full(len(code.cop), -1, code.cinit.dtype)
    first: dict[int, dict[int, int]] = {}
    for r, peer, gi in first_touches(fl, pr.msrc, pr.mdst, pr.side):
        pair = min(r, peer) * P + max(r, peer)
        cinit[gi + r] = pair         # one step per instruction, plus one END per rank
        first.setdefault(pair, {})[r] = gi - int(fl.rptr[r])
    return cinit, MappingProxyType({k: MappingProxyType(v) for k, v in first.items()})


def first_touches(fl: FlatProgram, msrc: np.ndarray, mdst: np.ndarray,
                  side: np.ndarray) -> list[tuple[int, int, int]]:
    """``(rank, peer, flat instruction index)`` of each rank's first *bare* post (an
    ``isend``/``irecv`` of its own, not in a ``BATCH``) to each peer, in program order
    per rank (ranks in order): where NCCL creates the pair's communicator under lazy
    init. Members' ``msrc``/``mdst``/``side`` as compile computes them."""
    gi = np.flatnonzero(fl.code == Opcode.POST)
    if not len(gi):
        return []
    j = fl.mptr[gi]
    rank = fl.rank_of_instr()[gi].astype(I64)
    peer = np.where(side[j] == 0, mdst[j], msrc[j]).astype(I64)
    keep = peer >= 0
    gi, rank, peer = gi[keep], rank[keep], peer[keep]
    key = rank * (int(max(rank.max(initial=0), peer.max(initial=0))) + 1) + peer
    _, first = np.unique(key, return_index=True)
    first.sort()
    return list(zip(rank[first].tolist(), peer[first].tolist(), gi[first].tolist()))


def first_touch_order(program: Program) -> list[list[tuple[int, int]]]:
    """Per rank, ``(peer, instruction index)`` of its first bare post (``isend`` /
    ``irecv`` of its own) to each peer, in program order: the order in which the rank
    creates its 2-rank communicators under lazy init (``CommModel.lazy_init``)."""
    fl = program.flat()
    pr = prep(fl, program)
    out: list[list[tuple[int, int]]] = [[] for _ in range(fl.ranks)]
    for r, peer, gi in first_touches(fl, pr.msrc, pr.mdst, pr.side):
        out[r].append((peer, gi - int(fl.rptr[r])))
    return out

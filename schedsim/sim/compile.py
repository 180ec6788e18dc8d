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

from typing import Any

import numpy as np

from schedsim.errors import ProgramError
from schedsim.program.flat import FlatProgram, Opcode
from schedsim.program.ir import Program
from schedsim.program.ops import COMM_KINDS, Comm, recv_comm
from schedsim.program.routing import cross_stage_inputs
from schedsim.sim.compile_data import compile_data
from schedsim.sim.compiled import Compiled
from schedsim.sim.costs import CommModel, CostModel, LinkModel
from schedsim.sim.identity import default_bytes
from schedsim.sim.kernels import Err, Step
from schedsim.sim.prep import I64, Prep, compute_costs, prep, where

_STREAM_MODE = {"none": 0, "per-peer": 1, "per-rank": 2}


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
    simulate_run`).
    """
    pl = program.placement
    P = pl.ranks
    fl = flat if flat is not None else program.flat()
    if fl.ranks != P:
        raise ProgramError(f"program has {fl.ranks} rank rows but the placement has {P} "
                           f"ranks")
    pr = prep(fl, program)
    data_mode = comm.semantics == "data"
    if data_mode:
        if fl.has_comm():      # the comm instructions are ignored, but must be right
            _compile_comm(program, fl, pr, costs, comm, with_costs=False)
        cp = compile_data(program, fl, pr, costs)
    else:
        cp = _compile_comm(program, fl, pr, costs, comm, allow_unmatched=allow_unmatched)
        cp.launch_cost = comm.launch_cost
        cp.atomic = comm.group_semantics == "atomic"
        if comm.lazy_init:
            cp.lazy_init = True
            cp.init_cost = comm.init_cost
            _mark_first_touch(cp, pr)
    _message_arrays(cp, costs, link, comm)
    if link.messages:
        _measured_messages(cp, link)
    if (comm.host or comm.host_cost) and not data_mode:
        _host_delays(cp, comm)
    return cp


def _measured_messages(cp: Compiled, link: LinkModel) -> None:
    """Measured transfer times (``LinkModel.messages``): the whole delay from the
    transfer's start to arrival (no link occupancy) and, when given, the sender's
    completion."""
    times = link.message_times()
    cp.msend = np.full(cp.num_messages, -1.0)
    cp.mlat, cp.mocc = cp.mlat.copy(), cp.mocc.copy()
    for m, k in enumerate(cp.mkey):
        t = times.get(k)
        if t is not None:
            cp.mlat[m], cp.mocc[m] = t.time, 0.0
            if t.send is not None:
                cp.msend[m] = t.send


def _host_delays(cp: Compiled, comm: CommModel) -> None:
    """Fill ``cp.delay`` from ``comm.host``: per step, the host time before it plus, for
    a launch, its own time (``launch_cost`` unless given); ``launch_cost`` becomes 0.
    ``comm.host_cost`` is the host time before each instruction ``comm.host`` does not
    list (charged at the instruction's first step)."""
    own = {(x.rank, x.index): x for x in comm.host}
    cp.delay = np.zeros(len(cp.cop))
    if comm.host_cost:
        first = np.ones(len(cp.cop), dtype=bool)
        first[1:] = cp.cipc[1:] != cp.cipc[:-1]
        first[cp.crptr[:-1][cp.crptr[:-1] < len(first)]] = True
        cp.delay[first] = comm.host_cost
    is_l = cp.cop == Step.LAUNCH
    cp.delay[is_l] += cp.launch_cost
    for r in range(cp.ranks):
        for g in range(int(cp.crptr[r]), int(cp.crptr[r + 1])):
            x = own.get((r, int(cp.cipc[g])))
            if x is None:
                continue
            d = x.before
            if is_l[g]:
                d += x.launch if x.launch is not None else cp.launch_cost
            cp.delay[g] = d
    cp.launch_cost = 0.0


def _key_ids(pr: Prep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compact ids of every key code the program names: ``(keys, member ids, atom input
    ids, atom output ids)`` (-1 stays -1). When the code space (``Prep.ncodes``: 2 x stages
    x microbatches, x 2 with shape messages, skip edges after them) is small next to the
    program, the codes are their own ids."""
    n = len(pr.mcode) + len(pr.a_in) + len(pr.a_out)
    space = pr.ncodes
    if space <= max(4 * n, 1 << 16):
        return np.arange(space, dtype=I64), pr.mcode, pr.a_in, pr.a_out
    allc = np.concatenate((pr.mcode, pr.a_in, pr.a_out))
    keys, inv = np.unique(allc, return_inverse=True)
    if len(keys) and keys[0] < 0:
        keys = keys[1:]
        inv = inv - 1
    inv = inv.astype(I64)
    n1, n2 = len(pr.mcode), len(pr.mcode) + len(pr.a_in)
    return keys, inv[:n1], inv[n1:n2], inv[n2:]


def _compile_comm(program: Program, fl: FlatProgram, pr: Prep, costs: CostModel,
                  comm: CommModel, with_costs: bool = True,
                  allow_unmatched: bool = False) -> Compiled:
    """The sequential pass (:func:`~schedsim.sim.kernels.compile_comm_kernel`) plus the
    link-order check."""
    from schedsim.sim.fast import kernels_for

    keys, mkey, a_in, a_out = _key_ids(pr)
    n, nmem, P = len(fl), len(pr.mcode), pr.P
    is_c = fl.code == Opcode.COMPUTE
    icost = np.zeros(n)
    if with_costs and is_c.any():
        icost[is_c] = compute_costs(fl, costs, is_c)
    ispan = np.where(is_c, np.cumsum(is_c) - 1, -1).astype(I64)
    mowner = np.where(pr.side == 0, pr.msrc, pr.mdst)
    mpeer = np.where(pr.side == 0, pr.mdst, pr.msrc)
    mlocal = ((pr.msrc == pr.mdst) & pr.mvalid).astype(I64)
    nk = len(keys)
    nsteps = n + P
    nlaunch = int(np.diff(fl.mptr)[(fl.code == Opcode.POST) | (fl.code == Opcode.BATCH)].sum())
    nwaitm = nmem - nlaunch
    cap_h = 3 * nlaunch + nwaitm + 1
    K, xs = kernels_for(n, "compile")
    a = {"key_msg": xs.full(nk, -1), "msg_key": xs.empty(nk),
         "hindex": xs.full(2 * nk, -1), "hseq": xs.full(2 * nk, -1),
         "made_rank": xs.full(nk, -1), "waited": xs.full(nk, 0),
         "posted": xs.empty(nlaunch + 1), "cop": xs.empty(nsteps),
         "cipc": xs.empty(nsteps), "cwk": xs.full(nsteps, -1), "ccost": xs.emptyf(nsteps),
         "cspan": xs.empty(nsteps), "chptr": xs.empty(nsteps + 1),
         "ch": xs.empty(cap_h), "cuptr": xs.empty(nsteps + 1),
         "crptr": xs.empty(P + 1), "unit_stream": xs.empty(nlaunch + 1),
         "unit_hptr": xs.full(nlaunch + 2, 0), "unit_h": xs.empty(nlaunch + 1),
         "hunit": xs.full(2 * nk, -1), "ugroup": xs.empty(max(P, 1)),
         "link_posts": xs.full(2 * P * P, 0), "hord": xs.full(2 * nk, -1),
         "msg_src": xs.empty(nk), "msg_dst": xs.empty(nk),
         "counts": xs.full(4, 0), "err": xs.full(4, 0)}
    # a shape message (FS/BS) is made by no compute op: its sender counts as its maker (the
    # program's order puts its launch after the op whose tensor it announces)
    shape = (pr.mk >= 2) & (pr.side == 0) & pr.mvalid
    for k, r in zip(np.asarray(mkey)[shape].tolist(), pr.msrc[shape].tolist()):
        a["made_rank"][k] = r
    K.compile_comm_kernel(
        P, xs.ints(fl.rptr), xs.ints(fl.code), xs.ints(fl.mptr), xs.ints(mkey),
        xs.ints(pr.side), xs.ints(mowner), xs.ints(mlocal), xs.ints(mpeer), xs.ints(pr.aptr),
        xs.ints(a_in), xs.ints(a_out), xs.floats(icost), xs.ints(ispan),
        _STREAM_MODE[comm.comm_stream], a["key_msg"], a["msg_key"], a["hindex"], a["hseq"],
        a["made_rank"], a["waited"], a["posted"], a["cop"], a["cipc"], a["cwk"], a["ccost"],
        a["cspan"], a["chptr"], a["ch"], a["cuptr"], a["crptr"], a["unit_stream"],
        a["unit_hptr"], a["unit_h"], a["hunit"], a["ugroup"], a["link_posts"], a["hord"],
        a["msg_src"], a["msg_dst"], a["counts"], a["err"])
    err = [int(x) for x in a["err"]]
    if err[0] != Err.OK:
        raise _comm_error(fl, pr, err, mkey, a_in, a)
    ns, nh, nm, nu = (int(x) for x in a["counts"])
    arr = {k: np.asarray(v, dtype=np.float64 if k == "ccost" else I64) for k, v in a.items()}
    mcode = keys[arr["msg_key"][:nm]]
    src, dst = arr["msg_src"][:nm], arr["msg_dst"][:nm]
    nuh = int(arr["unit_hptr"][nu])
    cp = Compiled(program=program, flat=fl, data_mode=False, ranks=P, stages=pr.S,
                  microbatches=pr.M, crptr=arr["crptr"], cop=arr["cop"][:ns],
                  cipc=arr["cipc"][:ns], cwk=arr["cwk"][:ns], ccost=arr["ccost"][:ns],
                  cspan=arr["cspan"][:ns], chptr=arr["chptr"][:ns + 1], ch=arr["ch"][:nh],
                  cuptr=arr["cuptr"][:ns + 1], cinit=np.full(ns, -1, I64),
                  span_gi=np.flatnonzero(is_c).astype(I64), mcode=mcode, msrc=src, mdst=dst,
                  hindex=arr["hindex"][:2 * nm], hseq=arr["hseq"][:2 * nm],
                  unit_stream=arr["unit_stream"][:nu], unit_hptr=arr["unit_hptr"][:nu + 1],
                  unit_h=arr["unit_h"][:nuh], hunit=arr["hunit"][:2 * nm])
    _check_matching(cp, arr["hord"][:2 * nm], pr, costs, arr["key_msg"][mkey],
                    allow_unmatched)
    return cp


def _comm_error(fl: FlatProgram, pr: Prep, err: list[int], mkey: np.ndarray,
                a_in: np.ndarray, a: dict[str, Any]) -> ProgramError:
    """The :class:`ProgramError` for an error code of the compile pass (``mkey``/``a_in``:
    key ids of the members and of the atoms' cross-rank inputs; ``a``: the pass's
    arrays)."""
    code, r, i, j = err
    loc = where(fl, r, i)
    if code == Err.NEED:      # j is an atom: its cross-rank input was never received
        kind, ps = cross_stage_inputs(pr.a_kind[j:j + 1], pr.a_stage[j:j + 1], pr.S)
        need: tuple = (("F", "B")[int(kind[0])], int(ps[0]), int(pr.a_mb[j]))
        if pr.a_skip is not None and pr.a_skip[j] >= 0:      # a skip-edge input
            p, c = pr.skips[int(pr.a_skip[j])]
            mb = int(pr.a_mb[j])
            need = ("F", p, mb, c) if pr.a_kind[j] == 0 else ("B", c, mb, p)
        m = int(a["key_msg"][int(a_in[j])])
        posted = m >= 0 and 0 <= int(a["hindex"][2 * m + 1]) < i
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
        m = int(a["key_msg"][int(mkey[j])])
        first = int(a["hindex"][2 * m + int(pr.side[j])])
        return ProgramError(f"{loc}: {c} posted twice (first at instr {first})")
    if code == Err.SEND_EARLY:
        return ProgramError(f"{loc}: sends {c} before the op that produces its data ran "
                            f"on this rank")
    return ProgramError(f"{loc}: waits for {c}, which this rank has not posted before")


def _check_matching(cp: Compiled, hord: np.ndarray, pr: Prep, costs: CostModel,
                    msg_of_member: np.ndarray, allow_unmatched: bool = False) -> None:
    """Every message posted by both sides, and on each directed link the k-th send and the
    k-th recv agree (:mod:`schedsim.sim.identity`: the same bytes; the same tag, else a
    silent swap, recorded in ``cp.swaps`` and the pair re-made as the library makes it;
    tag and bytes equal: the same message). ``hord``: each handle's k on its link (from
    the compile pass); when every pair names one message and no post names an identity
    there is nothing to look at. ``msg_of_member``: the message id of every member."""
    from schedsim.sim.identity import (
        check_pairs,
        member_where,
        ordinal,
        pair_members,
        swap_of,
        unmatched_text,
    )

    fl = cp.flat
    nm = cp.num_messages
    if nm == 0:
        return
    hi = cp.hindex.reshape(-1, 2)
    if (fl.ctag is None and np.all(hi >= 0)
            and np.array_equal(hord[0::2], hord[1::2])):
        return
    pairs = pair_members(fl, pr)
    cp.swaps = check_pairs(fl, pr, costs, pairs)
    ma, mb_ = msg_of_member[pairs.js], msg_of_member[pairs.jr]
    tag_same = np.ones(len(ma), bool)
    if cp.swaps:
        from schedsim.sim.identity import member_identity

        tag = member_identity(fl, pr, costs)[0]
        tag_same = tag[pairs.js] == tag[pairs.jr]
    bad = np.flatnonzero((ma != mb_) & tag_same)
    if len(pairs.unmatched) and (not allow_unmatched or len(bad) or cp.swaps):
        raise ProgramError(unmatched_text(fl, pr, int(pairs.unmatched[0])))
    if len(bad):
        p = int(bad[0])
        k, src, dst = int(pairs.k[p]), int(pairs.src[p]), int(pairs.dst[p])
        a, b = int(pairs.js[p]), int(pairs.jr[p])
        raise ProgramError(
            f"the {ordinal(k)} send on link {src}->{dst} is {member_where(fl, a)} but "
            f"the {ordinal(k)} recv is {member_where(fl, b)}: P2P ops match in posting "
            f"order per link, so both must name the same message")
    if len(pairs.unmatched):
        cp.unmatched = unmatched_text(fl, pr, int(pairs.unmatched[0]))
    _given_bytes(cp, pr, costs, msg_of_member)
    perm = swap_of(fl, pr, pairs, msg_of_member)
    if perm is not None:
        _repair(cp, perm, ma, mb_)


def _given_bytes(cp: Compiled, pr: Prep, costs: CostModel, msg_of_member: np.ndarray
                 ) -> None:
    """``cp.mbytes_given``: each message's bytes as its posts name them (both sides
    agree, checked), -1 where neither names any."""
    fl = cp.flat
    if fl.cbytes is None:
        return
    give = np.flatnonzero(fl.cbytes >= 0)
    out = np.full(cp.num_messages, -1.0)
    out[msg_of_member[give]] = fl.cbytes[give]
    cp.mbytes_given = out


def _repair(cp: Compiled, perm: np.ndarray, ma: np.ndarray, mb_: np.ndarray) -> None:
    """Re-pair the handles as the comm library pairs them (silent swaps): the recv paired
    with message a's send becomes a's recv handle; ``cp.mrcode`` keeps what each recv
    named."""
    for name in ("ch", "unit_h"):
        setattr(cp, name, perm[getattr(cp, name)])
    for name in ("hindex", "hseq", "hunit"):
        old = getattr(cp, name)
        new = old.copy()
        new[perm] = old
        setattr(cp, name, new)
    cp.mrcode = cp.mcode.copy()
    cp.mrcode[ma] = cp.mcode[mb_]


def _message_arrays(cp: Compiled, costs: CostModel, link: LinkModel, comm: CommModel) -> None:
    """Fill bytes, latency, link occupancy, link id (``src * ranks + dst``) and eagerness
    of every message."""
    P, S = cp.ranks, cp.stages
    mk, ps = cp.decode(cp.mcode)[:2]
    nbytes = default_bytes(costs, mk, ps, S)
    lk = cp.msrc * P + cp.mdst
    used = np.zeros(P * P, bool)
    used[lk] = True
    lat_t = np.zeros(P * P)
    bw_t = np.full(P * P, np.inf)
    for u in np.flatnonzero(used).tolist():
        lat_t[u], bw_t[u] = link.params(u // P, u % P)
    if cp.mbytes_given is not None:
        nbytes = np.where(cp.mbytes_given >= 0, cp.mbytes_given, nbytes)
    cp.mbytes = nbytes
    cp.mlat = lat_t[lk]
    mbw = bw_t[lk]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        cp.mocc = np.where(np.isinf(mbw), 0.0, nbytes / np.where(np.isinf(mbw), 1.0, mbw))
    cp.mlink = lk.astype(I64)
    cp.meager = comm.eager_messages(link, nbytes, cp.msrc, cp.mdst).astype(I64)
    cp.num_links = P * P


def _mark_first_touch(cp: Compiled, pr: Prep) -> None:
    """Lazy communicator init: mark each rank's first bare post to each peer with the
    rank pair's id (``cinit``) and record where each side first touches each pair
    (``pair_first[pair][rank] = instruction index``)."""
    fl, P = cp.flat, cp.ranks
    for r, peer, gi in first_touches(fl, pr.msrc, pr.mdst, pr.side):
        pair = min(r, peer) * P + max(r, peer)
        cp.cinit[gi + r] = pair         # one step per instruction, plus one END per rank
        cp.pair_first.setdefault(pair, {})[r] = gi - int(fl.rptr[r])


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

"""The compile pass over a flat program (see :mod:`schedsim.sim.compile`), written in the
subset of Python that both CPython and numba run (see :mod:`schedsim.sim.kernels`)."""
from __future__ import annotations

from schedsim.program.flat import Opcode
from schedsim.sim.opcodes import Err, Step, StreamMode, WaitKind

_COMPUTE = int(Step.COMPUTE)
_LAUNCH = int(Step.LAUNCH)
_WAIT = int(Step.WAIT)
_K_WAIT = int(WaitKind.WAIT)
_K_COMMIT = int(WaitKind.COMMIT)
_K_END = int(WaitKind.END)
_E_NO_MESSAGE = int(Err.NO_MESSAGE)
_E_LOCAL = int(Err.LOCAL)
_E_POST = int(Err.POST)
_E_SEND_EARLY = int(Err.SEND_EARLY)
_E_NEED = int(Err.NEED)
_E_WAIT_UNPOSTED = int(Err.WAIT_UNPOSTED)
_P_POST = int(Opcode.POST)
_P_BATCH = int(Opcode.BATCH)
_P_COMPUTE = int(Opcode.COMPUTE)
_P_COMMIT = int(Opcode.COMMIT)
_S_NONE = int(StreamMode.NONE)
_S_PER_RANK = int(StreamMode.PER_RANK)


def compile_comm_kernel(inp, tables, code, units, scratch):
    """One pass over every rank's instructions (ranks in order, each in program order):
    resolve posts to messages (created on first sight, from either side), check the comm
    rules, emit compiled code. Returns nothing; ``err[0]`` is an :class:`Err` code
    (``err[1:4]`` = rank, instruction, member or atom index) and ``counts`` = (steps,
    handles in code, messages, units).

    Inputs: ``inp`` (:class:`~schedsim.sim.kernel_records.PassInput`: per instruction
    its opcode, members and atoms; per compute instruction its cost; the compute
    instructions are spans 0, 1, ... in the pass's order). Written: ``tables``
    (:class:`~schedsim.sim.kernel_records.PassTables`: messages made, handles posted,
    ``hord[h]``: the k of "the k-th send (or recv) on its directed link" of handle h,
    so that matching in posting order per link holds when ``hord[2m] == hord[2m+1]``
    for every message), ``code`` (a :class:`~schedsim.sim.compiled.Code` of capacity
    arrays, ``cinit`` untouched, ``cuptr`` empty and untouched without comm streams),
    ``units`` (:class:`~schedsim.sim.compiled.Units`;
    ``unit_hptr`` allocated zeroed) and ``scratch``
    (:class:`~schedsim.sim.kernel_records.PassScratch`: ``counts``, ``err``). The
    records' fields are read into locals once, at the top.

    Order of the pass, per rank, each instruction in program order by opcode:

    - a launch (bare post or ``BATCH``): one LAUNCH step; each member is resolved to its
      message (created on first sight), checked (a message exists, is not a same-rank
      hand-off, this rank owns the side, it was not posted before, a send comes after
      its producer ran here) and given a handle and its order on its directed link; with
      comm streams the launch's handles are split into units (:func:`_units`);
    - a compute: each atom's cross-rank input must have been waited; its outputs are
      marked made on this rank; one COMPUTE step;
    - ``COMMIT``: one WAIT step over the handles posted since the previous ``COMMIT``;
    - ``WAIT``: one WAIT step over its members, each posted earlier on this rank;
    - at the end of the rank, the implicit ``END``: one WAIT step over every handle it
      posted.

    The first broken rule stops the pass with its code in ``err``.

    One function on purpose (an exception to the 80-line rule, docs/architecture.md): it
    runs compiled by numba, where a per-instruction helper call would pay
    reference-count traffic on its ~40 array arguments (measured on the event loop: 165
    ns per step with helpers, 46 ns as one function; benchmarks/NOTES.md, section 1,
    item 3).
    """
    # the records' fields as locals: the one place the pass unpacks them
    P, stream_mode, rptr, icode = inp.ranks, inp.stream_mode, inp.rptr, inp.icode
    mptr, mkey, mside, msrc, mdst = inp.mptr, inp.mkey, inp.mside, inp.msrc, inp.mdst
    aptr, a_in, a_out = inp.aptr, inp.a_in, inp.a_out
    scost = inp.scost
    key_msg, msg_key, msg_src, msg_dst = (tables.key_msg, tables.msg_key, tables.msg_src,
                                          tables.msg_dst)
    made_rank, waited, hindex, hseq = (tables.made_rank, tables.waited, tables.hindex,
                                       tables.hseq)
    hord, link_posts = tables.hord, tables.link_posts
    cop, cipc, cwk, ccost, cspan = code.cop, code.cipc, code.cwk, code.ccost, code.cspan
    chptr, ch, cuptr, crptr = code.chptr, code.ch, code.cuptr, code.crptr
    unit_hptr = units.unit_hptr
    posted, counts, err = scratch.posted, scratch.counts, scratch.err
    streams = stream_mode != _S_NONE      # else ``cuptr`` is empty: no units
    n = 0       # steps emitted
    nh = 0      # handles emitted in code
    nm = 0      # messages
    nu = 0      # units
    nsp = 0     # spans (compute instructions) so far
    for r in range(P):
        crptr[r] = n
        npost = 0            # handles posted so far by this rank (posted[0:npost])
        committed = 0
        for i in range(rptr[r], rptr[r + 1]):
            c = icode[i]
            ipc = i - rptr[r]
            if c == _P_POST or c == _P_BATCH:          # one launch
                cop[n] = _LAUNCH
                cipc[n] = ipc
                ccost[n] = 0.0
                cspan[n] = -1
                chptr[n] = nh
                first = npost
                for j in range(mptr[i], mptr[i + 1]):
                    k = mkey[j]
                    if k < 0:
                        err[0] = _E_NO_MESSAGE
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    m = key_msg[k]
                    side = mside[j]
                    own, peer = (msrc[j], mdst[j]) if side == 0 else (mdst[j], msrc[j])
                    if m < 0:
                        if msrc[j] == mdst[j]:   # a same-rank hand-off (k >= 0: valid)
                            err[0] = _E_LOCAL
                            err[1] = r
                            err[2] = ipc
                            err[3] = j
                            return
                        m = nm
                        key_msg[k] = m
                        msg_key[m] = k
                        if side == 0:
                            msg_src[m] = r
                            msg_dst[m] = peer
                        else:
                            msg_src[m] = peer
                            msg_dst[m] = r
                        nm += 1
                    h = 2 * m + side
                    if own != r or hindex[h] >= 0:
                        err[0] = _E_POST
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    hindex[h] = ipc
                    hseq[h] = npost
                    lk = 2 * ((r * P + peer) if side == 0 else (peer * P + r)) + side
                    hord[h] = link_posts[lk]
                    link_posts[lk] += 1
                    if side == 0 and made_rank[k] != r:
                        err[0] = _E_SEND_EARLY
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    posted[npost] = h
                    npost += 1
                    ch[nh] = h
                    nh += 1
                if streams:
                    cuptr[n] = nu
                    nu = _units(inp, r, first, npost, mptr[i], nu, posted, units,
                                scratch.ugroup)
                n += 1
            elif c == _P_COMPUTE:
                for a in range(aptr[i], aptr[i + 1]):
                    k = a_in[a]
                    if k >= 0 and not waited[k]:
                        err[0] = _E_NEED
                        err[1] = r
                        err[2] = ipc
                        err[3] = a
                        return
                for a in range(aptr[i], aptr[i + 1]):
                    k = a_out[a]
                    if k >= 0:
                        made_rank[k] = r
                cop[n] = _COMPUTE
                cipc[n] = ipc
                ccost[n] = scost[nsp]
                cspan[n] = nsp
                nsp += 1
                chptr[n] = nh
                if streams:
                    cuptr[n] = nu
                n += 1
            elif c == _P_COMMIT:
                cop[n] = _WAIT
                cipc[n] = ipc
                cwk[n] = _K_COMMIT
                ccost[n] = 0.0
                cspan[n] = -1
                chptr[n] = nh
                if streams:
                    cuptr[n] = nu
                for q in range(committed, npost):
                    h = posted[q]
                    if h & 1:
                        waited[msg_key[h >> 1]] = 1
                    ch[nh] = h
                    nh += 1
                committed = npost
                n += 1
            else:                                      # WAIT
                cop[n] = _WAIT
                cipc[n] = ipc
                cwk[n] = _K_WAIT
                ccost[n] = 0.0
                cspan[n] = -1
                chptr[n] = nh
                if streams:
                    cuptr[n] = nu
                for j in range(mptr[i], mptr[i + 1]):
                    k = mkey[j]
                    m = -1 if k < 0 else key_msg[k]
                    h = -1 if m < 0 else 2 * m + mside[j]
                    if (h < 0 or hindex[h] < 0 or hindex[h] >= ipc
                            or (msrc[j] if mside[j] == 0 else mdst[j]) != r):
                        err[0] = _E_WAIT_UNPOSTED
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    if h & 1:
                        waited[k] = 1
                    ch[nh] = h
                    nh += 1
                n += 1
        cop[n] = _WAIT                                  # END: everything posted
        cipc[n] = rptr[r + 1] - rptr[r]
        cwk[n] = _K_END
        ccost[n] = 0.0
        cspan[n] = -1
        chptr[n] = nh
        if streams:
            cuptr[n] = nu
        for q in range(npost):
            ch[nh] = posted[q]
            nh += 1
        n += 1
    crptr[P] = n
    chptr[n] = nh
    if streams:
        cuptr[n] = nu
    counts[0] = n
    counts[1] = nh
    counts[2] = nm
    counts[3] = nu


def _units(inp, r, first, last, m0, nu, posted, units, ugroup):
    """Split one launch's handles ``posted[first:last]`` into per-stream units (streams
    in order of their first handle; the launch's units are the new ids, in order);
    returns the new unit count. Unit u's handles are ``unit_h[unit_hptr[u]:unit_hptr[u+1]]``
    (``unit_hptr[nu]`` is kept at the end; the caller allocates it zeroed); ``m0``: the
    launch's first member (``inp.msrc``/``inp.mdst``/``inp.mside``: each member's peer
    rank is the side it is not)."""
    P, stream_mode, msrc, mdst, mside = (inp.ranks, inp.stream_mode, inp.msrc, inp.mdst,
                                         inp.mside)
    unit_stream, unit_hptr, unit_h, hunit = (units.unit_stream, units.unit_hptr,
                                             units.unit_h, units.hunit)
    start = unit_hptr[nu]
    ng = 0
    for q in range(first, last):
        j = m0 + q - first
        sid = r if stream_mode == _S_PER_RANK else P + r * P + (mdst[j] if mside[j] == 0
                                                                 else msrc[j])
        g = -1
        for x in range(ng):
            if ugroup[x] == sid:
                g = x
        if g < 0:
            ugroup[ng] = sid
            ng += 1
    pos = start
    for x in range(ng):
        sid = ugroup[x]
        unit_stream[nu] = sid
        unit_hptr[nu] = pos
        for q in range(first, last):
            j = m0 + q - first
            s2 = r if stream_mode == _S_PER_RANK else P + r * P + (mdst[j] if mside[j] == 0
                                                                    else msrc[j])
            if s2 == sid:
                h = posted[q]
                unit_h[pos] = h
                hunit[h] = nu
                pos += 1
        nu += 1
    unit_hptr[nu] = pos
    return nu

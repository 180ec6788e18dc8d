"""The simulator's inner loops, written once for two executors: CPython runs them over
Python lists (the pure engine), numba compiles them over numpy arrays (the fast engine,
:mod:`schedsim.sim.fast`, used when numba is installed and the program is large).

So they use only what both understand: integers, floats, indexable sequences allocated by
the caller, lists of tuples for the event heap, no dicts, sets, closures or exceptions
(an error is returned as a code and a location). Times that are not known yet are -1.0
(every real time is >= 0).

Compiled code (see :mod:`schedsim.sim.compile`) is one array per field over all ranks'
steps, rank r's steps at ``crptr[r]:crptr[r+1]``; step ``pc`` is a :class:`Step`:

- ``COMPUTE``: occupies the rank for ``ccost[pc]``, records span ``cspan[pc]``; under
  ``data`` semantics its handles ``ch[chptr[pc]:chptr[pc+1]]`` are the messages it sends
  (activated when it ends);
- ``LAUNCH``: one launch (a bare post or a ``BATCH``) of handles ``ch[...]``; with comm
  streams, units ``cuptr[pc]`` to ``cuptr[pc+1]-1``; ``cinit[pc] >= 0`` names the rank pair
  whose communicator this bare post creates under lazy init;
- ``WAIT``: blocks until every handle ``ch[...]`` completed (``WAIT``, ``COMMIT``,
  ``END``, ``DATA``).

Message m has send handle 2m and recv handle 2m+1.
"""
from __future__ import annotations

from enum import IntEnum
from heapq import heappop, heappush


class Step(IntEnum):
    """Opcodes of compiled code."""

    COMPUTE = 0
    LAUNCH = 1
    WAIT = 2


class WaitKind(IntEnum):
    """What a recorded wait was (``Timeline.waits[].kind``)."""

    WAIT = 0
    COMMIT = 1
    END = 2
    DATA = 3
    INIT = 4


class Err(IntEnum):
    """Error codes of :func:`compile_comm_kernel` (formatted by :mod:`schedsim.sim.compile`)."""

    OK = 0
    NO_MESSAGE = 1      # a post names a message that does not exist
    LOCAL = 2           # a post moves a same-rank hand-off
    POST = 3            # posted by the wrong rank, or twice
    SEND_EARLY = 4      # a send before its data was made on this rank
    NEED = 5            # a compute op uses a cross-rank input not received and waited
    WAIT_UNPOSTED = 6   # a WAIT names an op this rank has not posted before


_COMPUTE = 0
_LAUNCH = 1
_WAIT = 2
_K_WAIT = 0
_K_COMMIT = 1
_K_END = 2
_K_INIT = 4


# -- compile ---------------------------------------------------------------------------
def compile_comm_kernel(P, rptr, code, mptr, mkey, mside, mowner, mlocal, mpeer, aptr, a_in,
                        a_out, icost, ispan, stream_mode, key_msg, msg_key, hindex, hseq,
                        made_rank, waited, posted, cop, cipc, cwk, ccost, cspan, chptr, ch,
                        cuptr, crptr, unit_stream, unit_hptr, unit_h, hunit, ugroup,
                        counts, err):
    """One pass over every rank's instructions (ranks in order, each in program order):
    resolve posts to messages (created on first sight, from either side), check the comm
    rules, emit compiled code. Returns nothing; ``err[0]`` is an :class:`Err` code
    (``err[1:4]`` = rank, instruction, member or atom index) and ``counts`` = (steps,
    handles in code, messages, units).

    Inputs per instruction ``i``: ``code`` (Opcode), members ``mptr[i]:mptr[i+1]``
    (``mkey``: key id or -1 when no such message; ``mside``: 0 send / 1 recv;
    ``mowner``: the rank that must issue it; ``mlocal``: 1 for a same-rank hand-off;
    ``mpeer``: the other side's rank), compute atoms ``aptr[i]:aptr[i+1]`` (``a_in``: key
    of the cross-rank input or -1, ``a_out``: key of the output or -1), ``icost``,
    ``ispan``. ``stream_mode``: 0 none, 1 per-peer, 2 per-rank.
    """
    n = 0       # steps emitted
    nh = 0      # handles emitted in code
    nm = 0      # messages
    nu = 0      # units
    for r in range(P):
        crptr[r] = n
        npost = 0            # handles posted so far by this rank (posted[0:npost])
        committed = 0
        for i in range(rptr[r], rptr[r + 1]):
            c = code[i]
            ipc = i - rptr[r]
            if c == 1 or c == 2:                       # POST / BATCH: one launch
                cop[n] = _LAUNCH
                cipc[n] = ipc
                ccost[n] = 0.0
                cspan[n] = -1
                chptr[n] = nh
                first = npost
                for j in range(mptr[i], mptr[i + 1]):
                    k = mkey[j]
                    if k < 0:
                        err[0] = 1
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    m = key_msg[k]
                    if m < 0:
                        if mlocal[j]:
                            err[0] = 2
                            err[1] = r
                            err[2] = ipc
                            err[3] = j
                            return
                        m = nm
                        key_msg[k] = m
                        msg_key[m] = k
                        nm += 1
                    h = 2 * m + mside[j]
                    if mowner[j] != r or hindex[h] >= 0:
                        err[0] = 3
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    hindex[h] = ipc
                    hseq[h] = npost
                    if mside[j] == 0 and made_rank[k] != r:
                        err[0] = 4
                        err[1] = r
                        err[2] = ipc
                        err[3] = j
                        return
                    posted[npost] = h
                    npost += 1
                    ch[nh] = h
                    nh += 1
                cuptr[n] = nu
                if stream_mode != 0:
                    nu = _units(r, P, stream_mode, first, npost, posted, mptr[i], mpeer, nu,
                                unit_stream, unit_hptr, unit_h, hunit, ugroup)
                n += 1
            elif c == 0:                               # COMPUTE
                for a in range(aptr[i], aptr[i + 1]):
                    k = a_in[a]
                    if k >= 0 and not waited[k]:
                        err[0] = 5
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
                ccost[n] = icost[i]
                cspan[n] = ispan[i]
                chptr[n] = nh
                cuptr[n] = nu
                n += 1
            elif c == 4:                               # COMMIT
                cop[n] = _WAIT
                cipc[n] = ipc
                cwk[n] = _K_COMMIT
                ccost[n] = 0.0
                cspan[n] = -1
                chptr[n] = nh
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
                cuptr[n] = nu
                for j in range(mptr[i], mptr[i + 1]):
                    k = mkey[j]
                    m = -1 if k < 0 else key_msg[k]
                    h = -1 if m < 0 else 2 * m + mside[j]
                    if h < 0 or hindex[h] < 0 or hindex[h] >= ipc or mowner[j] != r:
                        err[0] = 6
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
        cuptr[n] = nu
        for q in range(npost):
            ch[nh] = posted[q]
            nh += 1
        n += 1
    crptr[P] = n
    chptr[n] = nh
    cuptr[n] = nu
    counts[0] = n
    counts[1] = nh
    counts[2] = nm
    counts[3] = nu


def _units(r, P, stream_mode, first, last, posted, m0, mpeer, nu, unit_stream, unit_hptr,
           unit_h, hunit, ugroup):
    """Split one launch's handles ``posted[first:last]`` into per-stream units (streams
    in order of their first handle; the launch's units are the new ids, in order);
    returns the new unit count. Unit u's handles are ``unit_h[unit_hptr[u]:unit_hptr[u+1]]``
    (``unit_hptr[nu]`` is kept at the end; the caller allocates it zeroed)."""
    start = unit_hptr[nu]
    ng = 0
    for q in range(first, last):
        sid = r if stream_mode == 2 else P + r * P + mpeer[m0 + q - first]
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
            s2 = r if stream_mode == 2 else P + r * P + mpeer[m0 + q - first]
            if s2 == sid:
                h = posted[q]
                unit_h[pos] = h
                hunit[h] = nu
                pos += 1
        nu += 1
    unit_hptr[nu] = pos
    return nu


# -- run -------------------------------------------------------------------------------
_ACT = 0      # work item: handle x becomes active at time t
_XFER = 1     # work item: message x is ready to move at time t
_DONE = 2     # work item: handle x completes at time t


def run_kernel(P, crptr, cop, ccost, cspan, chptr, ch, cuptr, cinit, hunit, unit_stream,
               unit_hptr, unit_h, mlat, mocc, mlink, meager, data_mode, strict, launch_cost,
               lazy_init, init_cost, sstart, send, hpost, hact, hdone, mstart, marr, pcs,
               times, reach, wrec, wt0, wt1, counts, sbusy, sfree, qhead, qtail, unext, uenq,
               udone, ucnt, waiter, wmax, wcnt, link_free, launched, pair_state, pair_rank,
               pair_t, wk_kind, wk_x, wk_t, ready):
    """Execute compiled code; fills the output arrays (see
    :class:`~schedsim.sim.engine.RunState`). ``counts[0]`` is the number of wait records
    ``wrec`` (step), ``wt0``/``wt1`` (reached, released); ``pair_*`` track lazy
    communicator inits (state 0 none, 1 one rank waiting: ``pair_rank`` since ``pair_t``,
    2 created); ``wk_*`` (the work stack) and ``ready`` are scratch.

    Event order. The heap holds (time, sequence number, event): a rank to resume, or
    (with ``strict``: finite bandwidth, so links serve transfers in time order) a transfer
    to start. Every rank starts at time 0, in rank order. A popped rank runs its program
    until it blocks: a compute step ends at ``t + cost`` (with ``strict`` the rank is
    re-queued at that time; else it just goes on); a launch activates its ops, or queues
    its units on their comm streams; a wait whose handles are not all complete makes the
    rank their waiter and stops it, and the completion of the last one re-queues it at
    the latest completion time. What a step sets off is worked off depth first before the
    next step: an activated op starts its transfer once both sides are active
    (rendezvous) or its send is (eager), a started transfer completes its send, then its
    recv; then the comm streams whose head unit completed start their next unit (the
    stream readied last first). Completion times are exact the moment a transfer starts,
    so a rank that runs ahead is never rolled back.
    """
    nrec = 0
    heap = [(0.0, r, r) for r in range(P)]
    seq = P
    sp = 0            # work stack depth
    nready = 0        # comm streams whose head unit completed
    r = -1            # the running rank (-1: none), at step pc and time t
    yielding = False  # strict: re-queue the running rank once its work is done
    pc = 0
    t = 0.0
    end = 0
    while True:
        # (a) work off activations, transfers and completions, depth first
        while sp > 0:
            sp -= 1
            x = wk_x[sp]
            tt = wk_t[sp]
            if wk_kind[sp] == _ACT:
                hact[x] = tt
                m = x >> 1
                tc = -1.0
                if x & 1 == 0:                       # a send: ready to move?
                    if meager[m]:
                        tc = tt
                    elif hact[x + 1] >= 0.0:
                        tc = tt if tt > hact[x + 1] else hact[x + 1]
                elif meager[m]:                      # an eager recv: data already here?
                    if marr[m] >= 0.0:
                        wk_kind[sp] = _DONE
                        wk_x[sp] = x
                        wk_t[sp] = marr[m] if marr[m] > tt else tt
                        sp += 1
                elif hact[x - 1] >= 0.0:             # a rendezvous recv: send active?
                    tc = tt if tt > hact[x - 1] else hact[x - 1]
                if tc >= 0.0:
                    if strict:                       # links are shared: in time order
                        heappush(heap, (tc, seq, -1 - m))
                        seq += 1
                    else:
                        wk_kind[sp] = _XFER
                        wk_x[sp] = m
                        wk_t[sp] = tc
                        sp += 1
            elif wk_kind[sp] == _XFER:               # start on the link (FIFO), complete
                m = x
                lk = mlink[m]
                s0 = link_free[lk] if link_free[lk] > tt else tt
                occ = mocc[m]
                link_free[lk] = s0 + occ
                arr = s0 + occ + mlat[m]
                mstart[m] = s0
                marr[m] = arr
                ra = hact[2 * m + 1]
                if not meager[m] or ra >= 0.0:       # the recv (done second)
                    wk_kind[sp] = _DONE
                    wk_x[sp] = 2 * m + 1
                    wk_t[sp] = arr if (not meager[m] or arr > ra) else ra
                    sp += 1
                wk_kind[sp] = _DONE                  # the send (done first)
                wk_x[sp] = 2 * m
                wk_t[sp] = s0 + occ if meager[m] else arr
                sp += 1
            else:                                    # handle x completes at tt
                hdone[x] = tt
                w = waiter[x]
                if w >= 0:
                    waiter[x] = -1
                    if tt > wmax[w]:
                        wmax[w] = tt
                    wcnt[w] -= 1
                    if wcnt[w] == 0:
                        heappush(heap, (wmax[w], seq, w))
                        seq += 1
                u = hunit[x]
                if u >= 0:
                    if tt > udone[u]:
                        udone[u] = tt
                    ucnt[u] -= 1
                    if ucnt[u] == 0:
                        ready[nready] = unit_stream[u]
                        nready += 1
        # (b) a comm stream whose head unit completed starts its next unit
        if nready > 0:
            nready -= 1
            s = ready[nready]
            u = sbusy[s]
            if u >= 0 and ucnt[u] == 0:
                sfree[s] = udone[u]
                sbusy[s] = -1
                nu = qhead[s]
                if nu >= 0:
                    qhead[s] = unext[nu]
                    sbusy[s] = nu
                    ts = uenq[nu] if uenq[nu] > udone[u] else udone[u]
                    for q in range(unit_hptr[nu + 1] - 1, unit_hptr[nu] - 1, -1):
                        wk_kind[sp] = _ACT
                        wk_x[sp] = unit_h[q]
                        wk_t[sp] = ts
                        sp += 1
            continue
        # (c) run the current rank until it blocks or sets work off
        if r >= 0:
            stop = False          # the rank blocked or yielded
            work = False          # a step set work off: do it before the next step
            if yielding:          # strict: a compute ended and its sends were set off
                heappush(heap, (t, seq, r))
                seq += 1
                yielding = False
                stop = True
            while pc < end and not stop and not work:
                op = cop[pc]
                if op == _COMPUTE:
                    e = t + ccost[pc]
                    sid = cspan[pc]
                    sstart[sid] = t
                    send[sid] = e
                    for q in range(chptr[pc + 1] - 1, chptr[pc] - 1, -1):   # data: sends
                        wk_kind[sp] = _ACT
                        wk_x[sp] = ch[q]
                        wk_t[sp] = e
                        sp += 1
                        work = True
                    t = e
                    pc += 1
                    if strict:            # yield, re-queued at t once the sends are set off
                        if work:
                            yielding = True
                        else:
                            heappush(heap, (t, seq, r))
                            seq += 1
                            stop = True
                elif op == _LAUNCH:
                    q = cinit[pc]
                    if lazy_init and q >= 0 and pair_state[q] != 2:
                        if pair_state[q] == 0:     # first of the pair: wait for the peer
                            pair_state[q] = 1
                            pair_rank[q] = r
                            pair_t[q] = t
                            reach[r] = t
                            stop = True
                            continue
                        tr = (t if t > pair_t[q] else pair_t[q]) + init_cost
                        pair_state[q] = 2          # the peer waits: both go on at tr
                        heappush(heap, (tr, seq, pair_rank[q]))
                        seq += 1
                        if tr > t:
                            wrec[nrec] = pc
                            wt0[nrec] = t
                            wt1[nrec] = tr
                            nrec += 1
                        t = tr
                    elif lazy_init and q >= 0 and reach[r] >= 0.0:   # resumed after init
                        if t > reach[r]:
                            wrec[nrec] = pc
                            wt0[nrec] = reach[r]
                            wt1[nrec] = t
                            nrec += 1
                        reach[r] = -1.0
                    if launch_cost > 0.0:           # the host is busy launching
                        if strict and not launched[r]:
                            launched[r] = 1         # resume at the launch's end, in order
                            heappush(heap, (t + launch_cost, seq, r))
                            seq += 1
                            stop = True
                            continue
                        if launched[r]:
                            launched[r] = 0
                        else:
                            t += launch_cost
                    for q in range(chptr[pc], chptr[pc + 1]):
                        hpost[ch[q]] = t
                    if cuptr[pc + 1] > cuptr[pc]:       # comm streams: queue the units
                        for u in range(cuptr[pc + 1] - 1, cuptr[pc] - 1, -1):
                            s = unit_stream[u]
                            uenq[u] = t
                            if sbusy[s] < 0 and qhead[s] < 0:
                                sbusy[s] = u
                                ts = t if t > sfree[s] else sfree[s]
                                for q in range(unit_hptr[u + 1] - 1, unit_hptr[u] - 1, -1):
                                    wk_kind[sp] = _ACT
                                    wk_x[sp] = unit_h[q]
                                    wk_t[sp] = ts
                                    sp += 1
                            else:
                                unext[u] = -1
                                if qhead[s] < 0:
                                    qhead[s] = u
                                else:
                                    unext[qtail[s]] = u
                                qtail[s] = u
                    else:
                        for q in range(chptr[pc + 1] - 1, chptr[pc] - 1, -1):
                            wk_kind[sp] = _ACT
                            wk_x[sp] = ch[q]
                            wk_t[sp] = t
                            sp += 1
                    work = sp > 0
                    pc += 1
                else:                                           # WAIT
                    cnt = 0
                    tmax = t
                    for q in range(chptr[pc], chptr[pc + 1]):
                        h = ch[q]
                        d = hdone[h]
                        if d < 0.0:
                            waiter[h] = r
                            cnt += 1
                        elif d > tmax:
                            tmax = d
                    if cnt > 0:
                        wcnt[r] = cnt
                        wmax[r] = tmax
                        if reach[r] < 0.0:
                            reach[r] = t
                        stop = True
                        continue
                    t0 = reach[r]
                    if t0 >= 0.0:
                        reach[r] = -1.0
                    else:
                        t0 = t
                    if tmax > t0:
                        wrec[nrec] = pc
                        wt0[nrec] = t0
                        wt1[nrec] = tmax
                        nrec += 1
                    t = tmax
                    pc += 1
            if stop or (pc >= end and not yielding):
                pcs[r] = pc
                times[r] = t
                r = -1
            continue
        # (d) the next event
        if len(heap) == 0:
            break
        tt, _, x = heappop(heap)
        if x < 0:                                   # a transfer (strict)
            wk_kind[0] = _XFER
            wk_x[0] = -1 - x
            wk_t[0] = tt
            sp = 1
        else:
            r = x
            pc = pcs[r]
            end = crptr[r + 1]
            t = tt
    counts[0] = nrec

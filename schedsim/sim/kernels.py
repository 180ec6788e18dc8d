"""The simulator's inner loops, written once for two executors: CPython runs them over
Python lists (the pure engine), numba compiles them over numpy arrays (the fast engine,
:mod:`schedsim.sim.fast`, used when numba is installed and the program is large).

So they use only what both understand: integers, floats, indexable sequences allocated by
the caller, lists of tuples for the event heap, no dicts, sets, closures or exceptions
(an error is returned as a code and a location). Times that are not known yet are -1.0
(every real time is >= 0).

Compiled code (see :mod:`schedsim.sim.compile`) is one array per field over all ranks'
steps, rank r's steps at ``crptr[r]:crptr[r+1]``; step ``pc`` is a
:class:`~schedsim.sim.opcodes.Step`:

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

from heapq import heappop, heappush

from schedsim.sim.opcodes import Step


# the opcodes as plain ints (what both executors compare fastest)
_COMPUTE = int(Step.COMPUTE)
_LAUNCH = int(Step.LAUNCH)
_WAIT = int(Step.WAIT)


# -- run -------------------------------------------------------------------------------
_ACT = 0      # work item: handle x becomes active at time t
_XFER = 1     # work item: message x is ready to move at time t
_DONE = 2     # work item: handle x completes at time t
_FIN = 3      # work item: handle x of an atomic group completes at time t (the group's)


def run_kernel(code, links, units, host, groups, out, scratch):
    """Execute compiled code (:class:`~schedsim.sim.compiled.Code`, with its
    :class:`~schedsim.sim.compiled.Links`, :class:`~schedsim.sim.compiled.Units` and
    :class:`~schedsim.sim.compiled.Host`; atomic :class:`~schedsim.sim.kernel_records.
    Groups`); fills ``out`` (:class:`~schedsim.sim.kernel_records.RunOut`, see
    :class:`~schedsim.sim.engine.RunState`) using ``scratch``
    (:class:`~schedsim.sim.kernel_records.RunScratch`). The records' fields are read into
    locals once, at the top (what numba compiles to nothing and CPython reads fastest).
    With a measured ``host.delay``, ``delay[pc]`` is host time spent before step pc
    (``delayed[r]``: the step whose delay rank r has spent); with a measured
    ``links.msend``, ``msend[m] >= 0`` is message m's sender completion after its
    transfer's start.

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

    One function on purpose (an exception to the 80-line rule, docs/architecture.md):
    compiled by numba, every helper call pays reference-count traffic on its ~20 array
    arguments; splitting activate -> transfer -> complete into helpers ran at 165 ns per
    step, this single loop with its explicit work stack at 46 ns (``inline='always'`` did
    not help; benchmarks/NOTES.md, section 1, item 3). The loop's parts are marked in
    the code: (a) the work stack, (b) comm streams starting their next unit, (c) the
    running rank's steps, (d) the next event from the heap.

    Atomic groups (``atomic``; :mod:`schedsim.sim.groups`): handle h is in group
    ``hgroup[h]`` (-1 none), group g's handles are ``gh[gptr[g]:gptr[g+1]]``; a message
    with ``matom[m]`` moves only once each of its grouped sides' group is *armed*, i.e.
    every member matched (both sides active; ``gpend`` counts the members not matched
    yet, ``gmax`` the latest match, ``garm`` the arm time), and a grouped handle
    completes when its whole group has (``gleft`` members not done, ``gfin`` their
    latest completion).
    """
    # the records' fields as locals: the one place the kernel unpacks them
    crptr, cop, ccost, cspan = code.crptr, code.cop, code.ccost, code.cspan
    chptr, ch, cuptr, cinit = code.chptr, code.ch, code.cuptr, code.cinit
    has_units = len(cuptr) > 0        # comm streams (else cuptr is empty)
    mlat, mocc, mlink, meager = links.mlat, links.mocc, links.mlink, links.meager
    msend, strict = links.msend, links.strict
    hunit, unit_stream, unit_hptr, unit_h = (units.hunit, units.unit_stream,
                                             units.unit_hptr, units.unit_h)
    launch_cost, lazy_init, init_cost = host.launch_cost, host.lazy_init, host.init_cost
    delay = host.delay
    atomic, hgroup, gptr, gh, matom = (groups.atomic, groups.hgroup, groups.gptr,
                                       groups.gh, groups.matom)
    sstart, send, hpost, hact, hdone = out.sstart, out.send, out.hpost, out.hact, out.hdone
    mstart, marr, pcs, times, reach = out.mstart, out.marr, out.pcs, out.times, out.reach
    wrec, wt0, wt1, sbusy = out.wrec, out.wt0, out.wt1, out.sbusy
    pair_state, pair_rank, pair_t = out.pair_state, out.pair_rank, out.pair_t
    sfree, qhead, qtail, unext = scratch.sfree, scratch.qhead, scratch.qtail, scratch.unext
    uenq, udone, ucnt, waiter = scratch.uenq, scratch.udone, scratch.ucnt, scratch.waiter
    wmax, wcnt, launched, delayed = (scratch.wmax, scratch.wcnt, scratch.launched,
                                     scratch.delayed)
    link_free, ready = scratch.link_free, scratch.ready
    wk_kind, wk_x, wk_t = scratch.wk_kind, scratch.wk_x, scratch.wk_t
    gpend, gmax, garm, gleft, gfin = (scratch.gpend, scratch.gmax, scratch.garm,
                                      scratch.gleft, scratch.gfin)
    P = len(crptr) - 1
    has_delay = len(delay) > 0
    has_msend = len(msend) > 0
    ACT, XFER, DONE, FIN = _ACT, _XFER, _DONE, _FIN   # locals: the fastest in CPython
    COMPUTE, LAUNCH = _COMPUTE, _LAUNCH
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
            if wk_kind[sp] == ACT:
                hact[x] = tt
                m = x >> 1
                tc = -1.0
                if atomic and matom[m]:              # an atomic group's member
                    if hact[x ^ 1] >= 0.0:           # matched now: arm its groups
                        tm = max(tt, hact[x ^ 1])
                        for y in range(2 * m, 2 * m + 2):
                            g = hgroup[y]
                            if g < 0:
                                continue
                            gmax[g] = max(gmax[g], tm)
                            gpend[g] -= 1
                            if gpend[g] > 0:
                                continue
                            garm[g] = gmax[g]
                            for q in range(gptr[g], gptr[g + 1]):   # who can move now
                                o = gh[q] ^ 1
                                go = hgroup[o]
                                if go >= 0 and garm[go] < 0.0:
                                    continue
                                ts = max(garm[g], garm[go] if go >= 0 else hact[o])
                                if strict:
                                    heappush(heap, (ts, seq, -1 - (o >> 1)))
                                    seq += 1
                                else:
                                    wk_kind[sp] = XFER
                                    wk_x[sp] = o >> 1
                                    wk_t[sp] = ts
                                    sp += 1
                elif x & 1 == 0:                     # a send: ready to move?
                    if meager[m]:
                        tc = tt
                    elif hact[x + 1] >= 0.0:
                        tc = max(hact[x + 1], tt)
                elif meager[m]:                      # an eager recv: data already here?
                    if marr[m] >= 0.0:
                        wk_kind[sp] = DONE
                        wk_x[sp] = x
                        wk_t[sp] = max(tt, marr[m])
                        sp += 1
                elif hact[x - 1] >= 0.0:             # a rendezvous recv: send active?
                    tc = max(hact[x - 1], tt)
                if tc >= 0.0:
                    if strict:                       # links are shared: in time order
                        heappush(heap, (tc, seq, -1 - m))
                        seq += 1
                    else:
                        wk_kind[sp] = XFER
                        wk_x[sp] = m
                        wk_t[sp] = tc
                        sp += 1
            elif wk_kind[sp] == XFER:               # start on the link (FIFO), complete
                m = x
                lk = mlink[m]
                s0 = max(tt, link_free[lk])
                occ = mocc[m]
                link_free[lk] = s0 + occ
                arr = s0 + occ + mlat[m]
                mstart[m] = s0
                marr[m] = arr
                ra = hact[2 * m + 1]
                if not meager[m] or ra >= 0.0:       # the recv (done second)
                    wk_kind[sp] = DONE
                    wk_x[sp] = 2 * m + 1
                    wk_t[sp] = arr if (not meager[m] or arr > ra) else ra
                    sp += 1
                wk_kind[sp] = DONE                   # the send (done first)
                wk_x[sp] = 2 * m
                wk_t[sp] = s0 + occ if meager[m] else arr
                if has_msend and msend[m] >= 0.0:      # a measured sender completion
                    wk_t[sp] = s0 + msend[m]
                sp += 1
            else:                                    # handle x completes at tt
                if atomic and wk_kind[sp] == DONE and hgroup[x] >= 0:
                    g = hgroup[x]                    # ... with its whole group
                    gfin[g] = max(gfin[g], tt)
                    gleft[g] -= 1
                    if gleft[g] == 0:
                        for q in range(gptr[g], gptr[g + 1]):
                            wk_kind[sp] = FIN
                            wk_x[sp] = gh[q]
                            wk_t[sp] = gfin[g]
                            sp += 1
                    continue
                hdone[x] = tt
                w = waiter[x]
                if w >= 0:
                    waiter[x] = -1
                    wmax[w] = max(wmax[w], tt)
                    wcnt[w] -= 1
                    if wcnt[w] == 0:
                        heappush(heap, (wmax[w], seq, w))
                        seq += 1
                u = hunit[x]
                if u >= 0:
                    udone[u] = max(udone[u], tt)
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
                    ts = max(udone[u], uenq[nu])
                    for q in range(unit_hptr[nu + 1] - 1, unit_hptr[nu] - 1, -1):
                        wk_kind[sp] = ACT
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
                if has_delay and delayed[r] != pc:    # measured host time before the step
                    delayed[r] = pc
                    d = delay[pc]
                    if d > 0.0:
                        if strict:          # resume after the host time, in time order
                            heappush(heap, (t + d, seq, r))
                            seq += 1
                            stop = True
                            continue
                        t += d
                op = cop[pc]
                if op == COMPUTE:
                    e = t + ccost[pc]
                    sid = cspan[pc]
                    sstart[sid] = t
                    send[sid] = e
                    for q in range(chptr[pc + 1] - 1, chptr[pc] - 1, -1):   # data: sends
                        wk_kind[sp] = ACT
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
                elif op == LAUNCH:
                    q = cinit[pc] if lazy_init else -1     # empty without lazy init
                    if lazy_init and q >= 0 and pair_state[q] != 2:
                        if pair_state[q] == 0:     # first of the pair: wait for the peer
                            pair_state[q] = 1
                            pair_rank[q] = r
                            pair_t[q] = t
                            reach[r] = t
                            stop = True
                            continue
                        tr = (max(pair_t[q], t)) + init_cost
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
                    if has_units and cuptr[pc + 1] > cuptr[pc]:    # queue the units
                        for u in range(cuptr[pc + 1] - 1, cuptr[pc] - 1, -1):
                            s = unit_stream[u]
                            uenq[u] = t
                            if sbusy[s] < 0 and qhead[s] < 0:
                                sbusy[s] = u
                                ts = max(sfree[s], t)
                                for q in range(unit_hptr[u + 1] - 1, unit_hptr[u] - 1, -1):
                                    wk_kind[sp] = ACT
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
                            wk_kind[sp] = ACT
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
            wk_kind[0] = XFER
            wk_x[0] = -1 - x
            wk_t[0] = tt
            sp = 1
        else:
            r = x
            pc = pcs[r]
            end = crptr[r + 1]
            t = tt
    out.counts[0] = nrec      # through the record: numba 0.68 lost the write to a local
    # bound before the loop and written only after it

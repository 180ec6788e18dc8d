"""Discrete-event simulator: Program + costs -> Timeline.

Model (DESIGN.md, "Comm semantics"): each rank's host runs its program in order; a compute
op occupies the rank for its cost; posting a send/recv does not block (launching a batch
costs ``CommModel.launch_cost`` of host time, 0 by default); ``WAIT``/``COMMIT``
block until the named ops complete; at the end of its program a rank waits for everything
it posted. Each directed link carries messages FIFO in the order they start, occupying the
link ``bytes/bandwidth`` and arriving ``latency`` later. Under ``eager`` a send completes
once its bytes have left and a recv at ``max(arrival, post)``; under ``rendezvous`` the
transfer starts once both sides are posted and both complete at arrival. With a comm
stream, a rank's launches (bare posts and batches) start one after another: a launch's
ops count as posted only when the launch reaches the head of its stream.

Algorithm: ranks run ahead until they block; completion times are exact as soon as a
transfer starts, so a blocked rank is resumed at the time its last awaited op completes.
Only when a link has finite bandwidth (a shared resource) are events processed strictly in
time order (compute ends and transfer starts go through the event heap), so that each link
serves transfers in the order they become ready. Everything terminates: when no event is
left and a rank has not finished, the program is deadlocked and
:mod:`schedsim.sim.deadlock` explains the wait-for cycle.
"""
from __future__ import annotations

from heapq import heappop, heappush

from schedsim.program.ir import Op
from schedsim.sim.compile import Compiled
from schedsim.sim.costs import CommModel
from schedsim.timeline import Message, Part, Span, Timeline, WaitRecord


class RunState:
    """Raw results of one run (arrays indexed by span, handle and message id)."""

    def __init__(self, cp: Compiled) -> None:
        nh = 2 * cp.num_messages
        self.sstart = [0.0] * len(cp.span_meta)
        self.send = [-1.0] * len(cp.span_meta)   # -1: never ran (deadlock)
        self.hpost: list[float | None] = [None] * nh
        self.hact: list[float | None] = [None] * nh
        self.hdone: list[float | None] = [None] * nh
        self.mstart: list[float | None] = [None] * cp.num_messages
        self.marr: list[float | None] = [None] * cp.num_messages
        self.pcs = [0] * len(cp.code)
        self.times = [0.0] * len(cp.code)
        self.reach: list[float | None] = [None] * len(cp.code)
        self.waits: list[tuple] = []
        self.stream_busy: dict[int, int] = {}
        self.stream_queue: dict[int, list[int]] = {}


def run(cp: Compiled) -> RunState:
    """Execute a compiled program; returns the raw :class:`RunState`."""
    st = RunState(cp)
    code = cp.code
    P = len(code)
    data_mode = cp.data_mode
    strict = any(o > 0 for o in cp.mocc)
    sstart, send_ = st.sstart, st.send
    hpost, hact, hdone = st.hpost, st.hact, st.hdone
    mstart, marr = st.mstart, st.marr
    meager, mlat, mocc, mlink = cp.meager, cp.mlat, cp.mocc, cp.mlink
    hunit, unit_handles, unit_stream = cp.hunit, cp.unit_handles, cp.unit_stream
    link_free = [0.0] * max(cp.num_links, 1)
    waiter = [-1] * len(hdone)
    wcnt = [0] * P
    wmax = [0.0] * P
    reach = st.reach
    pcs, times, waits = st.pcs, st.times, st.waits
    heap: list[tuple[float, int, int]] = []
    seq = 0
    # comm streams
    ucnt = [len(hs) for hs in unit_handles]
    udone = [0.0] * len(unit_handles)
    uenq = [0.0] * len(unit_handles)
    sbusy = st.stream_busy
    squeue = st.stream_queue
    sfree: dict[int, float] = {}
    ready_streams: list[int] = []
    launch_cost = cp.launch_cost
    msend = cp.msend
    delay = cp.delay            # measured host time before each instruction (or None)
    delayed = [-1] * P          # per rank: the code position whose delay has been spent
    launched = [False] * P

    streams = bool(unit_handles)
    if data_mode:   # implicit recvs are always posted
        for m in range(cp.num_messages):
            hact[2 * m + 1] = 0.0

    def set_done(h: int, td: float) -> None:
        nonlocal seq
        hdone[h] = td
        w = waiter[h]
        if w >= 0:
            waiter[h] = -1
            if td > wmax[w]:
                wmax[w] = td
            wcnt[w] -= 1
            if wcnt[w] == 0:
                heappush(heap, (wmax[w], seq, w))
                seq += 1
        if streams:
            u = hunit[h]
            if u >= 0:
                if td > udone[u]:
                    udone[u] = td
                ucnt[u] -= 1
                if ucnt[u] == 0:
                    ready_streams.append(unit_stream[u])

    def do_transfer(m: int, tc: float) -> None:
        lk = mlink[m]
        s = link_free[lk]
        if tc > s:
            s = tc
        occ = mocc[m]
        link_free[lk] = s + occ
        arr = s + occ + mlat[m]
        mstart[m] = s
        marr[m] = arr
        sd = None if msend is None else msend[m]      # a measured sender completion
        if meager[m]:
            set_done(2 * m, s + occ if sd is None else s + sd)
            ra = hact[2 * m + 1]
            if ra is not None:
                set_done(2 * m + 1, arr if arr > ra else ra)
        else:
            set_done(2 * m, arr if sd is None else s + sd)
            set_done(2 * m + 1, arr)

    def queue_transfer(m: int, tc: float) -> None:
        nonlocal seq
        heappush(heap, (tc, seq, ~m))
        seq += 1

    # a transfer whose conditions hold at tc: start it now, or (a link is a shared
    # resource) when the event loop reaches tc
    ready = queue_transfer if strict else do_transfer

    def activate(h: int, ta: float) -> None:
        hact[h] = ta
        m = h >> 1
        if h & 1 == 0:
            if meager[m]:
                ready(m, ta)
            else:
                ra = hact[h + 1]
                if ra is not None:
                    ready(m, ta if ta > ra else ra)
        else:
            if meager[m]:
                a = marr[m]
                if a is not None:
                    set_done(h, a if a > ta else ta)
            else:
                sa = hact[h - 1]
                if sa is not None:
                    ready(m, ta if ta > sa else sa)

    def start_unit(u: int, ts: float) -> None:
        sbusy[unit_stream[u]] = u
        for h in unit_handles[u]:
            activate(h, ts)

    def settle() -> None:
        while ready_streams:
            s = ready_streams.pop()
            u = sbusy.get(s, -1)
            if u < 0 or ucnt[u]:
                continue
            sfree[s] = udone[u]
            sbusy[s] = -1
            q = squeue.get(s)
            if q:
                nu = q.pop(0)
                ts = uenq[nu] if uenq[nu] > udone[u] else udone[u]
                start_unit(nu, ts)

    def enqueue(u: int, t: float) -> None:
        s = unit_stream[u]
        uenq[u] = t
        if sbusy.get(s, -1) < 0 and not squeue.get(s):
            f = sfree.get(s, 0.0)
            start_unit(u, t if t > f else f)
        else:
            squeue.setdefault(s, []).append(u)

    for r in range(P):
        heappush(heap, (0.0, seq, r))
        seq += 1
    while heap:
        t, _, x = heappop(heap)
        if x < 0:
            do_transfer(~x, t)
            if ready_streams:
                settle()
            continue
        r = x
        rc = code[r]
        n = len(rc)
        pc = pcs[r]
        while pc < n:
            ins = rc[pc]
            op = ins[0]
            if delay is not None and delayed[r] != pc:
                delayed[r] = pc
                d = delay[r][pc]
                if d:
                    if strict:          # resume after the host time, in time order
                        heappush(heap, (t + d, seq, r))
                        seq += 1
                        break
                    t += d
            if op == 0:
                end = t + ins[1]
                sid = ins[2]
                sstart[sid] = t
                send_[sid] = end
                for h in ins[4]:
                    activate(h, end)
                t = end
                pc += 1
                if strict:
                    heappush(heap, (t, seq, r))
                    seq += 1
                    break
            elif op == 1:
                if launch_cost:      # the host is busy launching the batch
                    if strict and not launched[r]:
                        launched[r] = True      # resume at the launch's end, in time order
                        heappush(heap, (t + launch_cost, seq, r))
                        seq += 1
                        break
                    if launched[r]:
                        launched[r] = False
                    else:
                        t += launch_cost
                hs = ins[1]
                for h in hs:
                    hpost[h] = t
                if ins[2]:
                    for u in ins[2]:
                        enqueue(u, t)
                    if ready_streams:
                        settle()
                else:
                    for h in hs:
                        activate(h, t)
                pc += 1
            else:
                cnt = 0
                tmax = t
                for h in ins[1]:
                    d = hdone[h]
                    if d is None:
                        waiter[h] = r
                        cnt += 1
                    elif d > tmax:
                        tmax = d
                if cnt:
                    wcnt[r] = cnt
                    wmax[r] = tmax
                    if reach[r] is None:
                        reach[r] = t
                    break
                t0 = reach[r]
                if t0 is not None:
                    reach[r] = None
                else:
                    t0 = t
                if tmax > t0:
                    waits.append((r, pc, ins[2], t0, tmax, ins[1]))
                t = tmax
                pc += 1
        pcs[r] = pc
        times[r] = t
    return st


def build_timeline(cp: Compiled, st: RunState, comm: CommModel, unit: str) -> Timeline:
    """Turn raw run results into a :class:`Timeline` (spans, messages, waits, summary)."""
    prog = cp.program
    pl = prog.placement
    chunk_of = pl.chunk_fn()
    sstart, send_ = st.sstart, st.send
    ran = [sid for sid, e in enumerate(send_) if e >= 0.0]   # deadlock: skip unreached ops
    meta = cp.span_meta

    def part(p: Op) -> Part:
        return Part(p.kind, p.mb, chunk_of(p.stage, p.mb), p.stage)

    spans = [Span(r, op.kind, op.mb, chunk_of(op.stage, op.mb), op.stage, sstart[sid],
                  send_[sid], idx, [part(p) for p in op.parts] if op.parts else None)
             for sid in ran for r, op, idx in (meta[sid],)]
    n = cp.num_messages
    hpost, hdone, hindex = st.hpost, st.hdone, cp.hindex
    if cp.data_mode:
        sposts, rposts = st.hact[0::2], [None] * n
    else:
        sposts, rposts = hpost[0::2], hpost[1::2]
    msgs = list(map(Message, [k[0] for k in cp.mkey], cp.msrc, cp.mdst,
                    [k[2] for k in cp.mkey], [k[1] for k in cp.mkey], cp.mbytes, sposts,
                    rposts, st.mstart, st.marr, hdone[0::2], hdone[1::2], hindex[0::2],
                    hindex[1::2]))
    waits = []
    for (r, pc, kind, t0, t1, hs) in st.waits:
        idx = cp.instr_index(r, pc)
        waits.append(WaitRecord(r, idx, kind, t0, t1, [cp.handle_token(h) for h in hs]))
    makespan, per_rank = Timeline.summarize(pl.ranks, spans)
    return Timeline(schedule=prog.name, ranks=pl.ranks, stages=pl.stages,
                    microbatches=prog.microbatches, semantics=comm.semantics,
                    comm_stream=comm.comm_stream, unit=unit, placement=pl.kind,
                    makespan=makespan, per_rank=per_rank, spans=spans, messages=msgs,
                    waits=waits, params=dict(prog.params))

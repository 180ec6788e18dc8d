"""The kernels' other records (besides the compiled program's, :mod:`schedsim.sim.
compiled`): what the event loop writes (:class:`RunOut`), its scratch
(:class:`RunScratch`), the atomic groups it reads (:class:`Groups`), and the compile pass's
input, tables and scratch (:class:`PassInput`, :class:`PassTables`,
:class:`PassScratch`).

Named tuples: frozen, built by keyword (no two same-typed arrays can be swapped by
position), and taken as they are by both executors (:mod:`schedsim.sim.fast`: numba
types a named tuple of arrays; CPython reads its fields). The arrays inside are the
kernels' outputs and scratch: the kernels write into them, never replace them.
"""

from typing import Any, NamedTuple

Arr = Any      # a numpy array (numba) or a list (CPython), allocated by the caller


class Groups(NamedTuple):
    """NCCL-like atomic groups (:mod:`schedsim.sim.groups`): handle h is in group
    ``hgroup[h]`` (-1 none); group g's handles are ``gh[gptr[g]:gptr[g+1]]``; message m
    with ``matom[m]`` moves only once its grouped sides' groups are armed. ``atomic``
    False: one-entry dummies."""

    atomic: bool
    hgroup: Arr
    gptr: Arr
    gh: Arr
    matom: Arr


class RunOut(NamedTuple):
    """What :func:`~schedsim.sim.kernels.run_kernel` writes (see
    :class:`~schedsim.sim.engine.RunState`): per span ``sstart``/``send``; per handle
    ``hpost``/``hact``/``hdone``; per message ``mstart``/``marr``; per rank ``pcs``
    (the next step, global), ``times``, ``reach``; the wait records ``wrec`` (step),
    ``wt0``/``wt1`` (reached, released), ``counts[0]`` of them; per stream ``sbusy``
    (the unit at its head, -1); lazy inits ``pair_state`` (0 none, 1 one rank waiting:
    ``pair_rank`` since ``pair_t``, 2 created)."""

    sstart: Arr
    send: Arr
    hpost: Arr
    hact: Arr
    hdone: Arr
    mstart: Arr
    marr: Arr
    pcs: Arr
    times: Arr
    reach: Arr
    wrec: Arr
    wt0: Arr
    wt1: Arr
    counts: Arr
    sbusy: Arr
    pair_state: Arr
    pair_rank: Arr
    pair_t: Arr


class RunScratch(NamedTuple):
    """The event loop's scratch: per stream ``sfree`` (when its last unit completed),
    ``qhead``/``qtail`` (its queue of units, linked by ``unext``); per unit ``uenq``
    (queued at), ``udone`` (latest completion), ``ucnt`` (handles not done); per handle
    ``waiter`` (the rank waiting for it, -1); per rank ``wmax``/``wcnt`` (its wait's
    latest completion and handles left), ``launched`` (its launch's host time spent),
    ``delayed`` (the step whose measured delay it spent); per link ``link_free``; the
    work stack ``wk_kind``/``wk_x``/``wk_t``; ``ready`` (streams whose head unit
    completed); per group ``gpend`` (members not matched), ``gmax`` (latest match),
    ``garm`` (arm time), ``gleft`` (members not done), ``gfin`` (their latest
    completion)."""

    sfree: Arr
    qhead: Arr
    qtail: Arr
    unext: Arr
    uenq: Arr
    udone: Arr
    ucnt: Arr
    waiter: Arr
    wmax: Arr
    wcnt: Arr
    launched: Arr
    delayed: Arr
    link_free: Arr
    wk_kind: Arr
    wk_x: Arr
    wk_t: Arr
    ready: Arr
    gpend: Arr
    gmax: Arr
    garm: Arr
    gleft: Arr
    gfin: Arr


class PassInput(NamedTuple):
    """The compile pass's input (:func:`~schedsim.sim.compile_kernel.
    compile_comm_kernel`): ``ranks``; ``stream_mode`` (a :class:`~schedsim.sim.opcodes.StreamMode`);
    per instruction (rank r's at ``rptr[r]:rptr[r+1]``) ``icode`` (its
    :class:`~schedsim.program.flat.Opcode`), members ``mptr[i]:mptr[i+1]``, atoms
    ``aptr[i]:aptr[i+1]``; per member ``mkey`` (key id, -1: no such
    message), ``mside`` (0 send, 1 recv), ``msrc``/``mdst`` (its message's source and
    destination ranks, as :class:`~schedsim.sim.prep.Prep` has them: the side's own rank
    is the one that must issue it, the other its peer; equal: a same-rank hand-off); per
    atom ``a_in``/``a_out`` (key of its cross-rank input / its output, -1); per compute
    instruction, in order (span id), ``scost``."""

    ranks: int
    stream_mode: int
    rptr: Arr
    icode: Arr
    mptr: Arr
    mkey: Arr
    mside: Arr
    msrc: Arr
    mdst: Arr
    aptr: Arr
    a_in: Arr
    a_out: Arr
    scost: Arr


class PassTables(NamedTuple):
    """The compile pass's message tables: per key id ``key_msg`` (its message, -1),
    ``made_rank`` (where its data was made, -1), ``waited`` (its recv waited); per
    message ``msg_key``, ``msg_src``/``msg_dst``; per handle ``hindex``/``hseq``
    (instruction index and posting order of its post, -1) and ``hord`` (its k on its
    directed link; ``link_posts`` counts them per link and side)."""

    key_msg: Arr
    msg_key: Arr
    msg_src: Arr
    msg_dst: Arr
    made_rank: Arr
    waited: Arr
    hindex: Arr
    hseq: Arr
    hord: Arr
    link_posts: Arr


class PassScratch(NamedTuple):
    """The compile pass's scratch and result: ``posted`` (the running rank's handles, in
    posting order), ``ugroup`` (a launch's streams), ``counts`` (steps, handles in code,
    messages, units) and ``err`` (an :class:`~schedsim.sim.opcodes.Err` code, then rank,
    instruction, member or atom index)."""

    posted: Arr
    ugroup: Arr
    counts: Arr
    err: Arr

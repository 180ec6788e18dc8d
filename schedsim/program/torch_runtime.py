"""The ``torch`` lowering policy: a compute schedule run the way torch 2.13's
``torch.distributed.pipelining`` runs it.

``torch`` (torch 2.13, ``torch/distributed/pipelining/schedules.py``), as torch runs the
schedule:

- a one-stage-per-rank schedule whose order is 1F1B's (and m >= p, which torch's
  ``Schedule1F1B`` requires) runs ``Schedule1F1B._step_microbatches``: warmup forwards
  wait their recv, post their send and wait the previous send; the last warmup send is
  batched with the first backward's recv; in steady state each backward's send is batched
  with the next forward's recv and each forward's send with the next backward's recv,
  every batch waited at once; cooldown backwards wait their recv and the previous send.
  Reproduces ``tests/data/refs/torch/Schedule1F1B_pp4_mb8.json`` token for token;
- a one-stage-per-rank schedule whose order is GPipe's runs
  ``ScheduleGPipe._step_microbatches``: every op posts and waits its recv, posts its send;
  forward sends are waited after the last forward, backward sends at the end;
- every other schedule runs as ``_PipelineScheduleRuntime``: comm actions are placed by
  ``_add_send_recv`` (a lock-step sweep over the ranks in which a rank's next action is
  taken once its input was produced; the producer's SEND goes right after it and the
  consumer's RECV is appended to the consumer's list at that moment), with the FSDP and
  grad-reduction bookkeeping actions torch inserts (``UNSHARD``/``RESHARD``, max 3 active
  stages; ``REDUCE_GRAD`` after a stage's last backward) occupying their sweep steps;
  each RECV is waited right before the op that consumes it; an ``OVERLAP_F_B`` action
  (an ``FB`` op) runs as its two sub-actions in turn -- the forward's RECV waited, the
  forward run, the backward's RECV waited, the backward run -- unless a custom function
  is registered for it (``overlap_f_b=True``: both RECVs waited, forward first, then one
  overlapped ``FB``, as torchtitan's ``dual_pipe_v.overlap_callback`` does); at the end
  of the step every SEND is waited, last posted first (the runtime pops its ``send_ops``
  list), one ``WAIT`` per SEND action. With ``defer_pp_recv=True`` (torch's
  ``_defer_recv_ops``) each RECV is moved down to just before the op that consumes it,
  except that a rank whose peer has a higher rank posts the RECVs from that peer before
  its next SEND to it (torch's rank-parity rule against crossed sends).

Launches are as torch issues them (``_batch_p2p``): a list of sends only or recvs only is
launched op by op (bare posts), a mixed list as one ``BATCH[...]``.

Not modelled: the P2P warm-up ``_initialize_pp_stages`` runs on a schedule's *first* step
only (the stages' forward/backward vote over blocking ``send``/``recv``, or for other
stage types ``_get_init_p2p_neighbors_ops`` + ``_batch_p2p``); a program here is one
steady-state step, which torch runs without it.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from schedsim.errors import ScheduleError
from schedsim.program.comm_plan import has_backward, lowered, op_recvs, op_sends
from schedsim.program.flat import FlatProgram, Opcode
from schedsim.program.flat_build import FlatBuilder
from schedsim.program.ir import Comm, Op, Placement, Program, Schedule
from schedsim.program.ops import recv_comm, send_comm
from schedsim.program.routing import consumer_stage, produces, route


# -- torch ----------------------------------------------------------------------------
def lower_torch(schedule: Schedule, *, overlap_f_b: bool = False,
                defer_pp_recv: bool = False) -> Program:
    """The ``torch`` policy (module docstring).

    ``overlap_f_b``: a custom function is registered for ``OVERLAP_F_B`` (each ``FB`` op
    stays one overlapped op). ``defer_pp_recv``: the runtime's ``defer_pp_recv=True``.
    Raises :class:`ScheduleError` if the schedule cannot be lowered (an op waits for data
    no rank ever produces first), or for ``defer_pp_recv`` on a schedule torch runs as
    ``Schedule1F1B``/``ScheduleGPipe`` (they have no such option).
    """
    runtime = torch_runtime_kind(schedule)
    if runtime != "runtime" and defer_pp_recv:
        raise ScheduleError(f"torch policy: defer_pp_recv is an option of torch's "
                            f"_PipelineScheduleRuntime; this schedule runs as torch's "
                            f"Schedule{runtime}, which has none")
    if runtime in ("1F1B", "GPipe"):
        b = FlatBuilder()
        run = _run_1f1b if runtime == "1F1B" else _run_gpipe
        for r in range(schedule.placement.ranks):
            run(schedule, r, b)
            b.end_rank()
        return lowered(schedule, b.build())
    rows = add_send_recv(schedule)
    if defer_pp_recv:
        rows = defer_recv_ops(schedule.placement, rows)
    return lowered(schedule, runtime_flat(schedule.placement, rows, overlap_f_b=overlap_f_b))


def torch_actions(schedule: Schedule, *, overlap_f_b: bool = False,
                  defer_pp_recv: bool = False) -> list[list[Op | Comm]] | None:
    """torch's own action list of ``schedule`` with its comms (what
    ``_PipelineScheduleRuntime.pipeline_order_with_comms`` holds and ``_dump_csv(...,
    format="compute_comms")`` writes): compute actions, an ``FB`` op kept as one
    ``OVERLAP_F_B`` action whether or not a custom function runs it (``overlap_f_b`` only
    changes how the runtime executes it), and the SEND/RECV actions of ``_add_send_recv``
    (moved by ``defer_pp_recv``). None when torch runs the schedule as ``Schedule1F1B`` or
    ``ScheduleGPipe``, which build no action list with comms. Raises
    :class:`ScheduleError` as :func:`lower_torch`."""
    del overlap_f_b                  # the action list is the same; only its execution differs
    if torch_runtime_kind(schedule) != "runtime":
        return None
    rows = add_send_recv(schedule)
    return defer_recv_ops(schedule.placement, rows) if defer_pp_recv else rows


def torch_runtime_kind(schedule: Schedule) -> str:
    """Which torch executor runs ``schedule``: ``1F1B`` (``Schedule1F1B``), ``GPipe``
    (``ScheduleGPipe``) or ``runtime`` (``_PipelineScheduleRuntime``)."""
    pl, p, m = schedule.placement, schedule.placement.ranks, schedule.microbatches
    if pl.kind != "loop" or pl.stages != p:
        return "runtime"
    rows = schedule.ranks
    if m >= p and all(rows[r] == _run_1f1b(schedule, r, None) for r in range(p)):
        return "1F1B"
    if all(rows[r] == [Op("F", r, i) for i in range(m)] + [Op("BW", r, i) for i in range(m)]
           for r in range(p)):
        return "GPipe"
    return "runtime"


class _Run:
    """Writes one rank's instructions into a :class:`FlatBuilder` with torch's batch/wait
    helpers (``out`` None: only its compute order); ``ops``: its compute ops, in order."""

    def __init__(self, schedule: Schedule, rank: int, out: FlatBuilder | None) -> None:
        self.pl, self.r, self.out = schedule.placement, rank, out
        self.s = rank                      # one stage per rank
        self.bw = has_backward(schedule)
        self.ops: list[Op] = []

    def recv(self, kind: str, mb: int) -> list[Comm]:
        return op_recvs(Op(kind, self.s, mb), self.r, self.pl)[:1]

    def send(self, kind: str, mb: int) -> list[Comm]:
        return op_sends(Op(kind, self.s, mb), self.r, self.pl, self.bw)

    def post(self, comms: list[Comm]) -> list[Comm]:
        """torch's ``_batch_p2p``: an all-send or all-recv list is launched op by op
        (``dist.isend``/``dist.irecv``, to avoid head-of-line blocking), a mixed list as
        one ``batch_isend_irecv``."""
        if self.out is None:
            return comms
        if len({c.is_send for c in comms}) > 1:
            self.out.comm_instr(Opcode.BATCH, comms)
        else:
            for c in comms:
                self.out.comm_instr(Opcode.POST, (c,))
        return comms

    def wait(self, comms: list[Comm]) -> None:
        if comms and self.out is not None:
            self.out.comm_instr(Opcode.WAIT, comms)

    def compute(self, kind: str, mb: int) -> None:
        op = Op(kind, self.s, mb)
        self.ops.append(op)
        if self.out is not None:
            self.out.compute(op)


def _run_1f1b(schedule: Schedule, rank: int, out: FlatBuilder | None) -> list[Op]:
    """``Schedule1F1B._step_microbatches`` for one rank (see module docstring), written
    into ``out`` (None: not written); returns the rank's compute ops."""
    x, m = _Run(schedule, rank, out), schedule.microbatches
    warmup = min(m, schedule.placement.stages - rank)
    f = b = 0
    send_work: list[Comm] = []
    fwd_sends: list[Comm] = []
    for _ in range(warmup):
        x.wait(x.post(x.recv("F", f)))
        x.compute("F", f)
        x.wait(send_work)
        fwd_sends = x.send("F", f)
        if f != warmup - 1:
            send_work = x.post(fwd_sends)
        f += 1
    while True:
        x.wait(x.post(fwd_sends + x.recv("BW", b)))
        x.compute("BW", b)
        bwd_sends = x.send("BW", b)
        b += 1
        if f == m:
            break
        x.wait(x.post(bwd_sends + x.recv("F", f)))
        x.compute("F", f)
        fwd_sends = x.send("F", f)
        f += 1
    send_work = x.post(bwd_sends)
    while b < m:
        x.wait(x.post(x.recv("BW", b)))
        x.compute("BW", b)
        x.wait(send_work)
        send_work = x.post(x.send("BW", b))
        b += 1
    x.wait(send_work)
    return x.ops


def _run_gpipe(schedule: Schedule, rank: int, out: FlatBuilder) -> list[Op]:
    """``ScheduleGPipe._step_microbatches`` for one rank (see module docstring), written
    into ``out``; returns the rank's compute ops."""
    x, m = _Run(schedule, rank, out), schedule.microbatches
    for kind in ("F", "BW"):
        sends: list[list[Comm]] = []
        for i in range(m):
            x.wait(x.post(x.recv(kind, i)))
            x.compute(kind, i)
            sends.append(x.post(x.send(kind, i)))
        for s in sends:
            x.wait(s)
    return x.ops


# torch's bookkeeping actions, kept only as placeholders that take a sweep step
_BOOKKEEPING = "bookkeeping"


def torch_bookkeeping(ops: Sequence[Op], microbatches: int,
                      max_active_stages: int = 3) -> list[Op | str]:
    """One rank's compute list with torch's ``UNSHARD``/``RESHARD`` (``_add_unshard_reshard``)
    and ``REDUCE_GRAD`` (``_add_reduce_grad``) actions inserted as placeholder strings.

    Only their positions matter here: in ``_add_send_recv`` each takes one sweep step.
    """
    n = len(ops)
    # rest[i]: the distinct stages of ops[i:] in order of first appearance when there are
    # fewer than max_active_stages of them (then torch's scan below reads to the end and
    # returns exactly these); None when there are more (then scan, it stops early)
    rest: list[list[int] | None] = [None] * (n + 1)
    rest[n] = []
    for i in range(n - 1, -1, -1):
        nxt = rest[i + 1]
        if nxt is None:
            continue
        cur = [a.stage for a in ops[i].atoms()]
        cur = list(dict.fromkeys(cur + nxt))
        rest[i] = cur if len(cur) < max_active_stages else None

    def stages_ahead(i: int) -> list[int]:
        if rest[i] is not None:
            return rest[i]
        seen: list[int] = []
        for op in ops[i:]:
            for a in op.atoms():
                if a.stage not in seen:
                    seen.append(a.stage)
                    if op.kind != "FB" and len(seen) == max_active_stages:
                        return seen
            if op.kind == "FB" and len(seen) >= max_active_stages:
                return seen
        return seen

    out: list[Op | str] = []
    active: set[int] = set()
    done: dict[int, int] = defaultdict(int)
    for i, op in enumerate(ops):
        ahead = stages_ahead(i)
        for s in [s for s in active if s not in ahead]:
            active.discard(s)
            out.append(_BOOKKEEPING)                 # RESHARD
        for s in ahead:
            if s not in active:
                active.add(s)
                out.append(_BOOKKEEPING)             # UNSHARD
        out.append(op)
        for a in op.atoms():                         # torch counts W and full B
            if a.kind in ("W", "BW"):
                done[a.stage] += 1
                if done[a.stage] == microbatches:
                    out.append(_BOOKKEEPING)         # REDUCE_GRAD
    out.extend(_BOOKKEEPING for _ in active)         # final RESHARDs
    return out


def add_send_recv(schedule: Schedule) -> list[list[Op | Comm]]:
    """torch's ``_add_send_recv`` on ``schedule`` (with its bookkeeping placeholders):
    per rank, compute ops and SEND/RECV comms in the order torch's runtime issues them.

    Raises :class:`ScheduleError` naming the stuck ranks if no rank can make progress.
    """
    pl = schedule.placement
    S = pl.stages
    rank_of = pl.rank_fn()
    queues = [torch_bookkeeping(ops, schedule.microbatches) for ops in schedule.ranks]
    heads = [0] * len(queues)
    out: list[list[Op | Comm]] = [[] for _ in queues]
    have: list[set] = [set() for _ in queues]     # ops done and comms placed, per rank

    def ready(r: int, a: Op) -> bool:
        # torch's _ready_to_schedule: the input was received, or made by the previous
        # stage on this rank (the V turn-around)
        if a.kind == "F":
            return (a.stage == 0 or Comm("RECV_F", a.stage, a.mb) in have[r]
                    or Op("F", a.stage - 1, a.mb) in have[r])
        if a.kind in ("B", "BW"):
            return (a.stage == S - 1 or Comm("RECV_B", a.stage, a.mb) in have[r]
                    or Op("B", a.stage + 1, a.mb) in have[r]
                    or Op("BW", a.stage + 1, a.mb) in have[r])
        return True

    left = sum(len(q) for q in queues)
    while left:
        progress = False
        for r, q in enumerate(queues):
            if heads[r] >= len(q):
                continue
            act = q[heads[r]]
            if isinstance(act, Op):
                if not all(ready(r, a) for a in act.atoms()):
                    continue
                out[r].append(act)
                for a in act.atoms():
                    have[r].add(a)
                    for c in _comm_pairs(a, S, rank_of):
                        send, recv, dst = c
                        out[r].append(send)
                        have[r].add(send)
                        out[dst].append(recv)
                        have[dst].add(recv)
            heads[r] += 1
            left -= 1
            progress = True
        if not progress:
            stuck = ", ".join(f"rank {r} at {q[heads[r]]}" for r, q in enumerate(queues)
                              if heads[r] < len(q))
            raise ScheduleError(f"torch policy: cannot place sends/recvs, every rank waits "
                                f"for an input no rank produces first ({stuck})")
    return out


def _comm_pairs(a: Op, S: int, rank_of) -> list[tuple[Comm, Comm, int]]:
    """(send, recv, receiving rank) for atom ``a``'s output if it crosses ranks
    (torch's ``_has_comms``/``_get_comms``)."""
    key = produces(a)
    if key is None or not 0 <= consumer_stage(key) < S:
        return []
    src, dst = route(key, rank_of)
    if src == dst:
        return []
    return [(send_comm(key), recv_comm(key), dst)]


def defer_recv_ops(placement: Placement, rows: list[list[Op | Comm]]) -> list[list[Op | Comm]]:
    """torch's ``_defer_recv_ops`` (``defer_pp_recv=True``) on compute+comm rows: each RECV
    is held back until the op that consumes it, or -- when this rank is lower than the
    RECV's peer -- until this rank's next SEND to that peer, whichever comes first (held
    RECVs flushed in the order they were posted). Raises :class:`ScheduleError` for a RECV
    no later op consumes (torch asserts the same)."""
    rank_of = placement.rank_fn()
    out: list[list[Op | Comm]] = []
    for r, acts in enumerate(rows):
        new: list[Op | Comm] = []
        held: dict[Comm, int] = {}           # held RECV -> the rank it comes from
        for act in acts:
            if isinstance(act, Comm):
                src, dst = route(act.message_key(), rank_of)
                if not act.is_send:
                    held[act] = src
                    continue
                if r < dst:                  # the lower rank posts its RECVs first
                    for c in [c for c, peer in held.items() if peer == dst]:
                        new.append(c)
                        del held[c]
            else:
                for c in op_recvs(act, r, placement):
                    if c in held:
                        new.append(c)
                        del held[c]
            new.append(act)
        if held:
            raise ScheduleError(f"torch policy (defer_pp_recv): rank {r} posts "
                                f"{', '.join(map(str, held))} but no later op consumes it")
        out.append(new)
    return out


def runtime_flat(placement: Placement, rows: list[list[Op | Comm]], *,
                 overlap_f_b: bool = False) -> FlatProgram:
    """The program of torch's ``_PipelineScheduleRuntime._step_microbatches`` for
    compute+comm action rows, as arrays: SEND and RECV are launched where they stand;
    each compute op waits the RECVs posted for its input right before it runs (an ``FB``
    op: each of its two parts in turn, or both then the overlapped pair with
    ``overlap_f_b``); at the end every SEND is waited, the last one posted first."""
    out = FlatBuilder()
    for r, acts in enumerate(rows):
        posted: set[Comm] = set()
        sends: list[Comm] = []

        def wait_inputs(op: Op) -> None:
            waits = [c for c in op_recvs(op, r, placement) if c in posted]
            posted.difference_update(waits)
            if waits:
                out.comm_instr(Opcode.WAIT, waits)

        for act in acts:
            if isinstance(act, Comm):
                out.comm_instr(Opcode.POST, (act,))
                (sends.append if act.is_send else posted.add)(act)
            elif act.kind == "FB" and not overlap_f_b:
                for part in act.parts:       # OVERLAP_F_B without a custom function
                    wait_inputs(part)
                    out.compute(part)
            else:
                for part in act.atoms():
                    wait_inputs(part)
                out.compute(act)
        for c in reversed(sends):
            out.comm_instr(Opcode.WAIT, (c,))
        out.end_rank()
    return out.build()

"""The ZB-V heuristic: zero bubble with a V-shaped placement of two chunks per rank.

Source: Qi et al., "Pipeline Parallelism with Controllable Memory" (2024) Section 4 and
the ZB-V schedule of "Zero Bubble Pipeline Parallelism" (ICLR 2024, Section 6 of the
arXiv version); algorithm as in sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py`` (``PipelineGraph.
try_v_schedule`` and ``create_schedule``), re-implemented here.

Each rank s holds chunk 0 (layer group s) and chunk 1 (layer group 2p-1-s): a microbatch's
forward runs down chunk 0 of ranks 0..p-1 and back up chunk 1 of ranks p-1..0; its input
gradient (``B``) runs the V the other way. Passes are indexed here by *leg*: ``F`` leg 0 is
chunk 0 and ``F`` leg 1 chunk 1; ``B`` leg 0 is chunk 1 (it starts at rank 0 after the
loss) and ``B`` leg 1 chunk 0. Leg 0 passes wait for rank s-1, leg 1 passes for rank s+1
(plus the per-hop comm cost); ``W`` waits only for its ``B`` on the same rank.

Phases: (1) warm-up forwards on chunk 0 until the first chunk-1 forward comes back, under
the memory limit; (2) ranks below take forwards alternately from both chunks until they
have as many as the rank above; (3) 2m rounds, each placing one ``B`` and then one ``F``
per rank, deferring ``W`` passes into gaps where the rank would wait for its input (and
flushing them when memory requires), with a per-rank bubble budget. The whole plan is
repeated with the previous run's per-rank bubbles as "approved" budgets while the worst
rank's bubble keeps shrinking, for each of the four ``fill_b``/``fill_f`` switches; the
smallest worst bubble wins (first one on ties).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import product

from schedsim.errors import ScheduleError

F, B, W = 0, 1, 2
#: which switch lets :meth:`_VPlanner.fill` put a W into a budgeted gap
FILL_F, FILL_B, ALWAYS = 0, 1, 2


class InfeasibleV(Exception):
    """The plan cannot proceed (memory limit, or a pass whose input never comes)."""


@dataclass
class VProblem:
    """Inputs: ranks, microbatches, per-chunk-pass costs ``(F, B, W)``, per-hop comm cost,
    memory deltas per chunk pass and the per-rank limit (same unit; default limit
    ``2 x ranks`` chunk forwards = p microbatches, the 1F1B peak, and the authors'
    default)."""

    ranks: int
    microbatches: int
    cost: tuple[float, float, float]
    comm: float = 0.0
    mem: tuple[float, float, float] = (2, -1, -1)
    max_mem: float | None = None


@dataclass
class VPlan:
    """``order[r]``: rank r's passes as ``(kind, leg, mb)`` in execution order;
    ``bubble[r]``: planned idle time after the rank's first forward; ``worst``: max."""

    order: list[list[tuple[int, int, int]]]
    bubble: list[float]
    worst: float


class _VPlanner:
    """One plan (``try_v_schedule`` without its recursion): the state of the walk -- per
    rank its clock, memory, planned bubble, deferred ``W`` passes and passes placed -- and
    the three phases as methods (:meth:`warmup`, :meth:`catch_up`, :meth:`rounds`)."""

    def __init__(self, pb: VProblem, fill_f: bool, fill_b: bool,
                 approved: list[float] | None) -> None:
        n, m = self.n, self.m = pb.ranks, pb.microbatches
        self.cost, self.comm, self.md = pb.cost, pb.comm, pb.mem
        self.limit = pb.max_mem if pb.max_mem is not None else pb.mem[F] * n * 2
        self.fill_f, self.fill_b = fill_f, fill_b
        self.used = [False, False]        # fill_f / fill_b tested (see fill)
        # flat end-time table indexed like the authors' (kind, leg, rank, mb) ids, so
        # that "no producer" (-1) reads the last entry, exactly as their code does
        self.nm = n * m
        self.end = [-1.0] * (6 * n * m)
        self.count = [[0] * 6 for _ in range(n)]    # passes placed per (kind, leg)
        self.cur = [0.0] * n
        self.mem = [0.0] * n
        self.bubble = [0.0] * n
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(n)]
        self.order: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        self.approved = approved if approved is not None else [-1.0] * n
        self.top_approved = max(self.approved)

    def key(self, k: int, leg: int, s: int, mb: int) -> int:
        return ((k * 2 + leg) * self.n + s) * self.m + mb

    def budget(self, s: int) -> float:
        return max(max(self.bubble), self.top_approved - self.approved[s])

    def place(self, k: int, leg: int, s: int) -> None:
        """Place rank s's next pass of kind k on ``leg`` as early as the rank and its
        inputs allow. Inputs: the same-rank predecessor (F leg 0 -> F leg 1 -> B leg 0
        -> B leg 1; W after its B) and, for F/B, the cross-rank producer (leg 0: rank
        s-1, leg 1: rank s+1) plus the comm cost. Raises :class:`InfeasibleV`."""
        j = k * 2 + leg             # the (kind, leg) index; table ids are j*n*m + s*m + mb
        cnt = self.count[s]
        mb = cnt[j]
        if mb >= self.m:
            raise InfeasibleV(f"rank {s} has no {'FBW'[k]} left on leg {leg}")
        mem = self.mem[s] + self.md[k]
        if mem > self.limit:
            raise InfeasibleV(f"rank {s} would exceed the memory limit")
        c = self.cost[k]
        t = packed = self.cur[s] + c
        end, m, nm = self.end, self.m, self.nm
        here = s * m + mb
        prev = (2 + leg) * nm + here if k == W else (j - 1) * nm + here if j else -1
        if prev >= 0 and end[prev] < 0:
            raise InfeasibleV(f"rank {s}: {'FBW'[k]} leg {leg} mb {mb} before its input")
        if k != W:
            src = None
            if leg == 1:
                if s < self.n - 1:
                    src = end[j * nm + here + m]
            elif s > 0:
                src = end[j * nm + here - m]
            if src is not None:
                if src < 0:
                    raise InfeasibleV(f"rank {s} would run {'FB'[k]} of mb {mb} before its "
                                      f"input is planned")
                x = src + self.comm + c
                if x > t:
                    t = x
        if cnt[0] > 0:
            self.bubble[s] += t - packed
        end[j * nm + here] = t
        self.cur[s] = t
        self.mem[s] = mem
        self.order[s].append((k, leg, mb))
        if k == B:
            self.pending[s].append((leg, mb))
        cnt[j] += 1

    def place_w(self, s: int) -> None:
        if not self.pending[s]:
            raise InfeasibleV(f"rank {s} exceeds the memory limit")
        leg, _ = self.pending[s].popleft()
        self.place(W, leg, s)

    def make_room(self, s: int, k: int) -> None:
        """Run deferred W passes until a pass of kind k fits in memory."""
        while self.mem[s] + self.md[k] > self.limit:
            self.place_w(s)

    def fill(self, s: int, src_id: int, switch: int) -> None:
        """Defer-W rule before a pass whose input is ``end[src_id]`` (-1: none).
        ``switch``: whether a W may go into the budgeted gap: :data:`ALWAYS`, or the
        plan's ``fill_f`` (:data:`FILL_F`) or ``fill_b`` (:data:`FILL_B`); a switch
        whose gap was tested is recorded in ``used`` (a plan that never tested one is the
        same plan with that switch flipped)."""
        end, pending, comm = self.end, self.pending, self.comm
        while pending[s] and src_id >= 0 and end[src_id] + comm >= self.cur[s] + self.cost[W]:
            self.place_w(s)
        if pending[s] and end[src_id] + comm - self.cur[s] > self.budget(s) - self.bubble[s]:
            if switch != ALWAYS:
                self.used[switch] = True
            if switch == ALWAYS or (self.fill_f, self.fill_b)[switch]:
                self.place_w(s)

    def warmup(self) -> None:
        """(1) forwards on chunk 0 until chunk 1's first forward comes back."""
        n, count = self.n, self.count
        for s in range(n):
            self.place(F, 0, s)
        for s in range(n - 1, -1, -1):
            if s == n - 1:
                self.place(F, 1, s)
                continue
            back = self.end[self.key(F, 1, s + 1, 0)] + self.comm
            while (self.mem[s] + self.md[F] * (2 + s * 2) <= self.limit
                   and self.cur[s] + self.cost[F] <= back and count[s][0] < self.m):
                for j in range(s + 1):
                    self.place(F, 0, j)
            self.place(F, 1, s)

    def catch_up(self) -> None:
        """(2) lower ranks take forwards alternately from both chunks until they have as
        many as the rank above."""
        n, m, count = self.n, self.m, self.count
        leg = 0
        guard = 4 * n * m + 8
        for s in range(1, n):
            while (count[s][0] + count[s][1] < count[s - 1][0] + count[s - 1][1]
                   or count[s][1] <= count[s - 1][1] < m):
                guard -= 1
                if guard < 0:
                    raise InfeasibleV("warm-up does not converge")
                for j in range(n - 1, s - 1, -1):
                    if count[j][leg] < m:
                        self.place(F, leg, j)
                leg = 1 - leg

    def backward_round(self) -> None:
        """One B per rank: leg 1 (ranks top down) where its input is planned, else leg 0."""
        n, count, end, key = self.n, self.count, self.end, self.key
        for s in range(n):
            self.make_room(s, B)
        b_leg0, b_leg1 = [], []
        for s in range(n):
            if count[s][3] >= count[s][2]:
                b_leg0.append(s)
            elif s == n - 1:
                b_leg1.append(s)
            elif end[key(B, 1, s + 1, count[s][3])] >= 0 or count[s][2] >= self.m:
                b_leg1.append(s)
            else:
                b_leg0.append(s)
        for s, lg in [(s, 1) for s in reversed(b_leg1)] + [(s, 0) for s in b_leg0]:
            src = -1
            if lg == 1 and s < n - 1:
                src = key(B, 1, s + 1, count[s][3])
            if lg == 0 and s > 0:
                src = key(B, 0, s - 1, count[s][2])
            self.fill(s, src, ALWAYS if lg == 1 else FILL_B)
            self.place(B, lg, s)

    def next_forward_leg(self, s: int) -> int | None:
        """Which leg rank s runs its next F on (None: no input is planned yet)."""
        count, end, key = self.count, self.end, self.key
        if count[s][1] >= count[s][0]:
            return 0
        if s == self.n - 1 or end[key(F, 1, s + 1, count[s][1])] >= 0:
            return 1
        if count[s][0] < self.m and (s == 0 or end[key(F, 0, s - 1, count[s][0])] >= 0):
            return 0
        return None

    def forward_round(self) -> None:
        """One F per rank that has one left and an input planned."""
        n, count, key = self.n, self.count, self.key
        for s in range(n):
            if count[s][1] >= self.m:
                continue
            nxt = self.next_forward_leg(s)
            if nxt is None:
                continue
            self.make_room(s, F)
            src = -1
            if nxt == 0 and s > 0:
                src = key(F, 0, s - 1, count[s][0])
            if nxt == 1 and s < n - 1:
                src = key(F, 1, s + 1, count[s][1])
            self.fill(s, src, FILL_F)
            self.place(F, nxt, s)

    def run(self) -> VPlan:
        self.warmup()
        self.catch_up()
        for _ in range(2 * self.m):          # (3) steady state and cooldown
            self.backward_round()
            self.forward_round()
        for s in range(self.n):
            while self.pending[s]:
                self.place_w(s)
        return VPlan(self.order, self.bubble, max(self.bubble))


class _Tries:
    """Plans by ``(fill_f, fill_b, approved)``, each run once: a plan that never tested
    a switch (:meth:`_VPlanner.fill`) is also the plan, or the same error, with that
    switch flipped (the walk is the same step for step), so it is kept for those keys
    too. An exact shortcut: the four variants of :func:`zbv_plan` often share runs."""

    def __init__(self, pb: VProblem) -> None:
        self.pb = pb
        self.done: dict[tuple, VPlan | InfeasibleV] = {}

    def __call__(self, fill_f: bool, fill_b: bool, approved: list[float] | None) -> VPlan:
        """One plan (``try_v_schedule`` without its recursion). Raises InfeasibleV."""
        key = (fill_f, fill_b, None if approved is None else tuple(approved))
        out = self.done.get(key)
        if out is None:
            planner = _VPlanner(self.pb, fill_f, fill_b, approved)
            try:
                out = planner.run()
            except InfeasibleV as e:
                out = e
            used_f, used_b = planner.used
            for ff in ((fill_f,) if used_f else (True, False)):
                for fb in ((fill_b,) if used_b else (True, False)):
                    self.done.setdefault((ff, fb, key[2]), out)
        if isinstance(out, InfeasibleV):
            raise out
        return out


def _refined(tries: _Tries, fill_f: bool, fill_b: bool) -> VPlan:
    """A plan re-run with its own per-rank bubbles as approved budgets while the worst
    bubble strictly shrinks (the authors' recursion, unrolled)."""
    best = tries(fill_f, fill_b, None)
    while True:
        nxt = tries(fill_f, fill_b, best.bubble)
        if nxt.worst < best.worst:
            best = nxt
        else:
            return best


def zbv_plan(pb: VProblem) -> VPlan:
    """The ZB-V order: best of ``fill_b`` x ``fill_f`` in {True, False} (authors' order,
    first on ties). Raises :class:`ScheduleError` if no variant is feasible."""
    best: VPlan | None = None
    why = ""
    tries = _Tries(pb)
    for fill_b, fill_f in product((True, False), repeat=2):
        try:
            plan = _refined(tries, fill_f, fill_b)
        except InfeasibleV as e:
            why = str(e)
            continue
        if best is None or plan.worst < best.worst:
            best = plan
    if best is None:
        lim = (pb.max_mem if pb.max_mem is not None else pb.mem[F] * pb.ranks * 2) / pb.mem[F]
        raise ScheduleError(
            f"zbv: the ZB-V heuristic finds no plan for {pb.ranks} ranks x "
            f"{pb.microbatches} microbatches under a limit of {lim:g} chunk forwards "
            f"({lim / 2:g} M_B): {why}; raise --mem-limit (the default, ranks, is the "
            f"authors' setting)")
    return best

"""Reserved bytes per rank: the tensor-level stream of :mod:`schedsim.workload.tensors`
walked over one run's ops (each rank's ops in time order) through the caching allocator
model (:class:`~schedsim.workload.allocator.CachingAllocator`, capacity the GPU's HBM).

The static blocks and receive buffers are allocated once; then the step's stream runs
again and again with the allocator's cache carried over, as a training loop does (its
segments stay cached across steps), until a step leaves the cache as it found it (at most
``steps``), and the peaks are over all of them: what ``torch.cuda.max_memory_reserved()``
reads in the steady state. Each step ends with the optimizer's step (its moments created
at the first, as ``torch.optim`` does) and then the next step's start frees the sharded gradients (``zero_grad``) and what torch
pipelining kept (``clear_runtime_states``). A request that does not fit
even after the cache is released is out of memory: the rank does not fit, the failed
request is recorded (:class:`ReservedMemory` ``oom_*``) and the rank's peaks are those
of the same stream replayed without a capacity, so reserved never reads below allocated.

Per stage the microbatches' kept tensors and W-stashes are matched FIFO (a stage runs
its backwards in its forwards' order). Units: bytes. Plain Python + numpy.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedsim.workload.hardware import DTYPE_BYTES
from schedsim.workload.allocator import CachingAllocator, OutOfMemory
from schedsim.workload.tensors import _B, _BW, _F, _FB, _W, MAX_EVENTS, StageBlocks, _split, stage_blocks


@dataclass(frozen=True)
class ReservedMemory:
    """One rank's allocator figures (bytes), all from one replay of the rank's stream, so
    ``peak_reserved >= peak_allocated >= peak_requested``: ``peak_reserved`` (segments),
    ``peak_allocated`` (blocks handed out), ``peak_requested`` (the tensors' bytes as
    asked: the aggregated model's peak), ``segments`` (at the end), ``oom``, ``steps``
    (the steps run) and ``end_requested`` (the bytes still allocated after the last step:
    the static blocks and receive buffers alone, every step's block being freed).

    ``oom``: a request fitted in no cached block and no new segment within the HBM, even
    after the cache was released; ``oom_step`` (1-based; 0: in the static blocks and receive
    buffers, before the first step), ``oom_request`` (bytes asked),
    ``oom_reserved`` and ``oom_allocated`` (at that moment) say where. The peaks are then
    those of the same stream replayed without a capacity: what the steps would reserve and
    allocate (the capped replay stops at the failed request, so its peaks would count part
    of the stream only)."""

    peak_reserved: float
    peak_allocated: float
    peak_requested: float
    segments: int
    oom: bool
    steps: int = 0
    end_requested: float = 0.0
    oom_step: int = 0
    oom_request: float = 0.0
    oom_reserved: float = 0.0
    oom_allocated: float = 0.0


class _Rank:
    """One rank's walk: the allocator and the per-stage state."""

    def __init__(self, a: CachingAllocator, blocks: list[StageBlocks]) -> None:
        self.a, self.blocks = a, blocks
        self.kept: dict[int, deque] = {}
        self.stash: dict[int, deque] = {}
        self.gathered: dict[int, dict[int, list[int | None]]] = {}    # stage -> unit ->
        self.grads: dict[int, dict[int, list[int | None]]] = {}       # blocks
        self.retained: list[int] = []
        self.moments: list[float] = []          # created at the first optimizer step
        self._units: dict[tuple[int, int, float], list[float]] = {}

    def malloc(self, size: float, stream: int = 0) -> int | None:
        return self.a.malloc(int(size + 0.5), stream) if size >= 1 else None

    def free(self, hs: Any) -> None:
        for h in hs:
            if h is not None:
                self.a.free(h)

    def _unit(self, s: int, u: int, total: float) -> list[float]:
        """Unit ``u``'s blocks of stage ``s``'s ``total`` (in its weights' proportions)."""
        key = (s, u, total)
        if key not in self._units:
            sb = self.blocks[s]
            sums = tuple(float(sum(x)) for x in sb.units)
            self._units[key] = (_split(_split(total, sums)[u], sb.units[u]) if total > 0
                                else [])
        return self._units[key]

    def gather(self, s: int, u: int) -> None:
        """FSDP2's all-gather of unit ``u`` at its first forward."""
        parts = self._unit(s, u, self.blocks[s].gathered)
        if parts:
            flat = self.malloc(sum(parts), 1)
            self.gathered[s][u] = [self.malloc(x) for x in parts]
            self.free([flat])

    def make_grads(self, s: int, u: int) -> None:
        self.grads[s][u] = [self.malloc(x) for x in self._unit(s, u, self.blocks[s].grads)]

    def forward(self, s: int) -> None:
        sb, first = self.blocks[s], s not in self.gathered
        if first:
            self.gathered[s] = {}
        u = len(sb.units) - len(sb.layers) - bool(sb.head)     # 1 with the embedding
        if first and u:
            self.gather(s, 0)
        layers: list[list[Any]] = []
        cur = self.malloc(sb.layers[0].first if sb.layers else   # the stage's input
                          sb.head[0] if sb.head else sb.output)
        for j, L in enumerate(sb.layers):
            if first:
                self.gather(s, u + j)
            kept, temps = [cur], []
            for size, keep in L.fwd:
                (kept if keep else temps).append(self.malloc(size))
            nxt = (sb.layers[j + 1].first if j + 1 < len(sb.layers) else
                   sb.head[0] if sb.head else sb.output)
            cur = self.malloc(nxt)
            self.free(temps)
            layers.append(kept)
        head = []
        if sb.head:
            if first:
                self.gather(s, len(sb.units) - 1)
            head = [cur] + [self.malloc(x) for x in sb.head[1:-1]]
            temps = [self.malloc(x) for x in sb.loss_fwd]
            head += [self.malloc(sb.head[-1])] if len(sb.head) > 1 else []
            self.free(temps)
        elif cur is not None:
            self.retained.append(cur)         # the output torch pipelining keeps
        self.kept.setdefault(s, deque()).append((layers, head))

    def backward(self, s: int, split: bool) -> None:
        sb = self.blocks[s]
        first = s not in self.grads
        if first:
            self.grads[s] = {}
        layers, head = self.kept[s].popleft()
        stash = []
        if first:                 # every unit's, in the backward's order
            for u in range(len(sb.units) - 1, -1, -1):
                self.make_grads(s, u)
        if sb.head:
            self.free([self.malloc(x) for x in sb.loss])
            for i, h in enumerate(head):
                (self.retained.append(h) if i == sb.keep_logits else self.free([h]))
        for j in range(len(sb.layers) - 1, -1, -1):
            L = sb.layers[j]
            rc = [self.malloc(x) for x in L.recomputed]
            gr = [self.malloc(x) for x in L.grads]
            wg = [self.malloc(x) for x in L.wgrads]
            self.free(gr), self.free(wg), self.free(rc), self.free(layers[j])
            if split:
                stash.append(self.malloc(L.stash))
        if split:
            stash.append(self.malloc(sb.head_stash))
            self.stash.setdefault(s, deque()).append(stash)
        self.retained.append(self.malloc(sb.input_grad))

    def last_backward(self, s: int) -> None:
        """The stage's last backward ended: torch pipelining runs each FSDP unit's
        ``post_backward`` (units in forward order): the reduce-scatter's output, the
        unit's sharded gradients, one flat block on the reduce-scatter stream (stream 2),
        the unsharded gradients and the gathered weights freed. FSDP2's
        ``foreach_reduce`` allocates that output in the reduce-scatter stream and keeps
        it as the sharded gradients (pytorch/pytorch
        ``torch/distributed/_composable/fsdp/_fsdp_collectives.py`` @01d66d2: "The RS
        output is allocated in the RS stream and used in the default stream (for
        optimizer)"; the same in ``torch/distributed/fsdp/_fully_shard/``), so its
        segments serve that stream alone."""
        grads, gathered = self.grads.pop(s, {}), self.gathered.get(s, {})
        sb = self.blocks[s]
        for u in range(len(sb.units)):
            self.free(grads.pop(u, []))
            self.retained.append(self.malloc(sum(self._unit(s, u, sb.sharded)), 2))
            self.free(gathered.pop(u, []))
        self.gathered[s] = {}

    def optimizer_step(self) -> None:
        """The optimizer's step: its moments at the first (``torch.optim.AdamW``'s lazy
        state). Its foreach temporaries (a shard-sized fp32 list) are not in the byte
        model, so not here either."""
        for v in self.moments:
            self.malloc(v)
        self.moments = []

    def step_end(self) -> None:
        """The next step's start: ``zero_grad`` frees the sharded gradients, torch
        pipelining's ``clear_runtime_states`` the kept outputs and input gradients."""
        self.free(self.retained)
        for held in (self.gathered, self.grads):
            for units in held.values():
                for blocks in units.values():
                    self.free(blocks)
            held.clear()
        self.retained, self.kept, self.stash = [], {}, {}


def _static(r: _Rank, d: Any, q: int, stages: list[int]) -> None:
    """Rank ``q``'s static bytes, one block a weight matrix of each state, and receive
    buffers, allocated before the first step; the optimizer's moments are left for
    :meth:`_Rank.optimizer_step` (torch.optim creates them at the first ``step()``).
    FSDP2's sharded gradients (static without PP) are on the reduce-scatter stream, as
    :meth:`_Rank.last_backward` says."""
    w, x = d.workload, d.static[q]
    sb = [r.blocks[s] for s in stages]
    mats = tuple(v for b in sb for unit in b.units for v in unit) or (1.0,)
    master = DTYPE_BYTES[w.master_dtype] if w.master_dtype != w.params_dtype else 0
    states, per = (2, 8.0) if w.optimizer == "adam" else (1, 4.0)
    moments = x.optimizer * per / (master + per)
    rs = 2 if w.framework == "torchtitan" and w.zero == 3 else 0   # FSDP2's sharded grads
    for part, stream in ((x.params, 0), (x.grads, rs), (x.unsharded, 0),
                         (x.optimizer - moments, 0)):
        for v in _split(part, mats):
            r.malloc(v, stream)
    r.moments = _split(moments / states, mats) * states
    msg = d.stage_model.message_bytes() or 0.0
    if d.recv_bytes[q] > 0 and msg > 0:
        n = max(1, int(round(d.recv_bytes[q] / msg)))
        for _ in range(n):
            r.malloc(d.recv_bytes[q] / n)


def step_events(blocks: list[StageBlocks], kind: Any, stage: Any, bkind: Any,
                bstage: Any) -> int:
    """The allocator events (allocations and frees) of one step of :func:`reserved_run`
    over these op columns, counted from the blocks before it runs (the static blocks,
    once, excluded)."""
    fwd = np.array([2 * (1 + sum(len(L.fwd) + 1 for L in b.layers) + len(b.head)
                         + len(b.loss_fwd)) for b in blocks], dtype=np.int64)
    bwd = np.array([2 * (2 + len(b.loss) + len(b.head)
                         + sum(len(L.recomputed) + len(L.grads) + len(L.wgrads) + 2
                               for L in b.layers)) for b in blocks], dtype=np.int64)
    once = sum(8 * sum(len(u) for u in b.units) for b in blocks)
    kind, stage = np.asarray(kind, dtype=np.int64), np.asarray(stage, dtype=np.int64)
    bkind, bstage = np.asarray(bkind, dtype=np.int64), np.asarray(bstage, dtype=np.int64)
    k = np.where(kind == _FB, bkind, kind)
    s = np.where(kind == _FB, bstage, stage)
    n = int(fwd[stage[(kind == _F) | (kind == _FB)]].sum())
    n += int(bwd[s[(k == _B) | (k == _BW)]].sum()) + 2 * int(np.count_nonzero(k == _W))
    return n + once


def reserved_run(d: Any, ranks: int, rank: Any, kind: Any, stage: Any, bkind: Any,
                 bstage: Any, start: Any, end: Any, steps: int = 8,
                 expandable: bool = False) -> list[ReservedMemory] | None:
    """Per rank, the :class:`ReservedMemory` of ``d``'s stream over the ops given as
    columns (as :func:`schedsim.workload.run.byte_levels` takes them: ``kind``/``stage``
    the op or an FB's forward, ``bkind``/``bstage`` its backward part, ``start``/``end``
    times or any numbers in each rank's op order); ``steps``: the most steps run (fewer
    when a step leaves the cache as the one before: reserved, its peak, the segments and
    the releases unchanged, and no more than :data:`~schedsim.workload.tensors.MAX_EVENTS`
    allow: :func:`step_events`, counted before it runs); None when they allow fewer than
    two steps (the first step's cache is not yet the steady state's: the optimizer's
    moments are made at its end). ``expandable``: the allocator's expandable
    segments."""
    blocks = stage_blocks(d)
    per_step = max(1, step_events(blocks, kind, stage, bkind, bstage))
    steps = min(steps, MAX_EVENTS // per_step)
    if steps < 2:
        return None
    rank, kind, stage = (np.asarray(x, dtype=np.int64) for x in (rank, kind, stage))
    bkind, bstage = np.asarray(bkind, dtype=np.int64), np.asarray(bstage, dtype=np.int64)
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    cap = int(d.workload.gpu.hbm_bytes)
    out = []
    for q in range(ranks):
        ops = np.flatnonzero(rank == q)
        ops = ops[np.lexsort((end[ops], start[ops]))]
        # per stage, the op that ends its last backward
        last: dict[int, int] = {}
        for i in ops:
            for k, s in ((kind[i], stage[i]), (bkind[i], bstage[i])):
                if k in (_B, _W, _BW) and (s not in last or end[i] >= end[last[s]]):
                    last[int(s)] = int(i)
        stages_q = sorted({int(s) for s in stage[ops]})

        cols = (kind, stage, bkind, bstage)
        a, ran, e = _replay(d, blocks, q, ops, cols, last, stages_q, steps, cap, expandable)
        if e is None:
            out.append(ReservedMemory(float(a.peak_reserved), float(a.peak_allocated),
                                      float(a.peak_requested), a.segments, False, ran,
                                      float(a.requested)))
            continue
        # out of memory: the peaks of the whole stream (uncapped), the failure beside them
        u, uran, _ = _replay(d, blocks, q, ops, cols, last, stages_q, steps, None,
                             expandable)
        out.append(ReservedMemory(float(u.peak_reserved), float(u.peak_allocated),
                                  float(u.peak_requested), u.segments, True, uran,
                                  float(u.requested), ran, float(e.request),
                                  float(e.reserved), float(e.allocated)))
    return out


def _replay(d: Any, blocks: list[StageBlocks], q: int, ops: Any, cols: tuple[Any, ...],
            last: dict[int, int], stages: list[int], steps: int, capacity: int | None,
            expandable: bool) -> tuple[CachingAllocator, int, OutOfMemory | None]:
    """Rank ``q``'s static blocks, then up to ``steps`` steps of its ``ops`` (indices into
    ``cols`` = kind, stage, bkind, bstage; ``last``: per stage the op ending its last
    backward) through one allocator of ``capacity``; returns it, the steps begun and the
    :class:`OutOfMemory` that stopped it (None)."""
    kind, stage, bkind, bstage = cols
    a = CachingAllocator(capacity, expandable)
    r = _Rank(a, blocks)
    ran = 0
    try:
        _static(r, d, q, stages)
        seen = None
        for _ in range(steps):
            ran += 1
            for i in ops:
                _run_op(r, int(kind[i]), int(stage[i]), int(bkind[i]), int(bstage[i]))
                for s in {int(stage[i]), int(bstage[i])}:
                    if last.get(s) == i:
                        r.last_backward(s)
            r.optimizer_step()
            r.step_end()
            now = (a.peak_reserved, a.reserved, a.segments, a.releases)
            if now == seen:          # the cache reached its steady state
                break
            seen = now
    except OutOfMemory as e:
        return a, ran, e
    return a, ran, None


def _run_op(r: _Rank, kind: int, stage: int, bkind: int, bstage: int) -> None:
    if kind in (_F, _FB):
        r.forward(stage)
    k, s = (bkind, bstage) if kind == _FB else (kind, stage)
    if k in (_B, _BW):
        r.backward(s, split=k == _B)
    elif k == _W:
        r.free(r.stash[s].popleft() if r.stash.get(s) else [])


__all__ = ["ReservedMemory", "reserved_run", "step_events"]

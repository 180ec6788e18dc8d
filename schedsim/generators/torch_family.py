"""The multi-stage schedules of ``torch.distributed.pipelining`` and Megatron-LM's interleaved
1F1B, ordered exactly as those implementations order them.

Sources (torch 2.13, ``torch/distributed/pipelining/schedules.py``):

- ``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble``: per-rank order built by
  ``_get_1f1b_rank_ops`` with ``_get_warmup_ops`` (Narayanan et al., "Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Section 2.2; Qi et al.,
  "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 3);
- ``ScheduleLoopedBFS`` (Lamy-Poirier, "Breadth-First Pipeline Parallelism", MLSys 2023);
- ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (ZB paper, Section 6).

Megatron-LM (``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_with_interleaving``, ``get_schedule_table`` and
``get_pp_rank_microbatches``) gives the ``--variant megatron`` order of interleaved 1F1B.

torch pads its ``pipeline_order`` tables with idle cells (``None``) to draw them in lock
step; its runtime skips them, so the orders here drop them. Backward ops that torch writes
``B`` (full backward) are our ``BW``; its ``I`` (input gradient) is our ``B``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from schedsim.errors import ScheduleError
from schedsim.generators import register
from schedsim.program.flat import FlatSchedule, OpKind
from schedsim.program.ir import Op, Placement, Schedule
from schedsim.program.megatron import (
    megatron_group_size,
    megatron_schedule_table,
    megatron_warmup,
)

_VARIANTS = ("torch", "megatron")


def _check_chunks(name: str, chunks: int) -> None:
    if not isinstance(chunks, int) or chunks < 2:
        raise ScheduleError(f"{name}: --chunks must be an integer >= 2 stages per rank (got "
                            f"{chunks!r}); with one stage per rank use 1f1b or gpipe")


def torch_rounds(ranks: int, microbatches: int, name: str) -> int:
    """Microbatches per round of torch's interleaved schedules: ``m // max(1, m // p)``.

    torch runs ``rounds = max(1, m // p)`` rounds and needs ``m`` to be a multiple of the
    number of rounds. Raises :class:`ScheduleError` naming the rule and the nearest valid
    microbatch counts otherwise.
    """
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        ok = [m for m in range(max(1, microbatches - 2 * ranks), microbatches + 2 * ranks + 1)
              if m % max(1, m // ranks) == 0]
        near = sorted(ok, key=lambda m: (abs(m - microbatches), m))[:4]
        raise ScheduleError(
            f"{name}: torch runs microbatches in rounds = max(1, m // p) = {rounds} and needs "
            f"m to be a multiple of the rounds, but m = {microbatches} is not a multiple of "
            f"{rounds} (p = {ranks}); nearby valid m: {', '.join(map(str, sorted(near)))}")
    return microbatches // rounds


def _torch_1f1b_rank(p: int, m: int, v: int, r: int, per_round: int, warmup: int,
                     zero_bubble: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank of torch's ``_get_1f1b_rank_ops`` (idle cells dropped), as columns
    ``(kind, stage, mb)``.

    ``warmup`` forwards, then one forward + one backward per step, then the remaining
    backwards. Forward step k runs chunk ``(k // per_round) % v``; backward step j runs
    chunk ``v - 1 - (j // per_round) % v``; microbatches count up per stage (the k-th
    step of a chunk is microbatch ``(k // (per_round*v)) * per_round + k % per_round``).
    With ``zero_bubble`` the backward is ``B`` and its ``W`` follows FIFO, ``r`` backwards
    later (after backward j comes the W of backward j - r), the rest at the end.
    """
    n, total = per_round, m * v
    k = np.arange(total)
    chunk = (k // n) % v
    mbs = (k // (n * v)) * n + k % n
    f_stage, b_stage = chunk * p + r, (v - 1 - chunk) * p + r
    bkind = OpKind.B if zero_bubble else OpKind.BW
    # sort keys: warmup forward k at k; steady step j (forward warmup+j, backward j,
    # then W of backward j-r) at warmup + 3j ..; cooldown backwards after; trailing Ws
    steady = total - warmup
    f_key = np.where(k < warmup, k, warmup + 3 * (k - warmup))
    b_key = np.where(k < steady, warmup + 3 * k + 1, warmup + 3 * steady + 2 * (k - steady))
    kinds = [np.full(total, int(OpKind.F)), np.full(total, int(bkind))]
    stages, mb, keys = [f_stage, b_stage], [mbs, mbs], [f_key, b_key]
    if zero_bubble:      # W of backward i follows backward i + r (or comes at the end)
        w_after = k + r
        w_key = np.where(w_after < total, b_key[np.minimum(w_after, total - 1)] + 1,
                         warmup + 3 * steady + 2 * (total - steady) + k)
        kinds.append(np.full(total, int(OpKind.W)))
        stages.append(b_stage)
        mb.append(mbs)
        keys.append(w_key)
    order = np.argsort(np.concatenate(keys), kind="stable")
    return (np.concatenate(kinds)[order], np.concatenate(stages)[order],
            np.concatenate(mb)[order])


def _schedule(name: str, placement: Placement, m: int, rows: list,
              **params: object) -> Schedule:
    """A schedule from per-rank columns ``(kind, stage, mb)``, validated by construction
    (the tests check every rule on every family)."""
    return Schedule.from_flat(FlatSchedule.from_columns(rows), name=name,
                              placement=placement, microbatches=m, validated=True,
                              params={"ranks": placement.ranks, "microbatches": m,
                                      **params})


@register("interleaved-1f1b",
          summary="interleaved (virtual-stage) 1F1B, depth first; torch order by default, "
                  "Megatron-LM's with --variant megatron",
          constraints="--chunks >= 2; torch: m a multiple of rounds = max(1, m // p); "
                      "megatron: ranks >= 2 and p <= group_size <= m and m % group_size "
                      "in {0} or >= p (so m >= p: p=6, m=3 is impossible)",
          placement="loop (stage s on rank s mod p, --chunks stages per rank)",
          source="torch ScheduleInterleaved1F1B; Megatron-LM "
                 "forward_backward_pipelining_with_interleaving; Narayanan et al. SC'21",
          params={"chunks": "stages per rank (default 2)",
                  "variant": "torch (default) | megatron",
                  "group_size": "megatron only: microbatch_group_size_per_vp_stage N "
                                "(default p; --param group_size=N)"})
def interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2, variant: str = "torch",
                     group_size: int | None = None) -> Schedule:
    """Interleaved 1F1B on ``ranks * chunks`` stages (loop placement), fused ``BW``.

    ``variant="torch"``: ``ScheduleInterleaved1F1B``. Rank r runs
    ``w = min((v-1)*n + 2*(p-1-r), m*v)`` warmup forwards (``n = m // max(1, m // p)``
    microbatches per round), then alternates one forward and one backward, then the last
    ``w`` backwards; forwards switch chunk every n steps, chunk 0 first; backwards the
    same, last chunk first.

    ``variant="megatron"``: Megatron-LM's table with N = ``group_size`` (its
    ``microbatch_group_size_per_vp_stage``, default p): microbatches in groups of N run
    through every chunk before the next group starts (the last group takes the rest);
    warmup ``2*(p-1-r) + (v-1)*N``. With N = n both orders are equal.

    Raises :class:`ScheduleError` for chunks < 2, an unknown variant, and each variant's
    microbatch rule (see ``schedsim list``).
    """
    name = "interleaved-1f1b"
    _check_chunks(name, chunks)
    if variant not in _VARIANTS:
        raise ScheduleError(f"{name}: unknown --variant {variant!r}: expected torch or "
                            f"megatron")
    p, m, v = ranks, microbatches, chunks
    pl = Placement(kind="loop", ranks=p, stages=p * v)
    if variant == "megatron":
        n = megatron_group_size(p, m, group_size)
        rows = [_megatron_rank(p, m, v, r, n) for r in range(p)]
        return _schedule(name, pl, m, rows, chunks=v, variant=variant, group_size=n)
    if group_size is not None:
        raise ScheduleError(f"{name}: group_size (microbatch_group_size_per_vp_stage) is a "
                            f"Megatron setting; add --variant megatron or drop it")
    n = torch_rounds(p, m, name)
    rows = [_torch_1f1b_rank(p, m, v, r, n, min((v - 1) * n + 2 * (p - 1 - r), m * v),
                             zero_bubble=False) for r in range(p)]
    return _schedule(name, pl, m, rows, chunks=v, variant=variant)


def _megatron_rank(p: int, m: int, v: int, r: int, n: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank of Megatron's interleaved 1F1B (no p2p overlap, the default), as columns:
    ``warmup`` forwards, then forward/backward pairs, then the remaining backwards;
    virtual microbatch k is ``megatron_schedule_table[k]`` for both directions, the
    backward running the chunks last first."""
    table = np.asarray(megatron_schedule_table(m, v, n), dtype=np.int64).reshape(-1, 2)
    total = m * v
    warmup = megatron_warmup(p, r, v, n, m)
    k = np.arange(total)
    mbs, chunk = table[:, 0], table[:, 1]
    steady = total - warmup
    f_key = np.where(k < warmup, k, warmup + 2 * (k - warmup))
    b_key = np.where(k < steady, warmup + 2 * k + 1, warmup + 2 * steady + (k - steady))
    order = np.argsort(np.concatenate((f_key, b_key)), kind="stable")
    kind = np.repeat([int(OpKind.F), int(OpKind.BW)], total)
    stage = np.concatenate((chunk * p + r, (v - 1 - chunk) * p + r))
    return kind[order], stage[order], np.concatenate((mbs, mbs))[order]


@register("looped-bfs",
          summary="breadth-first looped schedule: each local stage runs every microbatch "
                  "forward before the next stage; backwards last stage first, last "
                  "microbatch first",
          constraints="--chunks >= 2",
          placement="loop (stage s on rank s mod p, --chunks stages per rank)",
          source="torch ScheduleLoopedBFS; Lamy-Poirier, Breadth-First Pipeline "
                 "Parallelism (MLSys 2023)",
          params={"chunks": "stages per rank (default 2)"})
def looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    """torch's ``ScheduleLoopedBFS``: rank r runs ``F(s, 0..m-1)`` for its stages s in
    increasing order, then ``BW(s, m-1..0)`` for its stages in decreasing order.

    Raises :class:`ScheduleError` for chunks < 2.
    """
    _check_chunks("looped-bfs", chunks)
    p, m, v = ranks, microbatches, chunks
    pl = Placement(kind="loop", ranks=p, stages=p * v)
    rows = []
    for r in range(p):
        stages = np.asarray(pl.stages_of(r))
        kind = np.repeat([int(OpKind.F), int(OpKind.BW)], v * m)
        stage = np.concatenate((np.repeat(stages, m), np.repeat(stages[::-1], m)))
        mb = np.concatenate((np.tile(np.arange(m), v), np.tile(np.arange(m)[::-1], v)))
        rows.append((kind, stage, mb))
    return _schedule("looped-bfs", pl, m, rows, chunks=v)


@register("interleaved-zb",
          summary="interleaved 1F1B with split backward: B in the 1F1B slots, each W "
                  "deferred FIFO by r backwards on rank r (ZB-1P style)",
          constraints="--chunks >= 2; m a multiple of rounds = max(1, m // p)",
          placement="loop (stage s on rank s mod p, --chunks stages per rank)",
          source="torch ScheduleInterleavedZeroBubble; Qi et al., Zero Bubble Pipeline "
                 "Parallelism (ICLR 2024)",
          params={"chunks": "stages per rank (default 2)"})
def interleaved_zb(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    """torch's ``ScheduleInterleavedZeroBubble``: the interleaved 1F1B order with warmup
    ``min((v-1)*n + (p-1-r), m*v)`` (one forward per hop, not two), backwards split into
    ``B`` and ``W``; rank r issues the W of its j-th backward right after its (j+r)-th
    backward and the rest at the end.

    Raises :class:`ScheduleError` for chunks < 2 or m not a multiple of the rounds.
    """
    name = "interleaved-zb"
    _check_chunks(name, chunks)
    p, m, v = ranks, microbatches, chunks
    n = torch_rounds(p, m, name)
    pl = Placement(kind="loop", ranks=p, stages=p * v)
    rows = [_torch_1f1b_rank(p, m, v, r, n, min((v - 1) * n + (p - 1 - r), m * v),
                             zero_bubble=True) for r in range(p)]
    return _schedule(name, pl, m, rows, chunks=v)


def zbv_torch(ranks: int, microbatches: int) -> Schedule:
    """torch's ``ScheduleZBVZeroBubble`` order (v placement, 2 stages per rank).

    Rank r (chunk 0 = stage r, chunk 1 = stage 2p-1-r), counting microbatches per chunk,
    over ``n = max(2p-1, m)`` microbatches:

    1. ``2(p-r)-1`` forwards of chunk 0;
    2. r times: F chunk 1, F chunk 0;
    3. p-r times: F, B, W of chunk 1;
    4. while chunk 1 trails chunk 0 or chunk 0 has forwards left: F chunk 0 (if any
       left), B and W chunk 0, F, B and W chunk 1;
    5. r times: B chunk 0, B chunk 1; then p-r times: B chunk 0 and the oldest pending W
       of chunk 0; then the pending W of chunk 1, then of chunk 0.

    Ops of microbatches >= m (when m < 2p-1) are dropped, as torch does. Source:
    torch/distributed/pipelining/schedules.py ``ScheduleZBVZeroBubble`` (ZB paper,
    Section 6). Raises :class:`ScheduleError` for ranks or microbatches < 1.
    """
    if ranks < 1 or microbatches < 1:
        raise ScheduleError(f"zbv (torch): ranks and microbatches must be >= 1 (got {ranks}, "
                            f"{microbatches})")
    p, m = ranks, microbatches
    n = max(2 * p - 1, m)
    pl = Placement(kind="v", ranks=p, stages=2 * p)
    rows = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        cnt = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}
        row: list[Op] = []

        def add(kind: str, chunk: int, counter: str | None = None) -> None:
            key = counter or (("f" if kind == "F" else "b") + str(chunk))
            row.append(Op(kind, s1 if chunk else s0, cnt[key]))
            cnt[key] += 1

        for _ in range(2 * (p - r) - 1):
            add("F", 0)
        for _ in range(r):
            add("F", 1)
            add("F", 0)
        for _ in range(p - r):
            add("F", 1)
            row += [Op("B", s1, cnt["b1"]), Op("W", s1, cnt["b1"])]
            cnt["b1"] += 1
        while cnt["f1"] < cnt["f0"] or cnt["f0"] < n:
            if cnt["f0"] < n:
                add("F", 0)
            row += [Op("B", s0, cnt["b0"]), Op("W", s0, cnt["b0"])]
            cnt["b0"] += 1
            add("F", 1)
            row += [Op("B", s1, cnt["b1"]), Op("W", s1, cnt["b1"])]
            cnt["b1"] += 1
        w0, w1 = cnt["b0"], cnt["b1"]
        for _ in range(r):
            add("B", 0)
            add("B", 1)
        for _ in range(p - r):
            add("B", 0)
            row.append(Op("W", s0, w0))
            w0 += 1
        row += [Op("W", s1, i) for i in range(w1, cnt["b1"])]
        row += [Op("W", s0, i) for i in range(w0, cnt["b0"])]
        rows.append([op for op in row if op.mb < m])
    return Schedule(name="zbv", placement=pl, microbatches=m, ranks=rows,
                    params={"ranks": p, "microbatches": m, "variant": "torch"})


#: the torch schedule classes these generators reproduce, for interop and tests
TORCH_CLASSES: dict[str, Callable[..., Schedule]] = {
    "Interleaved1F1B": interleaved_1f1b,
    "LoopedBFS": looped_bfs,
    "InterleavedZeroBubble": interleaved_zb,
    "ZBVZeroBubble": zbv_torch,
}

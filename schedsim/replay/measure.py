"""Calibration measurements on the real ranks (torch): per-stage op costs and link
ping-pong. The fit and the cost file are in :mod:`schedsim.replay.calibrate`.

Op costs: the ranks take turns (one rank measures while the others wait at a barrier),
so each rank's numbers are uncontended even when ranks share CPU cores. For each stage
the rank holds (one copy per stage; DualPipe's second copy is measured on the rank
where it is the first), ``warmup`` + ``repeats`` rounds of:

- ``F``: forward of a fresh microbatch (plus the loss on the last stage);
- ``B``: input-gradient backward with weight gradients deferred; ``W``: running them;
- ``BW``: full backward of another forward;
- ``FB``: a forward followed by the full backward of an earlier forward (what the replay
  runs for an ``(F;BW)`` pair on one stream).

The median of the rounds is kept (ms). Link: rank 0 and rank 1 ping-pong blocking
send/recv of each size in ``calib_sizes`` (2 warm-up + ``calib_repeats`` x 3 round
trips); one-way time = median round trip / 2.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from .config import JobSpec
from .executor import RankExecutor
from .workload import WEIGHT_GRADS, loss_fn, microbatch_input, microbatch_target


def _stage_costs(ex: RankExecutor, key: tuple[int, int], repeats: int, warmup: int = 2
                 ) -> dict[str, float]:
    s = key[0]
    mod = ex.modules[key]
    cfg, dev, clock = ex.cfg, ex.device, ex.clock
    last = s == ex.S - 1
    target = microbatch_target(cfg, 0, dev)
    gen = torch.Generator().manual_seed(1234 + s)

    def inp() -> torch.Tensor:
        if s == 0:
            return microbatch_input(cfg, 0, dev)
        return torch.randn(cfg.activation_shape, generator=gen, dtype=torch.float64).to(
            device=dev, dtype=ex.dtype).requires_grad_(True)

    def fwd(x: torch.Tensor) -> torch.Tensor:
        out = mod(x)
        return loss_fn(out, target) if last else out

    grad = ex.scale if last else torch.randn(cfg.activation_shape, generator=gen,
                                             dtype=torch.float64).to(dev, ex.dtype)
    samples: dict[str, list] = {k: [] for k in ("F", "B", "W", "BW", "FB")}
    for rep in range(warmup + repeats):
        st = clock.stamp
        x1, x2, x3, x4 = inp(), inp(), inp(), inp()
        t0 = st()
        out = fwd(x1)
        t1 = st()
        with WEIGHT_GRADS.capture() as fns:
            torch.autograd.backward(out, grad)
        t2 = st()
        for fn in fns:
            fn()
        t3 = st()
        out = fwd(x2)
        t4 = st()
        torch.autograd.backward(out, grad)
        t5 = st()
        prev = fwd(x3)
        t6 = st()
        _ = fwd(x4)
        torch.autograd.backward(prev, grad)
        t7 = st()
        ex.zero_grad()
        if rep >= warmup:
            for k, a, b in (("F", t0, t1), ("B", t1, t2), ("W", t2, t3), ("BW", t4, t5),
                            ("FB", t6, t7)):
                samples[k].append((a, b))
    clock.sync()
    r = clock.resolve
    return {k: statistics.median((r(b) - r(a)) / 1e6 for a, b in v)
            for k, v in samples.items()}


def _pingpong(sizes: list[int], repeats: int, device: Any, dtype: torch.dtype
              ) -> list[list[float]]:
    rank = dist.get_rank()
    out = []
    itemsize = torch.empty((), dtype=dtype).element_size()
    for size in sizes:
        n = max(1, size // itemsize)
        buf = torch.zeros(n, dtype=dtype, device=device)
        rtts = []
        for k in range(2 + 3 * repeats):
            if rank == 0:
                t0 = time.perf_counter_ns()
                dist.send(buf, 1)
                dist.recv(buf, 1)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if k >= 2:
                    rtts.append(time.perf_counter_ns() - t0)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        if rank == 0:
            out.append([float(n * itemsize), statistics.median(rtts) / 2 / 1e6])
    return out


def calibrate_rank(ex: RankExecutor, spec: JobSpec) -> dict[str, Any] | None:
    """Measure this rank's stage costs (in turn) and, on ranks 0/1, the link. Collective.

    Returns, on rank 0, ``{"unit": "ms", "stages": {stage: {F, B, W, BW, FB}},
    "link_samples": [[bytes, one-way ms], ...], "message_bytes", "backend",
    "world_size", "fb_backward_kinds": [...]}``; None on other ranks.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine: dict[int, dict[str, float]] = {}
    seen: set[int] = set()
    for turn in range(world):
        dist.barrier()
        if turn != rank:
            continue
        for key in sorted(ex.modules, key=lambda k: (k[1], k[0])):
            if key[0] in seen:
                continue
            seen.add(key[0])
            mine[key[0]] = _stage_costs(ex, key, spec.calib_repeats)
    dist.barrier()
    samples = (_pingpong(spec.calib_sizes, spec.calib_repeats, ex.device, ex.dtype)
               if world > 1 and rank < 2 else [])
    got: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object((mine, samples), got if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    stages: dict[int, dict[str, float]] = {}
    for m, _ in got:
        for s, c in m.items():
            stages.setdefault(s, c)
    prog = ex.program
    fb_kinds = sorted({i.op.parts[1].kind for row in prog.ranks for i in row
                       if getattr(i, "op", None) is not None and i.op.kind == "FB"})
    return {"unit": "ms", "stages": {str(s): stages[s] for s in sorted(stages)},
            "link_samples": got[0][1], "message_bytes": ex.cfg.message_bytes,
            "backend": ex.cfg.backend, "world_size": world, "fb_backward_kinds": fb_kinds,
            "workload": ex.cfg.model_dump(include={"workload", "hidden", "layers_per_stage",
                                                   "seq", "microbatch_size", "dtype"})}

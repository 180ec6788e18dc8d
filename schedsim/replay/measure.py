r"""Calibration measurements on the real ranks (torch): per-stage op costs and link
ping-pong. The fit and the cost file are in :mod:`schedsim.replay.calibrate`.

Op costs: by default every rank measures at the same time, as the replay runs them, so
the numbers hold the contention the replay will see when ranks share CPU cores (or a
GPU); with ``calib_isolated`` the ranks take turns (one rank measures while the others
wait at a barrier) and the numbers are uncontended. (Taking turns made 1F1B and
DualPipeV predictions 31-37% short on 2 shared vCPUs: the replay's ops ran slower than
the isolated measurement.) For each stage the rank holds (one copy per stage; DualPipe's
second copy is measured on the rank where it is the first), ``warmup`` + ``repeats``
rounds of:

- ``F``: forward of a fresh microbatch (plus the loss on the last stage);
- ``B``: input-gradient backward with weight gradients deferred; ``W``: running them;
- ``BW``: full backward of another forward;
- ``FB``: a forward followed by the full backward of an earlier forward (what the replay
  runs for an ``(F;BW)`` pair on one stream).

The median of the rounds is kept (ms). Link: rank 0 and rank 1 ping-pong blocking
send/recv of each size in ``calib_sizes`` (2 warm-up + ``calib_repeats`` x 3 round
trips); one-way time = median round trip / 2.

Launch: rank 0 and rank 1 launch batches of sends/recvs to each other at the workload's
message size, one composition (S sends + R recvs; the peer launches R sends + S recvs) at
a time: a single ``isend``, a single ``irecv``, a send+recv pair and every composition of
the program's post runs. Each round both ranks run a forward of their first stage module
(a post run of the replay follows a compute op), then time on the host clock what a post
run does (:meth:`RankExecutor._post_run
<schedsim.replay.executor.RankExecutor._post_run>`: make the ``P2POp``\ s, a fresh
``torch.empty`` buffer per recv, and call ``batch_isend_irecv``), then wait for the
batch. 4 warm-up + ``calib_repeats`` x 10 timed rounds per composition pair; all samples
are kept (ms); the statistic is chosen in :meth:`Calibration.launch_cost
<schedsim.replay.calibrate.Calibration.launch_cost>`. (Two other set-ups, timing only
the rank whose peer had already posted and was computing, or only the rank whose peer
was blocked waiting, gave the same medians within the run-to-run noise.)
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from schedsim.program.ir import Program
from schedsim.replay.calibrate import composition_key, post_runs
from schedsim.replay.config import JobSpec
from schedsim.replay.executor import RankExecutor
from schedsim.replay.stage_modules import (
    WEIGHT_GRADS,
    loss_fn,
    microbatch_input,
    microbatch_target,
)


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


def _launch(ex: RankExecutor, comps: list[tuple[int, int]], repeats: int, warmup: int = 4
            ) -> dict[str, list[float]]:
    """Launch-time samples (ms) of this rank (0 or 1) by composition ``"S+R"`` (module
    docstring). ``comps`` are rank 0's compositions; rank 1 launches the mirror."""
    rank = dist.get_rank()
    peer = 1 - rank
    shape, dt, dev = ex.cfg.activation_shape, ex.dtype, ex.wire
    mod = ex.modules[min(ex.modules, key=lambda k: (k[1], k[0]))]
    x = torch.randn(shape, dtype=torch.float64).to(device=ex.device, dtype=dt)
    payload = torch.randn(shape, dtype=torch.float64).to(device=dev, dtype=dt)
    isend, irecv, P2POp, batch = dist.isend, dist.irecv, dist.P2POp, dist.batch_isend_irecv
    now = time.perf_counter_ns
    out: dict[str, list[float]] = {}
    for ns, nr in comps:
        mine = (ns, nr) if rank == 0 else (nr, ns)
        samples = out.setdefault(composition_key(*mine), [])
        # no barrier here: only ranks 0 and 1 run this (the batches' waits keep them
        # in step)
        for k in range(warmup + 10 * repeats):
            with torch.no_grad():
                mod(x)
            t0 = now()
            ops = [P2POp(isend, payload.contiguous(), peer) for _ in range(mine[0])]
            ops += [P2POp(irecv, torch.empty(shape, dtype=dt, device=dev), peer)
                    for _ in range(mine[1])]
            works = batch(ops)
            t1 = now()
            for w in works:
                w.wait()
            if k >= warmup:
                samples.append((t1 - t0) / 1e6)
    return out


def _launch_compositions(program: Program) -> list[tuple[int, int]]:
    """Single send, single recv, a send+recv pair and the program's post-run compositions
    (as rank 0 launches them), without mirror duplicates."""
    comps: list[tuple[int, int]] = [(1, 0), (0, 1), (1, 1)]
    for k in post_runs(program):
        s, r = (int(x) for x in k.split("+"))
        if (s, r) not in comps and (r, s) not in comps:
            comps.append((s, r))
    return comps


def calibrate_rank(ex: RankExecutor, spec: JobSpec) -> dict[str, Any] | None:
    """Measure this rank's stage costs (with the others, or in turn when
    ``spec.calib_isolated``) and, on ranks 0/1, the link and the launch time. Collective.

    Returns, on rank 0, ``{"unit": "ms", "stages": {stage: {F, B, W, BW, FB}},
    "link_samples": [[bytes, one-way ms], ...], "message_bytes", "backend",
    "world_size", "fb_backward_kinds": [...], "workload": {...}, "launch_samples":
    {"S+R": [ms, ...]}, "post_runs": {"S+R": count}}`` (the fields of
    :class:`~schedsim.replay.calibrate.Calibration`); None on other ranks.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine: dict[int, dict[str, float]] = {}
    seen: set[int] = set()
    for turn in range(world if spec.calib_isolated else 1):
        dist.barrier()
        if spec.calib_isolated and turn != rank:
            continue
        for key in sorted(ex.modules, key=lambda k: (k[1], k[0])):
            if key[0] in seen:
                continue
            seen.add(key[0])
            mine[key[0]] = _stage_costs(ex, key, spec.calib_repeats)
    dist.barrier()
    samples = (_pingpong(spec.calib_sizes, spec.calib_repeats, ex.wire, ex.dtype)
               if world > 1 and rank < 2 else [])
    dist.barrier()
    launch = (_launch(ex, _launch_compositions(ex.program), spec.calib_repeats)
              if world > 1 and rank < 2 else {})
    got: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object((mine, samples, launch), got if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    stages: dict[int, dict[str, float]] = {}
    launch_samples: dict[str, list[float]] = {}
    for m, _, ls in got:
        for k, v in ls.items():
            launch_samples.setdefault(k, []).extend(v)
        for s, c in m.items():
            stages.setdefault(s, c)
    prog = ex.program
    fb_kinds = sorted({i.op.parts[1].kind for row in prog.ranks for i in row
                       if getattr(i, "op", None) is not None and i.op.kind == "FB"})
    return {"unit": "ms", "stages": {str(s): stages[s] for s in sorted(stages)},
            "link_samples": got[0][1], "message_bytes": ex.cfg.message_bytes,
            "backend": ex.cfg.backend, "world_size": world, "fb_backward_kinds": fb_kinds,
            "workload": ex.cfg.model_dump(include={"workload", "hidden", "layers_per_stage",
                                                   "seq", "microbatch_size", "dtype"}),
            "launch_samples": launch_samples, "post_runs": post_runs(prog)}

"""schedsim's replay vs torch.distributed.pipelining's ``Schedule1F1B``: same model, same
1F1B schedule, same gloo process group, side by side.

Each rank holds the same stage module (:func:`schedsim.replay.stage_modules.build_stage`, an
MLP block stack). Per iteration, after a barrier, rank r times its own step; the step
time is the max over ranks (``all_reduce(MAX)``). The two executors alternate step by
step (so drift and noise from other processes hit both alike); after ``--warmup``
untimed steps of each, the medians of ``--steps`` timed steps are printed with their
ratio (target: schedsim <= 1.1 x torch).

torch side: ``PipelineStage(module, stage_index=r, num_stages=P)`` +
``Schedule1F1B(stage, M, loss_fn=mse, scale_grads=False)``; rank 0 feeds the batch of
M microbatches, the last rank the targets. schedsim side: the ``1f1b`` program (same
op order as torch's runtime) lowered with the ``async`` policy, run by
:class:`schedsim.replay.executor.RankExecutor` (loss scaled by 1/M). Both compute the
same forward and full backward per microbatch.

    python benchmarks/bench_replay.py                  # 2 ranks, 8 microbatches
    python benchmarks/bench_replay.py --ranks 4 --hidden 512 --steps 20
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _rank_main(rank: int, a: argparse.Namespace, port: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from schedsim import build_program
    from schedsim.replay.config import ReplayConfig
    from schedsim.replay.executor import RankExecutor
    from schedsim.replay.stage_modules import build_stage, loss_fn, microbatch_input, microbatch_target

    torch.set_num_threads(1)
    P, M = a.ranks, a.microbatches
    dist.init_process_group("gloo", rank=rank, world_size=P,
                            timeout=timedelta(seconds=a.timeout),
                            init_method=f"tcp://127.0.0.1:{port}")
    cfg = ReplayConfig(hidden=a.hidden, seq=a.seq, microbatch_size=a.microbatch_size,
                       layers_per_stage=a.layers, timeout=a.timeout)
    ours = RankExecutor(build_program("1f1b", P, M), rank, cfg)
    mod = build_stage(cfg, rank)
    stage = PipelineStage(mod, rank, P, torch.device("cpu"))
    sched = Schedule1F1B(stage, M, loss_fn=loss_fn, scale_grads=False)
    x = torch.cat([microbatch_input(cfg, mb) for mb in range(M)])
    y = torch.cat([microbatch_target(cfg, mb) for mb in range(M)])

    def torch_step() -> None:
        if rank == 0:
            sched.step(x)
        elif rank == P - 1:
            sched.step(target=y)
        else:
            sched.step()
        mod.zero_grad(set_to_none=True)

    def ours_step() -> None:
        ours.step()
        ours.zero_grad()

    times: dict[str, list[float]] = {"torch": [], "schedsim": []}
    buf = torch.zeros(1, dtype=torch.float64)
    for it in range(a.warmup + a.steps):
        for name, fn in (("torch", torch_step), ("schedsim", ours_step)):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            buf.fill_(time.perf_counter() - t0)
            dist.all_reduce(buf, op=dist.ReduceOp.MAX)
            if it >= a.warmup:
                times[name].append(buf.item() * 1e3)
    if rank == 0:
        tt, ts = statistics.median(times["torch"]), statistics.median(times["schedsim"])
        print(f"1F1B, {P} ranks x {M} microbatches, gloo, MLP hidden {a.hidden} x "
              f"{a.layers} layers/stage, seq {a.seq}, microbatch {a.microbatch_size}, "
              f"float32, 1 thread/rank; median of {a.steps} steps (ms)")
        print(f"{'executor':<34}{'median':>9}{'min':>9}{'max':>9}")
        for name, v in (("torch Schedule1F1B", times["torch"]),
                        ("schedsim replay (1f1b program)", times["schedsim"])):
            print(f"{name:<34}{statistics.median(v):>9.2f}{min(v):>9.2f}{max(v):>9.2f}")
        print(f"ratio schedsim / torch: {ts / tt:.3f} median, "
              f"{min(times['schedsim']) / min(times['torch']):.3f} best  (target <= 1.1)")
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    import torch.multiprocessing as mp

    from schedsim.replay.launch import free_port

    ctx = mp.start_processes(_rank_main, args=(a, free_port()), nprocs=a.ranks, join=False,
                             start_method="spawn")
    deadline = time.time() + a.timeout
    try:
        while not ctx.join(timeout=0.5):
            if time.time() > deadline:
                print(f"benchmark timed out after {a.timeout:g} s", file=sys.stderr)
                return 1
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

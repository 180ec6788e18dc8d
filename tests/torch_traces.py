"""Real torch.distributed.pipelining runs recorded with torch.profiler, for the trace
tests: 2 gloo processes, a tiny MLP per stage, :data:`WARMUP` warm-up steps (the last
of them profiled into a trace that is thrown away), then the profiled step(s); each rank
writes ``rank{r}.json`` (``export_chrome_trace``).

Run as a script (``python tests/torch_traces.py OUT HIDDEN[:SLOW[:PAUSE]]
SCHEDULE:M:V[:K] ...``) or through :func:`record`, which starts it in a subprocess with a
timeout and records every schedule asked for in one process group
(``OUT/SCHEDULE/rank{r}.json``). ``K`` profiled steps go in one trace
(``ProfilerStep#1..K``); a ``PAUSE`` (seconds) puts a barrier and that sleep before each
of them after the first, so that the steps sample the machine's speed over time: on this
project's 2-vCPU virtual machine it moves by up to 2x within a second, and consecutive
steps share one level (docs/traces.md, "From a separate run"). The shipped traces:
``chrt -f 1 python tests/torch_traces.py OUT 128:0:0.5 ScheduleInterleaved1F1B:8:2:9
ScheduleGPipe:4:1:9`` (9 steps 0.5 s apart), each file gzipped (``gzip -9``). ``SCHEDULE`` is a
class of ``torch.distributed.pipelining.schedules`` (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``, ...); ``V`` stages per
rank for the multi-stage ones (stage ``rank + 2 c`` for chunk c: the loop placement;
ZBV and DualPipeV: stages ``rank`` and ``3 - rank``, the V placement). A ``SLOW`` (seconds)
after ``HIDDEN`` makes the last rank's stages sleep that long in each forward, so that the
first rank certainly waits its sends before the last rank posts the matching recvs.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

WORLD = 2
#: steps before the recorded ones: the first steps of a schedule and the first profiled
#: step of a process are slow (measured, 2 gloo ranks at real-time priority: step 1 of
#: Interleaved1F1B 26-37 ms, steps 2-3 up to 40, then 11-17 ms; the first profiled step
#: 33 ms against 17-23 after it), so the last warm-up step runs under a profiler whose
#: trace is dropped
WARMUP = 3


def _sleep_layer(seconds: float):
    """A stand-in layer that sleeps ``seconds`` in its forward (a slow stage)."""
    import time

    import torch.nn as nn

    class Sleep(nn.Module):
        def forward(self, x):
            time.sleep(seconds)
            return x

    return Sleep()


def _one(rank: int, sched: str, m: int, v: int, out: Path, hidden: int,
         slow: float = 0.0, steps: int = 1, pause: float = 0.0) -> None:
    import time

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, schedules as S
    from torch.profiler import ProfilerActivity, profile, schedule as every

    cls = getattr(S, sched)
    multi = issubclass(cls, S.PipelineScheduleMulti)
    stages = WORLD * (v if multi else 1)
    if sched in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV"):      # the V placement
        mine = [rank, 2 * WORLD - 1 - rank]
    else:
        mine = [rank + WORLD * c for c in range(v)] if multi else [rank]
    built = []
    for s in mine:
        torch.manual_seed(s)
        mod = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        if slow > 0 and rank == WORLD - 1:
            mod.append(_sleep_layer(slow))
        built.append(PipelineStage(mod, s, stages, torch.device("cpu")))
    sch = cls(built if multi else built[0], m, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    torch.manual_seed(1000)
    x, t = torch.randn(m * 8, hidden), torch.randn(m * 8, hidden)

    def step() -> None:
        first, last = 0 in mine, stages - 1 in mine
        sch.step(*((x,) if first else ()), target=t if last else None,
                 losses=[] if last else None)

    for _ in range(WARMUP - 1):
        step()
    dist.barrier()
    # the profiler's warm-up step traces and is dropped; the recorded steps follow it at
    # once, each rank's beginning when its previous step ended, as in training
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=every(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for i in range(steps + 1):
            if pause > 0 and i > 0:
                dist.barrier()
                time.sleep(pause)
            step()
            prof.step()
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    dist.barrier()


def _run(rank: int, port: int, out: str, hidden: int, runs: list[tuple[Any, ...]],
         slow: float = 0.0, pause: float = 0.0) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=60))
    for sched, m, v, *k in runs:
        _one(rank, sched, m, v, Path(out) / sched, hidden, slow, *k, pause=pause)
    dist.destroy_process_group()


def record(out: Path, runs: list[tuple[Any, ...]], hidden: int = 128,
           timeout: float = 240.0, slow: float = 0.0, pause: float = 0.0
           ) -> dict[str, list[Path]]:
    """Record one profiled step of each ``(schedule, microbatches, stages per rank)`` (or
    ``K`` steps in one trace, ``ProfilerStep#1..K``, with a fourth element K; ``pause``
    seconds apart, after a barrier, or one after another with 0) on 2 gloo ranks;
    returns each schedule's two trace files. Raises RuntimeError (with
    the ranks' stderr) on failure and ``subprocess.TimeoutExpired`` after ``timeout`` s."""
    out.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, __file__, str(out), f"{hidden}:{slow}:{pause}",
                        *(":".join(map(str, r)) for r in runs)], capture_output=True,
                       text=True, timeout=timeout,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    files = {r[0]: [out / r[0] / f"rank{k}.json" for k in range(WORLD)] for r in runs}
    if p.returncode != 0 or not all(f.exists() for fs in files.values() for f in fs):
        raise RuntimeError(f"recording failed ({p.returncode}): {p.stderr[-2000:]}")
    return files


if __name__ == "__main__":
    import torch.multiprocessing as mp

    out_dir, size_slow = sys.argv[1], sys.argv[2].split(":")
    size, slow = int(size_slow[0]), float(size_slow[1]) if len(size_slow) > 1 else 0.0
    pause = float(size_slow[2]) if len(size_slow) > 2 else 0.0
    todo = [(a, *map(int, rest)) for a, *rest in (x.split(":") for x in sys.argv[3:])]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_run, args=(port, out_dir, size, todo, slow, pause), nprocs=WORLD)

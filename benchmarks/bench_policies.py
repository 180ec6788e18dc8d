"""Lowering speed of the comm policies, against ``async`` as the baseline.

    python benchmarks/bench_policies.py            # prints one line per (schedule, policy)

``torch`` replays torch's ``_add_send_recv`` lock-step sweep (plus its FSDP/REDUCE_GRAD
bookkeeping placement), so it costs more than ``async``; the ratio column says how much.
``megatron`` traces Megatron-LM's interleaved loop (only on the interleaved 1F1B cases,
whose torch order equals Megatron's with N = m / rounds). Best of 3 runs, wall-clock
seconds.
"""
from __future__ import annotations

import time

from schedsim.generators.torch_family import interleaved_1f1b, interleaved_zb, zbv_torch
from schedsim.program.lower import lower
from schedsim.util.gc import no_gc

MEGATRON = ("commit", "torch", "megatron")
CASES = [
    ("interleaved-1f1b p8 m64 v2", lambda: interleaved_1f1b(8, 64), MEGATRON),
    ("interleaved-1f1b p16 m256 v2", lambda: interleaved_1f1b(16, 256), MEGATRON),
    ("interleaved-1f1b p8 m64 v8", lambda: interleaved_1f1b(8, 64, chunks=8), MEGATRON),
    ("interleaved-zb p16 m128 v2", lambda: interleaved_zb(16, 128), ("commit", "torch")),
    ("zbv(torch) p16 m256", lambda: zbv_torch(16, 256), ("commit", "torch")),
]


def best(fn, repeat: int = 3) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        with no_gc():
            fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    print(f"{'schedule':32} {'ops':>7} {'policy':8} {'seconds':>8} {'x async':>8}")
    for label, make, policies in CASES:
        s = make()
        base = best(lambda: lower(s, "async"))
        for pol in ("async", *policies):
            t = base if pol == "async" else best(lambda: lower(s, pol))
            print(f"{label:32} {s.num_ops():7d} {pol:8} {t:8.3f} {t / base:8.2f}")


if __name__ == "__main__":
    main()

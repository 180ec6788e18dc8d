"""The CUDA / NCCL path of the replay: CUDA-event clock, B/W split on the GPU, NCCL
replays with the gradient check. Skipped without GPUs (CI runs on CPU)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from schedsim.program.ir import Program  # noqa: E402
from schedsim.replay.config import ReplayConfig, spec_from_scenario  # noqa: E402
from schedsim.scenario import parse_scenario  # noqa: E402
from schedsim.timeline import Timeline  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")


@needs_gpu
def test_cuda_clock_orders_events():
    from schedsim.replay.timing import Clock

    clock = Clock("cuda:0")
    a = clock.stamp()
    x = torch.randn(512, 512, device="cuda:0")
    for _ in range(20):
        x = x @ x.T / 512
    b = clock.stamp()
    clock.sync()
    ta, tb = clock.resolve(a), clock.resolve(b)
    assert clock.base_ns <= ta < tb


@needs_gpu
def test_split_backward_on_gpu():
    from schedsim.replay.stage_modules import (
        WEIGHT_GRADS,
        build_stage,
        microbatch_input,
        microbatch_target,
    )

    cfg = ReplayConfig(workload="transformer", hidden=32, heads=4, seq=8, dtype="float64")
    m1, m2 = build_stage(cfg, 0, "cuda:0"), build_stage(cfg, 0, "cuda:0")
    x, g = microbatch_input(cfg, 0, "cuda:0"), microbatch_target(cfg, 0, "cuda:0")
    with WEIGHT_GRADS.capture() as fns:       # CUDA autograd runs on a device thread
        torch.autograd.backward(m1(x), g)
    assert fns and all(p.grad is None for p in m1.parameters())
    for fn in fns:
        fn()
    torch.autograd.backward(m2(x), g)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name,ranks,mb", [("1f1b", 2, 4), ("dualpipev", 2, 4),
                                           ("dualpipe", 4, 8)])
def test_nccl_replay_passes_grad_check(name, ranks, mb):
    if GPUS < ranks:
        pytest.skip(f"needs {ranks} CUDA GPUs (nccl: one GPU per rank)")
    from schedsim.replay.launch import launch

    sc = parse_scenario({"schedule": {"name": name, "ranks": ranks, "microbatches": mb},
                         "replay": {"hidden": 64, "seq": 16, "backend": "nccl"}})
    spec = spec_from_scenario(sc, check_grads=True, timeout=180)
    tl = Timeline.model_validate(launch(spec, ranks)["timeline"])
    assert tl.backend == "nccl" and tl.device == "cuda"
    assert tl.grad_check["passed"], tl.grad_check
    prog = Program.model_validate(spec.program)
    assert len(tl.spans) == sum(len(r) for r in prog.schedule().ranks)

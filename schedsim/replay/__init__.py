"""The second executor: run a :class:`~schedsim.program.ir.Program` for real on torch.distributed.

Same program in, same :class:`~schedsim.timeline.Timeline` out (with ``source =
"measured"``). Each rank walks its instruction list: a run of consecutive ``Post``\\ s is
launched as one ``batch_isend_irecv`` (one ``isend``/``irecv`` per post), ``COMMIT`` waits
for every op posted since the previous ``COMMIT``, ``WAIT[...]`` waits for the named ops and
the implicit ``END`` for everything still outstanding; compute ops run a real model chunk
(:mod:`schedsim.replay.stage_modules`) with B (input gradient) and W (weight gradient) split.

Modules (only those marked *torch* import torch; the rest, and this package, import
without it so the CLI can give a clear message when torch is missing):

- :mod:`.config` — the ``[replay]`` scenario table, job specs, :class:`ReplayError`;
- :mod:`.stage_modules` (*torch*) — MLP / transformer stage modules, deferred weight grads,
  data, loss and the single-process reference;
- :mod:`.executor` (*torch*) — :class:`~.executor.RankExecutor`, one rank's program;
- :mod:`.timing` (*torch*) — clocks (perf_counter_ns, CUDA events), clock offsets,
  measured Timeline assembly;
- :mod:`.gradcheck` (*torch*) — gradient check against the reference;
- :mod:`.worker` (*torch*) — what each process runs (also under ``torchrun``);
- :mod:`.launch` — spawn local ranks, watch them, stop them all on a failure;
- :mod:`.measure` (*torch*) — calibration measurements (per-stage op costs, ping-pong);
- :mod:`.calibrate` — the link fit and the cost file ``simulate --costs-file`` reads;
- :mod:`.compare` — prediction vs measurement metrics and the overlay figure;
- :mod:`.trace_import` — Kineto/Chrome traces to a measured Timeline.
"""
from __future__ import annotations

from schedsim.replay.config import ReplayConfig, ReplayError, require_torch

__all__ = ["ReplayConfig", "ReplayError", "require_torch"]

"""torch.distributed.pipelining's own orders, built live without a process group.

- :func:`torch_compute`: a schedule class's ``pipeline_order`` (or, with comms, the
  ``_PipelineScheduleRuntime`` lowering) via ``_schedule_visualizer.get_schedule_ops``,
  in schedsim tokens, idle cells and FSDP/REDUCE_GRAD bookkeeping dropped;
- :func:`record_single`: what ``Schedule1F1B`` / ``ScheduleGPipe._step_microbatches``
  really issue (compute, P2P posts, waits), recorded with a fake stage and patched P2P
  helpers, as program tokens (``post[a+b]`` -> ``a b``, ``wait[a+b]`` -> ``WAIT[a+b]``);
- :func:`torch_schedule`: a schedule instance (mock stages) for ``_dump_csv``/``_load_csv``.
"""
from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
from torch.distributed.pipelining import schedules as S  # noqa: E402
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops  # noqa: E402
from torch.distributed.pipelining.stage import PipelineStage  # noqa: E402

BOOKKEEPING = ("REDUCE_GRAD", "UNSHARD", "RESHARD")
_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}


def token(a: Any) -> str:
    """schedsim token of a torch ``_Action`` (``I`` -> B, ``B`` -> BW, overlap -> (F;B))."""
    ct = a.computation_type.value
    if ct == "OVERLAP_F_B":
        f, b = a.sub_actions
        return f"({token(f)};{token(b)})"
    return f"{a.stage_index}{_KIND.get(ct, ct)}{a.microbatch_index}"


def torch_compute(name: str, p: int, m: int, k: int,
                  with_comms: bool = False) -> list[list[str]] | None:
    """Per-rank tokens of torch's schedule ``name``; None if torch refuses (p, m, k)."""
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ops = get_schedule_ops(name, p, m, k, with_comms=with_comms)
    except (ValueError, AssertionError, RuntimeError):
        return None
    finally:
        logging.disable(logging.NOTSET)
    return [[token(a) for a in row if a is not None
             and a.computation_type.value not in BOOKKEEPING] for row in ops]


class _FakeStage:
    """Records compute; hands out P2P ops named by their schedsim tokens."""

    def __init__(self, p: int, rank: int, log: list[str]) -> None:
        self.num_stages, self.stage_index, self.group_rank, self.group_size = p, rank, rank, p
        self.is_first, self.is_last = rank == 0, rank == p - 1
        self.log = log

    def _op(self, kind: str, mb: int, peer: int) -> SimpleNamespace:
        return SimpleNamespace(tok=f"{self.stage_index}{kind}{mb}", peer=peer)

    def get_fwd_recv_ops(self, mb):
        return [] if self.is_first else [self._op("RECV_F", mb, self.stage_index - 1)]

    def get_fwd_send_ops(self, mb):
        return [] if self.is_last else [self._op("SEND_F", mb, self.stage_index + 1)]

    def get_bwd_recv_ops(self, mb):
        return [] if self.is_last else [self._op("RECV_B", mb, self.stage_index + 1)]

    def get_bwd_send_ops(self, mb):
        return [] if self.is_first else [self._op("SEND_B", mb, self.stage_index - 1)]

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}BW{mb}")

    def perform_reduce_grad(self, *args, **kwargs):
        pass


def launch_tokens(toks: list[str]) -> list[str]:
    """Program tokens of one ``_batch_p2p`` call on ``toks`` (comm tokens), as torch 2.13
    launches it: an all-send or all-recv list op by op, a mixed list as one
    ``batch_isend_irecv`` (``BATCH[...]``)."""
    if len({"SEND" in t for t in toks}) > 1:
        return ["BATCH[" + "+".join(toks) + "]"]
    return list(toks)


def record_single(cls_name: str, p: int, m: int) -> list[list[str]]:
    """Program tokens ``Schedule1F1B``/``ScheduleGPipe._step_microbatches`` issue per rank."""
    cls = getattr(S, cls_name)
    rows = []
    for r in range(p):
        log: list[str] = []

        def batch(ops, desc=None):
            if not ops:
                return []
            log.extend(launch_tokens([o.tok for o in ops]))
            return [tuple(o.tok for o in ops)]

        def wait(work):
            for w in work:
                log.append("WAIT[" + "+".join(w) + "]")

        sched = cls(_FakeStage(p, r, log), m)
        sched._check_inputs = lambda *a, **k: ([()] * m, [{}] * m)
        sched._initialize_stage = lambda *a, **k: None
        sched._maybe_compute_loss = lambda *a, **k: None
        sched._maybe_get_loss = lambda *a, **k: None
        sched._update_losses = lambda *a, **k: None
        with mock.patch.object(S, "_batch_p2p", batch), \
                mock.patch.object(S, "_wait_batch_p2p", wait):
            sched._step_microbatches()
        rows.append(log)
    return rows


def torch_schedule(name: str, p: int, m: int, k: int) -> Any:
    """A torch schedule instance built on mock stages (as the visualizer does)."""
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, p, None
    stage.num_stages = p * k
    cls = S.get_schedule_class(name)
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls([stage] * k if k > 1 or issubclass(cls, S.PipelineScheduleMulti)
                       else stage, m)
    finally:
        logging.disable(logging.NOTSET)


def runtime_on_mock_stages(p: int, m: int, k: int) -> Any:
    """A bare ``_PipelineScheduleRuntime`` on mock stages, to call ``_load_csv`` on."""
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, p, None
    stage.num_stages = p * k
    return S._PipelineScheduleRuntime([stage] * k, m)

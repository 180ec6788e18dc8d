"""torch.distributed.pipelining's own orders, built live without a process group.

- :func:`torch_compute`: a schedule class's ``pipeline_order`` (or, with comms, the
  ``_PipelineScheduleRuntime`` lowering) via ``_schedule_visualizer.get_schedule_ops``,
  in schedsim tokens, idle cells and FSDP/REDUCE_GRAD bookkeeping dropped;
- :func:`record_single`: what ``Schedule1F1B`` / ``ScheduleGPipe._step_microbatches``
  really issue (compute, P2P posts, waits), recorded with a fake stage and patched P2P
  helpers, as program tokens (``post[a+b]`` -> ``a b``, ``wait[a+b]`` -> ``WAIT[a+b]``);
- :func:`record_runtime`: what ``_PipelineScheduleRuntime._step_microbatches`` really
  issues for a multi-stage class (compute, launches, recv waits, OVERLAP_F_B, final send
  waits), recorded the same way with stand-in stages;
- :func:`torch_schedule`: a schedule instance (mock stages) for ``_dump_csv``/``_load_csv``.
"""
from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace
from typing import Any
from unittest import mock

from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
from torch.distributed.pipelining.stage import PipelineStage

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


class _FakeRuntimeStage:
    """A stage of a multi-stage schedule: records compute, names P2P ops by token."""

    def __init__(self, stage_index: int, num_stages: int, rank: int, p: int,
                 log: list[str]) -> None:
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_rank, self.group_size = rank, p
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.submod = None
        self.log = log

    def _op(self, kind: str, mb: int) -> list[str]:
        return [f"{self.stage_index}{kind}{mb}"]

    def get_fwd_recv_ops(self, mb):
        return self._op("RECV_F", mb)

    def get_fwd_send_ops(self, mb):
        return self._op("SEND_F", mb)

    def get_bwd_recv_ops(self, mb):
        return self._op("RECV_B", mb)

    def get_bwd_send_ops(self, mb):
        return self._op("SEND_B", mb)

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
        self.log.append(f"{self.stage_index}{'BW' if full_backward else 'B'}{mb}")

    def backward_weight_one_chunk(self, mb, last_backward=False):
        self.log.append(f"{self.stage_index}W{mb}")

    def set_local_fwd_input(self, *args, **kwargs):
        pass

    def set_local_bwd_input(self, *args, **kwargs):
        pass

    def get_local_bwd_output(self, mb):
        return None

    def perform_reduce_grad(self, *args, **kwargs):
        pass


def _overlap_callback(action: Any, ctx: Any) -> None:
    """A custom OVERLAP_F_B function as torchtitan's ``dual_pipe_v.overlap_callback``
    registers it: wait the forward's recv, then the backward's, then run the pair
    overlapped (recorded as one ``(F;B)`` token)."""
    sched = ctx.schedule_ref
    stages = {st.stage_index: st for st in sched._stages}
    f, b = action.sub_actions
    fs, bs = stages[f.stage_index], stages[b.stage_index]
    if not fs.is_first and f.stage_index - 1 not in stages:
        S._wait_batch_p2p(sched.fwd_recv_ops.pop((f.stage_index, f.microbatch_index)))
    if not bs.is_last and b.stage_index + 1 not in stages:
        S._wait_batch_p2p(sched.bwd_recv_ops.pop((b.stage_index, b.microbatch_index)))
    fs.log.append(token(action))


def record_runtime(name: str, p: int, m: int, k: int = 2, *, defer_pp_recv: bool = False,
                   overlap_f_b: bool = False) -> list[list[str]] | None:
    """Program tokens torch's ``_PipelineScheduleRuntime._step_microbatches`` really
    issues per rank for the multi-stage schedule class ``name`` (k stages per rank):
    compute, launches (``_batch_p2p``: all-send/all-recv op by op, mixed as BATCH), waits
    (one ``WAIT`` per ``_wait_batch_p2p`` call, including the final waits on every send),
    recorded with stand-in stages. ``overlap_f_b`` registers :func:`_overlap_callback`.
    None if torch refuses (p, m, k)."""
    cls = S.get_schedule_class(name)
    num = p * k
    v_style = issubclass(cls, (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV))
    rows = []
    for r in range(p):
        log: list[str] = []
        idx = [r, num - 1 - r] if v_style else [r + i * p for i in range(k)]
        stages = [_FakeRuntimeStage(i, num, r, p, log) for i in idx]

        def batch(ops, desc=None, log=log):
            if not ops:
                return []
            log.extend(launch_tokens(list(ops)))
            return [tuple(ops)]

        def wait(work, log=log):
            for w in work:
                log.append("WAIT[" + "+".join(w) + "]")

        logging.disable(logging.CRITICAL)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sched = cls(stages, m, loss_fn=lambda *a: None, defer_pp_recv=defer_pp_recv)
        except (ValueError, AssertionError, RuntimeError):
            return None
        finally:
            logging.disable(logging.NOTSET)
        if overlap_f_b:
            sched.register_custom_function(S._ComputationType.OVERLAP_F_B, _overlap_callback)
        sched._check_inputs = lambda *a, **kw: ([()] * m, [{}] * m)
        sched._initialize_stages = lambda *a, **kw: None
        sched._maybe_compute_loss = lambda *a, **kw: None
        sched._maybe_get_loss = lambda *a, **kw: None
        sched._update_losses = lambda *a, **kw: None
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

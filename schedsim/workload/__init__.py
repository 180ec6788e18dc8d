"""Real models on real clusters: a model config, GPUs, a batch and parallel degrees →
costs in ms, bytes per rank, step time, tokens/s/GPU and MFU (docs/workload.md).

Modules: ``model`` (Hugging Face configs, :func:`load_model`), ``presets`` (shipped
model configs), ``hardware`` (GPU presets, :func:`gpu_preset`), ``layout``
(:class:`Workload`, its checks and stage layout), ``flops`` (FLOPs per piece and
Megatron-LM's model FLOPs), ``memory`` (activations after Korthikanti et al., static
bytes), ``cost`` (roofline pieces in ms → the stage model), ``derive`` (a workload on a
placement → the simulator's models), ``run`` (:func:`simulate_workload`).

Plain Python + pydantic + numpy (no torch).
"""
from __future__ import annotations

from schedsim.workload.derive import DerivedWorkload, derive
from schedsim.workload.flops import model_flops_per_step
from schedsim.workload.hardware import GPUS, Hardware, gpu_preset
from schedsim.workload.layout import RULES, Workload, WorkloadError, workload_from_dict
from schedsim.workload.model import ModelConfig, load_model
from schedsim.workload.presets import MODELS
from schedsim.workload.run import WorkloadResult, simulate_workload

__all__ = ["DerivedWorkload", "GPUS", "Hardware", "MODELS", "ModelConfig", "RULES",
           "Workload", "WorkloadError", "WorkloadResult", "derive", "gpu_preset",
           "load_model", "model_flops_per_step", "simulate_workload", "workload_from_dict"]

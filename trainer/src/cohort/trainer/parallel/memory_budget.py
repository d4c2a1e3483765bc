"""How much memory a device may use, and the activation checkpointing that fits in it.

``device_memory``: ``COHORT_DEVICE_MEMORY`` (e.g. ``16GiB``) when set, else 90 % of the GPU's own memory on a
GPU worker (the rest for the CUDA context, NCCL's buffers and the caching allocator's slack, which the memory
model does not count), else ``spec.resources.limits.memory`` (a CPU worker's device is its host), else 0 (not
known).

``checkpointing_for``: the spec's ``workload.activationCheckpointing``, or for ``auto`` the first of none,
selective and full under which the planner's memory model (planner/memory.py: parameters, gradients,
optimizer state and activations, fp32) puts the plan within the device's memory; full when none does.
The planner counts the activations of the built-in transformer (checked against torch's own storages in
trainer/tests/test_activation_checkpoint.py); for any other model, or when the memory is not known, auto is
none. Checkpointing does not change the mathematics, so ranks that chose differently (different GPUs) still
train the same model.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
from torch import nn

from cohort.api.models import TrainingJobSpec

from ..log import get_logger
from ..planner.dims import ParallelDims
from ..planner.hardware import Hardware, parse_bytes
from ..planner.memory import memory_per_device
from ..planner.search import fitting_checkpointing

log = get_logger(__name__)

GPU_SHARE = 0.9  # of a GPU's memory, what the planner may plan for


def device_memory(spec: TrainingJobSpec, device: torch.device | None = None) -> float:
    """Bytes a device may use (0: not known)."""
    text = os.environ.get("COHORT_DEVICE_MEMORY")
    if text:
        return parse_bytes(text)
    if device is not None and device.type == "cuda":
        return GPU_SHARE * torch.cuda.get_device_properties(device).total_memory
    limit = spec.resources.limits.get("memory")
    return parse_bytes(str(limit)) if limit else 0.0


def checkpointing_for(spec: TrainingJobSpec, model: nn.Module | None, dims: ParallelDims,
                      device: torch.device | None = None) -> ParallelDims:
    """``dims`` with the activation checkpointing this job runs (``auto`` fitted to the device's memory)."""
    mode = spec.workload.activation_checkpointing
    if mode != "auto":
        return replace(dims, ac=mode)
    from ..profiling import profile_model
    from ..workloads.models import Transformer

    memory = device_memory(spec, device)
    if not isinstance(model, Transformer) or not memory:
        log.info("activation checkpointing: auto is none", extra={
            "why": "the device's memory is not known" if not memory
            else f"the planner counts the built-in transformer's activations, not {type(model).__name__}'s"})
        return replace(dims, ac="none")
    opt = spec.workload.optimizer
    profile, batch = profile_model(model, None), spec.workload.batch_size * dims.dp
    fitted = fitting_checkpointing(profile, dims, batch, Hardware(memory_bytes=memory), opt.name, opt.momentum)
    need = memory_per_device(profile, fitted, batch, opt.name, opt.momentum).total
    log.info("activation checkpointing chosen", extra={"mode": fitted.ac, "plan": dims.describe(),
                                                       "predicted_bytes": round(need), "device_bytes": round(memory)})
    return fitted

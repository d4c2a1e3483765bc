"""How much memory a device may use, and the activation checkpointing that fits in it.

``device_memory``: ``COHORT_DEVICE_MEMORY`` (e.g. ``16GiB``) when set, else 90 % of the GPU's own memory on a
GPU worker (the rest for the CUDA context, NCCL's buffers and the caching allocator's slack, which the memory
model does not count), else ``spec.resources.limits.memory`` (a CPU worker's device is its host), else 0 (not
known).

``checkpointing_for``: the spec's ``workload.activationCheckpointing``, or for ``auto`` the first of none,
selective and full under which the planner's memory model (planner/memory.py: parameters, gradients,
optimizer state and activations) puts the plan within the device's memory; full when none does.
The activations are measured on the device in the job's precision (parallel/activation_probe.py) for any model
with blocks (``layers``), the built-in transformer and a user's alike; without a sample to measure with, the
planner's fp32 count of the built-in transformer (more than bf16 keeps: auto may then checkpoint more than it
needs). A model without blocks, or a device whose memory is not known, gets none. Checkpointing does not change
the mathematics, so ranks that chose differently (different GPUs) still train the same model.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cohort.api.models import TrainingJobSpec

from ..log import get_logger
from ..planner.dims import CHECKPOINTING_ORDER, ParallelDims
from ..planner.hardware import Hardware, parse_bytes
from ..planner.memory import memory_per_device
from ..planner.profile import ModelProfile, with_measured_activations
from ..planner.search import fitting_checkpointing
from .activation_probe import MODES, Activations, ProbeBatch, ProbeError, measure_activations
from .fsdp import shard_units

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
                      device: torch.device | None = None, probe: ProbeBatch | None = None) -> ParallelDims:
    """``dims`` with the activation checkpointing this job runs (``auto`` fitted to the device's memory, with the
    activations measured on ``probe``'s samples when given)."""
    mode = spec.workload.activation_checkpointing
    if mode != "auto":
        return replace(dims, ac=mode)
    memory = device_memory(spec, device)
    profile, why = memory_profile(spec, model, dims, device or torch.device("cpu"), probe) if memory \
        else (None, "the device's memory is not known")
    if profile is None:
        log.info("activation checkpointing: auto is none", extra={"why": why})
        return replace(dims, ac="none")
    opt = spec.workload.optimizer
    batch = spec.workload.batch_size * dims.dp
    fitted = fitting_checkpointing(profile, dims, batch, Hardware(memory_bytes=memory), opt.name, opt.momentum)
    need = memory_per_device(profile, fitted, batch, opt.name, opt.momentum).total
    log.info("activation checkpointing chosen", extra={
        "mode": fitted.ac, "plan": dims.describe(), "predicted_bytes": round(need), "device_bytes": round(memory),
        "activations": why or "measured"})
    return fitted


def agree_on_checkpointing(dims: ParallelDims) -> ParallelDims:
    """``dims`` with the most recomputation any rank of the group chose (a collective, on host tensors).

    Ranks choose by their own device's memory, which may differ (other GPUs, MIG slices, a pod's own
    ``COHORT_DEVICE_MEMORY``); under tensor parallelism full checkpointing runs the forward's all-reduces again
    in backward, so ranks that differed would issue different collectives and hang."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dims
    choice = torch.tensor([CHECKPOINTING_ORDER.index(dims.ac)])
    dist.all_reduce(choice, op=dist.ReduceOp.MAX)
    return replace(dims, ac=CHECKPOINTING_ORDER[int(choice)])


def memory_profile(spec: TrainingJobSpec, model: nn.Module | None, dims: ParallelDims, device: torch.device,
                   probe: ProbeBatch | None) -> tuple[ModelProfile | None, str]:
    """The profile auto fits ``dims`` with, and "" or why its activations are not measured (None: no profile)."""
    from ..profiling import block_profile, profile_model
    from ..workloads.models import Transformer

    blocks = shard_units(model) if model is not None else []
    if model is None or not blocks:
        return None, f"{type(model).__name__} has no blocks (`layers`) to checkpoint"
    counted = profile_model(model) if isinstance(model, Transformer) else None
    fallback = (counted, "the planner's fp32 count") if counted else (None, "its activations are not measured")
    if probe is None:
        return fallback[0], f"{fallback[1]}: no sample to measure with"
    sharded_bf16 = spec.workload.precision == "bf16" and dims.fully_sharded
    try:
        acts = _measured(model, probe, device, spec.workload.precision,
                         torch.bfloat16 if sharded_bf16 else torch.float32)
    except Exception as e:  # a model the probe cannot run still trains, planned without the measurement
        error = str(e) if isinstance(e, ProbeError) else f"{type(e).__name__}: {e}"
        log.warning("activations not measured", extra={"error": error[:500]})
        return fallback[0], f"{fallback[1]}: {error[:200]}"
    return with_measured_activations(counted or block_profile(model, blocks),
                                     {m: acts.block[m].per_sample for m in MODES},
                                     {m: acts.block[m].fixed for m in MODES}, (acts.rest.per_sample, acts.rest.fixed)), ""


def _measured(model: nn.Module, probe: ProbeBatch, device: torch.device, precision: str,
              param_dtype: torch.dtype) -> Activations:
    """``measure_activations``, once per model, device, precision and parameter dtype (every world asks)."""
    key = (str(device), precision, param_dtype)
    cache: dict[Any, Activations] = model.__dict__.setdefault("_cohort_activations", {})
    if key not in cache:
        cache[key] = measure_activations(model, probe, device, precision, param_dtype)
    return cache[key]

"""The optimizer and its learning-rate schedule: built from ``spec.workload.optimizer``, evaluated per step."""

from __future__ import annotations

import math
from typing import Any

import torch

from cohort.api.models import TrainingJobSpec


def build_optimizer(params: Any, opt: Any) -> torch.optim.Optimizer:
    """The spec's optimizer; ``implementation`` picks torch's kernel (auto: torch's own default)."""
    kernel: dict[str, Any] = {"auto": {}, "foreach": {"foreach": True}, "fused": {"fused": True},
                              "loop": {"foreach": False}}[opt.implementation]
    if opt.name == "adamw":
        return torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay, **kernel)
    return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay, **kernel)


def lr_at(step: int, dp_size: float, spec: TrainingJobSpec, epochs_done: float = 0.0) -> float:
    """Base lr scaled for the data-parallel size (relative to replicas.target), with linear warmup and
    the schedule's decay.

    ``dp_size`` is the global batch in units of ``batchSize``: the dp size, unless the plan (auto) keeps
    the global batch of data parallelism with fewer, larger dp ranks. ``epochs_done`` (fractional) measures
    an epoch-based run's progress, since its number of steps depends on the world sizes it will have.
    """
    w = spec.workload
    opt = w.optimizer
    ratio = dp_size / max(spec.replicas.target, 1)
    scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[opt.lr_scaling]
    warm = min(1.0, (step + 1) / opt.warmup_steps) if opt.warmup_steps > 0 else 1.0
    if w.max_steps > 0:
        progress = (step - opt.warmup_steps) / max(w.max_steps - opt.warmup_steps, 1)
    else:
        progress = epochs_done / max(w.epochs, 1)
    return opt.lr * scale * warm * decay(opt.schedule, opt.min_lr_ratio, progress)


def decay(schedule: str, floor: float, progress: float) -> float:
    """The schedule's factor at ``progress`` (0: warmup just ended, 1: the end of the run), from 1 to ``floor``."""
    p = min(max(progress, 0.0), 1.0)
    shape = {"constant": 1.0, "linear": 1.0 - p, "cosine": 0.5 * (1.0 + math.cos(math.pi * p))}[schedule]
    return floor + (1.0 - floor) * shape if schedule != "constant" else 1.0

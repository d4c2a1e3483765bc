"""``strategy: auto``: run the plan the planner ranks first for this world and model.

Rank 0 plans (so every rank runs the same plan even if their calibration
files differ) and broadcasts the choice; it is re-planned whenever the world
changes. The global batch stays what data parallelism would process on this
world (``batchSize x world size``), so every candidate trains the same thing
and the choice only changes speed and memory: a plan with fewer dp ranks
gives each a bigger batch. The choice and the planner's ranked table go to
the log; ``describe()`` (the ``/progress`` plan) says ``auto: <plan>``.

Hardware comes from the calibration file (``COHORT_CALIBRATION`` or
``~/.cache/cohort/calibration.json``, written by ``cohort calibrate``), else
the defaults; device memory from ``memory_budget.device_memory`` (``COHORT_DEVICE_MEMORY``, a GPU's own,
``spec.resources.limits.memory``, else unlimited). ``activationCheckpointing: auto`` is planned with each
split: the plan gets the least recomputation under which it fits. With a known memory, the activations are
those the trainer measures on the job's samples and device (parallel/activation_probe.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from cohort.api.models import TrainingJobSpec

from ..log import get_logger
from ..planner import Candidate, Hardware, best_plan, load_hardware, rank_plans
from ..planner.dims import ParallelDims
from ..profiling import profile_model
from ..workloads.splits import Split
from .activation_probe import ProbeBatch
from .base import Plan, PlanContext
from .data import DataParallel
from .dims import ParallelismError
from .memory_budget import checkpointing_for, device_memory, memory_profile
from .sharded import MeshPlan

log = get_logger(__name__)


def _sample(model: nn.Module) -> torch.Tensor | None:
    """One input for measuring a non-transformer model (built-in shapes only)."""
    if hasattr(model, "fc1") and isinstance(model.fc1, nn.Linear) and not hasattr(model, "conv1"):
        return torch.zeros(1, model.fc1.in_features)
    if hasattr(model, "shape"):
        return torch.zeros(1, *cast(tuple[int, ...], model.shape))
    return None


def may_shard(spec: TrainingJobSpec) -> bool:
    """Whether strategy auto may choose a sharded plan: gossip, local SGD and compression act on whole replicas,
    so only data parallelism runs them."""
    return spec.sync.algorithm == "allreduce" and spec.compression.method == "none"


def choose_dims(spec: TrainingJobSpec, model: nn.Module | None, world_size: int,
                device: torch.device | None = None, probe: ProbeBatch | None = None) -> ParallelDims:
    """The planner's first choice (a single-process decision; see AutoPlan for the collective one)."""
    replicas = ParallelDims(dp=world_size, dp_mode="ddp")
    if model is None or not may_shard(spec):
        return checkpointing_for(spec, model, replicas, device, probe)
    from ..planner import format_table, load_hardware
    from ..workloads.models import Transformer

    sample = None if isinstance(model, Transformer) else _sample(model)
    if sample is None and not isinstance(model, Transformer):
        return checkpointing_for(spec, model, replicas, device, probe)
    hw = load_hardware(os.environ.get("COHORT_CALIBRATION") or None).with_overrides(
        memory_bytes=device_memory(spec, device))
    best, ranked = plan_for(spec, model, world_size, hw, sample=sample, probe=probe, device=device)
    log.info("auto plan chosen", extra={"plan": best.dims.describe(), "predicted_step_ms":
                                        round(best.time.total * 1e3, 2), "hardware": hw.source,
                                        "ranking": format_table(ranked, limit=8).splitlines()})
    return best.dims


def plan_for(spec: TrainingJobSpec, model: nn.Module, world_size: int, hw: Hardware | None = None,
             sample: Any = None, probe: ProbeBatch | None = None,
             device: torch.device | None = None) -> tuple[Candidate, list[Candidate]]:
    """The planner's choice for ``spec`` on ``world_size`` ranks, and the whole ranked list.

    The global batch is the one data parallelism would use on this world
    (``batchSize x world_size``); ``parallelism.tensor``/``pipeline`` above 1
    pin those degrees. With ``probe`` and a known device memory, the activations are measured on ``device`` in
    the job's precision (memory_budget.memory_profile): with fp32 parameters under autocast for the plans that
    replicate them, and for a bf16 job's FSDP plans again with bf16 parameters and block inputs, as their
    MixedPrecisionPolicy runs them.
    """
    hw = hw or load_hardware()
    profile, sharded = profile_model(model, sample), None
    if probe is not None and hw.memory_bytes:
        device = device or torch.device("cpu")
        measured, _why = memory_profile(spec, model, ParallelDims(dp_mode="ddp"), device, probe)
        profile = measured or profile
        if spec.workload.precision == "bf16" and world_size > 1:
            sharded, _why = memory_profile(spec, model, ParallelDims(dp=world_size), device, probe)
    opt = spec.workload.optimizer
    p = spec.parallelism
    candidates = rank_plans(world_size, profile, hw, spec.workload.batch_size * world_size, opt.name,
                            opt.momentum, tp=p.tensor if p.tensor > 1 else None,
                            pp=p.pipeline if p.pipeline > 1 else None, ac=spec.workload.activation_checkpointing,
                            sharded_profile=sharded)
    best = best_plan(candidates)
    if best is None:
        reason = candidates[0].rejected if candidates else "no dp x tp x pp split of this model fits the world"
        raise ParallelismError(f"spec.parallelism.strategy: auto found no plan for {world_size} ranks ({reason})")
    return best, candidates


class AutoPlan(Plan):
    def __init__(self, ctx: PlanContext):
        super().__init__(ctx)
        choice = [choose_dims(ctx.spec, ctx.model, ctx.world_size, ctx.device, ctx.probe) if ctx.rank == 0 else None]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(choice, src=0)
        dims = choice[0]
        assert isinstance(dims, ParallelDims)
        self.dims = dims
        global_batch = ctx.spec.workload.batch_size * ctx.world_size
        self.inner: Plan = DataParallel(ctx, ac=dims.ac) if dims.dp_mode == "ddp" else \
            MeshPlan(ctx, dims, batch_size=global_batch // dims.dp)

    # Everything is the chosen plan's.
    @property
    def replicated(self) -> bool:  # type: ignore[override]
        return self.inner.replicated

    @property
    def checkpoint_group(self) -> dist.ProcessGroup | None:  # type: ignore[override]
        return self.inner.checkpoint_group

    @property
    def dp_rank(self) -> int:
        return self.inner.dp_rank

    @property
    def dp_size(self) -> int:
        return self.inner.dp_size

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    def apply(self, model: nn.Module) -> nn.Module:
        self.module = self.inner.apply(model)
        return self.module

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         scale: float = 1.0,
                         loss_scale: Callable[[torch.Tensor], torch.Tensor] = lambda v: v) -> torch.Tensor:
        return self.inner.forward_backward(x, y, loss_fn, scale, loss_scale)

    def accumulating(self) -> AbstractContextManager[Any]:
        return self.inner.accumulating()

    def clip_grad_norm(self, max_norm: float) -> float:
        return self.inner.clip_grad_norm(max_norm)

    def after_step(self, step: int) -> None:
        self.inner.after_step(step)

    def finish(self, step: int) -> None:
        self.inner.finish(step)

    def consensus(self, step: int) -> torch.Tensor | None:
        return self.inner.consensus(step)

    def eval_module(self) -> nn.Module:
        return self.inner.eval_module()

    def eval_outputs(self, split: Split, batch: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.inner.eval_outputs(split, batch)

    def describe(self) -> str:
        return "auto: " + self.inner.describe()

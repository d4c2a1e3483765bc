"""The explicit mesh strategies: how each derives its dims from the spec and the world size.

dp always follows the world size; tp (``parallelism.tensor``) and pp
(``parallelism.pipeline``) are fixed by the spec, so the operator keeps the
world a multiple of tp x pp. Every one of them runs as a MeshPlan.
"""

from __future__ import annotations

from typing import Any

from ..planner.dims import ParallelDims
from .base import PlanContext
from .dims import dims_for_world
from .memory_budget import agree_on_checkpointing, checkpointing_for
from .sharded import MeshPlan


def _dims(ctx: PlanContext, **fixed: Any) -> ParallelDims:
    """This world's dims from the spec, with its activation checkpointing (auto fitted to the device, the same on
    every rank)."""
    dims = checkpointing_for(ctx.spec, ctx.model, dims_for_world(ctx.spec, ctx.world_size, **fixed), ctx.device,
                             ctx.probe)
    return agree_on_checkpointing(dims) if ctx.spec.workload.activation_checkpointing == "auto" else dims


class FSDPPlan(MeshPlan):
    """``strategy: fsdp``: every rank is a dp rank; FSDP2 shards the model over all of them."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, _dims(ctx, tensor=1, pipeline=1))


class TensorPlan(MeshPlan):
    """``strategy: tensor``: tp = ``parallelism.tensor``; dp = world / tp, over FSDP2."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, _dims(ctx, pipeline=1))


class PipelinePlan(MeshPlan):
    """``strategy: pipeline``: pp = ``parallelism.pipeline`` stages; dp = world / pp, over FSDP2."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, _dims(ctx, tensor=1))


class HybridPlan(MeshPlan):
    """``strategy: hybrid``: dp x tp x pp with tp and pp from the spec."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, _dims(ctx))

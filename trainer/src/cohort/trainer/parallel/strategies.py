"""The explicit mesh strategies: how each derives its dims from the spec and the world size.

dp always follows the world size; tp (``parallelism.tensor``) and pp
(``parallelism.pipeline``) are fixed by the spec, so the operator keeps the
world a multiple of tp x pp. Every one of them runs as a MeshPlan.
"""

from __future__ import annotations

from .base import PlanContext
from .dims import dims_for_world
from .sharded import MeshPlan


class FSDPPlan(MeshPlan):
    """``strategy: fsdp``: every rank is a dp rank; FSDP2 shards the model over all of them."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, dims_for_world(ctx.spec, ctx.world_size, tensor=1, pipeline=1))


class TensorPlan(MeshPlan):
    """``strategy: tensor``: tp = ``parallelism.tensor``; dp = world / tp, over FSDP2."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, dims_for_world(ctx.spec, ctx.world_size, pipeline=1))


class PipelinePlan(MeshPlan):
    """``strategy: pipeline``: pp = ``parallelism.pipeline`` stages; dp = world / pp, over FSDP2."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, dims_for_world(ctx.spec, ctx.world_size, tensor=1))


class HybridPlan(MeshPlan):
    """``strategy: hybrid``: dp x tp x pp with tp and pp from the spec."""

    def __init__(self, ctx: PlanContext):
        super().__init__(ctx, dims_for_world(ctx.spec, ctx.world_size))

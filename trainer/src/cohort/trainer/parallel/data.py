"""``parallelism.strategy: data``: every rank holds the whole model; a Sync keeps replicas in agreement."""

from __future__ import annotations

import torch
from torch import nn

from ..planner.dims import ParallelDims
from ..sync.base import SyncContext
from ..sync.registry import SYNCS
from .activation_checkpoint import applied_checkpointing, apply_activation_checkpointing
from .base import Plan, PlanContext
from .compile import apply_compile
from .memory_budget import checkpointing_for


class DataParallel(Plan):
    replicated = True

    def __init__(self, ctx: PlanContext, ac: str | None = None):
        super().__init__(ctx)
        self.ac = ac  # activation checkpointing (None: the spec's, auto fitted to the device at the first apply)
        algo = ctx.spec.sync.algorithm
        self.sync = SYNCS[algo](SyncContext(ctx.rank, ctx.world_size, ctx.spec, ctx.stats, carried=ctx.carried,
                                             check_gate=ctx.check_gate))

    def apply(self, model: nn.Module) -> nn.Module:
        self.ac = applied_checkpointing(model) or self.ac or checkpointing_for(
            self.ctx.spec, model, ParallelDims(dp=self.ctx.world_size, dp_mode="ddp"), self.ctx.device, self.ctx.probe).ac
        apply_activation_checkpointing(model, self.ac)
        if self.ctx.spec.workload.compile:
            apply_compile(model)
        self.module = self.sync.wrap(model)
        return self.module

    def after_step(self, step: int) -> None:
        assert self.module is not None
        self.sync.after_step(self.module, step)

    def finish(self, step: int) -> None:
        assert self.module is not None
        self.sync.finish(self.module, step)

    def consensus(self, step: int) -> torch.Tensor | None:
        assert self.module is not None
        return self.sync.consensus(self.module, step)

    def describe(self) -> str:
        c, sync = self.ctx.spec.compression.method, self.ctx.spec.sync
        outer = sync.outer_optimizer.name if sync.algorithm == "localsgd" else "none"
        return (f"data dp={self.dp_size} sync={sync.algorithm}" + (f" outer={outer}" if outer != "none" else "")
                + (f" fragments={sync.fragments}" if sync.fragments > 1 else "")
                + (f" overlap={sync.overlap_steps}" if sync.overlap_steps else "")
                + (f" mixing={sync.mixing:g}" if sync.mixing else "")
                + (f" compression={c}" if c != "none" else "")
                + (f" ac={self.ac}" if self.ac not in (None, "none") else ""))

"""MeshPlan: a Plan over a dp x tp x pp DeviceMesh (the fsdp, tensor, pipeline and hybrid strategies).

No rank holds the whole training state, so this plan is not ``replicated``:
the trainer gives it a fresh model each world, ``apply`` builds the mesh and
composes the parallelisms (see parallelize.py), and then the state comes from
the newest checkpoint, which DCP reshards to the new mesh. Data sharding
follows the mesh: tp peers and pipeline stages of one dp replica read the
same batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from cohort.api.models import TrainingJobSpec

from ..planner.dims import ParallelDims
from ..runtime.device import to_device
from ..workloads.splits import Split
from .base import Plan, PlanContext
from .clip import clip_grad_norm
from .dims import ParallelismError
from .mesh import build_mesh
from .parallelize import Parallelized, parallelize
from .pipeline import check_pipeline
from .tensor import check_tensor_parallel


class MeshPlan(Plan):
    replicated = False

    def __init__(self, ctx: PlanContext, dims: ParallelDims, batch_size: int | None = None):
        super().__init__(ctx)
        if dims.world_size != ctx.world_size:
            raise ParallelismError(f"spec.parallelism: {dims.describe()} needs {dims.world_size} ranks, "
                                   f"the world has {ctx.world_size}")
        if ctx.spec.sync.algorithm != "allreduce":
            raise ParallelismError(f"spec.sync.algorithm: {ctx.spec.sync.algorithm} averages whole replicas; "
                                   "sharded strategies need allreduce (or strategy: data)")
        if ctx.spec.compression.method != "none":
            raise ParallelismError(f"spec.compression.method: {ctx.spec.compression.method} compresses DDP "
                                   "gradient buckets; sharded strategies reduce-scatter through FSDP2 "
                                   "(use strategy: data, or compression: none)")
        self.dims = dims
        self._batch_size = batch_size or ctx.spec.workload.batch_size
        # Coordinates in the ("pp", "dp", "tp") mesh, known before the mesh exists (rank order is fixed).
        self.pp_rank, rest = divmod(ctx.rank, dims.dp * dims.tp)
        self._dp_rank, self.tp_rank = divmod(rest, dims.tp)
        self.parts: Parallelized | None = None
        self.mesh: DeviceMesh | None = None

    @property
    def dp_rank(self) -> int:
        return self._dp_rank

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def apply(self, model: nn.Module) -> nn.Module:
        check_dims(self.dims, model, self.batch_size)
        mesh = self.mesh = build_mesh(self.dims, self.ctx.device)
        assert mesh.get_local_rank("dp") == self._dp_rank and mesh.get_local_rank("pp") == self.pp_rank
        self.parts = parallelize(model, self.dims, mesh, self.ctx.spec.workload, self.ctx.device)
        self.module = self.parts.module
        self.checkpoint_group = dist.new_group(backend="gloo")
        return self.module

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         scale: float = 1.0,
                         loss_scale: Callable[[torch.Tensor], torch.Tensor] = lambda v: v) -> torch.Tensor:
        assert self.parts is not None
        assert scale == 1.0, "globalBatchSize is for strategy data (admission refuses it here)"
        if self.parts.pipeline is not None:  # fp16 (a loss_scale) is for strategy data: admission refuses it here
            return self.parts.pipeline.train_step(x, y, loss_fn)
        return super().forward_backward(x, y, loss_fn, loss_scale=loss_scale)

    def clip_grad_norm(self, max_norm: float) -> float:
        assert self.parts is not None and self.mesh is not None
        stages = self.mesh["pp"].get_group() if self.dims.pp > 1 else None
        return clip_grad_norm(self.parts.module.parameters(), max_norm, stages)

    def eval_outputs(self, split: Split, batch: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        assert self.parts is not None
        # Equal shards: FSDP and tp all-gather inside forward, so every dp rank must run as many batches.
        per_rank = len(split) // self.dims.dp
        shard = torch.arange(self._dp_rank, per_rank * self.dims.dp, self.dims.dp)
        pipeline = self.parts.pipeline
        for start in range(0, len(shard), batch):
            x, y = split.fetch(shard[start:start + batch])
            x, y = to_device(x, self.ctx.device), to_device(y, self.ctx.device)
            out = pipeline.forward(x) if pipeline is not None else self.parts.module(x)
            if out is not None and self.tp_rank == 0:
                yield y, out

    def describe(self) -> str:
        return self.dims.describe()

    @classmethod
    def check(cls, spec: TrainingJobSpec, model: nn.Module | None) -> None:
        p = spec.parallelism
        dims = ParallelDims(tp=p.tensor, pp=p.pipeline, microbatches=p.microbatches, schedule=p.schedule)
        check_dims(dims, model, spec.workload.batch_size)


def check_dims(dims: ParallelDims, model: nn.Module | None, batch_size: int) -> None:
    """Refuse dims the model or the per-rank batch cannot be split by (one clear line, naming the field)."""
    if dims.dp_mode == "ddp" and (dims.tp > 1 or dims.pp > 1):
        raise ParallelismError("spec.parallelism: DDP replicas cannot hold tensor- or pipeline-parallel parts "
                               "(TP + plain DDP fails on gloo); the dp dimension uses FSDP2 instead")
    if model is None:
        return
    if dims.tp > 1:
        check_tensor_parallel(model, dims.tp)
    if dims.pp > 1:
        check_pipeline(model, dims.pp, dims.microbatches, dims.schedule, batch_size)

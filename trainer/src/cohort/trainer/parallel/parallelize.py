"""``parallelize``: the one place where the parallelisms compose, in this order.

1. **Pipeline split** (pp > 1): cut this rank's stage out of the model.
   First, so tensor parallelism and FSDP only touch modules this rank runs.
2. **Tensor parallel** (tp > 1): ``parallelize_module`` on the tp mesh.
   Before FSDP, because FSDP2 shards DTensor parameters further (a tp-sharded
   weight becomes 2-D over dp x tp); the other order is not supported.
3. **Activation checkpointing** (``dims.ac``: ``workload.activationCheckpointing``,
   auto resolved): each block's forward recomputed in backward (activation_checkpoint.py).
4. **Compile** (``workload.compile``): each block on its own (compile.py),
   the checkpointed forward inside.
5. **FSDP2** (dp > 1): ``fully_shard`` per block, then the root, on the dp mesh,
   with bf16 compute when ``workload.precision`` is bf16 (MixedPrecisionPolicy).
   Also the data-parallel gradient sync when tp or pp > 1 (TP + plain DDP
   fails on gloo; FSDP2 over a 2-D mesh works).
6. **Pipeline schedule** (pp > 1): the stage, wrapped as above, goes into a
   ``PipelineStage`` and a GPipe or 1F1B schedule (it turns off FSDP's
   gradient sync for all but the last microbatch itself).

The model is changed in place; the optimizer must be built afterwards, over
the parameters it now has (FSDP and TP replace them with DTensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from cohort.api.models import Workload

from ..planner.dims import ParallelDims
from .activation_checkpoint import apply_activation_checkpointing
from .compile import apply_compile
from .fsdp import apply_fsdp
from .pipeline import Pipeline, split_stage
from .tensor import apply_tp


@dataclass
class Parallelized:
    """What ``parallelize`` made of a model on this rank."""

    module: nn.Module              # the (stage) module, changed in place
    pipeline: Pipeline | None      # set when pp > 1


def parallelize(model: nn.Module, dims: ParallelDims, mesh: DeviceMesh, workload: Workload,
                device: torch.device) -> Parallelized:
    """``model`` may be on the host: tensor parallelism and FSDP2 move each tensor to ``device`` (the mesh's) as
    they shard it, one unit at a time, so the device never holds the whole unsharded model; what neither shards
    (a stage without dp or tp) moves after them."""
    pp_rank = mesh.get_local_rank("pp")
    if dims.pp > 1:
        split_stage(model, pp_rank, dims.pp)  # type: ignore[arg-type]  # check_dims allowed transformers only
    if dims.tp > 1:
        apply_tp(model, mesh["tp"])
    apply_activation_checkpointing(model, dims.ac)
    if workload.compile:
        apply_compile(model)
    if dims.dp > 1:
        apply_fsdp(model, mesh["dp"], reshard_after_forward=dims.pp == 1, precision=workload.precision,
                   device=device)
    model.to(device)
    pipeline = None
    if dims.pp > 1:
        pipeline = Pipeline(model, pp_rank, dims.pp, mesh.get_group("pp"), dims.microbatches, dims.schedule, device)
    return Parallelized(model, pipeline)

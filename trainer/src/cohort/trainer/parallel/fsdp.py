"""``apply_fsdp``: shard a model's parameters, gradients and optimizer state over the dp ranks with FSDP2.

Each transformer block is its own ``fully_shard`` unit, so only one block's
parameters are gathered at a time, and the root unit takes what is left
(embeddings, final norm, output). Models without ``layers`` are one root unit.
When the model already holds tensor-parallel DTensors (1-D on the tp mesh),
``fully_shard`` on the dp mesh makes them 2-D; that is how tp and dp compose
(plain DDP over TP parameters fails on gloo).

A model on the host is moved to ``device`` a unit at a time, each just before it is sharded: the device holds
the shards so far and one unit whole, never the whole model.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The sub-modules that get their own FSDP unit: the transformer's blocks (those this stage holds)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        return list(layers.values() if isinstance(layers, nn.ModuleDict) else layers)
    return []


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, *, reshard_after_forward: bool = True,
               precision: str = "fp32", device: torch.device | None = None) -> nn.Module:
    """Shard ``model`` in place over ``dp_mesh``; returns it (now an FSDPModule).

    ``precision`` bf16: parameters are gathered and computed in bf16, gradients
    reduced in fp32 (torchtitan's default policy); the sharded parameters and
    the optimizer stay fp32.

    ``reshard_after_forward=False`` keeps each block gathered between forward
    and backward: pipeline stages run several microbatches per step, and
    re-gathering for each of them would multiply the all-gathers.
    """
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16" else MixedPrecisionPolicy()
    for unit in [*shard_units(model), model]:  # the root last: what the blocks left (embeddings, head)
        if device is not None:
            unit.to(device)  # a sharded block's DTensors are there already: only this unit's own tensors move
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    return model

"""Gradient clipping by the global L2 norm, over every shard of the model.

Under FSDP2 and tensor parallelism a gradient is a DTensor: its norm is a
partial value on each rank, and ``full_tensor()`` reduces it over its mesh.
Under pipeline parallelism each stage holds other parameters, so the stages'
squared norms are summed over the pipeline group. Replicated gradients (DDP,
after its allreduce) count once. torch's ``clip_grad_norm_`` does the first
part for one mesh; it cannot mix DTensors of several meshes with plain
tensors, nor see other pipeline stages, so the norm is put together here
from ``torch.nn.utils.get_total_norm`` per group, and the gradients are
scaled in place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float,
                   stage_group: dist.ProcessGroup | None = None) -> float:
    """Scale the gradients so their global L2 norm is at most ``max_norm``; returns the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = {}
    plain: list[torch.Tensor] = []
    for g in grads:
        if isinstance(g, DTensor):
            by_mesh.setdefault(g.device_mesh, []).append(g)
        else:
            plain.append(g)
    if not grads:  # every pipeline stage holds parameters, so the stages' all_reduce below is never skipped
        assert stage_group is None, "a pipeline stage without gradients"
        return 0.0
    local = grads[0].to_local() if isinstance(grads[0], DTensor) else grads[0]
    squared = local.new_zeros((), dtype=torch.float64)  # on the gradients' device (NCCL sums it across stages)
    if plain:
        squared += torch.nn.utils.get_total_norm(plain, 2.0).double() ** 2
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        squared += (norm.full_tensor() if isinstance(norm, DTensor) else norm).double() ** 2
    if stage_group is not None:
        dist.all_reduce(squared, group=stage_group)
    total = float(squared.sqrt())
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total

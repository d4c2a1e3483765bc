"""The model's parameters as one flat vector, in ``parameters_to_vector``'s order: slices of it read and written
through views, and the whole written back in place.

torch's ``vector_to_parameters`` rebinds each parameter's ``.data`` to a view of the vector instead of writing
into it: whatever holds the old storage (a wrapper tensor subclass, such as the tests' simulated device, whose
parameters then silently keep their values; a captured graph) no longer sees the parameters. Writing in place
keeps each parameter's storage. Replicas that train apart (gossip, local SGD) are evaluated and checkpointed as
their average, a flat vector (``Sync.consensus``): ``holding`` puts it into the parameters for an evaluation,
``named_slices`` into a checkpoint's state dict.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def slice_views(params: list[torch.Tensor], a: int, b: int) -> list[torch.Tensor]:
    """Flat views of entries a..b of the parameters' flat concatenation (parameters_to_vector's order): a round
    reads and writes its slice through them, without copying the rest of the model."""
    views, start = [], 0
    for p in params:
        end = start + p.numel()
        if start < b and end > a:
            views.append(p.detach().view(-1)[max(a, start) - start:min(b, end) - start])
        if end >= b:
            break
        start = end
    return views


def write_flat(params: list[torch.Tensor], vec: torch.Tensor) -> None:
    """Copy the flat ``vec`` into the parameters (or into ``slice_views``' views of them), in place."""
    for p, value in zip(params, torch.split(vec, [p.numel() for p in params]), strict=True):
        p.detach().view(-1).copy_(value)


def named_slices(model: nn.Module, vec: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each parameter name of ``model`` (a tied parameter under each of its names, as its state dict has it) ->
    its entries of the flat ``vec`` (``parameters_to_vector``'s order), shaped like the parameter."""
    offsets, start = {}, 0
    for p in model.parameters():  # each tensor once, in the vector's order
        offsets[id(p)], start = start, start + p.numel()
    return {name: vec[offsets[id(p)]:offsets[id(p)] + p.numel()].view_as(p)
            for name, p in model.named_parameters(remove_duplicate=False)}


@contextmanager
def holding(params: list[torch.Tensor], vec: torch.Tensor | None) -> Iterator[None]:
    """Within the block the parameters hold the flat ``vec``; after it (an error included) their own values again.
    None: the parameters as they are."""
    if vec is None:
        yield
        return
    own = torch.cat([p.detach().reshape(-1) for p in params])
    write_flat(params, vec)
    try:
        yield
    finally:
        write_flat(params, own)

"""The model's parameters as one flat vector, in ``parameters_to_vector``'s order: slices of it read and written
through views, and the whole written back in place.

torch's ``vector_to_parameters`` rebinds each parameter's ``.data`` to a view of the vector instead of writing
into it: whatever holds the old storage (a wrapper tensor subclass, such as the tests' simulated device, whose
parameters then silently keep their values; a captured graph) no longer sees the parameters. Writing in place
keeps each parameter's storage.
"""

from __future__ import annotations

import torch


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

"""Error feedback (Seide et al. 2014, "1-bit SGD"; Stich et al. 2018; Karimireddy et al. 2019).

What a biased compressor drops is not lost: it is kept as a residual and added
to the next step's input. Invariant: after T steps, the sum of everything sent
plus the current residual equals the sum of the T inputs, so every gradient
coordinate is eventually applied.

Residuals are keyed (DDP bucket index, or any name) and reset when a key's
size changes, or when the Sync is rebuilt for a new world. DDP rebuilds its
buckets after the first iteration, in the order the gradients became ready:
a bucket may then keep its index and size but hold its tensors in another
order, so the DDP hooks also reset a bucket's memory when its parameters or
their order change (:class:`BucketLayouts`). Otherwise a residual would be
added to other coordinates than the ones it was kept for.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
import torch.distributed as dist


class ErrorFeedback:
    def __init__(self) -> None:
        self.residuals: dict[Hashable, torch.Tensor] = {}

    def compensate(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the residual carried from the previous step (a new tensor)."""
        r = self.residuals.get(key)
        if r is None or r.shape != x.shape:
            return x.clone()
        return x + r

    def update(self, key: Hashable, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        """Keep what the compressor dropped this step."""
        self.residuals[key] = compensated - sent

    def reset(self, key: Hashable) -> None:
        self.residuals.pop(key, None)


class BucketLayouts:
    """Which parameters, in which order, each DDP bucket held when its memory was last used."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[tuple[int, int], ...]] = {}

    def check(self, bucket: dist.GradBucket, memory: Any) -> None:
        """Reset ``memory``'s state for this bucket if DDP has changed what the bucket holds."""
        layout = tuple((p.data_ptr(), p.numel()) for p in bucket.parameters())
        key = bucket.index()
        if memory is not None and self.seen.get(key, layout) != layout:
            memory.reset(key)
        self.seen[key] = layout

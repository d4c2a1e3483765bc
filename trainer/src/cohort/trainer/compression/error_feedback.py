"""Error feedback (Seide et al. 2014, "1-bit SGD"; Stich et al. 2018; Karimireddy et al. 2019).

What a biased compressor drops is not lost: it is kept as a residual and added
to the next step's input. Invariant: after T steps, the sum of everything sent
plus the current residual equals the sum of the T inputs, so every gradient
coordinate is eventually applied.

Residuals are keyed (DDP bucket index, or any name) and reset when a key's
size changes, e.g. when DDP rebuilds its buckets after the first iteration or
the Sync is rebuilt for a new world.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch


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

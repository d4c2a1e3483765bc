"""powersgd: low-rank gradient factorisation (Vogels et al. 2019), torch's own DDP hook.

Not a payload compressor: PowerSGD's factors P and Q are summed by allreduces,
so it runs only with ``sync.algorithm: allreduce`` (gossip sends parameters to
neighbours only; local SGD averages parameters). Rank ``compression.rank``,
error feedback per ``compression.errorFeedback``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sync.base import SyncContext
from .base import Method
from .hooks import Hook, powersgd_hook


@dataclass(frozen=True)
class PowerSGDConfig:
    rank: int = 2
    """The approximation rank (compression.rank)."""
    error_feedback: bool = True
    """Carry each rank's approximation error into its next step (compression.errorFeedback)."""


class PowerSGD(Method):
    name = "powersgd"
    Config = PowerSGDConfig

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return powersgd_hook(ctx, self.config.rank, self.config.error_feedback)

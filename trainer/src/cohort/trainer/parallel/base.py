"""The Plan interface: one parallelism strategy applied to one world.

A plan is rebuilt after every membership change. It decides which data shard
a rank reads (``dp_rank``/``dp_size``), wraps or shards the model, runs the
forward/backward of a step, and says whether every data-parallel rank holds
the full training state (``replicated``): then a membership change recovers by
broadcasting state from a live peer, and rank 0 alone writes checkpoints.
Sharded plans recover and checkpoint through DCP collectively.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..sync.base import CommStats


@dataclass
class PlanContext:
    spec: Any            # the job spec (config Section)
    rank: int
    world_size: int
    stats: CommStats


class Plan(ABC):
    replicated = True

    def __init__(self, ctx: PlanContext):
        self.ctx = ctx
        self.module: nn.Module | None = None

    @property
    def dp_rank(self) -> int:
        return self.ctx.rank

    @property
    def dp_size(self) -> int:
        return self.ctx.world_size

    @abstractmethod
    def apply(self, model: nn.Module) -> nn.Module:
        """Parallelize ``model`` for this world; returns the module to train."""

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        assert self.module is not None
        loss = loss_fn(self.module(x), y)
        loss.backward()
        return loss.detach()

    def after_step(self, step: int) -> None:  # noqa: B027 - optional
        """After the optimizer step (gossip and local SGD average parameters here)."""

    def eval_module(self) -> nn.Module:
        assert self.module is not None
        return self.module

    def describe(self) -> str:
        return f"dp={self.dp_size}"

    def sync_state(self) -> dict[str, Any]:
        return {}

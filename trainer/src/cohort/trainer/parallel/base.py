"""The Plan interface: one parallelism strategy applied to one world.

A plan is rebuilt after every membership change. It decides which data shard
a rank reads (``dp_rank``/``dp_size``), wraps or shards the model, runs the
forward/backward of a step, and says whether every data-parallel rank holds
the full training state (``replicated``): then a membership change recovers by
broadcasting state from a live peer, and rank 0 alone writes checkpoints.
Sharded plans recover and checkpoint through DCP collectively: the trainer
builds them a fresh model, ``apply`` shards it, and only then is state loaded
(from the newest checkpoint, resharded by DCP to this world's mesh).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cohort.api.models import TrainingJobSpec

from ..runtime.device import to_device
from ..sync.base import CommStats
from ..workloads.splits import Split
from .activation_probe import ProbeBatch
from .clip import clip_grad_norm


@dataclass
class PlanContext:
    spec: TrainingJobSpec
    rank: int
    world_size: int
    stats: CommStats
    model: nn.Module | None = None   # an unsharded copy of the model, for planning and checks (may be None)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # runtime/device.py's choice
    carried: dict[str, torch.Tensor] = field(default_factory=dict)  # the sync's state across worlds (TrainState.sync)
    check_gate: Callable[[], None] = lambda: None  # the commit gate's check, for exchanges after the step (SyncContext)
    probe: ProbeBatch | None = None  # samples to measure activations with (activationCheckpointing auto)


class Plan(ABC):
    replicated = True
    checkpoint_group: dist.ProcessGroup | None = None  # sharded plans save on their own group (async saves
    #                                                    run collectives on a background thread)

    def __init__(self, ctx: PlanContext):
        self.ctx = ctx
        self.module: nn.Module | None = None

    @property
    def dp_rank(self) -> int:
        return self.ctx.rank

    @property
    def dp_size(self) -> int:
        return self.ctx.world_size

    @property
    def batch_size(self) -> int:
        """Samples per data-parallel rank per step (the spec's, unless the plan keeps another global batch)."""
        return self.ctx.spec.workload.batch_size

    @classmethod
    def check(cls, spec: TrainingJobSpec, model: nn.Module | None) -> None:
        """Refuse, before training starts, a spec this strategy cannot run (raise a ValidationError)."""
        return None  # replicas run whatever the model runs

    @abstractmethod
    def apply(self, model: nn.Module) -> nn.Module:
        """Parallelize ``model`` for this world; returns the module to train."""

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         scale: float = 1.0,
                         loss_scale: Callable[[torch.Tensor], torch.Tensor] = lambda v: v) -> torch.Tensor:
        """One micro-batch: forward, and backward of the loss times ``scale`` (then through ``loss_scale``:
        fp16's gradient scaler); returns the unscaled loss."""
        assert self.module is not None
        loss = loss_fn(self.module(x), y)
        loss_scale(loss * scale if scale != 1.0 else loss).backward()
        return loss.detach()

    def accumulating(self) -> AbstractContextManager[Any]:
        """Backward passes inside accumulate gradients without communicating (DDP's ``no_sync``): every
        micro-batch of a step but the last runs here, so hooks and compressors fire once per step."""
        no_sync = getattr(self.module, "no_sync", None)
        return no_sync() if callable(no_sync) else nullcontext()

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip the gradients' global L2 norm (optimizer.gradClipNorm); returns the norm before clipping."""
        assert self.module is not None
        return clip_grad_norm(self.module.parameters(), max_norm)

    def after_step(self, step: int) -> None:  # noqa: B027 - optional
        """After the optimizer step (gossip and local SGD average parameters here)."""

    def finish(self, step: int) -> None:  # noqa: B027 - optional
        """Training ended after ``step`` on every rank (a collective): the replicas become one model before the
        final evaluation and checkpoint (data parallelism's sync)."""

    def consensus(self, step: int) -> torch.Tensor | None:
        """Collective: the one model replicas that train apart make at ``step`` (flat; data parallelism's
        ``Sync.consensus``), which evaluations measure and checkpoints hold; None when the ranks hold it."""
        return None

    def eval_module(self) -> nn.Module:
        assert self.module is not None
        return self.module

    def eval_outputs(self, split: Split, batch: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(targets, model outputs) for this rank's share of the eval ``split``, batch by batch.

        Ranks whose outputs duplicate another's (tp peers, non-last pipeline
        stages) yield nothing, so metric sums over all ranks count each sample once.
        """
        module = self.eval_module()
        shard = torch.arange(self.dp_rank, len(split), self.dp_size)
        for start in range(0, len(shard), batch):
            x, y = split.fetch(shard[start:start + batch])
            yield to_device(y, self.ctx.device), module(to_device(x, self.ctx.device))

    def describe(self) -> str:
        return f"dp={self.dp_size}"

    def sync_state(self) -> dict[str, Any]:
        return {}

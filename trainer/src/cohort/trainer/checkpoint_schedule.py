"""When a checkpoint is due: ``checkpoint.everySteps`` and ``everySeconds``, decided alike on every rank.

The step count is the same on every rank, so ``everySteps`` needs no agreement. Each rank's clock started
at its own time, so alone the ranks disagree on ``everySeconds`` near its deadline: a sharded save is a
collective every rank must enter at the same step (before this, ranks of an FSDP plan saved at different
steps and committed checkpoints without a rank's shards), and the ranks that do not save a replicated plan
must know that rank 0 does, because their next collective waits for it (collective_timeout.py). So the
time-based part is agreed each step: a one-integer MAX allreduce, only when ``everySeconds`` is set. A final
save (leaving, or after the last step) is never agreed: rank 0 may be alone.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cohort.api.models import Checkpoint


class CheckpointSchedule:
    def __init__(self, spec: Checkpoint, device: torch.device):
        self.spec, self.device = spec, device
        self.last_time = time.monotonic()
        self.last_step = -1  # the step of the newest save decided

    @property
    def enabled(self) -> bool:
        return self.spec.every_steps > 0 or self.spec.every_seconds > 0

    def due(self, step: int, final: bool = False, agree: bool = False) -> bool:
        """Whether to save at ``step`` (once per step); ``agree``: the ranks of a world decide together,
        so every one of them must call this at the same step."""
        by_time = self._by_seconds(agree and not final)
        every = self.spec.every_steps
        due = by_time or (final and self.enabled) or (every > 0 and step % every == 0)
        if not due or step == self.last_step:
            return False
        self.last_time, self.last_step = time.monotonic(), step
        return True

    def _by_seconds(self, agree: bool) -> bool:
        every = self.spec.every_seconds
        if every <= 0:
            return False
        mine = time.monotonic() - self.last_time >= every
        if not agree:
            return mine
        flag = torch.tensor([int(mine)], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

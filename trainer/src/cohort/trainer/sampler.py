"""An elastic, exactly resumable data order.

Each epoch has one global permutation (seeded by ``seed`` and the epoch). A
step consumes the next global batch of it (``batch_size x world_size``, or the
fixed ``global_batch_size``) and rank r takes its ``r``-th contiguous share
(shares differ by at most one sample when the world does not divide it). The position is a single global offset, so it stays
exact when the world size changes mid-epoch or a job resumes from a
checkpoint at another size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ElasticSampler:
    def __init__(self, num_samples: int, batch_size: int, seed: int, global_batch_size: int = 0):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size  # 0: batch_size x world_size
        self.seed = seed
        self.epoch = 0
        self.offset = 0  # global samples consumed in this epoch
        self._perm: tuple[int, torch.Tensor] | None = None

    def _permutation(self) -> torch.Tensor:
        if self._perm is None or self._perm[0] != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._perm = (self.epoch, torch.randperm(self.num_samples, generator=g))
        return self._perm[1]

    def global_batch(self, world_size: int) -> int:
        return self.global_batch_size or self.batch_size * world_size

    def epoch_done(self, world_size: int) -> bool:
        """True when fewer than one full global batch remains (the tail is dropped)."""
        return self.offset + self.global_batch(world_size) > self.num_samples

    def steps_left_in_epoch(self, world_size: int) -> int:
        return max(0, (self.num_samples - self.offset) // self.global_batch(world_size))

    def indices(self, rank: int, world_size: int) -> torch.Tensor:
        return self._share(self.offset, rank, world_size)

    def _share(self, offset: int, rank: int, world_size: int) -> torch.Tensor:
        """Rank ``rank``'s contiguous share of the global batch that starts at ``offset``."""
        g = self.global_batch(world_size)
        return self._permutation()[offset + g * rank // world_size:offset + g * (rank + 1) // world_size]

    def upcoming(self, rank: int, world_size: int) -> Iterator[torch.Tensor]:
        """This rank's indices for the current step and each later one of this epoch, in this world."""
        epoch, offset, g = self.epoch, self.offset, self.global_batch(world_size)
        while epoch == self.epoch and offset + g <= self.num_samples:
            yield self._share(offset, rank, world_size)
            offset += g

    def micro_batches(self, world_size: int) -> int:
        """How many micro-batches of at most ``batch_size`` every rank runs per step (the largest share's)."""
        largest_share = -(-self.global_batch(world_size) // world_size)  # ceiling division
        return -(-largest_share // self.batch_size)

    def advance(self, world_size: int) -> None:
        self.offset += self.global_batch(world_size)

    def next_epoch(self) -> None:
        self.epoch += 1
        self.offset = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(f"checkpoint was taken on a dataset of {state['num_samples']} samples, "
                             f"this one has {self.num_samples}")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])

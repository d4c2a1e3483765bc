"""An elastic, exactly resumable data order.

Each epoch has one global permutation (seeded by ``seed`` and the epoch). A
step consumes the next global batch of it (``batch_size x world_size``, or the
fixed ``global_batch_size``) and rank r takes its ``r``-th contiguous share
(shares differ by at most one sample when the world does not divide it). The position is a single global offset, so it stays
exact when the world size changes mid-epoch or a job resumes from a
checkpoint at another size.

The seed on resume. ``seed`` is the spec's (``workload.seed``); the position
carries the seed that orders the epoch in progress (``epoch_seed``). A
position taken with another seed (a new job resuming an old job's checkpoint,
or a ``cohort run --local`` re-run with the seed changed; a running
TrainingJob's seed is immutable at admission) keeps that seed until its epoch
ends, so the epoch stays one permutation: no sample twice, none skipped. The
next epochs are ordered by the spec's seed. A position at the very start of an
epoch takes the spec's seed at once. Either way the result depends only on the
checkpoint and the spec, not on the world size, and it is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)


class ElasticSampler:
    def __init__(self, num_samples: int, batch_size: int, seed: int, global_batch_size: int = 0):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size  # 0: batch_size x world_size
        self.seed = seed  # the spec's: orders every epoch this process starts
        self.epoch_seed = seed  # orders the epoch in progress (a loaded position's own, until its epoch ends)
        self.epoch = 0
        self.offset = 0  # global samples consumed in this epoch
        self._perm: tuple[tuple[int, int], torch.Tensor] | None = None

    def _permutation(self) -> torch.Tensor:
        key = (self.epoch, self.epoch_seed)
        if self._perm is None or self._perm[0] != key:
            g = torch.Generator().manual_seed(self.epoch_seed * 1_000_003 + self.epoch)
            self._perm = (key, torch.randperm(self.num_samples, generator=g))
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
        self.epoch_seed = self.seed

    def state_dict(self) -> dict[str, Any]:
        # "seed" is the epoch in progress's (before issue 32 it was the only one, and it was ignored on load).
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.epoch_seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(f"checkpoint was taken on a dataset of {state['num_samples']} samples, "
                             f"this one has {self.num_samples}")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        taken = int(state.get("seed", self.seed))
        self.epoch_seed = taken if self.offset > 0 else self.seed
        if taken != self.seed:
            log.warning("resuming a position taken with workload.seed %d; spec.workload.seed is %d: %s", taken,
                        self.seed, f"epoch {self.epoch} continues in the order it began ({self.offset} of "
                        f"{self.num_samples} samples done), epochs from {self.epoch + 1} on follow seed {self.seed}"
                        if self.offset > 0 else f"epoch {self.epoch} has not begun and follows seed {self.seed}")

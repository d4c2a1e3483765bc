"""The Sync interface, and the per-process accounting every algorithm reports to.

A Sync wraps the model for one world (it is rebuilt after every membership
change) and may act after each optimizer step. Whatever it sends, it records
in :class:`CommStats`, honestly for the collective used (a ring allreduce of
n bytes sends 2(P-1)/P * n per rank; an allgather of k bytes sends (P-1) * k).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cohort.api.models import TrainingJobSpec


class CommStats:
    """Cumulative bytes this process sent, payload vs dense sizes (compression ratio), and the replicas' drift."""

    def __init__(self, clock: Callable[[], Any] = time.perf_counter) -> None:
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.payload_bytes = 0
        self.dense_bytes = 0
        self.clock = clock          # timing.DeviceClock.mark on a device: marks are stream events
        self.hooks = 0              # gradient buckets handed to communication so far
        self.last_hook: Any = None  # the clock's mark at the last hand-off
        # How far this replica was from the replicas' average when last measured (sync/mean.py average, for an
        # evaluation or a periodic checkpoint of gossip or local SGD): ||mine - average|| / ||average||.
        self.replica_drift = 0.0

    def record(self, wire_bytes: int, payload_bytes: int, dense_bytes: int) -> None:
        with self._lock:
            self.bytes_sent += int(wire_bytes)
            self.payload_bytes += int(payload_bytes)
            self.dense_bytes += int(dense_bytes)

    def mark_hook(self) -> None:
        self.last_hook = self.clock()
        self.hooks += 1

    @property
    def compression_ratio(self) -> float:
        return self.dense_bytes / self.payload_bytes if self.payload_bytes else 1.0


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring allreduce (reduce-scatter + allgather)."""
    return 0 if world_size <= 1 else (2 * (world_size - 1) * nbytes) // world_size


def allgather_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in an allgather of ``nbytes`` per rank (ring: (P-1) hops of its payload)."""
    return (world_size - 1) * nbytes


@dataclass
class SyncContext:
    """What a Sync needs to know about the world it runs in."""

    rank: int
    world_size: int
    spec: TrainingJobSpec
    stats: CommStats
    group: dist.ProcessGroup | None = None   # None: the default group
    # State the trainer keeps across worlds for this sync, identical on every rank (TrainState.sync: local
    # SGD's outer step); empty when it keeps none.
    carried: dict[str, torch.Tensor] = field(default_factory=dict)
    # The commit gate's check (commit.py): raises StepDiscarded when this step's collectives failed. An exchange
    # after the optimizer step calls it before applying its result (NCCL reports a failure late, the result
    # perhaps half written).
    check_gate: Callable[[], None] = lambda: None


class Sync(ABC):
    """One synchronisation algorithm, for one world."""

    def __init__(self, ctx: SyncContext):
        self.ctx = ctx
        self.agreed = False  # finish() made the replicas one model: consensus() has nothing to compute

    @abstractmethod
    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the trainer calls forward/backward on."""

    def after_step(self, model: nn.Module, step: int) -> None:  # noqa: B027 - optional hook
        """Runs after each optimizer step (parameter averaging lives here)."""

    def finish(self, model: nn.Module, step: int) -> None:  # noqa: B027 - optional hook
        """Training ended after ``step``, on every rank at once (a collective): replicas that train apart
        (gossip, local SGD) become one model here, so that the job's final evaluation and checkpoint are of it."""

    def consensus(self, model: nn.Module, step: int) -> torch.Tensor | None:
        """Collective, at ``step`` on every rank: the one model the replicas make now, as a flat vector in
        ``parameters_to_vector``'s order, which evaluations measure and checkpoints hold (sync/flat.py); None
        when the replicas are one model already (allreduce's always; gossip's and local SGD's after ``finish``)."""
        return None

"""How the mean of one flat vector per rank travels: local SGD's rounds and the replicas' :func:`average` send one.

A :class:`Mean` starts the exchange and returns it in flight (:class:`InFlight`); ``wait`` gives the mean in fp32,
the same bits on every rank. :class:`CastMean` is an allreduce of x / P in a float dtype (fp32: exact up to the
sum's rounding; fp16 and bf16: half the bytes). compression/fp8.py's mean sends 8-bit codes with a scale per chunk,
as a reduce-scatter then an all-gather. A lossy mean is for the change since a reference every rank holds bit for
bit (local SGD's θ): the rounding then touches the small update, not the weights. :func:`average` is the replicas'
average that evaluations and checkpoints of gossip and local SGD hold (``Sync.consensus``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.distributed as dist

from .base import SyncContext, ring_allreduce_bytes


class InFlight(ABC):
    """A mean sent and not yet received. ``wire_bytes``: what this rank sends for it; ``payload_bytes``: the size
    its vector travels in (the compressed size of a DDP bucket or a round)."""

    wire_bytes: int
    payload_bytes: int

    def advance(self) -> None:  # noqa: B027 - a one-phase exchange has nothing to advance
        """Collective, on every rank at the same point: start whatever phase can start now (a two-phase exchange
        starts its second when its first has arrived), so that ``wait`` has less left to do."""

    @abstractmethod
    def wait(self) -> torch.Tensor:
        """The mean in fp32, identical on every rank; raises if the exchange failed (a peer left)."""


class Mean(ABC):
    """One way of sending a mean."""

    #: Rounds what it sends: meant for the change since a shared reference, not for the weights themselves.
    lossy: bool

    @abstractmethod
    def start(self, x: torch.Tensor, group: dist.ProcessGroup | None, world: int) -> InFlight:
        """Start the mean of this rank's flat fp32 ``x`` (left unchanged) over the ``world`` ranks of ``group``."""


class _Allreduced(InFlight):
    def __init__(self, sent: torch.Tensor, work: Any):
        self.sent, self.work = sent, work
        self.payload_bytes = sent.element_size() * sent.numel()

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.sent.float()


class CastMean(Mean):
    """An allreduce of x / P cast to ``dtype``, left running; its sum back in fp32."""

    def __init__(self, dtype: torch.dtype):
        self.dtype, self.lossy = dtype, dtype != torch.float32

    def start(self, x: torch.Tensor, group: dist.ProcessGroup | None, world: int) -> InFlight:
        sent = (x / world).to(self.dtype)
        flight = _Allreduced(sent, dist.all_reduce(sent, group=group, async_op=True))
        flight.wire_bytes = ring_allreduce_bytes(flight.payload_bytes, world)
        return flight


FP32_MEAN = CastMean(torch.float32)


def average(ctx: SyncContext, mine: torch.Tensor, reference: torch.Tensor | None = None,
            mean: Mean = FP32_MEAN) -> torch.Tensor:
    """Collective: the replicas' average of the flat ``mine`` (a new tensor), once the commit gate's check passes (on
    NCCL a failed exchange may have written part of it): sent as ``mean`` sends it, a lossy one as the change since a
    ``reference`` every rank holds bit for bit (as local SGD's rounds are; in fp32 without one). Sets this rank's
    ``replica_drift``, ||mine - average|| / ||average||."""
    delta = reference is not None and mean.lossy
    if reference is not None and delta:
        flight = mean.start(mine - reference, ctx.group, ctx.world_size)
    else:
        flight = FP32_MEAN.start(mine, ctx.group, ctx.world_size)
    ctx.stats.record(flight.wire_bytes, 0, 0)  # wire only: not a sync payload
    avg = flight.wait()
    if reference is not None and delta:
        avg = reference + avg
    ctx.check_gate()
    ctx.stats.replica_drift = float(torch.dist(mine.float(), avg.float())
                                    / torch.linalg.vector_norm(avg.float()).clamp_min(1e-30))
    return avg

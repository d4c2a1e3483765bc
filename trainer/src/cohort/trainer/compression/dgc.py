"""Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018): top-k with momentum correction.

Plain top-k with error feedback accumulates gradients locally and lets the
optimizer's momentum act on the sparse sum, which is not what momentum SGD
would do with the dense gradients. DGC moves the momentum before the
compression (§3.2, "momentum correction"), per DDP bucket:

    u <- m * u + g          (the local velocity)
    v <- v + u              (accumulated velocity: what has not been sent yet)
    send top-k(v)
    v, u <- 0 where sent    ("momentum factor masking", §3.3)

Every rank applies the mean of the sent velocities as its update, so the job's
optimizer must not add momentum again: admission refuses ``dgc`` unless
the optimizer is SGD with ``spec.workload.optimizer.momentum`` 0 (models.py, OWN_MOMENTUM).

The wire format is top-k's: k = ceil(ratio * n) (int32 index, fp32 value)
pairs, 8k bytes (``perTensor`` as for topk). Deliberate differences from the
paper and from GRACE's DGC: the k entries are the exact top-k (GRACE estimates
a threshold from a 1% sample, so the count varies and its payloads have
unequal sizes); no local gradient clipping and no warm-up of the sparsity
(the paper's §3.4 and §3.5).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..sync.base import SyncContext
from .base import Memory, Unsupported
from .hooks import Hook
from .sparsify import TopK


class MomentumCorrection:
    """DGC's per-bucket state: the velocity u and the accumulated velocity v (a Memory)."""

    def __init__(self, momentum: float):
        self.momentum = momentum
        self.velocity: dict[Hashable, torch.Tensor] = {}      # u
        self.accumulated: dict[Hashable, torch.Tensor] = {}   # v

    def compensate(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        u, v = self.velocity.get(key), self.accumulated.get(key)
        if u is None or v is None or u.shape != x.shape:  # a new bucket, or DDP rebuilt its buckets
            u, v = torch.zeros_like(x), torch.zeros_like(x)
        u = u.mul_(self.momentum).add_(x)
        v = v.add_(u)
        self.velocity[key], self.accumulated[key] = u, v
        return v.clone()

    def update(self, key: Hashable, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        """Momentum factor masking: zero u and v where an entry was sent.

        Sent entries are found as the non-zero entries of ``sent``; one sent with
        the value 0 (v_i = 0 exactly) keeps its u_i, and its v_i is 0 either way.
        """
        was_sent = sent != 0
        self.velocity[key].masked_fill_(was_sent, 0.0)
        self.accumulated[key] = compensated - sent  # v with the sent entries taken out (exactly 0 there)

    def reset(self, key: Hashable) -> None:
        self.velocity.pop(key, None)
        self.accumulated.pop(key, None)


@dataclass(frozen=True)
class DGCConfig:
    ratio: float = 0.01
    """Fraction of entries kept (compression.ratio)."""
    momentum: float = 0.9
    """m, the momentum of the momentum correction (compression.momentum)."""
    per_tensor: bool = False
    """Keep that fraction of each tensor in the vector (compression.perTensor)."""
    segments: tuple[int, ...] = ()
    """The tensors' sizes, in vector order (set by ``layout``)."""


class DGC(TopK):
    name = "dgc"
    Config = DGCConfig  # type: ignore[assignment]
    biased = True

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return super(TopK, self).ddp_hook(ctx)  # the payload allgather; no sparse collective

    def memory(self, error_feedback: bool = True) -> Memory | None:
        """Momentum correction always: its accumulation is DGC (``errorFeedback`` does not apply)."""
        return MomentumCorrection(self.config.momentum)

    def consensus_step(self) -> float:
        raise Unsupported("compression dgc cannot gossip (its momentum correction is for gradients)")

    def layout(self, sizes: Sequence[int]) -> DGC:
        return DGC(replace(self.config, segments=tuple(sizes))) if self.config.per_tensor else self


__all__ = ["DGC", "DGCConfig", "MomentumCorrection"]

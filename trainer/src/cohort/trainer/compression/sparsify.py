"""Sparsifiers: keep k = ceil(ratio * n) entries of a vector (threshold: at most k).

- top-k (Aji & Heafield 2017; Lin et al. 2018, "Deep Gradient Compression";
  Stich et al. 2018, "Sparsified SGD with memory"): the k largest magnitudes,
  sent as k (int32 index, fp32 value) pairs, 8k bytes. Biased: it needs error
  feedback (on by default) to converge. ``per_tensor`` (compression.perTensor)
  takes the k_i = ceil(ratio * n_i) largest of each tensor in the vector
  instead (layer-wise selection, as Aji & Heafield and DGC apply it per layer):
  over a whole DDP bucket, a small layer next to a large one with larger
  gradients would otherwise keep none of its entries.
- random-k (Stich et al. 2018; Wangni et al. 2018): k coordinates drawn
  uniformly without replacement. The indices come from a seed every rank can
  derive, so only the k values travel (4k bytes). Scaled by n/k it is
  unbiased (variance factor n/k - 1); CHOCO-gossip uses it unscaled
  (``contractive``), where it shrinks the error by a factor (1 - k/n).
- threshold (GRACE's threshold compressor; Strom, "Scalable Distributed DNN
  Training Using Commodity GPU Cloud Computing", Interspeech 2015): the entries
  with |x_i| >= ``threshold``. Their number varies, and payloads must have one
  size, so the payload has a fixed capacity of k = ceil(ratio * n) pairs: a
  4-byte count c, then k (fp32 value, int32 index) pairs of which the first c
  are the above-threshold entries, largest first, and the rest are padding
  (value 0, index 0): 4 + 8k bytes. Above the capacity only the k largest go
  (then it is top-k); the rest stays in error feedback (on by default), as
  everything below the threshold does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..sync.base import SyncContext
from .base import Compressor, kept, shared_permutation
from .cyclic_topk import cyclic_hook
from .error_feedback import ErrorFeedback
from .global_topk import global_hook
from .hooks import Hook
from .packing import Reader, pack_floats, pack_sparse, unpack_floats, unpack_sparse
from .sparse_allreduce import sparse_hook


@dataclass(frozen=True)
class TopKConfig:
    ratio: float = 0.01
    """Fraction of entries kept (compression.ratio)."""
    per_tensor: bool = False
    """Keep that fraction of each tensor in the vector, not of the whole vector (compression.perTensor)."""
    segments: tuple[int, ...] = ()
    """The tensors' sizes, in vector order (set by ``layout``; empty: the vector is one segment)."""
    collective: str = "allgather"
    """How DDP's buckets travel (compression.collective): allgather of payloads, sparse allreduce, the
    cyclic leader's indices with an allreduce of the values, or the global top-k of the sum."""


class TopK(Compressor):
    name = "topk"
    Config = TopKConfig
    biased = True

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        if self.config.collective == "allgather":
            return super().ddp_hook(ctx)
        hook = {"sparse": sparse_hook, "cyclic": cyclic_hook, "global": global_hook}[self.config.collective]
        return hook(ctx, self, ErrorFeedback() if ctx.spec.compression.error_feedback else None)

    def layout(self, sizes: Sequence[int]) -> TopK:
        return TopK(replace(self.config, segments=tuple(sizes))) if self.config.per_tensor else self

    def _segments(self, numel: int) -> tuple[int, ...]:
        segments = self.config.segments or (numel,)
        if sum(segments) != numel:
            raise ValueError(f"topk: a vector of {numel} entries is not the layout {segments} it was built for")
        return segments

    def count(self, numel: int) -> int:
        """k: how many entries a vector of ``numel`` keeps (the sum over its segments)."""
        return sum(kept(n, self.config.ratio) for n in self._segments(numel) if n)

    def payload_nbytes(self, numel: int) -> int:
        return 8 * self.count(numel)

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """Indices of the k largest |x| (of each segment's k_i largest, per tensor)."""
        picks, offset = [], 0
        for n in self._segments(x.numel()):
            if n:
                part = x[offset:offset + n].abs()
                picks.append(torch.topk(part, kept(n, self.config.ratio), sorted=False).indices + offset)
            offset += n
        return torch.cat(picks) if picks else torch.zeros(0, dtype=torch.int64, device=x.device)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        idx = self.select(x)
        return pack_sparse(idx, x[idx])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        idx, values = unpack_sparse(payload, self.count(numel))
        return values.new_zeros(numel).index_put_((idx,), values)

    def consensus_step(self) -> float:
        return 0.05


@dataclass(frozen=True)
class RandomKConfig:
    ratio: float = 0.01
    """Fraction of entries kept (compression.ratio)."""
    contractive: bool = False
    """Send the values unscaled (biased, contractive: what CHOCO-gossip needs) instead of scaled by n/k (unbiased)."""


class RandomK(Compressor):
    name = "randomk"
    Config = RandomKConfig

    def payload_nbytes(self, numel: int) -> int:
        return 4 * kept(numel, self.config.ratio)

    def indices(self, numel: int, seed: int, device: torch.device) -> torch.Tensor:
        return shared_permutation(numel, seed, device)[: kept(numel, self.config.ratio)]

    def _scale(self, numel: int) -> float:
        return 1.0 if self.config.contractive else numel / kept(numel, self.config.ratio)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        return pack_floats(x[self.indices(x.numel(), seed, x.device)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        values = unpack_floats(payload) * self._scale(numel)
        return values.new_zeros(numel).index_put_((self.indices(numel, seed, payload.device),), values)

    def consensus_step(self) -> float:
        return min(1.0, 0.5 * self.config.ratio)


@dataclass(frozen=True)
class ThresholdConfig:
    threshold: float = 0.001
    """Send the entries with |x| >= threshold (compression.threshold)."""
    ratio: float = 0.01
    """The payload's capacity, as a fraction of the entries (compression.ratio)."""


class Threshold(Compressor):
    name = "threshold"
    Config = ThresholdConfig
    biased = True

    def capacity(self, numel: int) -> int:
        return kept(numel, self.config.ratio) if numel else 0

    def payload_nbytes(self, numel: int) -> int:
        return 4 + 8 * self.capacity(numel)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        k = self.capacity(x.numel())
        magnitudes, idx = torch.topk(x.abs(), k, sorted=True)  # the k largest, largest first
        count = int((magnitudes >= self.config.threshold).sum())  # a prefix: the entries at or above it
        values = x.new_zeros(k)
        values[:count] = x[idx[:count]]
        idx[count:] = 0
        return torch.cat([x.new_tensor([count], dtype=torch.int32).view(torch.uint8), pack_sparse(idx, values)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        count = int(rd.take(4).clone().view(torch.int32)[0])
        idx, values = unpack_sparse(rd.take(8 * self.capacity(numel)), self.capacity(numel))
        return values.new_zeros(numel).index_put_((idx[:count],), values[:count])


__all__ = ["RandomK", "Threshold", "TopK"]

"""Sparsifiers: keep k = ceil(ratio * n) entries of a vector.

- top-k (Aji & Heafield 2017; Lin et al. 2018, "Deep Gradient Compression";
  Stich et al. 2018, "Sparsified SGD with memory"): the k largest magnitudes,
  sent as k (int32 index, fp32 value) pairs, 8k bytes. Biased: it needs error
  feedback (on by default) to converge.
- random-k (Stich et al. 2018; Wangni et al. 2018): k coordinates drawn
  uniformly without replacement. The indices come from a seed every rank can
  derive, so only the k values travel (4k bytes). Scaled by n/k it is
  unbiased (variance factor n/k - 1); CHOCO-gossip uses it unscaled
  (``contractive``), where it shrinks the error by a factor (1 - k/n).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Compressor, generator, kept
from .packing import pack_floats, pack_sparse, unpack_floats, unpack_sparse


@dataclass(frozen=True)
class TopKConfig:
    ratio: float = 0.01
    """Fraction of entries kept (compression.ratio)."""


class TopK(Compressor):
    name = "topk"
    Config = TopKConfig
    biased = True

    def payload_nbytes(self, numel: int) -> int:
        return 8 * kept(numel, self.config.ratio)

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """Indices of the k largest |x|."""
        return torch.topk(x.abs(), kept(x.numel(), self.config.ratio), sorted=False).indices

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        idx = self.select(x)
        return pack_sparse(idx, x[idx])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        idx, values = unpack_sparse(payload, kept(numel, self.config.ratio))
        return torch.zeros(numel).index_put_((idx,), values)

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

    def indices(self, numel: int, seed: int) -> torch.Tensor:
        return torch.randperm(numel, generator=generator(seed))[: kept(numel, self.config.ratio)]

    def _scale(self, numel: int) -> float:
        return 1.0 if self.config.contractive else numel / kept(numel, self.config.ratio)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        return pack_floats(x[self.indices(x.numel(), seed)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        values = unpack_floats(payload) * self._scale(numel)
        return torch.zeros(numel).index_put_((self.indices(numel, seed),), values)

    def consensus_step(self) -> float:
        return min(1.0, 0.5 * self.config.ratio)


__all__ = ["RandomK", "TopK"]

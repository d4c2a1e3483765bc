"""Stochastic quantisers: unbiased, a few bits per element plus one fp32 scale.

- QSGD (Alistarh et al. 2017, "QSGD: Communication-Efficient SGD via Gradient
  Quantization and Encoding"): with s = ``levels``, each |x_i|/||x||_2 is
  rounded at random to one of the s+1 levels {0, 1/s, ..., 1} so that the
  expectation is exact. Sent as ||x||_2/s and, per element, a sign bit plus a
  level code of ceil(log2(s+1)) bits (fixed width; the paper's Elias coding
  would shrink it further). Variance: E||Q(x) - x||^2 <= min(n/s^2, sqrt(n)/s) ||x||^2.
- TernGrad (Wen et al. 2017): each element becomes max|x| * sign(x_i) with
  probability |x_i|/max|x|, else 0. Two bits per element plus the scale.

Both are unbiased, so they need no error feedback. ``contractive`` divides the
result by (1 + omega), omega being the variance factor, which turns an unbiased
compressor into one whose error shrinks (E||C(x) - x||^2 <= (1 - delta)||x||^2):
the property CHOCO-gossip's convergence needs (Koloskova et al. 2019, §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Compressor, generator
from .packing import Reader, pack_bits, pack_floats, packed_nbytes, unpack_bits


@dataclass(frozen=True)
class QSGDConfig:
    levels: int = 256
    """s, the number of quantisation levels above zero (compression.levels)."""
    contractive: bool = False
    """Scale by 1/(1 + omega) for CHOCO-gossip instead of staying unbiased."""


class QSGD(Compressor):
    name = "qsgd"
    Config = QSGDConfig

    @property
    def level_bits(self) -> int:
        return self.config.levels.bit_length()  # codes 0..s

    def payload_nbytes(self, numel: int) -> int:
        return 4 + packed_nbytes(numel, self.level_bits + 1)

    def variance_factor(self, numel: int) -> float:
        """omega in E||Q(x) - x||^2 <= omega ||x||^2 (the paper's Lemma 3.1)."""
        s = self.config.levels
        return min(numel / s**2, math.sqrt(numel) / s)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        s, n = self.config.levels, x.numel()
        norm = float(x.norm())
        if norm == 0.0 or not math.isfinite(norm):
            levels = torch.zeros(n, dtype=torch.int32)
        else:
            r = x.abs() * (s / norm)
            low = r.floor()
            up = torch.rand(n, generator=generator(seed)) < (r - low)
            levels = (low + up).clamp_(max=s).to(torch.int32)
        codes = levels | ((x < 0).to(torch.int32) << self.level_bits)
        shrink = 1.0 + self.variance_factor(n) if self.config.contractive else 1.0
        scale = norm / s / shrink
        return torch.cat([pack_floats(torch.tensor([scale])), pack_bits(codes, self.level_bits + 1)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        scale = rd.scalar()
        codes = unpack_bits(rd.take(packed_nbytes(numel, self.level_bits + 1)), numel, self.level_bits + 1)
        magnitude = (codes & ((1 << self.level_bits) - 1)).to(torch.float32)
        sign = 1.0 - 2.0 * (codes >> self.level_bits).to(torch.float32)
        return magnitude * sign * scale

    def consensus_step(self) -> float:
        return 0.2


@dataclass(frozen=True)
class TernGradConfig:
    contractive: bool = False
    """Scale by 1/(1 + omega) for CHOCO-gossip instead of staying unbiased."""


class TernGrad(Compressor):
    name = "terngrad"
    Config = TernGradConfig

    def payload_nbytes(self, numel: int) -> int:
        return 4 + packed_nbytes(numel, 2)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        peak = float(x.abs().max()) if x.numel() else 0.0
        if peak == 0.0 or not math.isfinite(peak):
            return torch.cat([pack_floats(torch.zeros(1)), pack_bits(torch.zeros(x.numel()), 2)])
        keep = torch.rand(x.numel(), generator=generator(seed)) < x.abs() / peak
        codes = keep.to(torch.int32) * torch.where(x < 0, 2, 1)  # 0: zero, 1: +scale, 2: -scale
        scale = peak
        if self.config.contractive:
            # E||Q(x)||^2 = peak * ||x||_1, so 1 + omega = peak * ||x||_1 / ||x||^2.
            scale = float(x.pow(2).sum()) / float(x.abs().sum())
        return torch.cat([pack_floats(torch.tensor([scale])), pack_bits(codes, 2)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        scale = rd.scalar()
        codes = unpack_bits(rd.take(packed_nbytes(numel, 2)), numel, 2)
        return ((codes == 1).to(torch.float32) - (codes == 2).to(torch.float32)) * scale

    def consensus_step(self) -> float:
        return 0.2

"""Stochastic quantisers: unbiased, a few bits per element plus one fp32 scale per chunk.

- QSGD (Alistarh et al. 2017, "QSGD: Communication-Efficient SGD via Gradient
  Quantization and Encoding"): with s = ``levels``, each |x_i|/||x_c||_2 is
  rounded at random to one of the s+1 levels {0, 1/s, ..., 1} so that the
  expectation is exact, x_c being the chunk of ``chunk_size`` elements that
  holds x_i (the paper's bucketing, §3.1: "bucket size d"). Sent as one
  ||x_c||_2/s per chunk and, per element, a sign bit plus a level code of
  ceil(log2(s+1)) bits (fixed width; the paper's Elias coding would shrink it
  further). Variance: E||Q(x) - x||^2 <= min(d/s^2, sqrt(d)/s) ||x||^2 with
  d = chunk_size (Lemma 3.1 per chunk, summed).
- TernGrad (Wen et al. 2017): each element becomes max|x_c| * sign(x_i) with
  probability |x_i|/max|x_c|, else 0. Two bits per element plus one scale per chunk.

Why chunks: one norm over a whole DDP bucket (up to 25 MiB) makes the error
scale with the bucket: on 6.5 M Gaussian entries QSGD(256)'s error is several
times ||x||^2, and a small layer that shares a bucket with a large one is
quantised against the large one's norm and loses nearly all its signal
(trainer/tests/test_compression.py measures both). Per-chunk norms bound the
error by the chunk's size, whatever the bucket holds. The scales are counted in
the payload: 4 bytes per chunk.

- natural compression (Horvath, Ho, Horvath, Sahu, Canini & Richtarik, "Natural
  Compression for Distributed Deep Learning", 2019): each x_i is rounded at
  random to one of the two powers of two around it, 2^a <= |x_i| < 2^(a+1), up
  with probability (|x_i| - 2^a) / 2^a, so that the expectation is exact
  (variance factor 1/8). Sent as a sign bit and fp32's 8-bit biased exponent
  (code 0: zero), 9 bits per element and no scale. |x| below 2^-126 rounds to
  0 or 2^-126 the same way; rounding up from 2^127 stays at 2^127 (fp32 has no
  2^128), the one biased case.

They are unbiased, so they need no error feedback. ``contractive`` divides the
result by (1 + omega), omega being the variance factor, which turns an unbiased
compressor into one whose error shrinks (E||C(x) - x||^2 <= (1 - delta)||x||^2):
the property CHOCO-gossip's convergence needs (Koloskova et al. 2019, §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Compressor, shared_uniform
from .packing import Reader, pack_bits, pack_floats, packed_nbytes, unpack_bits, unpack_floats


def chunks(numel: int, chunk_size: int) -> int:
    """How many chunks (and so scales) a vector of ``numel`` elements has."""
    return math.ceil(numel / chunk_size)


def as_rows(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``x`` zero-padded to whole chunks, one chunk per row: a view of ``x`` when it needs no padding (its
    callers only read it; a padded copy cost as long as the codec's arithmetic on a 25 MiB bucket)."""
    d = min(chunk_size, max(1, x.numel()))
    m = chunks(x.numel(), d)
    pad = m * d - x.numel()
    return F.pad(x, (0, pad)).view(m, d) if pad else x.reshape(m, d)


def _flat(rows: torch.Tensor, numel: int) -> torch.Tensor:
    return rows.reshape(-1)[:numel]


@dataclass(frozen=True)
class QSGDConfig:
    levels: int = 256
    """s, the number of quantisation levels above zero (compression.levels)."""
    chunk_size: int = 512
    """d, the elements that share one norm (compression.chunkSize)."""
    contractive: bool = False
    """Scale by 1/(1 + omega) for CHOCO-gossip instead of staying unbiased."""


class QSGD(Compressor):
    name = "qsgd"
    Config = QSGDConfig

    @property
    def level_bits(self) -> int:
        return self.config.levels.bit_length()  # codes 0..s

    def payload_nbytes(self, numel: int) -> int:
        return 4 * chunks(numel, self.config.chunk_size) + packed_nbytes(numel, self.level_bits + 1)

    def variance_factor(self, numel: int) -> float:
        """omega in E||Q(x) - x||^2 <= omega ||x||^2 (the paper's Lemma 3.1, per chunk of d elements)."""
        s, d = self.config.levels, min(self.config.chunk_size, numel)
        return min(d / s**2, math.sqrt(d) / s)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        s, n = self.config.levels, x.numel()
        rows = as_rows(x, self.config.chunk_size)
        norms = rows.norm(dim=1)
        usable = (norms > 0) & torch.isfinite(norms)
        r = rows.abs() * (s / torch.where(usable, norms, 1.0)).unsqueeze(1)
        low = r.floor()
        up = as_rows(shared_uniform(n, seed, x.device), self.config.chunk_size) < (r - low)
        levels = torch.where(usable.unsqueeze(1), (low + up).clamp_(max=s), 0.0)
        codes = _flat(levels, n).to(torch.int32) | ((x < 0).to(torch.int32) << self.level_bits)
        shrink = 1.0 + self.variance_factor(n) if self.config.contractive else 1.0
        scales = torch.where(usable, norms, 0.0) / s / shrink
        return torch.cat([pack_floats(scales), pack_bits(codes, self.level_bits + 1)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        scales = unpack_floats(rd.take(4 * chunks(numel, self.config.chunk_size)))
        codes = unpack_bits(rd.take(packed_nbytes(numel, self.level_bits + 1)), numel, self.level_bits + 1)
        magnitude = (codes & ((1 << self.level_bits) - 1)).to(torch.float32)
        sign = 1.0 - 2.0 * (codes >> self.level_bits).to(torch.float32)
        return _flat(as_rows(magnitude * sign, self.config.chunk_size) * scales.unsqueeze(1), numel)

    def consensus_step(self) -> float:
        return 0.2


@dataclass(frozen=True)
class TernGradConfig:
    chunk_size: int = 512
    """Elements that share one scale, max|x_c| (compression.chunkSize)."""
    contractive: bool = False
    """Scale by 1/(1 + omega) for CHOCO-gossip instead of staying unbiased."""


class TernGrad(Compressor):
    name = "terngrad"
    Config = TernGradConfig

    def payload_nbytes(self, numel: int) -> int:
        return 4 * chunks(numel, self.config.chunk_size) + packed_nbytes(numel, 2)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        n = x.numel()
        rows = as_rows(x, self.config.chunk_size)
        peaks = rows.abs().amax(dim=1) if n else rows.new_zeros(rows.shape[0])
        usable = (peaks > 0) & torch.isfinite(peaks)
        p = rows.abs() / torch.where(usable, peaks, 1.0).unsqueeze(1)
        keep = (as_rows(shared_uniform(n, seed, x.device), self.config.chunk_size) < p) & usable.unsqueeze(1)
        codes = _flat(keep, n).to(torch.int32) * torch.where(x < 0, 2, 1)  # 0: zero, 1: +scale, 2: -scale
        scales = torch.where(usable, peaks, 0.0)
        if self.config.contractive:
            # Per chunk, E||Q(x_c)||^2 = peak_c * ||x_c||_1, so 1 + omega_c = peak_c * ||x_c||_1 / ||x_c||^2.
            l1 = rows.abs().sum(dim=1)
            scales = torch.where(usable, rows.pow(2).sum(dim=1) / torch.where(usable, l1, 1.0), 0.0)
        return torch.cat([pack_floats(scales), pack_bits(codes, 2)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        scales = unpack_floats(rd.take(4 * chunks(numel, self.config.chunk_size)))
        codes = unpack_bits(rd.take(packed_nbytes(numel, 2)), numel, 2)
        ternary = (codes == 1).to(torch.float32) - (codes == 2).to(torch.float32)
        return _flat(as_rows(ternary, self.config.chunk_size) * scales.unsqueeze(1), numel)

    def consensus_step(self) -> float:
        return 0.2


@dataclass(frozen=True)
class NaturalConfig:
    """Natural compression has nothing to tune."""


class Natural(Compressor):
    name = "natural"
    Config = NaturalConfig
    CODE_BITS = 9  # sign and fp32's biased exponent

    def payload_nbytes(self, numel: int) -> int:
        return packed_nbytes(numel, self.CODE_BITS)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        a = x.abs()
        mantissa, exponent = torch.frexp(a)  # a = mantissa * 2^exponent, mantissa in [0.5, 1)
        u = shared_uniform(x.numel(), seed, x.device)
        # 2^(exponent-1) <= a < 2^exponent: up with probability a / 2^(exponent-1) - 1 = 2 * mantissa - 1.
        biased_exp = exponent.to(torch.int32) + 126 + (u < 2 * mantissa - 1).to(torch.int32)
        tiny = a < 2.0**-126  # zero and fp32's subnormals: round to 0 or 2^-126 (code 1)
        biased_exp = torch.where(tiny, (u < a * 2.0**126).to(torch.int32), biased_exp).clamp_(0, 254)
        return pack_bits(biased_exp | ((x < 0).to(torch.int32) << 8), self.CODE_BITS)

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        codes = unpack_bits(payload, numel, self.CODE_BITS)
        biased_exp = codes & 0xFF
        magnitude = torch.where(biased_exp > 0, torch.ldexp(torch.ones(numel, device=codes.device), biased_exp - 127), 0.0)
        return torch.where(codes >= 256, -magnitude, magnitude)

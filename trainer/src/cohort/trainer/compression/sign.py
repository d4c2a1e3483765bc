"""One bit per element: the scaled sign, 1-bit SGD and Signum.

- signsgd, the scaled sign (EF-SignSGD; Karimireddy et al. 2019, "Error Feedback
  Fixes SignSGD"): one bit per element plus one fp32 scale, ||x||_1 / n, so the
  compressed vector has the same l1 mass as the original. Plain signSGD
  (Bernstein et al. 2018) is biased and can diverge; with error feedback (on by
  default) it converges like SGD. Zero maps to +scale: one bit has no room for
  a third value, and error feedback absorbs the difference.
- onebit, 1-bit SGD (Seide, Fu, Droppo, Li & Yu, Interspeech 2014): per chunk of
  ``chunk_size`` elements, one bit per element (negative or not) and two fp32
  reconstruction values, the mean of the chunk's non-negative entries and the
  mean of its negative ones (0 for an empty side), with error feedback. 8 bytes
  per chunk plus n/8.
- signum (Bernstein, Wang, Azizzadenesheli & Anandkumar, "signSGD: Compressed
  Optimisation for Non-Convex Problems", ICML 2018, Algorithm 3 with majority
  vote): each rank keeps a momentum m <- beta * m + (1 - beta) * g (m starts at
  0) and sends sign(m), one bit per element and nothing else; the result is the
  majority vote sign(sum of the P signs), not their mean, so every coordinate
  moves by exactly lr (or not at all on a tie). The optimizer adds no momentum
  of its own (admission requires spec.workload.optimizer.momentum 0).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from .base import Compressor, Memory
from .packing import Reader, pack_bits, pack_floats, packed_nbytes, unpack_bits, unpack_floats
from .quantize import _flat, as_rows, chunks


@dataclass(frozen=True)
class SignConfig:
    """The scaled sign has nothing to tune."""


class ScaledSign(Compressor):
    name = "signsgd"
    Config = SignConfig
    biased = True

    def payload_nbytes(self, numel: int) -> int:
        return 4 + packed_nbytes(numel, 1)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        scale = x.abs().mean() if x.numel() else x.new_zeros(())
        return torch.cat([pack_floats(scale.reshape(1)), pack_bits((x >= 0).to(torch.int32), 1)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        scale = rd.scalar()
        bits = unpack_bits(rd.take(packed_nbytes(numel, 1)), numel, 1)
        return (bits.to(torch.float32) * 2.0 - 1.0) * scale

    def consensus_step(self) -> float:
        return 0.1


@dataclass(frozen=True)
class OneBitConfig:
    chunk_size: int = 512
    """Elements that share one pair of reconstruction values (compression.chunkSize)."""


class OneBit(Compressor):
    name = "onebit"
    Config = OneBitConfig
    biased = True

    def payload_nbytes(self, numel: int) -> int:
        return 8 * chunks(numel, self.config.chunk_size) + packed_nbytes(numel, 1)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        n, d = x.numel(), self.config.chunk_size
        rows = as_rows(x, d)
        real = as_rows(torch.ones(n, dtype=torch.bool, device=x.device), d)  # the padding of the last chunk counts on neither side
        negative = rows < 0
        positive = ~negative & real
        means = [(rows * side).sum(1) / side.sum(1).clamp(min=1) for side in (positive, negative)]
        return torch.cat([pack_floats(means[0]), pack_floats(means[1]), pack_bits((x < 0).to(torch.int32), 1)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        m = chunks(numel, self.config.chunk_size)
        rd = Reader(payload)
        positive, negative = unpack_floats(rd.take(4 * m)), unpack_floats(rd.take(4 * m))
        bits = as_rows(unpack_bits(rd.take(packed_nbytes(numel, 1)), numel, 1).bool(), self.config.chunk_size)
        return _flat(torch.where(bits, negative.unsqueeze(1), positive.unsqueeze(1)), numel)


class SignumMomentum:
    """Signum's per-bucket local momentum (a Memory): m <- beta * m + (1 - beta) * g, sent as its sign."""

    def __init__(self, beta: float):
        self.beta = beta
        self.momenta: dict[Hashable, torch.Tensor] = {}

    def compensate(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        m = self.momenta.get(key)
        if m is None or m.shape != x.shape:
            m = torch.zeros_like(x)
        m = m.mul_(self.beta).add_(x, alpha=1.0 - self.beta)
        self.momenta[key] = m
        return m.clone()

    def update(self, key: Hashable, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        """The momentum keeps everything: Signum has no error feedback."""

    def reset(self, key: Hashable) -> None:
        self.momenta.pop(key, None)


@dataclass(frozen=True)
class SignumConfig:
    momentum: float = 0.9
    """beta, the local momentum (compression.momentum)."""


class Signum(Compressor):
    name = "signum"
    Config = SignumConfig
    biased = True

    def memory(self, error_feedback: bool = True) -> Memory | None:
        """Its momentum, always (``errorFeedback`` does not apply)."""
        return SignumMomentum(self.config.momentum)

    def payload_nbytes(self, numel: int) -> int:
        return packed_nbytes(numel, 1)

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        return pack_bits((x >= 0).to(torch.int32), 1)  # zero counts as +

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        return unpack_bits(payload, numel, 1).to(torch.float32) * 2.0 - 1.0

    def combine(self, total: torch.Tensor, world: int) -> torch.Tensor:
        """The majority vote: the sign of the sum of the ranks' signs (0 on a tie)."""
        return total.sign_()

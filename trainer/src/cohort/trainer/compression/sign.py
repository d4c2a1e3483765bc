"""Scaled sign (EF-SignSGD; Karimireddy et al. 2019, "Error Feedback Fixes SignSGD"):
one bit per element plus one fp32 scale, ||x||_1 / n, so the compressed
vector has the same l1 mass as the original.

Plain signSGD (Bernstein et al. 2018) is biased and can diverge; with error
feedback (on by default) it converges like SGD. Zero maps to +scale: one bit
has no room for a third value, and error feedback absorbs the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Compressor
from .packing import Reader, pack_bits, pack_floats, packed_nbytes, unpack_bits


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
        scale = x.abs().mean() if x.numel() else torch.zeros(())
        return torch.cat([pack_floats(scale.reshape(1)), pack_bits((x >= 0).to(torch.int32), 1)])

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        rd = Reader(payload)
        scale = rd.scalar()
        bits = unpack_bits(rd.take(packed_nbytes(numel, 1)), numel, 1)
        return (bits.to(torch.float32) * 2.0 - 1.0) * scale

    def consensus_step(self) -> float:
        return 0.1

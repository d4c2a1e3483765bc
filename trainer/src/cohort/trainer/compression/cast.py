"""fp16 and bf16: the gradient (or parameter) cast to 16 bits, half the bytes.

For DDP, hooks.py prefers torch's own hooks (fp16_compress_hook everywhere,
bf16_compress_hook where the backend supports it); these classes are the
same idea as payload compressors, for gossip and for the bf16 path on gloo.
fp16 keeps more mantissa (10 bits) but overflows above 65504; bf16 keeps fp32's
range with 7 mantissa bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Compressor
from .packing import pack_floats, unpack_floats


@dataclass(frozen=True)
class CastConfig:
    """Casts have nothing to tune."""


class _Cast(Compressor):
    Config = CastConfig
    dtype: torch.dtype

    def payload_nbytes(self, numel: int) -> int:
        return 2 * numel

    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        return pack_floats(x, self.dtype)

    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        return unpack_floats(payload, self.dtype)


class FP32(_Cast):
    """No compression: the raw fp32 vector (gossip's ``compression.method: none``)."""

    name = "none"
    dtype = torch.float32

    def payload_nbytes(self, numel: int) -> int:
        return 4 * numel


class FP16(_Cast):
    name = "fp16"
    dtype = torch.float16


class BF16(_Cast):
    name = "bf16"
    dtype = torch.bfloat16

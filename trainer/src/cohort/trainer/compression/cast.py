"""none, fp16 and bf16: the vector as it is, or cast to 16 bits (half the bytes).

On DDP they use torch's own hooks (none: DDP's built-in allreduce;
fp16_compress_hook everywhere; bf16_compress_hook where the backend supports
it, the same cast-allreduce-cast elsewhere). As payloads they carry gossip's
messages, and local SGD averages in their dtype. Every sync can use them.
fp16 keeps more mantissa (10 bits) but overflows above 65504; bf16 keeps fp32's
range with 7 mantissa bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..sync.base import SyncContext
from ..sync.mean import CastMean, Mean
from .base import Compressor
from .hooks import Hook, accounted, bf16_hook
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

    def consensus_step(self) -> float:
        return 1.0  # (nearly) exact: gossip is plain averaging

    def localsgd_mean(self) -> Mean:
        return CastMean(self.dtype)


class FP32(_Cast):
    """No compression: the raw fp32 vector (gossip's ``compression.method: none``)."""

    name = "none"
    dtype = torch.float32

    def payload_nbytes(self, numel: int) -> int:
        return 4 * numel

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return None  # DDP's built-in C++ allreduce


class FP16(_Cast):
    name = "fp16"
    dtype = torch.float16

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return ctx.group, accounted(default_hooks.fp16_compress_hook, ctx, bytes_per_elem=2)


class BF16(_Cast):
    name = "bf16"
    dtype = torch.bfloat16

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return ctx.group, accounted(bf16_hook, ctx, bytes_per_elem=2)

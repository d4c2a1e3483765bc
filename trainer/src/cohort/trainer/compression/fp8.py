"""fp8: 8-bit floats (e4m3) with one fp32 scale per chunk, sent as a reduce-scatter then an all-gather.

Each chunk of ``compression.chunkSize`` elements is scaled so that its largest magnitude maps to e4m3's largest
finite value (448), then rounded to the nearest e4m3 value: 3 mantissa bits, so an element's error is at most
2^-4 of its magnitude (2^-10 of the chunk's largest below e4m3's normal range), like fp16/bf16's round to nearest
with fewer bits, and no error feedback. One byte per element plus 4 per chunk: 1.008 bytes at the default 512.

The mean of P vectors (:class:`FP8Mean`) is torchft's quantised allreduce (``torchft/collectives.py``,
``allreduce_quantized``: quantise, all-to-all, reduce, quantise, all-gather), in torch operations on any device
and backend: the vector is cut into P parts; each rank quantises each part and sends part j to rank j
(``all_to_all_single``); rank j decodes the P codes of its part, sums them in rank order in fp32, divides by P
and quantises the result; an all-gather gives every rank every part's codes, which every rank (the owners
included) decodes the same way, so the replicas take the same bits. A rank sends 2(P-1)/P of the encoded vector:
half of a bf16 ring allreduce, a quarter of fp32's.

Under ``sync.algorithm: localsgd`` it carries the rounds' change since θ (DiLoCo's outer gradient: torchft's
DiLoCo quantises it to fp8 the same way) and the warm-up's gradients; under ``allreduce``, the gradients; under
``gossip``, CHOCO's differences, as a payload (``encode``) to each neighbour.
Its two phases run one after the other: a round left in flight (``sync.overlapSteps``) starts the all-gather at
the step after it was sent (``advance``), a DDP bucket as soon as its all-to-all has arrived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..sync.base import SyncContext
from ..sync.mean import InFlight, Mean
from .base import Compressor
from .hooks import Hook
from .packing import pack_floats, unpack_floats
from .quantize import as_rows, chunks

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448


@dataclass(frozen=True)
class FP8Config:
    chunk_size: int = 512
    """Elements that share one scale (compression.chunkSize)."""


class FP8(Compressor):
    name = "fp8"
    Config = FP8Config

    def payload_nbytes(self, numel: int) -> int:
        return 4 * chunks(numel, self.config.chunk_size) + numel

    def encode(self, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """The chunks' fp32 scales, then one e4m3 code per element. A chunk of zeros has scale 0; a chunk with a
        non-finite entry has a non-finite scale, which its decoded values carry on."""
        n = x.numel()
        rows = as_rows(x.float(), self.config.chunk_size)
        peaks = rows.abs().amax(dim=1)
        usable = (peaks > 0) & torch.isfinite(peaks)
        codes = (rows * torch.where(usable, E4M3_MAX / peaks, 0.0).unsqueeze(1)).clamp_(-E4M3_MAX, E4M3_MAX)
        return torch.cat([pack_floats(peaks / E4M3_MAX), codes.to(E4M3).view(torch.uint8).reshape(-1)[:n]])

    def decode(self, payload: torch.Tensor, numel: int, seed: int = 0) -> torch.Tensor:
        m = chunks(numel, self.config.chunk_size)
        scales = unpack_floats(payload[:4 * m])
        codes = payload[4 * m:4 * m + numel].view(E4M3).float()
        return (as_rows(codes, self.config.chunk_size) * scales.unsqueeze(1)).reshape(-1)[:numel]

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return FP8Mean(self), _hook(ctx)

    def consensus_step(self) -> float:
        return 1.0  # nearly exact, as the casts: CHOCO's copies take each round's difference to within 2^-4

    def localsgd_mean(self) -> Mean:
        return FP8Mean(self)


class FP8Mean(Mean):
    """The mean of every rank's vector in fp8 codes: a quantised reduce-scatter, then an all-gather."""

    lossy = True

    def __init__(self, codec: FP8):
        self.codec = codec

    def start(self, x: torch.Tensor, group: dist.ProcessGroup | None, world: int) -> InFlight:
        return _Quantised(self.codec, x, group, world)


class _Quantised(InFlight):
    def __init__(self, codec: FP8, x: torch.Tensor, group: dist.ProcessGroup | None, world: int):
        self.codec, self.group, self.world, self.n = codec, group, world, x.numel()
        self.part = math.ceil(self.n / world)  # entries per rank's part (the last padded with zeros)
        parts = F.pad(x.detach().reshape(-1).float(), (0, world * self.part - self.n)).view(world, self.part)
        size = codec.payload_nbytes(self.part)
        self.payload_bytes = world * size
        self.wire_bytes = 2 * (world - 1) * size  # an all-to-all and an all-gather of one part's codes
        sent = torch.cat([codec.encode(p) for p in parts])  # part j's codes at j x size: rank j's share
        self.size = size
        self.received = torch.empty_like(sent)
        self.gathered = torch.empty_like(sent)
        self.first = dist.all_to_all_single(self.received, sent, group=group, async_op=True)
        self.second: Any = None

    def advance(self) -> None:
        if self.second is None:
            self.first.wait()
            total = torch.zeros(self.part, dtype=torch.float32, device=self.received.device)
            for r in range(self.world):  # rank order: the owner's sum does not depend on arrival order
                total += self.codec.decode(self._row(self.received, r), self.part)
            mine = self.codec.encode(total.div_(self.world))
            self.second = dist.all_gather_into_tensor(self.gathered, mine, group=self.group, async_op=True)

    def wait(self) -> torch.Tensor:
        self.advance()
        self.second.wait()
        return self._mean()

    def future(self) -> torch.futures.Future[torch.Tensor]:
        """The all-gather's future, resolving to the mean (``advance`` first, on the calling thread: every
        collective goes out from it in the same order on every rank)."""
        self.advance()

        def mean(f: torch.futures.Future[Any]) -> torch.Tensor:
            f.value()  # re-raises if the all-gather failed
            return self._mean()
        return self.second.get_future().then(mean)

    def _mean(self) -> torch.Tensor:
        return torch.cat([self.codec.decode(self._row(self.gathered, r), self.part)
                          for r in range(self.world)])[:self.n]

    def _row(self, buffer: torch.Tensor, r: int) -> torch.Tensor:
        return buffer[r * self.size:(r + 1) * self.size]


def _hook(ctx: SyncContext) -> Hook:
    """``sync.algorithm: allreduce`` (and local SGD's warm-up): each DDP bucket's mean through :class:`FP8Mean`."""
    def run(mean: FP8Mean, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        grad = bucket.buffer()
        flight = _Quantised(mean.codec, grad, ctx.group, ctx.world_size)
        ctx.stats.record(flight.wire_bytes, flight.payload_bytes, 4 * grad.numel())

        def take(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            return grad.copy_(f.value())
        return flight.future().then(take)
    return run

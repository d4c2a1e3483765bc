"""A compression method, in one class: :class:`Method`, and :class:`Compressor` for payloads.

Everything Cohort knows about one ``spec.compression.method`` lives in its class:

- ``syncs()``: the sync algorithms it supports. Read from the API's
  ``SUPPORTED_COMPRESSION``, the one declaration that the CRD's CEL rule,
  admission's message and docs/api.md are generated from; the class must then
  implement what that table promises (tests/…/test_compression.py checks it);
- ``ddp_hook(ctx)``: how ``sync.algorithm: allreduce`` communicates with it
  (None: DDP's built-in dense allreduce);
- ``consensus_step()``: CHOCO-gossip's step size for it (``sync.algorithm: gossip``);
- ``localsgd_mean()``: how local SGD's averaging rounds travel (sync/mean.py).
  A method without a gossip step or a local-SGD mean raises
  :class:`Unsupported` there.

The strategies a method runs under are an admission rule (compression acts on
whole-replica gradients, so only ``data`` and ``auto``), declared in the API.

A :class:`Compressor` turns a flat fp32 vector into a ``uint8`` payload whose size

depends only on the vector's length (``payload_nbytes``). Fixed sizes matter:
gloo's allgather refuses unequal sizes, and a receiver must know how many
bytes to expect from a gossip peer. The payload is what goes on the wire, so
its size is what Cohort reports as payload bytes.

Some methods keep local state per DDP bucket between steps, a *memory*
(``memory()``): error feedback's residual for the biased ones, DGC's momentum
correction (dgc.py), Signum's momentum (sign.py). The hook passes each
bucket's gradient through ``memory.compensate`` before encoding and tells it
what the receivers will see (``memory.update``). And a method decides how the
P decoded payloads combine (``combine``): their mean, except Signum's
majority vote (the sign of their sum).

Randomised compressors draw from a ``torch.Generator`` seeded by the caller
(``derive_seed``), never from the global RNG: checkpoints hold the global RNG
state, and a receiver can regenerate the sender's random choices (random-k
indices) from the same seed instead of receiving them.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Protocol

import torch
import torch.distributed as dist

from cohort.api.models import SUPPORTED_COMPRESSION

from ..sync.base import SyncContext, allgather_bytes
from ..sync.mean import Mean
from .error_feedback import BucketLayouts, ErrorFeedback
from .hooks import Hook

_MASK64 = (1 << 64) - 1


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (splitmix64 over the parts); same on every rank."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def shared_uniform(n: int, seed: int, device: torch.device) -> torch.Tensor:
    """n uniform draws that every rank reproduces from ``seed``: drawn by a CPU generator (the same
    stream on any device, and a receiver on another device draws the same), then moved to ``device``."""
    return torch.rand(n, generator=generator(seed)).to(device)


def shared_permutation(n: int, seed: int, device: torch.device) -> torch.Tensor:
    """A permutation of 0..n-1 that every rank reproduces from ``seed`` (as :func:`shared_uniform`)."""
    return torch.randperm(n, generator=generator(seed)).to(device)


class Memory(Protocol):
    """Local state per key (DDP bucket) around a compressor: ErrorFeedback has this interface."""

    def compensate(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        """What to compress this step, from this step's gradient ``x`` (a new tensor)."""

    def update(self, key: Hashable, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        """After encoding ``compensated``: ``sent`` is what every receiver decodes."""

    def reset(self, key: Hashable) -> None:
        """Forget ``key``'s state (its DDP bucket now holds other tensors, or in another order)."""


class Unsupported(NotImplementedError):
    """This method cannot run with that sync algorithm (admission refuses the pair)."""


class Method(ABC):
    """One ``spec.compression.method`` with its config (a small frozen dataclass, ``Config``)."""

    name: ClassVar[str]
    Config: ClassVar[type]
    #: Biased compressors (top-k, sign) need error feedback to converge; it is on by default for them.
    biased: ClassVar[bool] = False

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    @classmethod
    def from_spec(cls, compression: Any, **overrides: Any) -> Method:
        """Build from ``spec.compression`` (only the fields this method's Config declares)."""
        names = {f.name for f in dataclasses.fields(cls.Config)}
        fields = {name: getattr(compression, name) for name in names if hasattr(compression, name)}
        return cls(cls.Config(**{**fields, **{k: v for k, v in overrides.items() if k in names}}))

    @classmethod
    def syncs(cls) -> tuple[str, ...]:
        """The sync algorithms this method supports: the API's one declaration of the pairs."""
        return tuple(sync for sync, methods in SUPPORTED_COMPRESSION.items() if cls.name in methods)

    @abstractmethod
    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        """(state, hook) for ``DDP.register_comm_hook``; None keeps DDP's built-in allreduce."""

    def consensus_step(self) -> float:
        """CHOCO-gossip's gamma in x += gamma * w * (theirs - mine) (sync/gossip.py).

        1 for the (nearly) exact encodings, where gossip is plain averaging. The
        others were tuned (docs/algorithms.md) on digits with 4 ranks on a ring, and
        on pure consensus from different starting points with 2 and 4 ranks: too
        large a gamma and the public copies lag behind the parameters, so the
        consensus step overshoots (top-k at 10% with gamma = 0.5 diverges at P = 2;
        0.05 converges). Random-k carries the least, so its gamma scales with k/n.
        """
        raise Unsupported(f"compression {self.name} cannot gossip")

    def localsgd_mean(self) -> Mean:
        """How local SGD's averaging rounds travel (sync/localsgd.py); its warm-up's gradients go through
        ``ddp_hook``."""
        raise Unsupported(f"compression {self.name} cannot run local SGD")


class Compressor(Method):
    """A payload compressor: a vector in, a fixed-size byte payload out, and back.

    On DDP, each rank compresses its bucket into a payload (with error feedback
    for the biased ones), the payloads are allgathered as they are, and every
    rank decodes all P payloads and averages them locally. A payload is never
    expanded before it crosses the wire: a sum of sparse or quantised vectors is
    not sparse or quantised, so an allreduce cannot carry it compactly.
    """

    def ddp_hook(self, ctx: SyncContext) -> tuple[Any, Hook] | None:
        return CompressedAllgather(ctx, self, self.memory(ctx.spec.compression.error_feedback)), \
            compressed_allgather_hook

    def memory(self, error_feedback: bool = True) -> Memory | None:
        """The per-bucket state the DDP hook keeps: error feedback for biased methods (when on)."""
        return ErrorFeedback() if self.biased and error_feedback else None

    def combine(self, total: torch.Tensor, world: int) -> torch.Tensor:
        """The bucket's result from the sum of the ``world`` decoded payloads (in place): their mean."""
        return total.div_(world)

    def layout(self, sizes: Sequence[int]) -> Compressor:
        """This compressor for a vector made of tensors of ``sizes`` entries, in order.

        Only per-tensor methods (top-k with ``perTensor``) use it; the others
        treat the vector as one. Every rank must pass the same layout.
        """
        return self

    @abstractmethod
    def payload_nbytes(self, numel: int) -> int:
        """Bytes of ``encode``'s output for a vector of ``numel`` elements (fixed for a given numel)."""

    @abstractmethod
    def encode(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        """Compress flat fp32 ``x`` into a 1-D uint8 payload of ``payload_nbytes(x.numel())`` bytes."""

    @abstractmethod
    def decode(self, payload: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        """The fp32 vector a receiver reconstructs (``seed``: the one the sender encoded with)."""

    def roundtrip(self, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(payload, what the receiver will see): the sender needs both for error feedback."""
        payload = self.encode(x, seed)
        return payload, self.decode(payload, x.numel(), seed)

    def ratio(self, numel: int) -> float:
        """Dense fp32 bytes / payload bytes."""
        return 4 * numel / self.payload_nbytes(numel)


def kept(numel: int, ratio: float) -> int:
    """Entries a sparsifier keeps: ceil(ratio * numel), at least one."""
    return min(numel, max(1, math.ceil(ratio * numel)))


class CompressedAllgather:
    """Hook state: the compressor, its memory (error feedback or the method's own), and a step counter for the shared seeds."""

    def __init__(self, ctx: SyncContext, compressor: Compressor, memory: Memory | None):
        self.ctx, self.compressor, self.memory = ctx, compressor, memory
        self.layouts = BucketLayouts()
        self.base_seed = derive_seed(ctx.spec.workload.seed, 0xD0)
        self.step = 0

    def seed(self, bucket_index: int, rank: int) -> int:
        # Every rank derives every other rank's seed: random-k indices need not travel.
        return derive_seed(self.base_seed, self.step, bucket_index, rank)


def compressed_allgather_hook(state: CompressedAllgather, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Allgather the bucket's payloads (an allgather of a k-byte payload costs (P-1) * k bytes per rank),
    decode them all and combine them (the mean; Signum: the majority vote)."""
    ctx, ef = state.ctx, state.memory
    grad, key, world = bucket.buffer(), bucket.index(), ctx.world_size
    state.layouts.check(bucket, ef)
    comp = state.compressor.layout([g.numel() for g in bucket.gradients()])
    n = grad.numel()
    seeds = [state.seed(key, r) for r in range(world)]
    x = ef.compensate(key, grad) if ef is not None else grad
    payload, mine = comp.roundtrip(x, seeds[ctx.rank])
    if ef is not None:
        ef.update(key, x, mine)
    size = payload.numel()
    ctx.stats.record(allgather_bytes(size, world), size, 4 * n)
    gathered = payload.new_empty(world * size)
    fut = dist.all_gather_into_tensor(gathered, payload, group=ctx.group, async_op=True).get_future()
    if bucket.is_last():
        state.step += 1

    def average(f: torch.futures.Future[Any]) -> torch.Tensor:
        f.value()  # re-raises if the allgather failed (a peer left)
        total = grad.new_zeros(n, dtype=torch.float32)
        for r in range(world):  # in rank order on every rank: the ranks' sums agree bit for bit
            total += mine if r == ctx.rank else comp.decode(gathered[r * size:(r + 1) * size], n, seeds[r])
        grad.copy_(comp.combine(total, world))
        return grad
    return fut.then(average)

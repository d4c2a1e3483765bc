"""The Compressor interface: a vector in, a fixed-size byte payload out, and back.

A compressor turns a flat fp32 vector into a ``uint8`` payload whose size
depends only on the vector's length (``payload_nbytes``). Fixed sizes matter:
gloo's allgather refuses unequal sizes, and a receiver must know how many
bytes to expect from a gossip peer. The payload is what goes on the wire, so
its size is what Cohort reports as payload bytes.

Randomised compressors draw from a ``torch.Generator`` seeded by the caller
(``derive_seed``), never from the global RNG: checkpoints hold the global RNG
state, and a receiver can regenerate the sender's random choices (random-k
indices) from the same seed instead of receiving them.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

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


class Compressor(ABC):
    """One compression method with its config (a small frozen dataclass, ``Config``)."""

    name: ClassVar[str]
    Config: ClassVar[type]
    #: Biased compressors (top-k, sign) need error feedback to converge; it is on by default for them.
    biased: ClassVar[bool] = False

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    @classmethod
    def from_spec(cls, compression: Any, **overrides: Any) -> Compressor:
        """Build from ``spec.compression`` (only the fields this compressor's Config declares)."""
        fields = {f.name: getattr(compression, f.name) for f in dataclasses.fields(cls.Config)
                  if hasattr(compression, f.name)}
        return cls(cls.Config(**{**fields, **overrides}))

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

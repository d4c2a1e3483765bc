"""Wire formats: fixed-width bit codes packed into bytes, sparse (index, value) pairs, fp32 scalars.

Everything packs into flat ``uint8`` tensors so a payload is one contiguous
buffer for one collective. Bit order is little-endian within a byte (code bit
0 of element 0 is bit 0 of byte 0); the format only has to agree with itself,
and the tests check that every pack round-trips exactly.
"""

from __future__ import annotations

import math

import torch

_BYTE_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _arange(n: int, like: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """0..n-1 on ``like``'s device (bit shifts for a payload on a GPU are computed there)."""
    return torch.arange(n, dtype=dtype, device=like.device)


def packed_nbytes(numel: int, bits: int) -> int:
    return (numel * bits + 7) // 8


def _group(bits: int) -> int:
    """Codes per group whose bits fill whole bytes (8 / gcd(bits, 8)); the fast path needs <= 64 bits."""
    return 8 // math.gcd(bits, 8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack non-negative integer ``codes`` (each < 2**bits) into ``packed_nbytes(n, bits)`` bytes."""
    if not 1 <= bits <= 31:
        raise ValueError(f"bits must be in 1..31, got {bits}")
    codes = codes.reshape(-1).to(torch.int64)
    n, group = codes.numel(), _group(bits)
    if bits == 8:
        return codes.to(torch.uint8)
    if group * bits <= 64:
        # Fast path: a group of codes becomes one int64 word, then its bytes.
        pad = (-n) % group
        words = torch.cat([codes, codes.new_zeros(pad)]).view(-1, group)
        words = (words << (_arange(group, codes) * bits)).sum(1, keepdim=True)
        nbytes = group * bits // 8
        out = ((words >> (_arange(nbytes, codes) * 8)) & 0xFF).to(torch.uint8).reshape(-1)
        return out[: packed_nbytes(n, bits)]
    shifts = _arange(bits, codes)
    flat = ((codes.unsqueeze(1) >> shifts) & 1).to(torch.uint8).reshape(-1)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return (flat.view(-1, 8) << _BYTE_SHIFTS.to(flat.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``numel`` int32 codes."""
    packed = packed.reshape(-1)
    if bits == 8:
        return packed[:numel].to(torch.int32)
    group = _group(bits)
    if group * bits <= 64:
        nbytes = group * bits // 8
        pad = (-packed.numel()) % nbytes
        raw = torch.cat([packed, packed.new_zeros(pad)]).to(torch.int64).view(-1, nbytes)
        words = (raw << (_arange(nbytes, raw) * 8)).sum(1, keepdim=True)
        codes = (words >> (_arange(group, raw) * bits)) & ((1 << bits) - 1)
        return codes.reshape(-1)[:numel].to(torch.int32)
    flat = ((packed.unsqueeze(1) >> _BYTE_SHIFTS.to(packed.device)) & 1).reshape(-1)[: numel * bits]
    shifts = _arange(bits, packed, torch.int32)
    return (flat.view(numel, bits).to(torch.int32) << shifts).sum(1, dtype=torch.int32)


def pack_floats(values: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Floats as raw bytes (``dtype``: float32, float16 or bfloat16)."""
    return values.reshape(-1).to(dtype).contiguous().view(torch.uint8)


def _view(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Reinterpreting bytes needs an aligned start; a payload sliced out of an
    # allgather buffer may begin at any byte, so copy it when it does not.
    raw = raw.contiguous()
    size = torch.empty((), dtype=dtype).element_size()
    if raw.storage_offset() % size:
        raw = raw.clone()
    return raw.view(dtype)


def unpack_floats(raw: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`pack_floats`, widened to fp32."""
    return _view(raw, dtype).to(torch.float32)


def pack_sparse(indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """k int32 indices and k fp32 values: 8k bytes (values first, both 4-byte aligned)."""
    return torch.cat([pack_floats(values), indices.to(torch.int32).contiguous().view(torch.uint8)])


def unpack_sparse(raw: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values = unpack_floats(raw[: 4 * k])
    indices = _view(raw[4 * k: 8 * k], torch.int32).to(torch.int64)
    return indices, values


class Reader:
    """Sequential slicing of a payload: ``take(nbytes)`` returns the next ``nbytes`` bytes."""

    def __init__(self, payload: torch.Tensor):
        self.payload, self.offset = payload, 0

    def take(self, nbytes: int) -> torch.Tensor:
        out = self.payload[self.offset:self.offset + nbytes]
        self.offset += nbytes
        return out

    def scalar(self) -> float:
        return float(unpack_floats(self.take(4))[0])

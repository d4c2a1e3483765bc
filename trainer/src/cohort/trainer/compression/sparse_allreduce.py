"""``compression.collective: sparse``: top-k gradients summed by a sparse allreduce.

An allgather of top-k payloads costs each rank (P-1) * 8k bytes, so its
advantage over a dense allreduce halves each time P doubles. This collective
follows SparCML's split allgather (Renggli, Ashkboos, Aghagolzadeh, Alistarh &
Hoefler, "SparCML: High-Performance Sparse Communication for Machine
Learning", SC 2019), with OmniReduce's switch to dense blocks (Fei, Ho, Sahu,
Canini & Sapio, "Efficient Sparse Collective Communication and its application
to Accelerate Distributed Deep Learning", SIGCOMM 2021):

1. *sparse reduce-scatter*: index i belongs to rank i mod P (a strided split:
   top-k entries bunch up in a few layers, and contiguous ranges would leave
   one rank with most of them); each rank sends the (index, value) pairs that
   rank j owns to rank j (an all-to-all with uneven splits), and rank j sums
   what it receives;
2. *allgather of the merged shares*: each rank sends its summed share to every
   other rank, as (index, value) pairs or densely as fp32, whichever is
   smaller, so a share never costs more than its dense form.

Per rank, phase 1 sends about 8k (P-1)/P bytes and phase 2 (P-1) times the
merged share: between k/P pairs (every rank picked the same entries) and k
pairs (disjoint supports), at most n/P floats. So the bytes stay flat in P as
far as the ranks' supports overlap, and never exceed a dense ring allreduce's
8n (P-1)/P while k <= n/2. Only rank j sums the entries it owns, so every rank
ends with bit-identical gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..sync.base import SyncContext, allgather_bytes
from .error_feedback import ErrorFeedback
from .hooks import Hook
from .topk_buckets import TopKBuckets


def owned(numel: int, world: int, rank: int) -> int:
    """How many of [0, numel) rank ``rank`` owns: the indices i with i mod world == rank."""
    return (numel - rank + world - 1) // world


def pack_pairs(indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(index, value) pairs as int32 words, two per pair.

    Interleaved, unlike packing.pack_sparse (all values, then all indices): an
    all-to-all with uneven splits cuts the buffer by destination, so each
    destination's pairs must be contiguous.
    """
    return torch.stack([indices.to(torch.int32), values.to(torch.float32).view(torch.int32)], dim=1).reshape(-1)


def unpack_pairs(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = words.view(-1, 2)
    return pairs[:, 0].to(torch.int64), pairs[:, 1].contiguous().view(torch.float32)


@dataclass
class Exchanged:
    """What one sparse allreduce did on this rank: the sum, and what it sent."""
    total: torch.Tensor
    wire_bytes: int
    dense_shares: int  # shares that travelled dense in phase 2 (over all ranks)


@dataclass
class Share:
    """This rank's share of the sum after phase 1, and the bytes phase 1 sent."""
    summed: torch.Tensor  # entry j is index j * world + rank of the whole vector
    wire_bytes: int


def sparse_reduce_scatter(indices: torch.Tensor, values: torch.Tensor, numel: int, rank: int, world: int,
                          group: dist.ProcessGroup | None = None) -> Share:
    """Phase 1: the sum over ranks of the entries of each rank's sparse vector that this rank owns."""
    owner = indices % world
    order = torch.argsort(owner, stable=True)
    indices, values = indices[order], values[order]
    send_counts = (2 * torch.bincount(owner, minlength=world)).tolist()  # int32 words per destination
    counts = torch.tensor(send_counts, dtype=torch.int64)  # host metadata: over gloo on a GPU too
    recv_counts = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, counts, group=group)
    received = torch.empty(int(recv_counts.sum()), dtype=torch.int32, device=values.device)
    dist.all_to_all_single(received, pack_pairs(indices, values), output_split_sizes=recv_counts.tolist(),
                           input_split_sizes=send_counts, group=group)
    mine = values.new_zeros(owned(numel, world, rank))
    got_idx, got_val = unpack_pairs(received)
    mine.index_add_(0, got_idx // world, got_val)  # in source-rank order: only this rank sums its share
    words_out = sum(send_counts) - send_counts[rank]
    return Share(mine, 8 * (world - 1) + 4 * words_out)


def sparse_allreduce(indices: torch.Tensor, values: torch.Tensor, numel: int, rank: int, world: int,
                     group: dist.ProcessGroup | None = None) -> Exchanged:
    """The sum over ranks of each rank's sparse vector (``indices`` unique), densely, on every rank."""
    share = sparse_reduce_scatter(indices, values, numel, rank, world, group)
    mine = share.summed
    nonzero = mine.nonzero().flatten()
    dense = 4 * mine.numel() <= 8 * nonzero.numel()
    block = mine.view(torch.int32) if dense else pack_pairs(nonzero, mine[nonzero])
    header = torch.tensor([block.numel(), int(dense)], dtype=torch.int64)  # host metadata
    headers = torch.empty(2 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(headers, header, group=group)
    sizes, dense_flags = headers.view(world, 2)[:, 0].tolist(), headers.view(world, 2)[:, 1].tolist()
    out_sizes = [0 if j == rank else sizes[j] for j in range(world)]
    in_sizes = [0 if j == rank else block.numel() for j in range(world)]
    blocks = block.new_empty(sum(out_sizes))
    dist.all_to_all_single(blocks, block.repeat(world - 1), output_split_sizes=out_sizes,
                           input_split_sizes=in_sizes, group=group)

    total = mine.new_zeros(numel)
    total[rank::world] = mine
    for j, part in zip(range(world), blocks.split(out_sizes), strict=True):
        if j == rank:
            continue
        if dense_flags[j]:
            total[j::world] = part.view(torch.float32)
        else:
            idx, val = unpack_pairs(part)
            total[idx * world + j] = val
    wire = share.wire_bytes + allgather_bytes(16, world) + 4 * block.numel() * (world - 1)
    return Exchanged(total, wire, sum(dense_flags))


def sparse_allreduce_hook(state: TopKBuckets, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k of the (error-compensated) bucket, summed by :func:`sparse_allreduce`, averaged (off backward)."""
    return state.launch(bucket, _sparse_allreduce_bucket)


def _sparse_allreduce_bucket(state: TopKBuckets, bucket: dist.GradBucket) -> torch.Tensor:
    ctx, grad, world = state.ctx, bucket.buffer(), state.ctx.world_size
    x, comp = state.open(bucket)
    idx = comp.select(x)
    values = x[idx]
    state.keep_unsent(bucket, x, idx, values)
    done = sparse_allreduce(idx, values, grad.numel(), ctx.rank, world, ctx.group)
    return state.finish(bucket, done.total, done.wire_bytes, 8 * idx.numel())


def sparse_hook(ctx: SyncContext, compressor: Any, error_feedback: ErrorFeedback | None) -> tuple[Any, Hook]:
    return TopKBuckets(ctx, compressor, error_feedback), sparse_allreduce_hook

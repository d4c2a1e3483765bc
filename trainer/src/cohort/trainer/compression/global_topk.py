"""``compression.collective: global``: the top-k of the sum, by a sparse reduce-scatter and a fixed allgather.

With error feedback the ranks' own top-k selections barely overlap
(docs/benchmarks.md measures it), so the sum of P of them holds nearly P k
entries, and any collective that delivers that whole sum (an allgather, or
``collective: sparse``) costs each rank about 8k (P-1) bytes. This one keeps
only about k entries of the sum, as global top-k sparsification does (Shi et
al., "A Distributed Synchronous SGD Algorithm with Global Top-k
Sparsification for Low Bandwidth Networks", ICDCS 2019; and Li & Hoefler,
"Near-Optimal Sparse Allreduce for Distributed Deep Learning", PPoPP 2022,
Ok-Topk, whose split-and-reduce this follows):

1. *sparse reduce-scatter*, as ``collective: sparse``: index i belongs to rank
   i mod P, and each rank sums the (index, value) pairs it owns from every
   rank's top-k (sparse_allreduce.sparse_reduce_scatter);
2. *selection*: each rank keeps the m = ceil(k/P) entries of its summed share
   largest in magnitude (padding with index -1 when its share is smaller), so
   about k entries are kept in all. Ok-Topk keeps the entries above a global
   threshold, estimated every few steps, instead; the strided split spreads
   the large entries evenly enough over the ranks for a fixed m;
3. *allgather* of the m kept pairs from every rank, a fixed size, so no header
   round: every rank writes the same sum at the same indices;
4. *error feedback*: each rank keeps, as its residual, its compensated vector
   outside the kept indices, so what it sent in phase 1 that was not kept
   globally waits there, as in gTop-k.

Per rank, phase 1 sends about 8k (P-1)/P bytes and phase 3 8m (P-1), about
8k (P-1)/P: 16k (P-1)/P in all, whatever the overlap, 2/P of an allgather's
8k (P-1), and below a dense ring allreduce's 8n (P-1)/P while k < n/2.
From P = 2 to 8 that grows by (7/8)/(1/2) = 1.75x, as every reduce-scatter
and allgather does. The price is that the sum is cut to about k entries: an
entry that one rank picked but is small in the sum waits in that rank's
residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..sync.base import SyncContext, allgather_bytes
from .error_feedback import ErrorFeedback
from .hooks import Hook
from .sparse_allreduce import pack_pairs, sparse_reduce_scatter, unpack_pairs
from .topk_buckets import TopKBuckets


def per_rank(k: int, world: int) -> int:
    """m: how many entries of its share of the sum each rank keeps."""
    return math.ceil(k / world)


@dataclass
class Selected:
    """What one global top-k did on this rank: the kept sum (dense), its indices, and the bytes sent."""
    total: torch.Tensor
    kept: torch.Tensor
    wire_bytes: int


def global_topk_allreduce(indices: torch.Tensor, values: torch.Tensor, numel: int, k: int, rank: int, world: int,
                          group: dist.ProcessGroup | None = None) -> Selected:
    """The ceil(k/P) largest entries of each rank's share of the sum of the ranks' sparse vectors, on every rank."""
    share = sparse_reduce_scatter(indices, values, numel, rank, world, group)
    m = per_rank(k, world)
    top = torch.topk(share.summed.abs(), min(m, share.summed.numel()), sorted=False).indices
    words = torch.full((2 * m,), -1, dtype=torch.int32, device=values.device)  # unused pairs: index -1
    words[:2 * top.numel()] = pack_pairs(top * world + rank, share.summed[top])
    gathered = words.new_empty(world * 2 * m)
    dist.all_gather_into_tensor(gathered, words, group=group)
    idx, val = unpack_pairs(gathered)
    used = idx >= 0
    idx, val = idx[used], val[used]
    total = val.new_zeros(numel).index_put_((idx,), val)
    return Selected(total, idx, share.wire_bytes + allgather_bytes(8 * m, world))


def global_topk_hook(state: TopKBuckets, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k of the (error-compensated) bucket; the top-k of the ranks' sum kept; averaged (off backward)."""
    return state.launch(bucket, _global_topk_bucket)


def _global_topk_bucket(state: TopKBuckets, bucket: dist.GradBucket) -> torch.Tensor:
    ctx, grad, world = state.ctx, bucket.buffer(), state.ctx.world_size
    x, comp = state.open(bucket)
    idx = comp.select(x)
    values = x[idx]
    done = global_topk_allreduce(idx, values, grad.numel(), comp.count(grad.numel()), ctx.rank, world, ctx.group)
    sent = torch.isin(idx, done.kept)
    state.keep_unsent(bucket, x, idx[sent], values[sent])
    return state.finish(bucket, done.total, done.wire_bytes, 8 * idx.numel())


def global_hook(ctx: SyncContext, compressor: Any, error_feedback: ErrorFeedback | None) -> tuple[Any, Hook]:
    return TopKBuckets(ctx, compressor, error_feedback), global_topk_hook

"""``compression.collective: cyclic``: one rank's top-k indices, in turn, used by every rank.

ScaleCom's cyclic local top-k, CLT-k (Chen et al., "ScaleCom: Scalable
Sparsified Gradient Compression for Communication-Efficient Distributed
Training", NeurIPS 2020). With error feedback, the ranks' own top-k selections
barely overlap (docs/benchmarks.md measures it), so any sum of them, allgathered
or sparse-allreduced, carries nearly P k entries. CLT-k makes the selection
shared instead:

1. a *leader*, rank (step + bucket index) mod P, so the role cycles through the
   ranks from step to step and from bucket to bucket, takes the top-k of its
   error-compensated bucket and broadcasts the k indices (4k bytes);
2. every rank takes its own compensated values at those indices, and a dense
   allreduce of the k floats sums them;
3. error feedback keeps, on every rank, what its own vector had outside the
   leader's indices.

Per rank that is 4k (P-1)/P bytes for the broadcast (its mean share: every
rank but the leader receives the indices once, whatever tree gloo uses) plus
a ring allreduce's 8k (P-1)/P: flat in P, 1.5/P of an allgather's 8k (P-1).
The price is in the selection: each rank sends the entries that are largest
for the leader, not for itself, and its own largest wait in its residual
until some leader picks them (ScaleCom argues that the ranks' residuals come
to agree, so the leader's top-k is a good pick for all). ScaleCom's low-pass
filter on the residual is not implemented.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..sync.base import SyncContext, ring_allreduce_bytes
from .error_feedback import ErrorFeedback
from .hooks import Hook
from .topk_buckets import TopKBuckets


def leader(step: int, bucket_index: int, world: int) -> int:
    """The rank (in the group) whose top-k every rank uses for this bucket at this step."""
    return (step + bucket_index) % world


def broadcast_share_bytes(nbytes: int, world: int) -> int:
    """A broadcast's bytes per rank, as the mean over ranks: every rank but the root receives nbytes once."""
    return nbytes * (world - 1) // world


def cyclic_wire_bytes(k: int, world: int) -> int:
    """Per rank and bucket: the k int32 indices' broadcast (mean share) and the k fp32 values' ring allreduce."""
    return broadcast_share_bytes(4 * k, world) + ring_allreduce_bytes(4 * k, world)


class CyclicTopKState(TopKBuckets):
    """Hook state: :class:`TopKBuckets`, and how often each bucket has been reduced."""

    def __init__(self, ctx: SyncContext, compressor: Any, error_feedback: ErrorFeedback | None):
        super().__init__(ctx, compressor, error_feedback)
        self.steps: dict[int, int] = {}  # bucket index -> calls so far; every rank calls in the same order

    def next_step(self, bucket_index: int) -> int:
        step = self.steps.get(bucket_index, 0)
        self.steps[bucket_index] = step + 1
        return step


def leaders_indices(x: torch.Tensor, select: Callable[[torch.Tensor], torch.Tensor], k: int, lead: int, rank: int,
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The k indices ``select`` picks from the leader's ``x``, on every rank (a broadcast of int32)."""
    # On the device on every rank: a broadcast whose ranks pass tensors of different devices would take
    # different backends (NCCL on the leader, gloo elsewhere) and hang.
    idx = select(x).to(torch.int32) if rank == lead else torch.empty(k, dtype=torch.int32, device=x.device)
    dist.broadcast(idx, src=lead if group is None else dist.get_global_rank(group, lead), group=group)
    return idx.to(torch.int64)


def cyclic_topk_hook(state: CyclicTopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The leader's top-k indices, broadcast; every rank's values there, summed; averaged (off backward)."""
    return state.launch(bucket, _cyclic_topk_bucket)  # type: ignore[arg-type]  # a CyclicTopKState's own work


def _cyclic_topk_bucket(state: CyclicTopKState, bucket: dist.GradBucket) -> torch.Tensor:
    ctx, grad, key, world = state.ctx, bucket.buffer(), bucket.index(), state.ctx.world_size
    x, comp = state.open(bucket)
    k = comp.count(grad.numel())
    chosen = leaders_indices(x, comp.select, k, leader(state.next_step(key), key, world), ctx.rank, ctx.group)
    values = x[chosen]
    state.keep_unsent(bucket, x, chosen, values)
    dist.all_reduce(values, group=ctx.group)
    total = values.new_zeros(grad.numel()).index_put_((chosen,), values)
    return state.finish(bucket, total, cyclic_wire_bytes(k, world), 8 * k)


def cyclic_hook(ctx: SyncContext, compressor: Any, error_feedback: ErrorFeedback | None) -> tuple[Any, Hook]:
    return CyclicTopKState(ctx, compressor, error_feedback), cyclic_topk_hook

"""What the top-k collectives' DDP hooks share: a bucket's compensated input and its error feedback.

``compression.collective: sparse`` (sparse_allreduce.py), ``cyclic``
(cyclic_topk.py) and ``global`` (global_topk.py) open a bucket the same way (reset its memory if DDP changed
what it holds, lay the compressor out over its tensors, add the residual) and
close it the same way (keep, as the next residual, what was not sent; count
the bytes; write the mean into the bucket). Only the choice of indices and the
collective between them differ.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..sync.base import SyncContext
from .error_feedback import BucketLayouts, ErrorFeedback


class TopKBuckets:
    """Hook state: the context, the top-k compressor, its error feedback, and each bucket's last layout."""

    def __init__(self, ctx: SyncContext, compressor: Any, error_feedback: ErrorFeedback | None):
        self.ctx, self.compressor, self.error_feedback = ctx, compressor, error_feedback
        self.layouts = BucketLayouts()

    def open(self, bucket: dist.GradBucket) -> tuple[torch.Tensor, Any]:
        """The bucket's error-compensated gradient (a new tensor with error feedback), and the compressor laid out on it."""
        self.layouts.check(bucket, self.error_feedback)
        comp = self.compressor.layout([g.numel() for g in bucket.gradients()])
        grad = bucket.buffer()
        ef = self.error_feedback
        return (ef.compensate(bucket.index(), grad) if ef is not None else grad), comp

    def keep_unsent(self, bucket: dist.GradBucket, x: torch.Tensor, indices: torch.Tensor,
                    values: torch.Tensor) -> None:
        """Error feedback keeps what ``x`` had outside ``indices`` (``values`` went out there)."""
        if self.error_feedback is not None:
            self.error_feedback.update(bucket.index(), x, torch.zeros_like(x).index_put_((indices,), values))

    def finish(self, bucket: dist.GradBucket, total: torch.Tensor, wire_bytes: int,
               payload_bytes: int) -> torch.futures.Future[torch.Tensor]:
        """Count the bytes, write ``total`` (the sum over ranks) / P into the bucket, and hand it back to DDP."""
        grad = bucket.buffer()
        self.ctx.stats.record(wire_bytes, payload_bytes, 4 * grad.numel())
        grad.copy_(total.div_(self.ctx.world_size))
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(grad)
        return fut

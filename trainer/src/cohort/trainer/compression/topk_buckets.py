"""What the top-k collectives' DDP hooks share: a bucket's compensated input and its error feedback.

``compression.collective: sparse`` (sparse_allreduce.py), ``cyclic``
(cyclic_topk.py) and ``global`` (global_topk.py) open a bucket the same way (reset its memory if DDP changed
what it holds, lay the compressor out over its tensors, add the residual) and
close it the same way (keep, as the next residual, what was not sent; count
the bytes; write the mean into the bucket). Only the choice of indices and the
collective between them differ.

Their collectives are several blocking steps each (sizes exchanged on the host
before the payloads), so a bucket's work runs on this state's own thread, and
the hook returns DDP a future that completes when it is done: backward goes on
computing the next buckets' gradients meanwhile, as with the allgather hook's
asynchronous collective. One thread, first in first out: every rank issues the
buckets' collectives in the same order (collectives issued from completion
callbacks could interleave differently on different ranks; see hooks.py's
PowerSGD note).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
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
        self.comm = _start_worker(self)

    def launch(self, bucket: dist.GradBucket,
               work: Callable[[TopKBuckets, dist.GradBucket], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
        """Run ``work`` (the bucket's selection, collectives and update; returns the bucket) on this state's
        thread, on the stream and device backward uses; the future carries its result or its exception (a
        peer lost mid-collective fails the backward, as a failed allreduce does)."""
        grad = bucket.buffer()
        stream = torch.cuda.current_stream(grad.device) if grad.is_cuda else None
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[grad.device] if grad.is_cuda else None)

        def run() -> None:
            try:
                if stream is not None:
                    with torch.cuda.device(grad.device), torch.cuda.stream(stream):
                        fut.set_result(work(self, bucket))
                else:
                    fut.set_result(work(self, bucket))
            except BaseException as e:  # handed to DDP, which raises it in backward
                fut.set_exception(e)  # type: ignore[arg-type]  # torch types it as the result
        self.comm.put(run)
        return fut

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

    def finish(self, bucket: dist.GradBucket, total: torch.Tensor, wire_bytes: int, payload_bytes: int) -> torch.Tensor:
        """Count the bytes, write ``total`` (the sum over ranks) / P into the bucket, and return it (for DDP)."""
        grad = bucket.buffer()
        self.ctx.stats.record(wire_bytes, payload_bytes, 4 * grad.numel())
        return grad.copy_(total.div_(self.ctx.world_size))


def _start_worker(owner: object) -> queue.SimpleQueue[Callable[[], None] | None]:
    """A daemon thread running what is put in the returned queue, in order, until ``owner`` is collected (a new
    world builds a new DDP and a new state). A daemon: one blocked in a collective with a lost peer must not
    keep the process from exiting."""
    jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

    def loop() -> None:
        while (job := jobs.get()) is not None:
            job()
    threading.Thread(target=loop, name="cohort-topk", daemon=True).start()
    weakref.finalize(owner, jobs.put, None)
    return jobs

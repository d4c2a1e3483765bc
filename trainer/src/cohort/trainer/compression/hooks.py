"""torch's own DDP communication hooks, with Cohort's byte accounting.

The methods that use them say so in their classes (cast.py, powersgd.py):

- fp16: torch's ``fp16_compress_hook`` (cast, mean allreduce, cast back).
- bf16: torch's ``bf16_compress_hook`` where the backend supports it (NCCL
  buckets on CUDA); on gloo torch refuses it, so Cohort casts, allreduces and
  casts back itself: the same algorithm.
- powersgd: torch's ``powerSGD_hook`` (Vogels et al. 2019), rank
  ``compression.rank``, error feedback per ``compression.errorFeedback``.

The payload compressors' allgather hook is in base.py. Bytes are recorded per
bucket in ``ctx.stats`` for the collective used: a ring allreduce of n bytes
costs 2(P-1)/P * n per rank, an allgather of a k-byte payload (P-1) * k. Hence
a sparse payload's advantage over dense shrinks as P grows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from ..sync.base import SyncContext, ring_allreduce_bytes

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

# PowerSGD's first iterations are plain allreduce: DDP rebuilds its buckets
# after the first backward, and PowerSGD's per-bucket state must not see that.
POWERSGD_START_ITER = 2


def accounted(hook: Hook, ctx: SyncContext, bytes_per_elem: int) -> Hook:
    """Wrap a torch hook that allreduces the bucket cast to ``bytes_per_elem`` bytes per element."""
    def run(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        n = bucket.buffer().numel()
        ctx.stats.record(ring_allreduce_bytes(bytes_per_elem * n, ctx.world_size), bytes_per_elem * n, 4 * n)
        return hook(state, bucket)
    return run


def bf16_hook(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16 hook where it works (NCCL); otherwise the same cast-allreduce-cast on any backend."""
    buffer = bucket.buffer()
    if buffer.is_cuda and dist.get_backend(group) == "nccl":
        return default_hooks.bf16_compress_hook(group, bucket)  # type: ignore[arg-type]  # None: the default group
    world = dist.get_world_size(group)
    compressed = buffer.to(torch.bfloat16).div_(world)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f: torch.futures.Future[Any]) -> torch.Tensor:
        buffer.copy_(f.value()[0])
        return buffer
    return fut.then(decompress)


# --- PowerSGD -------------------------------------------------------------------

def powersgd_hook(ctx: SyncContext, rank: int, error_feedback: bool) -> tuple[powerSGD_hook.PowerSGDState, Hook]:
    state = powerSGD_hook.PowerSGDState(
        process_group=ctx.group, matrix_approximation_rank=rank, start_powerSGD_iter=POWERSGD_START_ITER,
        use_error_feedback=error_feedback, warm_start=True, random_seed=ctx.spec.workload.seed)

    # powerSGD_hook issues its second and third allreduce (the Ps, the Qs) from callbacks on gloo's
    # completion threads. With several buckets in flight, whether bucket i's Qs go out before bucket
    # i + 1's first allreduce then depends on timing, and can differ between ranks: a collective
    # mismatch (gloo: "Received data size doesn't match", seen on the 1.86 M-parameter GPT, whose
    # gradients fill several buckets, in about half the runs). So a bucket's PowerSGD starts only
    # when the previous bucket's has finished: the collectives go out in one order on every rank.
    previous: list[torch.futures.Future[torch.Tensor]] = []

    def run(state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        _record_powersgd(ctx, state, bucket)
        if previous and bucket.index() > 0:
            previous[0].wait()
        fut = powerSGD_hook.powerSGD_hook(state, bucket)
        previous[:] = [fut]
        return fut
    return state, run


def _record_powersgd(ctx: SyncContext, state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> None:
    """PowerSGD's bytes: three ring allreduces (uncompressed tensors, the Ps, the Qs).

    Mirrors powerSGD_hook's own choice of which tensors to compress (a matrix
    is compressed when (n + m) * rank * min_compression_rate < n * m).
    """
    dense = bucket.buffer().numel()
    if state.iter < state.start_powerSGD_iter:
        ctx.stats.record(ring_allreduce_bytes(4 * dense, ctx.world_size), 4 * dense, 4 * dense)
        return
    uncompressed = ps = qs = 0
    for grad in bucket.gradients():
        n = grad.shape[0] if grad.dim() else 1
        m = grad.numel() // max(n, 1)
        r = min(n, m, state.matrix_approximation_rank)
        if (n + m) * r * state.min_compression_rate < n * m:
            ps, qs = ps + n * r, qs + m * r
        else:
            uncompressed += grad.numel()
    wire = sum(ring_allreduce_bytes(4 * k, ctx.world_size) for k in (uncompressed, ps, qs) if k)
    ctx.stats.record(wire, 4 * (uncompressed + ps + qs), 4 * dense)

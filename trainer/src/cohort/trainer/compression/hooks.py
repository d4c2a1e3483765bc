"""DDP communication hooks for ``sync.algorithm: allreduce`` with ``compression.method != none``.

- fp16: torch's ``fp16_compress_hook`` (cast, mean allreduce, cast back).
- bf16: torch's ``bf16_compress_hook`` where the backend supports it (NCCL
  buckets on CUDA); on gloo torch refuses it, so Cohort casts, allreduces and
  casts back itself: the same algorithm.
- powersgd: torch's ``powerSGD_hook`` (Vogels et al. 2019), rank
  ``compression.rank``, error feedback per ``compression.errorFeedback``.
- topk, randomk, qsgd, terngrad, signsgd: Cohort's compact path. Each rank
  compresses its bucket into a fixed-size byte payload (with error feedback
  for the biased ones), the payloads are allgathered as they are, and every
  rank decodes all P payloads and averages them locally. A compressed payload
  is never expanded before it crosses the wire: a sum of sparse or quantised
  vectors is not sparse or quantised, so an allreduce cannot carry it compactly.

Bytes are recorded per bucket in ``ctx.stats`` for the collective used: a ring
allreduce of n bytes costs 2(P-1)/P * n per rank, an allgather of a k-byte
payload (P-1) * k. Hence a sparse payload's advantage over dense shrinks as P
grows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from ..sync.base import SyncContext, allgather_bytes, ring_allreduce_bytes
from .base import Compressor, derive_seed
from .error_feedback import ErrorFeedback
from .registry import build_compressor, uses_error_feedback

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

# PowerSGD's first iterations are plain allreduce: DDP rebuilds its buckets
# after the first backward, and PowerSGD's per-bucket state must not see that.
POWERSGD_START_ITER = 2


def make_ddp_hook(ctx: SyncContext) -> tuple[Any, Hook]:
    """(state, hook) for ``DDP.register_comm_hook``, per ``ctx.spec.compression``."""
    method = ctx.spec.compression.method
    if method == "fp16":
        return ctx.group, _accounted(default_hooks.fp16_compress_hook, ctx, bytes_per_elem=2)
    if method == "bf16":
        return ctx.group, _accounted(bf16_hook, ctx, bytes_per_elem=2)
    if method == "powersgd":
        return powersgd_hook(ctx)
    compressor = build_compressor(ctx.spec.compression)
    ef = ErrorFeedback() if uses_error_feedback(compressor, ctx.spec.compression) else None
    return CompressedAllgather(ctx, compressor, ef), compressed_allgather_hook


def _accounted(hook: Hook, ctx: SyncContext, bytes_per_elem: int) -> Hook:
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


def cast_wrapper(hook: Hook, dtype: torch.dtype) -> Hook:
    """Run ``hook`` on the bucket cast to ``dtype`` (torch's fp16/bf16_compress_wrapper, for any backend)."""
    if dtype == torch.float16:
        return default_hooks.fp16_compress_wrapper(hook)

    def run(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        bucket.set_buffer(buffer.to(dtype))
        fut = hook(state, bucket)

        def decompress(f: torch.futures.Future[Any]) -> torch.Tensor:
            buffer.copy_(f.value())
            return buffer
        return fut.then(decompress)
    return run


# --- PowerSGD -------------------------------------------------------------------

def powersgd_hook(ctx: SyncContext) -> tuple[powerSGD_hook.PowerSGDState, Hook]:
    c = ctx.spec.compression
    state = powerSGD_hook.PowerSGDState(
        process_group=ctx.group, matrix_approximation_rank=c.rank, start_powerSGD_iter=POWERSGD_START_ITER,
        use_error_feedback=c.error_feedback, warm_start=True, random_seed=ctx.spec.workload.seed)

    def run(state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        _record_powersgd(ctx, state, bucket)
        return powerSGD_hook.powerSGD_hook(state, bucket)
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


# --- compact compressors: allgather of payloads --------------------------------

class CompressedAllgather:
    """Hook state: the compressor, its error feedback, and a step counter for the shared seeds."""

    def __init__(self, ctx: SyncContext, compressor: Compressor, error_feedback: ErrorFeedback | None):
        self.ctx, self.compressor, self.error_feedback = ctx, compressor, error_feedback
        self.base_seed = derive_seed(ctx.spec.workload.seed, 0xD0)
        self.step = 0

    def seed(self, bucket_index: int, rank: int) -> int:
        # Every rank derives every other rank's seed: random-k indices need not travel.
        return derive_seed(self.base_seed, self.step, bucket_index, rank)


def compressed_allgather_hook(state: CompressedAllgather, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    ctx, comp, ef = state.ctx, state.compressor, state.error_feedback
    grad, key, world = bucket.buffer(), bucket.index(), ctx.world_size
    n = grad.numel()
    seeds = [state.seed(key, r) for r in range(world)]
    x = ef.compensate(key, grad) if ef is not None else grad
    payload, mine = comp.roundtrip(x, seeds[ctx.rank])
    if ef is not None:
        ef.update(key, x, mine)
    size = payload.numel()
    ctx.stats.record(allgather_bytes(size, world), size, 4 * n)
    gathered = torch.empty(world * size, dtype=torch.uint8)
    fut = dist.all_gather_into_tensor(gathered, payload, group=ctx.group, async_op=True).get_future()
    if bucket.is_last():
        state.step += 1

    def average(f: torch.futures.Future[Any]) -> torch.Tensor:
        f.value()  # re-raises if the allgather failed (a peer left)
        total = torch.zeros(n)
        for r in range(world):  # in rank order on every rank: the ranks' sums agree bit for bit
            total += mine if r == ctx.rank else comp.decode(gathered[r * size:(r + 1) * size], n, seeds[r])
        grad.copy_(total.div_(world))
        return grad
    return fut.then(average)

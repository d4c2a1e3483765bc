"""``sync.algorithm: allreduce``: synchronous data parallelism with DDP.

Gradients are averaged by DDP; ``spec.compression`` picks the communication
hook (torch's own fp16/PowerSGD hooks where the backend supports them,
Cohort's compact compressors otherwise; see cohort.trainer.compression).
Every hook is wrapped to time the hand-off and to count bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .base import Sync, ring_allreduce_bytes


def dense_allreduce_hook(ctx, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mean allreduce of the bucket (what DDP does by default), with accounting."""
    tensor = bucket.buffer()
    nbytes = tensor.numel() * tensor.element_size()
    ctx.stats.record(ring_allreduce_bytes(nbytes, ctx.world_size), nbytes, nbytes)
    tensor.div_(ctx.world_size)
    fut = dist.all_reduce(tensor, group=ctx.group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def timed_hook(hook, stats):
    """Wrap a comm hook to note when the last bucket left compute (see CommStats.mark_hook)."""
    def wrapper(state, bucket):
        stats.mark_hook()
        return hook(state, bucket)
    return wrapper


class AllreduceSync(Sync):
    def wrap(self, model: nn.Module) -> nn.Module:
        if self.ctx.world_size == 1:
            return model
        ddp = DDP(model, process_group=self.ctx.group)
        method = self.ctx.spec.compression.method
        if method == "none":
            ddp.register_comm_hook(self.ctx, timed_hook(dense_allreduce_hook, self.ctx.stats))
        else:
            from ..compression.hooks import make_ddp_hook  # compressors are optional machinery

            state, hook = make_ddp_hook(self.ctx)
            ddp.register_comm_hook(state, timed_hook(hook, self.ctx.stats))
        return ddp

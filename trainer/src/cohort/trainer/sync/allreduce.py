"""``sync.algorithm: allreduce``: synchronous data parallelism with DDP.

Gradients are averaged by DDP; the class of ``spec.compression.method`` gives the
communication hook (torch's own fp16/bf16/PowerSGD hooks, or the payload
compressors' allgather; see cohort.trainer.compression).
Every hook is wrapped to time the hand-off and to count bytes. Without
compression DDP keeps its built-in C++ allreduce (a Python hook costs a few
percent of a small step); the hand-off is then timed by a post-accumulate
hook on the parameter whose gradient backward computes last.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..compression.registry import build_method
from .base import Sync, ring_allreduce_bytes


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
        hooked = build_method(self.ctx.spec.compression).ddp_hook(self.ctx)
        if hooked is None:
            params = [p for p in model.parameters() if p.requires_grad]
            self._dense_bytes = sum(p.numel() * p.element_size() for p in params)
            # DDP buckets parameters in reverse order: the first parameter's gradient is the last one
            # backward produces, so it is when the last bucket is handed to communication.
            stale = getattr(model, "_cohort_handoff_marker", None)
            if stale is not None:  # a previous world's marker: one per model
                stale.remove()
            model._cohort_handoff_marker = params[0].register_post_accumulate_grad_hook(
                lambda p: self.ctx.stats.mark_hook())
        else:
            state, hook = hooked
            ddp.register_comm_hook(state, timed_hook(hook, self.ctx.stats))
        return ddp

    def after_step(self, model: nn.Module, step: int) -> None:
        nbytes = getattr(self, "_dense_bytes", 0)
        if nbytes:  # DDP's own allreduce moved every gradient once this step
            self.ctx.stats.record(ring_allreduce_bytes(nbytes, self.ctx.world_size), nbytes, nbytes)

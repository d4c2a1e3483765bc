"""``sync.algorithm: localsgd``: post-local SGD (Lin et al. 2020, "Don't Use Large
Mini-Batches, Use Local SGD"; Stich 2019, "Local SGD Converges Fast and
Communicates Little"), with torch's own pieces.

For the first ``warmup_steps`` steps, DDP allreduces gradients (torch's
``post_localSGD_hook``); after that each rank steps on its own gradients and
every ``sync.period`` steps the replicas average their parameters (torch's
``PeriodicModelAverager``). The hook's subgroup, normally the ranks sharing a
machine, is explicit here: a Cohort pod is its own machine, so the subgroup is
the rank alone (torch's default subgroup needs CUDA and fails on CPU).

``sync.outerOptimizer`` turns the average into an outer step (DiLoCo: Douillard et al. 2023,
"DiLoCo: Distributed Low-Communication Training of Language Models"; SlowMo: Wang et al. 2020,
"SlowMo: Improving Communication-Efficient Distributed SGD with Slow Momentum"): the previous
round's parameters minus the new average is an outer gradient, and torch's SGD (with Nesterov
momentum for ``nesterov``) steps the previous round's parameters by it. The previous round's
parameters and the outer momentum are identical on every rank (each computed from the same
averages), so the step needs no communication. Both live with the world: the first round of a
world is a plain average, which every rank of it (a newcomer too) starts from.

fp16/bf16 apply to both exchanges: the warm-up gradients (torch's
``fp16_compress_wrapper``; a cast wrapper of Cohort's for bf16, which torch
limits to NCCL) and the averaging, which sends the change since the previous
average in 16 bits (every rank holds that previous average bit for bit), so
rounding touches the small update, not the weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as plsgd
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from cohort.api.models import OuterOptimizer

from ..compression.hooks import cast_wrapper
from ..compression.registry import build_method
from .allreduce import timed_hook
from .base import Sync, SyncContext, ring_allreduce_bytes


@dataclass(frozen=True)
class LocalSGDConfig:
    warmup_steps: int = 10
    """Steps of fully synchronous SGD (gradient allreduce) before local SGD starts."""


class OuterStep:
    """The outer optimizer: torch's SGD on the round's parameters, whose gradient is how far the average moved."""

    def __init__(self, config: OuterOptimizer):
        self.config = config
        self.params: torch.Tensor | None = None
        self.optimizer: torch.optim.SGD | None = None

    def __call__(self, previous: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
        """The new round's parameters, from the previous round's and this round's average."""
        if self.optimizer is None or self.params is None:
            self.params = previous.clone()
            c = self.config
            self.optimizer = torch.optim.SGD([self.params], lr=c.lr, momentum=c.momentum,
                                             nesterov=c.name == "nesterov" and c.momentum > 0)
        self.params.copy_(previous)
        self.params.grad = previous - average
        self.optimizer.step()
        return self.params.detach().clone()


class CastPeriodicAverager(PeriodicModelAverager):
    """torch's PeriodicModelAverager, with the averaged quantity optionally cast to 16 bits and an outer step."""

    def __init__(self, period: int, warmup_steps: int, group: dist.ProcessGroup | None, ctx: SyncContext,
                 dtype: torch.dtype | None, outer: OuterStep | None = None):
        super().__init__(period=period, warmup_steps=warmup_steps, process_group=group)
        self.ctx, self.dtype, self.outer = ctx, dtype, outer
        self.reference: torch.Tensor | None = None  # the last round's parameters, identical on every rank

    def average_parameters(self, params: Any) -> None:
        params = list(params)
        due = self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0
        n, world = sum(p.numel() for p in params), self.ctx.world_size
        if not due:
            self.step += 1
            return
        if self.dtype is None and self.outer is None:
            self.ctx.stats.record(ring_allreduce_bytes(4 * n, world), 4 * n, 4 * n)
            super().average_parameters(params)  # torch's fp32 average (and its step counter)
            return
        x = parameters_to_vector(params).detach()
        if self.reference is None or self.dtype is None:  # a world's first average is fp32, to agree on the reference
            self.ctx.stats.record(ring_allreduce_bytes(4 * n, world), 4 * n, 4 * n)
            dist.all_reduce(x.div_(world), group=self.process_group)
        else:
            delta = (x - self.reference).div_(world).to(self.dtype)
            self.ctx.stats.record(ring_allreduce_bytes(2 * n, world), 2 * n, 4 * n)
            dist.all_reduce(delta, group=self.process_group)
            x = self.reference + delta.float()
        if self.outer is not None and self.reference is not None:
            x = self.outer(self.reference, x)
        self.reference = x.clone()
        vector_to_parameters(x, params)
        self.step += 1


class LocalSGDSync(Sync):
    def __init__(self, ctx: SyncContext, config: LocalSGDConfig | None = None):
        super().__init__(ctx)
        self.config = config or LocalSGDConfig()
        dtype = build_method(ctx.spec.compression).localsgd_dtype()  # admission refuses the others
        self.dtype = None if dtype == torch.float32 else dtype  # None: torch's own fp32 average
        self.hook_state: plsgd.PostLocalSGDState | None = None
        self.averager: CastPeriodicAverager | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.ctx.world_size == 1:
            return model
        # One subgroup per rank; every rank must take part in creating all of them.
        subgroup, _ = dist.new_subgroups(group_size=1, group=self.ctx.group)
        self.hook_state = plsgd.PostLocalSGDState(process_group=self.ctx.group, subgroup=subgroup,
                                                  start_localSGD_iter=self.config.warmup_steps)
        with warnings.catch_warnings():
            # Buffers stay local between averaging rounds (a per-forward broadcast is a global
            # collective every step). torch 2.13 deprecates the argument but says to keep using it
            # for exactly this until its replacement exists.
            warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
            ddp = DDP(model, process_group=self.ctx.group, broadcast_buffers=False)
        ddp.register_comm_hook(self.hook_state, timed_hook(self._hook(), self.ctx.stats))
        outer = self.ctx.spec.sync.outer_optimizer
        self.averager = CastPeriodicAverager(max(1, int(self.ctx.spec.sync.period)), self.config.warmup_steps,
                                             self.ctx.group, self.ctx, self.dtype,
                                             OuterStep(outer) if outer.name != "none" else None)
        return ddp

    def _hook(self) -> Any:
        hook: Callable[..., Any] = plsgd.post_localSGD_hook
        if self.dtype is not None:
            hook = cast_wrapper(hook, self.dtype)
        ctx, bpe = self.ctx, 4 if self.dtype is None else 2

        def accounted(state: plsgd.PostLocalSGDState, bucket: dist.GradBucket) -> Any:
            if state.iter < state.start_localSGD_iter:  # global allreduce; afterwards a group of one
                n = bucket.buffer().numel()
                ctx.stats.record(ring_allreduce_bytes(bpe * n, ctx.world_size), bpe * n, 4 * n)
            return hook(state, bucket)
        return accounted

    def after_step(self, model: nn.Module, step: int) -> None:
        if self.averager is None or self.hook_state is None:
            return
        # Count in the trainer's steps, which survive world changes (a new Sync starts from 0).
        self.hook_state.iter = step
        self.averager.step = step
        self.averager.average_parameters(model.parameters())

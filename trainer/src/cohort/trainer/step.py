"""One optimizer step on this rank: forward, backward, synchronisation, the optimizer, and what each cost.

Reads like nanoGPT's step: autocast, forward, (scaled) backward, clip, the
commit gate (commit.py: did every collective of the step complete without
error?), step.
The synchronisation is the plan's: DDP's comm hooks fire inside backward,
FSDP2 reduce-scatters there too, and gossip and local SGD act in
``plan.after_step``. Everything here runs on the worker's device; the batch
arrives on the host and is copied there first.

Precision (``workload.precision``): bf16 and fp16 autocast on the device's
type (the CPU has a real bf16 autocast too); fp16 adds torch's dynamic
``GradScaler``, which unscales before clipping and skips a step whose
gradients overflowed. Parameters and optimizer state stay fp32.

Timing holds on a GPU: marks are device events (timing.DeviceClock), and the
step ends with one synchronisation, after which they are read. Compute is
forward + backward up to the last gradient bucket's hand-off to
communication, plus the optimizer; communication is what backward waited for
after that hand-off (exposed, not overlapped) plus ``after_step``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from cohort.api.models import TrainingJobSpec

from .commit import CommitGate, StepDiscarded
from .parallel.base import Plan
from .runtime.device import autocast, synchronize, to_device
from .sync.base import CommStats
from .timing import DeviceClock

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class StepResult:
    loss: float
    wall_s: float
    compute_s: float
    comm_s: float


@dataclass
class MicroBatching:
    """How this rank's share of a global batch is cut: ``parts`` micro-batches, each weighted by
    samples x dp / global batch so that DDP's mean over ranks is the mean over the global batch."""

    parts: int = 1
    dp_size: int = 1
    global_batch: int = 0   # 0: the share is a whole per-rank batch (no weighting)


class StepRunner:
    def __init__(self, spec: TrainingJobSpec, device: torch.device, stats: CommStats, gate: CommitGate | None = None):
        """``gate``: the commit gate the optimizer waits on (commit.py); None applies every step (tests)."""
        self.device, self.stats, self.gate = device, stats, gate
        self.precision = spec.workload.precision
        self.clip_norm = spec.workload.optimizer.grad_clip_norm
        self.scaler = torch.amp.GradScaler(device.type) if self.precision == "fp16" else None
        self.clock = DeviceClock(device)
        stats.clock = self.clock.mark

    def run(self, plan: Plan, optimizer: torch.optim.Optimizer, fetch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
            loss_fn: LossFn, micro: MicroBatching, before_update: Callable[[], object], step: int,
            slow_down: Callable[[float], float] = lambda s: 0.0,
            after_backward: Callable[[], None] = lambda: None,
            applied: Callable[[], None] = lambda: None) -> StepResult:
        """One step: this rank's batch (``fetch``: host tensors), its gradients synchronised and applied;
        ``step`` is the number of the step this completes. ``slow_down`` and ``after_backward`` are fault
        injection's (a straggler; a collective that failed after writing part of its result). ``applied``
        runs once the optimizer has updated the model, before the plan's exchange after the step (local
        SGD's round, gossip's mixing): from then on the step counts, even if that exchange fails.
        Raises commit.StepDiscarded, with nothing applied, when the gate refuses the step."""
        start, hooks_before = self.clock.mark(), self.stats.hooks
        if self.gate is not None:
            self.gate.begin()
        x, y = (to_device(t, self.device) for t in fetch())
        optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.precision):
            loss = self._forward_backward(plan, x, y, loss_fn, micro)
        backward_done = self.clock.mark()
        handed_off = self.stats.last_hook if self.stats.hooks > hooks_before else backward_done
        after_backward()
        self._commit_or_discard(optimizer)  # the gradients' collectives completed without error
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)  # clipping sees true gradients
        if self.clip_norm > 0:
            plan.clip_grad_norm(self.clip_norm)
            if not plan.replicated:  # sharded plans reduce the norm across ranks: gate that too (no fp16 here)
                self._commit_or_discard(optimizer)
        before_update()  # a checkpoint still being staged must not see this update
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        updated = self.clock.mark()
        applied()
        plan.after_step(step)
        end = self.clock.mark()
        synchronize(self.device)
        value = float(loss)
        s = DeviceClock.seconds
        compute = s(start, handed_off) + s(backward_done, updated)
        injected = slow_down(compute)  # a fault-injected straggler (faults.py) sleeps here
        return StepResult(loss=value, wall_s=s(start, end) + injected, compute_s=compute + injected,
                          comm_s=s(handed_off, backward_done) + s(updated, end))

    def _commit_or_discard(self, optimizer: torch.optim.Optimizer) -> None:
        if self.gate is None:
            return
        try:
            self.gate.check()
        except StepDiscarded:
            optimizer.zero_grad(set_to_none=True)  # nothing of this step survives it
            raise

    def _forward_backward(self, plan: Plan, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                          micro: MicroBatching) -> torch.Tensor:
        """This rank's share in ``micro.parts`` micro-batches; only the last backward communicates."""
        if micro.parts == 1 and not micro.global_batch:
            return plan.forward_backward(x, y, loss_fn, loss_scale=self._loss_scale)
        total = float(micro.global_batch or len(x) * micro.dp_size)
        loss = x.new_zeros((), dtype=torch.float32)
        chunks = [(cx, cy) for cx, cy in zip(torch.tensor_split(x, micro.parts), torch.tensor_split(y, micro.parts),
                                             strict=True) if len(cx)]
        for i, (cx, cy) in enumerate(chunks):
            weight = len(cx) * micro.dp_size / total
            sync = plan.accumulating() if i < len(chunks) - 1 else nullcontext()
            with sync:
                part = plan.forward_backward(cx, cy, loss_fn, weight, loss_scale=self._loss_scale)
            loss += part.float() * len(cx) / len(x)
        return loss

    def _loss_scale(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward starts from: the loss, times the fp16 scaler's factor when there is one."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

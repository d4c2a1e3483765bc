"""Pipeline parallelism with ``torch.distributed.pipelining``: stage split, schedule, evaluation.

``split_stage`` cuts this rank's stage out of the built-in transformer by
hand (no tracing): the first stage keeps the embeddings, the last keeps the
final norm and output, and each keeps a contiguous run of blocks. Blocks
live in a ModuleDict, so a stage's parameters keep their full-model names
(``layers.3.attention.wq.weight``) and DCP checkpoints load at any stage count.

Training runs a torch schedule (GPipe or 1F1B) over ``microbatches``; the loss
exists only on the last stage and is broadcast along the pipeline so every
rank reports it. Evaluation runs the stages forward with plain send/recv,
because a schedule's buffers are shaped for the training microbatch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from ..planner.dims import stage_layers
from ..workloads.models import Transformer
from .dims import ParallelismError

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def check_pipeline(model: nn.Module, pp: int, microbatches: int, schedule: str, batch_size: int) -> None:
    """Raise ParallelismError unless ``model`` and the per-rank batch split into ``pp`` stages."""
    if not isinstance(model, Transformer):
        raise ParallelismError(f"spec.parallelism.pipeline: no stage split for {type(model).__name__} "
                               "(built-in: transformer); use strategy data, fsdp or tensor")
    if len(model.layers) < pp:
        raise ParallelismError(f"spec.parallelism.pipeline: {pp} stages need at least {pp} layers, "
                               f"the transformer has {len(model.layers)} (modelArgs.n_layers)")
    if batch_size % microbatches:
        raise ParallelismError(f"spec.parallelism.microbatches: {microbatches} does not divide the per-rank "
                               f"batch of {batch_size}")
    if schedule == "1f1b" and microbatches < pp:
        raise ParallelismError(f"spec.parallelism.microbatches: 1f1b needs at least as many microbatches as "
                               f"stages ({pp}), got {microbatches}")


def split_stage(model: Transformer, stage: int, n_stages: int) -> Transformer:
    """Drop, in place, every part of ``model`` that ``stage`` does not run; returns it."""
    keep = {str(i) for i in stage_layers(len(model.layers), stage, n_stages)}
    for name in [n for n in model.layers if n not in keep]:
        del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if stage < n_stages - 1:
        model.norm = None
        model.output = None
    return model


class Pipeline:
    """One rank's stage of a pipeline over ``group``: training steps and evaluation passes."""

    def __init__(self, module: nn.Module, stage: int, n_stages: int, group: dist.ProcessGroup,
                 microbatches: int, schedule: str, device: torch.device):
        self.module, self.stage, self.n_stages, self.group, self.device = module, stage, n_stages, group, device
        self.microbatches, self.schedule_name = microbatches, schedule
        self._stage = PipelineStage(module, stage, n_stages, device, group=group)
        self._schedule: PipelineScheduleSingle | None = None
        self._loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def _current_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self._loss_fn is not None, "train_step sets the loss function before the schedule runs"
        return self._loss_fn(out, target)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.n_stages - 1

    def train_step(self, x: torch.Tensor, y: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Forward and backward over all microbatches; returns the batch loss on every stage."""
        if self._schedule is None:
            # The schedule holds the loss function; it calls through this indirection so a later
            # step's loss_fn is the one used. scale_grads: gradients of the mean microbatch loss.
            self._schedule = SCHEDULES[self.schedule_name](self._stage, self.microbatches,
                                                           loss_fn=self._current_loss)
        self._loss_fn = loss_fn
        losses: list[torch.Tensor] = []
        if self.is_first and self.is_last:
            self._schedule.step(x, target=y, losses=losses)
        elif self.is_first:
            self._schedule.step(x)
        elif self.is_last:
            self._schedule.step(target=y, losses=losses)
        else:
            self._schedule.step()
        # On the device on every stage: a broadcast whose ranks pass tensors of different devices would
        # take different backends (gloo here, NCCL there) and hang.
        loss = torch.stack([v.detach().float() for v in losses]).mean() if losses else \
            torch.zeros((), device=self.device)
        dist.broadcast(loss, group=self.group, group_src=self.n_stages - 1)
        return loss

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """An evaluation forward pass of a whole batch; the output on the last stage, else None."""
        if not self.is_first:  # the shape is host metadata (gloo), the activations the device's
            shape = torch.zeros(3, dtype=torch.long)
            dist.recv(shape, group=self.group, group_src=self.stage - 1)
            x = torch.empty(*shape.tolist(), device=self.device)
            dist.recv(x, group=self.group, group_src=self.stage - 1)
        h = self.module(x)
        if self.is_last:
            return h
        h = h.float().contiguous()
        dist.send(torch.tensor(h.shape, dtype=torch.long), group=self.group, group_dst=self.stage + 1)
        dist.send(h, group=self.group, group_dst=self.stage + 1)
        return None

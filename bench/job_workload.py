"""The job's own model, data, loss and optimizer for the baseline workers (torchrun, torchft).

A goodput comparison is fair only if every system trains the same thing: the
baselines build the manifest's workload with the code Cohort's trainer uses
(``build_workload``, ``build_optimizer``) and run it in their own plain loops.
Batches are a seeded permutation per epoch, each rank taking its slice of the
global batch, as in bench/torchrun_worker.py's digits loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from cohort.api.models import TrainingJobSpec
from cohort.api.schema import parse
from cohort.trainer.optim import build_optimizer
from cohort.trainer.runtime.device import PRECISIONS
from cohort.trainer.workloads.workload import Workload, build_workload


@dataclass
class Job:
    spec: TrainingJobSpec
    work: Workload

    @property
    def model(self) -> torch.nn.Module:
        return self.work.model

    @property
    def per_rank(self) -> int:
        return self.spec.workload.batch_size

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The manifest's ``workload.precision`` as an autocast dtype (None: fp32). fp16 would need the gradient
        scaler Cohort's step has (step.py), which these plain loops do not: refused rather than run unscaled."""
        if self.spec.workload.precision == "fp16":
            raise ValueError("workload.precision fp16: the baseline loops have no gradient scaler; use bf16 or fp32")
        return PRECISIONS[self.spec.workload.precision]

    def optimizer(self, params: Any) -> torch.optim.Optimizer:
        return build_optimizer(params, self.spec.workload.optimizer)

    def batch(self, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank ``rank``'s share of step ``step``'s global batch (per-rank batch x world)."""
        split, per = self.work.data.train, self.per_rank
        per_epoch = max(1, len(split) // (per * world))
        perm = torch.randperm(len(split), generator=torch.Generator().manual_seed(step // per_epoch))
        offset = (step % per_epoch) * per * world + rank * per
        return split.fetch(perm[offset:offset + per])

    def loss(self, x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        return self.work.loss_fn(model(x), y)


def load(manifest: str | Path) -> Job:
    spec = parse(TrainingJobSpec, yaml.safe_load(Path(manifest).read_text())["spec"], "spec")
    torch.manual_seed(spec.workload.seed)
    return Job(spec, build_workload(spec))

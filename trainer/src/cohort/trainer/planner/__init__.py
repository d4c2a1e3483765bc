"""The auto-parallel planner: cost models, search, calibration (docs/parallelism.md#planner).

Entry points: ``plan_for`` (what ``strategy: auto`` runs), ``rank_plans`` and
``format_table`` (what ``cohort plan`` prints), ``calibrate`` (``cohort calibrate``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .hardware import Hardware, load_hardware
from .profile import ModelProfile, profile_model
from .report import format_table
from .search import Candidate, best_plan, rank_plans


def plan_for(spec: Any, model: nn.Module, world_size: int, hw: Hardware | None = None,
             sample: Any = None) -> tuple[Candidate, list[Candidate]]:
    """The planner's choice for ``spec`` on ``world_size`` ranks, and the whole ranked list.

    The global batch is the one data parallelism would use on this world
    (``batchSize x world_size``); ``parallelism.tensor``/``pipeline`` above 1
    pin those degrees.
    """
    hw = hw or load_hardware()
    profile = profile_model(model, sample)
    opt = spec.workload.optimizer
    p = spec.parallelism
    candidates = rank_plans(world_size, profile, hw, spec.workload.batch_size * world_size, opt.name,
                            opt.momentum, tp=p.tensor if p.tensor > 1 else None,
                            pp=p.pipeline if p.pipeline > 1 else None)
    best = best_plan(candidates)
    if best is None:
        from ..parallel.dims import ParallelismError

        reason = candidates[0].rejected if candidates else "no dp x tp x pp split of this model fits the world"
        raise ParallelismError(f"spec.parallelism.strategy: auto found no plan for {world_size} ranks ({reason})")
    return best, candidates


__all__ = ["Candidate", "Hardware", "ModelProfile", "format_table", "load_hardware", "plan_for", "profile_model",
           "rank_plans"]

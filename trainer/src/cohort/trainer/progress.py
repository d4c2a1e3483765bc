"""How far a run has to go and what its steps cost: the ``stepsTotal``, ``etaSeconds`` and
``restartCostSeconds`` of ``/progress`` (docs/contracts.md §4), and so of the job's status.

Arithmetic over the sampler's position, the workload's length and the measured global throughput
(timing.StepClock's samples per second), at the current data-parallel size: a world that grows or
shrinks changes the global batch, and the estimates follow.
"""

from __future__ import annotations

from cohort.api.models import Workload

from .sampler import ElasticSampler


def total_steps(workload: Workload, sampler: ElasticSampler, step: int, dp_size: int | None) -> int | None:
    """The run's last step: ``maxSteps`` when set (it ends the run), else this epoch's steps left and every
    later epoch's at this size. None before a plan gives the size."""
    if workload.max_steps > 0:
        return workload.max_steps
    if dp_size is None:
        return None
    per_epoch = sampler.num_samples // sampler.global_batch(dp_size)
    return step + sampler.steps_left_in_epoch(dp_size) + per_epoch * max(0, workload.epochs - sampler.epoch - 1)


def seconds_for(steps: int, sampler: ElasticSampler, dp_size: int | None,
                samples_per_second: float | None) -> int | None:
    """What ``steps`` steps take at the measured global throughput; None until there is one."""
    if dp_size is None or not samples_per_second or samples_per_second <= 0:
        return None
    return round(steps * sampler.global_batch(dp_size) / samples_per_second)

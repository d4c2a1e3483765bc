"""A world's ParallelDims from the spec, and ParallelismError.

:class:`~cohort.trainer.planner.dims.ParallelDims` (the planner's) says how a
world of ``dp * tp * pp`` ranks is laid out. The explicit strategies derive it
from the spec and the world size here (dp follows the world, tp and pp stay
fixed); ``auto`` gets it from the planner. Every check that can fail raises
:class:`ParallelismError` (a ``ValidationError``), whose message is the one line
the CLI prints before exiting 2. The checks that need the model are in
sharded.py's ``check_dims``.
"""

from __future__ import annotations

from cohort.api import ValidationError
from cohort.api.models import TrainingJobSpec

from ..planner.dims import ParallelDims


class ParallelismError(ValidationError):
    """A parallelism setting cannot run with this model, world or backend; the message names the field."""


def dims_for_world(spec: TrainingJobSpec, world_size: int, *, tensor: int | None = None, pipeline: int | None = None,
                   dp_mode: str = "fsdp") -> ParallelDims:
    """The dims of a world: tp and pp from the spec (fixed), dp from the world size (elastic)."""
    p = spec.parallelism
    tp = p.tensor if tensor is None else tensor
    pp = p.pipeline if pipeline is None else pipeline
    if world_size % (tp * pp):
        raise ParallelismError(
            f"spec.parallelism: a world of {world_size} ranks is not a multiple of tensor x pipeline = "
            f"{tp} x {pp}; run a multiple of {tp * pp} workers (the operator keeps the rest as spares)")
    return ParallelDims(dp=world_size // (tp * pp), tp=tp, pp=pp, microbatches=p.microbatches if pp > 1 else 1,
                        schedule=p.schedule, dp_mode=dp_mode)


def check_world_size(spec: TrainingJobSpec, world_size: int) -> None:
    """Refuse a world the spec's fixed tp x pp does not divide (the operator never forms one)."""
    if spec.parallelism.strategy in ("tensor", "pipeline", "hybrid"):
        dims_for_world(spec, world_size)

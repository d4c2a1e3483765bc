"""ParallelDims: the dp x tp x pp shape of one world, and the checks that a model and batch fit it.

One frozen value says how a world of ``dp * tp * pp`` ranks is laid out. The
explicit strategies derive it from the spec and the world size (dp follows the
world, tp and pp stay fixed); ``auto`` gets it from the planner. Every check
that can fail raises :class:`ParallelismError` (a ``ConfigError``), whose
message is the one line the CLI prints before exiting 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config import ConfigError


class ParallelismError(ConfigError):
    """A parallelism setting cannot run with this model, world or backend; the message names the field."""


@dataclass(frozen=True)
class ParallelDims:
    """How one world's ranks are split. Ranks are laid out pp-major, tp-minor (tp peers are adjacent)."""

    dp: int = 1
    """Data-parallel degree: ranks that read different batches."""
    tp: int = 1
    """Tensor-parallel degree: ranks that split each layer's weights."""
    pp: int = 1
    """Pipeline-parallel degree: stages, each holding a contiguous slice of the layers."""
    microbatches: int = 1
    """Pipeline microbatches per step (only used when pp > 1)."""
    schedule: str = "1f1b"
    """Pipeline schedule, ``gpipe`` or ``1f1b`` (only used when pp > 1)."""
    dp_mode: str = "fsdp"
    """How the dp ranks keep one model: ``fsdp`` (FSDP2 shards it) or ``ddp`` (replicas; tp = pp = 1 only)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.pp > 1:
            parts.append(f"mb={self.microbatches} {self.schedule}")
        if self.dp > 1 or self.dp_mode == "ddp":
            parts.append(self.dp_mode)
        return " ".join(parts)


def dims_for_world(spec: Any, world_size: int, *, tensor: int | None = None, pipeline: int | None = None,
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


def check_world_size(spec: Any, world_size: int) -> None:
    """Refuse a world the spec's fixed tp x pp does not divide (the operator never forms one)."""
    if spec.parallelism.strategy in ("tensor", "pipeline", "hybrid"):
        dims_for_world(spec, world_size)


def check_dims(dims: ParallelDims, model: nn.Module | None, batch_size: int) -> None:
    """Refuse dims the model or the per-rank batch cannot be split by (one clear line, naming the field)."""
    from .pipeline import check_pipeline  # each parallelism knows its own constraints
    from .tensor import check_tensor_parallel

    if dims.dp_mode == "ddp" and (dims.tp > 1 or dims.pp > 1):
        raise ParallelismError("spec.parallelism: DDP replicas cannot hold tensor- or pipeline-parallel parts "
                               "(TP + plain DDP fails on gloo); the dp dimension uses FSDP2 instead")
    if model is None:
        return
    if dims.tp > 1:
        check_tensor_parallel(model, dims.tp)
    if dims.pp > 1:
        check_pipeline(model, dims.pp, dims.microbatches, dims.schedule, batch_size)

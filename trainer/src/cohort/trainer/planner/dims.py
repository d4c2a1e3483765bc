"""ParallelDims: the dp x tp x pp shape of one world, and how a pipeline splits the layers.

Pure values (no torch): the planner's cost and memory models reason about
them, and parallel/ builds the meshes, stages and shards they describe.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINTING_ORDER = ("none", "selective", "full")  # activation checkpointing modes, least recomputation first


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
    ac: str = "none"
    """Activation checkpointing of each block: ``none``, ``full`` or ``selective`` (workload.activationCheckpointing)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def fully_sharded(self) -> bool:
        """FSDP2 shards the model over dp (parallelize applies it when dp > 1): a bf16 job's blocks then compute
        with bf16 parameters (its MixedPrecisionPolicy), not with autocast's copies of fp32 ones."""
        return self.dp_mode == "fsdp" and self.dp > 1

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.pp > 1:
            parts.append(f"mb={self.microbatches} {self.schedule}")
        if self.dp > 1 or self.dp_mode == "ddp":
            parts.append(self.dp_mode)
        if self.ac != "none":
            parts.append(f"ac={self.ac}")
        return " ".join(parts)


def stage_layers(n_layers: int, stage: int, n_stages: int) -> range:
    """The blocks of ``stage``: contiguous and balanced; the earlier stages take the remainder."""
    base, extra = divmod(n_layers, n_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))

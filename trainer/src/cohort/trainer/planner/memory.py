"""Memory per device of a plan: parameters, gradients, optimizer state and activations.

Follows the per-scheme memory analysis surveyed by Liang et al. (TPDS 2023,
§3): data parallelism replicates everything; ZeRO-3 / FSDP divides
parameters, gradients and optimizer state by dp (plus the unit it has
gathered); tensor parallelism divides the split weights and the split
activations by tp; pipeline parallelism keeps one stage's share of each, and
the schedule sets how many microbatches' activations are alive at once
(GPipe: all m; 1F1B: at most p on the first stage). Activation checkpointing
(``workload.activationCheckpointing``) keeps less per block: ``full`` its input,
plus the rest of one block's activations while backward recomputes it; ``selective`` the
outputs of its matmuls and attention (with tp, also the all-reduces' outputs). Bytes a block keeps whatever the
batch (autocast's bf16 copies of its weights: ``ModelProfile.block_fixed``) divide with its weights under tp.
Parameters, gradients and optimizer state are fp32; activations are the profile's (fp32 when counted, the job's
precision when measured), and the worst stage is reported (the device that runs out first).
"""

from __future__ import annotations

from dataclasses import dataclass

from .dims import CHECKPOINTING_ORDER, ParallelDims, stage_layers
from .profile import BYTES, ModelProfile

# Optimizer state in parameter-sized tensors: SGD's momentum buffer; AdamW's two moments.
OPTIMIZER_STATES = {"sgd": 1, "sgd-no-momentum": 0, "adamw": 2}


@dataclass(frozen=True)
class Memory:
    """Bytes per device on the most loaded stage."""

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations


def optimizer_states(name: str, momentum: float = 0.9) -> int:
    return OPTIMIZER_STATES["sgd-no-momentum" if name == "sgd" and momentum == 0 else name]


def stage_params(profile: ModelProfile, dims: ParallelDims, stage: int) -> tuple[float, float]:
    """(parameters this stage's device holds after tp splits, the biggest FSDP unit among them)."""
    first, last = stage == 0, stage == dims.pp - 1
    blocks = len(stage_layers(profile.n_layers, stage, dims.pp)) if profile.n_layers else 0

    def local(total: int, split: int) -> float:
        return total - split + split / dims.tp

    block = local(profile.block_params, profile.block_params_tp)
    root = (local(profile.first_params, profile.first_params_tp) if first else 0.0) + \
        (local(profile.last_params, profile.last_params_tp) if last else 0.0)
    return blocks * block + root, max(block if blocks else 0.0, root)


def block_kept_bytes(profile: ModelProfile, tp: int, ac: str = "none") -> float:
    """Activations one block keeps per sample from its forward to its backward, under ``ac``."""
    if ac == "full":
        return profile.block_kept_full
    if ac == "selective":
        tp_outputs = 2 * profile.boundary_bytes if tp > 1 else 0.0  # wo's and w2's all-reduced outputs
        return profile.block_kept_selective + profile.block_kept_selective_tp / tp + tp_outputs
    return profile.block_act_bytes + profile.block_act_bytes_tp / tp


def block_fixed_bytes(profile: ModelProfile, tp: int, ac: str = "none") -> float:
    """Bytes one block keeps whatever the batch under ``ac`` (its weights' low-precision copies), on one tp rank."""
    fixed = profile.block_fixed[CHECKPOINTING_ORDER.index(ac)]
    split = profile.block_params_tp / profile.block_params if profile.block_params else 0.0
    return fixed * (1 - split + split / tp)


def activation_bytes(profile: ModelProfile, dims: ParallelDims, stage: int, global_batch: int) -> float:
    """Activations alive at the peak of backward on ``stage``'s device (checkpointed as ``dims.ac`` says): those
    kept after the forward, and while backward recomputes a block the rest of its own (one microbatch's)."""
    if not _stage_blocks(profile, dims, stage):
        return kept_after_forward(profile, dims, stage, global_batch)
    micro = global_batch / dims.dp / dims.microbatches
    recomputed = micro * (block_kept_bytes(profile, dims.tp) - block_kept_bytes(profile, dims.tp, dims.ac)) + \
        block_fixed_bytes(profile, dims.tp) - block_fixed_bytes(profile, dims.tp, dims.ac)
    return kept_after_forward(profile, dims, stage, global_batch) + recomputed


def kept_after_forward(profile: ModelProfile, dims: ParallelDims, stage: int, global_batch: int) -> float:
    """Activations ``stage``'s device holds when its forward passes are done and backward begins."""
    per_rank = global_batch / dims.dp
    micro = per_rank / dims.microbatches
    in_flight = dims.microbatches if dims.schedule == "gpipe" else min(dims.microbatches, dims.pp - stage)
    samples = micro * in_flight if dims.pp > 1 else per_rank
    blocks = _stage_blocks(profile, dims, stage)
    per_sample = blocks * block_kept_bytes(profile, dims.tp, dims.ac)
    whatever = blocks * block_fixed_bytes(profile, dims.tp, dims.ac)
    if stage == dims.pp - 1:
        per_sample += profile.last_act_bytes
        whatever += profile.last_fixed
    return samples * per_sample + whatever


def _stage_blocks(profile: ModelProfile, dims: ParallelDims, stage: int) -> int:
    return len(stage_layers(profile.n_layers, stage, dims.pp)) if profile.n_layers else 0


def memory_per_device(profile: ModelProfile, dims: ParallelDims, global_batch: int, optimizer: str = "adamw",
                      momentum: float = 0.9) -> Memory:
    """The most loaded stage's device memory (bytes) under ``dims``."""
    worst: Memory | None = None
    for stage in range(dims.pp):
        p, unit = stage_params(profile, dims, stage)
        sharded = dims.dp_mode == "fsdp" and dims.dp > 1
        if sharded:
            # Shards, plus what FSDP has gathered: one unit at a time, or (pipelines keep units gathered
            # from forward to backward, reshard_after_forward=False) the whole stage.
            params = p / dims.dp + (p if dims.pp > 1 else unit)
            grads = p / dims.dp
        else:
            params, grads = p, p
        opt = optimizer_states(optimizer, momentum) * (p / dims.dp if sharded else p)
        m = Memory(params * BYTES, grads * BYTES, opt * BYTES, activation_bytes(profile, dims, stage, global_batch))
        if worst is None or m.total > worst.total:
            worst = m
    assert worst is not None
    return worst

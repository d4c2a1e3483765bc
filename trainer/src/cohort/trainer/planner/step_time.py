"""Predicted time of one training step of a plan, split into the parts that explain it.

For a global batch ``G`` on ``dims`` (dp x tp x pp, m microbatches):

- **compute**: a training step is 3x the forward FLOPs (Kaplan et al.: the
  backward pass does two matmuls per forward one). One microbatch on the
  slowest stage costs ``3·F_stage·(G/dp/m) / tp / X``, with ``X`` the
  throughput of one rank (``device_flops``).
- **pipeline bubble**: a GPipe or 1F1B pipeline runs ``m + p - 1`` slots of
  one microbatch each, of which ``p - 1`` are fill and drain, the bubble
  fraction ``(p-1)/(m+p-1)`` (Huang et al. 2019; Narayanan et al. 2019).
  Each slot also carries the tp and p2p communication of its microbatch.
- **fixed costs**: each block's forward + backward also costs a measured
  fixed time per microbatch (eager dispatch; far more under DTensor), each
  pipeline microbatch and each FSDP unit too (``cohort calibrate`` times
  them on a tiny model). They matter for small layers and many microbatches.
- **shared host** (``host_flops`` set: ranks share CPU cores): the step
  cannot beat the whole step's work (FLOPs and fixed costs of every rank)
  over the host's cores. When that bound is longer than the compute and
  bubble above, it replaces them: the host is saturated, and a pipeline's
  idle slots are filled by other ranks' work.
- **tp**: per block, 2 all-reduces of the activations forward (after the
  row-wise ``wo``, ``w2``) and 4 backward (input gradients of the column-wise
  ``wq``, ``wk``, ``wv``, ``w1``); plus the embedding's all-reduce and the
  output's logits all-gather forward and its input-gradient all-reduce
  backward (counted with CommDebugMode in the tests).
- **pp**: per microbatch and stage, one activation sent forward and one
  gradient sent back, ``2·(α + m·β)``.
- **dp**: DDP all-reduces the gradients once (in 25 MiB buckets, each paying
  the latency); FSDP all-gathers each unit's parameters for forward and
  again for backward (once, when a pipeline keeps them gathered) and
  reduce-scatters its gradients (Liang et al. 2023, Table 3: ZeRO-3 moves 1.5x
  the bytes of data parallelism). Not overlapped with compute: on shared CPU
  cores gloo's threads compete with it, and the model stays conservative.
- **optimizer**: the update streams parameters, gradients and state through
  memory once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .dims import ParallelDims, stage_layers
from .hardware import Hardware
from .memory import optimizer_states, stage_params
from .profile import BYTES, ModelProfile

DDP_BUCKET_BYTES = 25 * 2 ** 20


@dataclass(frozen=True)
class StepTime:
    """Seconds per step, by cause. ``total`` is what plans are ranked by."""

    compute: float
    bubble: float
    tp: float
    pp: float
    dp: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.tp + self.pp + self.dp + self.optimizer

    def parts(self) -> dict[str, float]:
        return {"compute": self.compute, "bubble": self.bubble, "tp": self.tp, "pp": self.pp, "dp": self.dp,
                "optimizer": self.optimizer}


def _stage_flops(profile: ModelProfile, dims: ParallelDims, stage: int) -> float:
    blocks = len(stage_layers(profile.n_layers, stage, dims.pp)) if profile.n_layers else 0
    flops = blocks * profile.block_flops
    flops += profile.first_flops if stage == 0 else 0.0
    flops += profile.last_flops if stage == dims.pp - 1 else 0.0
    return flops


def _tp_seconds(profile: ModelProfile, dims: ParallelDims, stage: int, micro: float, hw: Hardware,
                forwards: int = 1) -> float:
    """Tensor-parallel communication of one microbatch on ``stage`` (blocks run ``forwards`` forward passes)."""
    if dims.tp == 1:
        return 0.0
    act = micro * profile.boundary_bytes

    def ar(nbytes: float) -> float:
        return hw.allreduce_s(nbytes, dims.tp)

    blocks = len(stage_layers(profile.n_layers, stage, dims.pp))
    t = blocks * (forwards * profile.tp_allreduces_fwd + profile.tp_allreduces_bwd) * ar(act)
    if stage == 0:
        t += ar(act)  # the row-wise embedding's forward all-reduce
    if stage == dims.pp - 1:
        t += hw.allgather_s(micro * profile.logits_bytes, dims.tp) + ar(act)
    return t


def _dp_seconds(profile: ModelProfile, dims: ParallelDims, stage: int, hw: Hardware) -> float:
    """Gradient (and, for FSDP, parameter) communication among the dp ranks of ``stage``."""
    if dims.dp == 1:
        return 0.0
    p, _ = stage_params(profile, dims, stage)
    if dims.dp_mode == "ddp":
        nbytes = p * BYTES
        buckets = max(1, math.ceil(nbytes / DDP_BUCKET_BYTES))
        return buckets * hw.allreduce_s(nbytes / buckets, dims.dp)
    blocks = len(stage_layers(profile.n_layers, stage, dims.pp)) if profile.n_layers else 0
    block = (profile.block_params - profile.block_params_tp + profile.block_params_tp / dims.tp) * BYTES
    root = p * BYTES - blocks * block
    gathers = 2 if dims.pp == 1 else 1
    t = 0.0
    for unit in [block] * blocks + [root]:
        if unit > 0:
            t += gathers * hw.allgather_s(unit, dims.dp) + hw.reduce_scatter_s(unit, dims.dp)
            t += hw.fsdp_unit_overhead_s
    return t


def step_time(profile: ModelProfile, dims: ParallelDims, global_batch: int, hw: Hardware,
              optimizer: str = "adamw", momentum: float = 0.9) -> StepTime:
    """Predicted seconds per step; the slowest stage sets the pace of a pipeline.

    ``dims.ac`` full runs each block's forward twice (3 -> 4 passes of its FLOPs, its tp all-reduces again);
    selective recomputes only element-wise work, which the FLOP count leaves out."""
    forwards = 2 if dims.ac == "full" else 1
    micro = global_batch / dims.dp / dims.microbatches
    slots = dims.microbatches + dims.pp - 1
    compute = tp = pp = dp = opt = 0.0
    slot = host_work = 0.0
    tp_extra = max(0.0, hw.tp_layer_overhead_s - hw.layer_overhead_s) if dims.tp > 1 else 0.0
    for stage in range(dims.pp):
        blocks = len(stage_layers(profile.n_layers, stage, dims.pp)) if profile.n_layers else 0
        rest = _stage_flops(profile, dims, stage) - blocks * profile.block_flops  # embeddings, output, a generic model
        c = blocks * (hw.block_s((2 + forwards) * profile.block_flops * micro / dims.tp) + tp_extra)
        c += 3 * rest * micro / dims.tp / hw.device_flops + (hw.microbatch_overhead_s if dims.pp > 1 else 0.0)
        if not profile.n_layers:
            c += hw.layer_overhead_s
        host_work += dims.dp * dims.tp * dims.microbatches * c  # core-seconds of every rank of this stage
        t = _tp_seconds(profile, dims, stage, micro, hw, forwards)
        s = 2 * hw.p2p_s(micro * profile.boundary_bytes) if dims.pp > 1 else 0.0
        if c + t + s > slot:
            slot, compute, tp, pp = c + t + s, c, t, s
        p, _ = stage_params(profile, dims, stage)
        local = p / dims.dp if dims.dp_mode == "fsdp" and dims.dp > 1 else p
        # The update reads and writes the parameter and each state tensor, and reads the gradient.
        streamed = local * BYTES * (2 + 2 * optimizer_states(optimizer, momentum) + 1)
        dp = max(dp, _dp_seconds(profile, dims, stage, hw))
        opt = max(opt, streamed / hw.memory_bandwidth)
    if hw.host_flops > 0:  # ranks on one host share its memory bandwidth too
        opt *= max(1.0, dims.world_size * hw.device_flops / hw.host_flops)
    m = dims.microbatches
    compute, bubble = m * compute, (slots - m) * slot
    host_bound = host_work / hw.cores
    if host_bound > compute + bubble:
        compute, bubble = host_bound, 0.0
    return StepTime(compute=compute, bubble=bubble, tp=m * tp, pp=m * pp, dp=dp, optimizer=opt)

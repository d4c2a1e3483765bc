"""Throughput in the units a GPU user reads: tokens (or samples) per second, and MFU.

MFU (model FLOPs utilisation) is the model's training FLOPs per second over
the device's peak, as in PaLM (Chowdhery et al. 2022, appendix B) and
torchtitan: 6 x parameters per token for the matmuls of forward and backward
(embeddings excluded: a lookup is no matmul), plus 12 x layers x dim x
sequence length per token for attention's scores and values. Models other
than the built-in transformer count 6 x parameters per sample. The peak is
the device's dense bf16/fp16 (or TF32, for fp32) tensor-core figure from
NVIDIA's datasheets for the cards below, or ``COHORT_PEAK_TFLOPS``; without
one, MFU is not reported (never guessed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .runtime.device import device_name
from .workloads.models import Transformer
from .workloads.workload import Workload

# Dense tensor-core peaks per device, in FLOP/s: (bf16 or fp16, tf32). SXM parts where there are several.
PEAK_FLOPS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 494.5e12),
    "H100": (989e12, 494.5e12),
    "A100": (312e12, 156e12),
    "L40S": (362e12, 183e12),
    "A10": (125e12, 62.5e12),
    "L4": (121e12, 60e12),
}


def peak_flops(device: torch.device, precision: str, env: dict[str, str] | None = None) -> float | None:
    env = dict(os.environ if env is None else env)
    if env.get("COHORT_PEAK_TFLOPS"):
        return float(env["COHORT_PEAK_TFLOPS"]) * 1e12
    name = device_name(device)
    for card, (half, tf32) in PEAK_FLOPS.items():
        if card in name:
            return half if precision in ("bf16", "fp16") else tf32
    return None


@dataclass(frozen=True)
class Throughput:
    tokens_per_sample: int        # the sequence length for language models, else 1 (then "tokens" are samples)
    flops_per_sample: float
    peak_flops: float | None      # per device

    @classmethod
    def of(cls, workload: Workload, device: torch.device, precision: str) -> Throughput:
        model = workload.model
        params = sum(p.numel() for p in model.parameters())
        if isinstance(model, Transformer):
            c = model.config
            embeddings = sum(e.weight.numel() for e in (model.tok_embeddings, model.pos_embeddings) if e is not None)
            seq = int(c["seq_len"])
            per_token = 6 * (params - embeddings) + 12 * int(c["n_layers"]) * int(c["dim"]) * seq
            return cls(seq, float(per_token * seq), peak_flops(device, precision))
        tokens = workload.data.info.seq_len if workload.task == "lm" and workload.data.info.seq_len else 1
        return cls(int(tokens), float(6 * params * tokens), peak_flops(device, precision))

    def tokens_per_second(self, samples_per_second: float) -> float:
        return samples_per_second * self.tokens_per_sample

    def mfu(self, samples_per_second: float, devices: int) -> float | None:
        """The share of ``devices`` devices' peak that ``samples_per_second`` (global) uses."""
        if not self.peak_flops or devices < 1:
            return None
        return samples_per_second * self.flops_per_sample / (self.peak_flops * devices)

"""A model's ModelProfile for the planner: analytic where it can be, measured with torch otherwise.

``profile_spec`` (what ``cohort plan`` runs) needs no torch for the built-in
transformer on ``synthetic-lm``: its shape is in the spec's arguments and the
built-ins' defaults (``workloads/defaults.py``), and the planner core counts it.
Any other model is built on the meta device and measured: FLOPs with
``FlopCounterMode``, activations from its leaf modules' outputs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from cohort.api.models import TrainingJobSpec

from .planner.profile import BYTES, ModelProfile, transformer_profile
from .workloads import defaults

if TYPE_CHECKING:
    import torch
    from torch import nn


def profile_spec(spec: TrainingJobSpec) -> ModelProfile:
    """The profile of a job spec's model (torch only for models other than the built-in transformer)."""
    w = spec.workload
    if w.model == "transformer" and w.dataset == "synthetic-lm":
        model = {**dataclasses.asdict(defaults.TRANSFORMER), **w.model_args}
        data = {**dataclasses.asdict(defaults.SYNTHETIC_LM), **w.dataset_args}
        return transformer_profile(model["dim"], model["n_layers"], model["n_heads"], model["ffn_mult"],
                                   data["vocab"], data["seq_len"])
    return _measured_spec(spec)


def _measured_spec(spec: TrainingJobSpec) -> ModelProfile:
    """Build the spec's model on the meta device (no memory) and profile it."""
    import torch

    from .workloads.models import MODELS
    from .workloads.workload import build_data, load_entry_point

    w = spec.workload
    data = build_data(w.dataset, w.dataset_args)
    info, sample = data.info, data.train.fetch(torch.tensor([0]))[0].to("meta")
    with torch.device("meta"):
        if ":" in w.model:
            model = load_entry_point(w.model, "spec.workload.model")(info, **w.model_args)
            model = getattr(model, "model", model)  # a Workload's model
        else:
            model = MODELS[w.model](info, **w.model_args)
    return profile_model(model, sample)


def profile_model(model: nn.Module, sample: torch.Tensor | None = None) -> ModelProfile:
    """The profile of ``model``: analytic for the built-in transformer, measured otherwise."""
    from .workloads.models import Transformer

    if isinstance(model, Transformer):
        c = model.config
        return transformer_profile(c["dim"], c["n_layers"], c["n_heads"], c["ffn_mult"], c["vocab_size"],
                                   c["seq_len"])
    if sample is None:
        raise ValueError(f"profiling {type(model).__name__} needs a sample input")
    return generic_profile(model, sample)


def block_profile(model: nn.Module, blocks: list[nn.Module]) -> ModelProfile:
    """A model with blocks (``layers``), by its parameters: what the memory model needs besides activations
    (which ``parallel/activation_probe.py`` measures). Blocks are taken as alike: the mean of their sizes."""
    params = sum(p.numel() for p in model.parameters())
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    return ModelProfile(
        name=type(model).__name__, n_layers=len(blocks), block_params=in_blocks // len(blocks), block_params_tp=0,
        first_params=params - in_blocks, first_params_tp=0, last_params=0, last_params_tp=0,
        block_flops=0.0, first_flops=0.0, last_flops=0.0, block_act_bytes=0.0, block_act_bytes_tp=0.0,
        block_kept_selective=0.0, block_kept_selective_tp=0.0, last_act_bytes=0.0, boundary_bytes=0.0,
        logits_bytes=0.0)


def generic_profile(model: nn.Module, sample: torch.Tensor) -> ModelProfile:
    """Any model, measured on one sample: FLOPs with FlopCounterMode, activations from leaf outputs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    outputs: list[int] = []

    def record(_m: nn.Module, _i: object, out: object) -> None:
        if isinstance(out, torch.Tensor):
            outputs.append(out.numel())

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(record) for m in leaves]
    try:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(sample[:1])
    finally:
        for handle in handles:
            handle.remove()
    params = sum(p.numel() for p in model.parameters())
    return ModelProfile(
        name=type(model).__name__, n_layers=0, block_params=0, block_params_tp=0,
        first_params=params, first_params_tp=0, last_params=0, last_params_tp=0,
        block_flops=0.0, first_flops=float(counter.get_total_flops()), last_flops=0.0,
        block_act_bytes=0.0, block_act_bytes_tp=0.0, block_kept_selective=0.0, block_kept_selective_tp=0.0,
        last_act_bytes=float(sum(outputs) * BYTES),
        boundary_bytes=0.0, logits_bytes=0.0)

"""ModelProfile: what the cost model needs to know about a model, counted per sample.

For the built-in transformer every number is analytic (checked against
``torch.utils.flop_counter`` and the model's own parameters in the tests);
any other model gets a generic profile, measured with ``FlopCounterMode`` and
forward hooks, which the planner only splits data-parallel.

Counts are per *sample* (one sequence of ``seq_len`` tokens) and fp32:
- forward FLOPs (a training step costs 3x: forward + backward's two matmuls);
- parameters, with the part tensor parallelism splits (``*_tp``);
- bytes of activations autograd keeps for backward, with the part tp splits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

BYTES = 4  # fp32 parameters, gradients, optimizer state and activations


@dataclass(frozen=True)
class ModelProfile:
    name: str
    n_layers: int                # blocks a pipeline splits (0: not splittable)
    block_params: int            # parameters of one block ...
    block_params_tp: int         # ... of which tensor parallelism splits
    first_params: int            # embeddings (first stage)
    first_params_tp: int
    last_params: int             # final norm + output (last stage)
    last_params_tp: int
    block_flops: float           # forward FLOPs per sample, one block
    first_flops: float
    last_flops: float
    block_act_bytes: float       # saved activations per sample, one block (replicated part) ...
    block_act_bytes_tp: float    # ... and the part tp splits
    last_act_bytes: float        # final norm, output input, logits and their softmax
    boundary_bytes: float        # activation per sample crossing a pipeline boundary (also one TP all-reduce)
    logits_bytes: float          # output logits per sample (TP gathers them)
    tp_divides: tuple[int, ...] = ()   # sizes tp must divide (heads, vocab, ffn hidden); () = no TP plan
    tp_allreduces_fwd: int = 2   # per block: after wo and w2 (row-wise)
    tp_allreduces_bwd: int = 4   # per block: input grads of wq, wk, wv and w1 (column-wise)

    @property
    def params(self) -> int:
        return self.n_layers * self.block_params + self.first_params + self.last_params

    @property
    def forward_flops(self) -> float:
        return self.n_layers * self.block_flops + self.first_flops + self.last_flops

    def supports_tp(self, tp: int) -> bool:
        return tp == 1 or (bool(self.tp_divides) and all(n % tp == 0 for n in self.tp_divides))

    def supports_pp(self, pp: int) -> bool:
        return pp == 1 or self.n_layers >= pp


def transformer_profile(dim: int, n_layers: int, n_heads: int, ffn_mult: int, vocab_size: int,
                        seq_len: int) -> ModelProfile:
    """The built-in Transformer (workloads/models.py), counted by hand."""
    d, f, v, t, h = dim, ffn_mult * dim, vocab_size, seq_len, n_heads
    attn = 4 * d * d                        # wq, wk, wv, wo (no bias)
    ffn = d * f + f + f * d + d             # w1 (+bias), w2 (+bias)
    norms = 2 * 2 * d                       # two LayerNorms (weight + bias)
    block_params = attn + ffn + norms
    block_tp = attn + d * f + f + f * d     # every weight of wq/wk/wv/wo/w1/w2 and w1's bias; w2's bias stays
    # Forward FLOPs per token: 2 per multiply-add of each linear, plus QK^T and AV (2·t·d each, full square:
    # scaled_dot_product_attention on CPU computes the masked half too).
    block_flops = t * (2 * (4 * d * d + 2 * d * f) + 2 * 2 * t * d)
    # Saved for backward, per token: the residual stream into each norm and each norm's output (4·d) and
    # norm statistics (4); split by tp: q, k, v, attention output, wo's input (5·d), the softmax
    # log-sum-exp (h), w1's output and gelu's output (2·f).
    block_act = t * (4 * d + 4) * BYTES
    block_act_tp = t * (5 * d + h + 2 * f) * BYTES
    return ModelProfile(
        name=f"transformer(dim={d}, layers={n_layers}, heads={h}, vocab={v}, seq={t})",
        n_layers=n_layers, block_params=block_params, block_params_tp=block_tp,
        first_params=v * d + t * d, first_params_tp=v * d,
        last_params=2 * d + d * v, last_params_tp=d * v,
        block_flops=float(block_flops), first_flops=0.0, last_flops=float(t * 2 * d * v),
        block_act_bytes=float(block_act), block_act_bytes_tp=float(block_act_tp),
        last_act_bytes=float(t * (2 * d + 2 + 2 * v) * BYTES),
        boundary_bytes=float(t * d * BYTES), logits_bytes=float(t * v * BYTES),
        tp_divides=(h, v, f))


def generic_profile(model: nn.Module, sample: torch.Tensor) -> ModelProfile:
    """Any model, measured on one sample: FLOPs with FlopCounterMode, activations from leaf outputs."""
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
        block_act_bytes=0.0, block_act_bytes_tp=0.0, last_act_bytes=float(sum(outputs) * BYTES),
        boundary_bytes=0.0, logits_bytes=0.0)


def profile_spec(spec: object) -> ModelProfile:
    """The profile of a job spec's model, built on the meta device (no memory, no data generated for LMs)."""
    import inspect

    from ..workloads.datasets import synthetic_lm
    from ..workloads.models import MODELS, DataInfo
    from ..workloads.workload import build_data, load_entry_point

    w = spec.workload  # type: ignore[attr-defined]
    if w.dataset == "synthetic-lm":  # its shape is in its arguments; generating a big vocabulary is slow
        defaults = {k: v.default for k, v in inspect.signature(synthetic_lm).parameters.items()}
        args = {**defaults, **w.dataset_args}
        info = DataInfo((args["seq_len"],), vocab_size=args["vocab"], seq_len=args["seq_len"])
        sample = torch.zeros(1, args["seq_len"], dtype=torch.long, device="meta")
    else:
        data = build_data(w.dataset, w.dataset_args)
        info, sample = data.info, data.train_x[:1].to("meta")
    with torch.device("meta"):
        if ":" in w.model:
            model = load_entry_point(w.model, "spec.workload.model")(info, **w.model_args)
            model = getattr(model, "model", model)  # a Workload's model
        else:
            model = MODELS[w.model](info, **w.model_args)
    return profile_model(model, sample)


def profile_model(model: nn.Module, sample: torch.Tensor | None = None) -> ModelProfile:
    """The profile of ``model``: analytic for the built-in transformer, measured otherwise."""
    from ..workloads.models import Transformer

    if isinstance(model, Transformer):
        c = model.config
        return transformer_profile(c["dim"], c["n_layers"], c["n_heads"], c["ffn_mult"], c["vocab_size"],
                                   c["seq_len"])
    if sample is None:
        raise ValueError(f"profiling {type(model).__name__} needs a sample input")
    return generic_profile(model, sample)

"""ModelProfile: what the cost model needs to know about a model, counted per sample.

For the built-in transformer every number is analytic (checked against
``torch.utils.flop_counter`` and the model's own parameters in the tests);
any other model gets a generic profile, measured with torch by
``cohort.trainer.profiling``, which the planner only splits data-parallel.
This module, like the rest of the planner core, imports no torch.

Counts are per *sample* (one sequence of ``seq_len`` tokens) and fp32:
- forward FLOPs (a training step costs 3x: forward + backward's two matmuls);
- parameters, with the part tensor parallelism splits (``*_tp``);
- bytes of activations autograd keeps for backward, with the part tp splits, and what a block keeps under
  selective and full activation checkpointing;
- bytes kept whatever the batch (autocast's low-precision copies of the weights: 0 in fp32).

The activation counts are fp32. ``with_measured_activations`` puts in their place what the trainer measured on
the device in the job's precision (parallel/activation_probe.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    block_kept_selective: float  # kept per sample under selective activation checkpointing (replicated part) ...
    block_kept_selective_tp: float  # ... and the part tp splits
    last_act_bytes: float        # final norm, output input, logits and their softmax
    boundary_bytes: float        # activation per sample crossing a pipeline boundary (also one TP all-reduce)
    logits_bytes: float          # output logits per sample (TP gathers them)
    tp_divides: tuple[int, ...] = ()   # sizes tp must divide (heads, vocab, ffn hidden); () = no TP plan
    tp_allreduces_fwd: int = 2   # per block: after wo and w2 (row-wise)
    tp_allreduces_bwd: int = 4   # per block: input grads of wq, wk, wv and w1 (column-wise)
    block_kept_full: float = 0.0  # kept per sample under full activation checkpointing (the block's input)
    block_fixed: tuple[float, float, float] = (0.0, 0.0, 0.0)  # one block, whatever the batch, per CHECKPOINTING_ORDER
    last_fixed: float = 0.0       # the rest (embeddings, output, loss), whatever the batch

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
    if dim % n_heads:
        raise ValueError(f"modelArgs.dim ({dim}) must be divisible by modelArgs.n_heads ({n_heads})")
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
    # norm statistics (4); split by tp: q, k, v, attention's output (4·d; wo's input is a view of it), the
    # softmax log-sum-exp (h), w1's output and gelu's output (2·f). Selective checkpointing keeps the block's
    # input and the outputs of wo and w2 (3·d); split: q, k, v, attention's output (4·d), the log-sum-exp
    # and w1's output (f). Measured per block with torch's storages in test_activation_checkpoint.py.
    block_act = t * (4 * d + 4) * BYTES
    block_act_tp = t * (4 * d + h + 2 * f) * BYTES
    return ModelProfile(
        name=f"transformer(dim={d}, layers={n_layers}, heads={h}, vocab={v}, seq={t})",
        n_layers=n_layers, block_params=block_params, block_params_tp=block_tp,
        first_params=v * d + t * d, first_params_tp=v * d,
        last_params=2 * d + d * v, last_params_tp=d * v,
        block_flops=float(block_flops), first_flops=0.0, last_flops=float(t * 2 * d * v),
        block_act_bytes=float(block_act), block_act_bytes_tp=float(block_act_tp),
        block_kept_selective=float(t * 3 * d * BYTES), block_kept_selective_tp=float(t * (4 * d + h + f) * BYTES),
        last_act_bytes=float(t * (2 * d + 2 + 2 * v) * BYTES),
        boundary_bytes=float(t * d * BYTES), logits_bytes=float(t * v * BYTES),
        tp_divides=(h, v, f), block_kept_full=float(t * d * BYTES))


def with_measured_activations(profile: ModelProfile, per_sample: dict[str, float], fixed: dict[str, float],
                              rest: tuple[float, float]) -> ModelProfile:
    """``profile`` with the activations measured for one block under each checkpointing mode (``per_sample`` and
    ``fixed``, keyed none, selective, full) and for the rest (per sample, fixed).

    Measured on a whole block: a counted profile's split between the replicated part and the part tensor
    parallelism divides is kept in proportion (the measurement scales both)."""
    def split(replicated: float, tp_part: float, measured: float) -> tuple[float, float]:
        counted = replicated + tp_part
        return (measured * replicated / counted, measured * tp_part / counted) if counted else (measured, 0.0)

    none, none_tp = split(profile.block_act_bytes, profile.block_act_bytes_tp, per_sample["none"])
    selective, selective_tp = split(profile.block_kept_selective, profile.block_kept_selective_tp,
                                    per_sample["selective"])
    return replace(profile, block_act_bytes=none, block_act_bytes_tp=none_tp, block_kept_selective=selective,
                   block_kept_selective_tp=selective_tp, block_kept_full=per_sample["full"],
                   block_fixed=(fixed["none"], fixed["selective"], fixed["full"]),
                   last_act_bytes=rest[0], last_fixed=rest[1])

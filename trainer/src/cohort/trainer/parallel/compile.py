"""``workload.compile``: torch.compile a model in place, block by block where it has blocks.

As torchtitan does: each transformer block is compiled on its own (the blocks
are alike, so one compiled graph serves them all, and a block boundary is
where FSDP2 gathers and frees parameters), other models whole.
``nn.Module.compile`` compiles in place: parameter names, and so checkpoints
and DDP's buckets, stay those of the eager model. Tensor parallelism is
applied before (the compiled graph sees DTensors) and FSDP2 after (it wraps
the compiled blocks), the order torchtitan uses.
"""

from __future__ import annotations

from torch import nn

from .fsdp import shard_units


def apply_compile(model: nn.Module) -> nn.Module:
    """Compile ``model`` in place, once: a replicated model is re-wrapped every world, not re-compiled."""
    if getattr(model, "_cohort_compiled", False):
        return model
    model._cohort_compiled = True  # type: ignore[assignment]
    blocks = shard_units(model)
    for block in blocks:
        block.compile()
    if not blocks:
        model.compile()
    return model

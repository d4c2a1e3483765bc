"""``workload.activationCheckpointing``: recompute each block's activations in backward instead of keeping them.

Block by block, as torchtitan's ``activation_checkpoint`` (torchtitan/distributed/activation_checkpoint.py),
on torch's non-reentrant ``torch.utils.checkpoint``:

- ``full``: a block keeps only its input; backward runs its forward again (about a third more block compute)
  and then its backward, so one block's activations are alive at a time.
- ``selective``: torch's selective checkpoint (``create_selective_checkpoint_contexts``) keeps the outputs of
  the costly operations (matmuls, attention, collectives: torchtitan's op-level save list, every matmul
  here, where torchtitan recomputes every second one) and recomputes the cheap ones between them (norms,
  activation functions, additions). A collective's output is kept so that tensor parallelism's all-reduces
  never run twice.

The block's ``forward`` is replaced on the instance (torch's ``checkpoint_wrapper`` would add a module and a
``_checkpoint_wrapped_module.`` to every parameter name): names, and so checkpoints, DDP's buckets and peer
hand-over, are those of the plain model. FSDP2's hooks and ``torch.compile`` run around the block's call and
see the checkpointed forward inside, the order torchtitan uses (tensor parallel, checkpointing, compile, FSDP).
Recomputation replays the forward's random state (``preserve_rng_state``), so the gradients equal those of
``none``; trainer/tests/test_activation_checkpoint.py checks that bit for bit and the memory kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .dims import ParallelismError
from .fsdp import shard_units

_aten = torch.ops.aten
_c10d = torch.ops._c10d_functional
# The operations whose outputs selective checkpointing keeps: matmuls (``nn.Linear`` is mm, or addmm with a
# bias), attention (each backend's kernel) and tensor parallelism's collectives.
SAVED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default, _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _c10d.all_reduce.default, _c10d.reduce_scatter_tensor.default, _c10d.all_gather_into_tensor.default,
})


def _keep_costly(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(_keep_costly)


def _checkpointed(forward: Callable[..., Any], mode: str, *args: Any, **kwargs: Any) -> Any:
    if mode == "selective":
        kwargs["context_fn"] = _selective_contexts
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def check_activation_checkpointing(mode: str, model: nn.Module | None) -> None:
    """Refuse full or selective for a model without blocks (the message names the field)."""
    if mode not in ("none", "auto") and model is not None and not shard_units(model):
        raise ParallelismError(f"spec.workload.activationCheckpointing: {mode} recomputes the model's blocks, and "
                               f"{type(model).__name__} has none (a `layers` ModuleList or ModuleDict); use none")


def applied_checkpointing(model: nn.Module) -> str | None:
    """The mode ``model``'s blocks were checkpointed with (None: not yet applied)."""
    return getattr(model, "_cohort_checkpointed", None)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> nn.Module:
    """Checkpoint each block of ``model`` in place with ``mode`` (none, full or selective), once: a replicated
    model is re-wrapped every world, and keeps its first mode."""
    assert mode in ("none", "full", "selective"), mode  # auto is resolved before (memory_budget.py)
    if applied_checkpointing(model) is not None:
        return model
    model._cohort_checkpointed = mode  # type: ignore[assignment]
    if mode == "none":
        return model
    check_activation_checkpointing(mode, model)
    for block in shard_units(model):
        block.forward = functools.partial(_checkpointed, block.forward, mode)
    return model

"""``apply_tp``: DTensor tensor-parallel plans for the built-in transformer and MLP.

Megatron-style pairs: a column-wise layer splits its output features, the
row-wise layer after it splits its input features and all-reduces its output,
so each pair costs one all-reduce forward and one backward.

Transformer: per block ``wq/wk/wv`` column-wise (each rank holds n_heads/tp
heads: the model's ``view(b, t, -1, head_dim)`` keeps heads whole), ``wo``
row-wise; ``w1`` column-wise, ``w2`` row-wise. ``tok_embeddings`` is split
row-wise over the vocabulary; ``output`` column-wise over the vocabulary with
its logits gathered (Replicate), so the workload's own loss function (any
user loss) sees ordinary full logits. ``loss_parallel`` would save that
gather, but only for cross-entropy; at the vocabularies used here it is small.
Norms and positional embeddings stay replicated: their inputs are replicated,
so their gradients agree on every tp rank without communication.

MLP: ``fc1`` column-wise, hidden layers column-wise from gathered input, and
``fc2`` row-wise.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ..workloads.models import MLP, Transformer
from .dims import ParallelismError


def check_tensor_parallel(model: nn.Module, tp: int) -> None:
    """Raise ParallelismError unless ``model`` can be split ``tp`` ways."""
    if isinstance(model, Transformer):
        c = model.config
        hidden = c["dim"] * c["ffn_mult"]
        for name, value in (("n_heads", c["n_heads"]), ("vocab size", c["vocab_size"]), ("ffn hidden", hidden)):
            if value % tp:
                raise ParallelismError(f"spec.parallelism.tensor: {tp} does not divide the transformer's "
                                       f"{name} ({value})")
    elif isinstance(model, MLP):
        if model.fc1.out_features % tp:
            raise ParallelismError(f"spec.parallelism.tensor: {tp} does not divide modelArgs.hidden "
                                   f"({model.fc1.out_features})")
    else:
        raise ParallelismError(f"spec.parallelism.tensor: no tensor-parallel plan for {type(model).__name__} "
                               "(built-in plans: transformer, mlp); use strategy data, fsdp or pipeline")


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Parallelize ``model`` in place over ``tp_mesh``; modules a pipeline stage dropped are skipped."""
    if isinstance(model, Transformer):
        plan = _transformer_plan(model)
    elif isinstance(model, MLP):
        plan = _mlp_plan(model)
    else:
        check_tensor_parallel(model, tp_mesh.size())
        raise AssertionError("unreachable")
    return parallelize_module(model, tp_mesh, plan)


def _transformer_plan(model: Transformer) -> dict:
    plan: dict = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.output is not None:
        plan["output"] = ColwiseParallel(output_layouts=Replicate())
    for name in model.layers:
        plan[f"layers.{name}.attention.wq"] = ColwiseParallel()
        plan[f"layers.{name}.attention.wk"] = ColwiseParallel()
        plan[f"layers.{name}.attention.wv"] = ColwiseParallel()
        plan[f"layers.{name}.attention.wo"] = RowwiseParallel()
        plan[f"layers.{name}.feed_forward.w1"] = ColwiseParallel()
        plan[f"layers.{name}.feed_forward.w2"] = RowwiseParallel()
    return plan


def _mlp_plan(model: MLP) -> dict:
    plan: dict = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for i in range(len(model.hidden)):
        # The input arrives split (the previous layer was column-wise): gather it, split the output again.
        plan[f"hidden.{i}"] = ColwiseParallel(input_layouts=Shard(-1))
    return plan

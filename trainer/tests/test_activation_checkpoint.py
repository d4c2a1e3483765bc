"""workload.activationCheckpointing: what a checkpointed block keeps for backward, and the gradients it gives.

What is kept is counted from torch's own storages: every storage an operation created during the forward
pass that is still alive when backward starts (torch's weak storage references; the parameters and the
input are not counted). That is what autograd holds, and for selective checkpointing also the outputs its
cache holds (saved_tensors_hooks would not see those).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gloo_ranks import data_plan, train_steps
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cohort.api import ValidationError
from cohort.api.jobconfig import from_manifest
from cohort.trainer.parallel.activation_checkpoint import (
    applied_checkpointing,
    apply_activation_checkpointing,
    check_activation_checkpointing,
)
from cohort.trainer.parallel.dims import ParallelismError
from cohort.trainer.parallel.memory_budget import checkpointing_for, device_memory
from cohort.trainer.planner.dims import ParallelDims
from cohort.trainer.planner.memory import block_kept_bytes, memory_per_device
from cohort.trainer.planner.profile import transformer_profile
from cohort.trainer.profiling import profile_model
from cohort.trainer.workloads.models import MLP, DataInfo, Transformer
from cohort.trainer.workloads.workload import build_workload

INFO = DataInfo(input_shape=(32,), num_classes=64, vocab_size=64, seq_len=32)


class Kept(TorchDispatchMode):
    """The storages created under it; ``bytes()`` sums those still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[int, int, int]] = []  # (weak reference, bytes, address)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                s = t.untyped_storage()
                self.created.append((s._weak_ref(), s.nbytes(), s.data_ptr()))
        return out

    def bytes(self, exclude: set[int]) -> int:
        alive = {ptr: n for ref, n, ptr in self.created
                 if not torch.UntypedStorage._expired(ref) and ptr not in exclude}
        return sum(alive.values())


def model(mode: str) -> Transformer:
    torch.manual_seed(0)
    m = Transformer(INFO, dim=64, n_layers=3, n_heads=4)
    return apply_activation_checkpointing(m, mode)


def kept_and_grads(m: torch.nn.Module) -> tuple[int, list[torch.Tensor]]:
    tokens = torch.randint(0, 64, (8, 32), generator=torch.Generator().manual_seed(1))
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    with Kept() as kept:
        out = m(tokens)
    held = kept.bytes(params | {out.untyped_storage().data_ptr()})
    torch.nn.functional.cross_entropy(out.flatten(0, 1), tokens.flatten()).backward()
    return held, [p.grad for p in m.parameters()]


def test_full_and_selective_keep_less_for_backward_and_give_the_same_gradients():
    none, grads = kept_and_grads(model("none"))
    full, full_grads = kept_and_grads(model("full"))
    selective, selective_grads = kept_and_grads(model("selective"))
    print(f"kept for backward: none {none} B, full {full} B ({full / none:.2f}x), "
          f"selective {selective} B ({selective / none:.2f}x)")
    # full: each block's input (3 x 8 x 32 x 64 fp32 = 196608 B) beside the embeddings' and the head's own.
    assert full < 0.3 * none
    # selective: the block's input and its matmuls' and attention's outputs stay; norms and gelu go.
    assert full < selective < 0.8 * none
    for g, f, s in zip(grads, full_grads, selective_grads, strict=True):
        assert torch.equal(g, f) and torch.equal(g, s)


def test_names_stay_and_a_second_apply_wraps_nothing_more():
    plain, m = model("none"), model("full")
    assert list(m.state_dict()) == list(plain.state_dict())
    forward = m.layers["0"].forward
    apply_activation_checkpointing(m, "full")  # a replicated model is re-applied every world
    assert m.layers["0"].forward is forward
    calls = []
    m.layers["0"].attention.register_forward_hook(lambda *_: calls.append(1))
    kept_and_grads(m)
    assert len(calls) == 2  # the forward, and its recomputation in backward


def test_a_model_without_blocks_is_refused_naming_the_field():
    manifest = {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ac"},
                "spec": {"workload": {"model": "mlp", "dataset": "digits", "activationCheckpointing": "full"}}}
    with pytest.raises(ValidationError, match="spec.workload.activationCheckpointing"):
        from_manifest(manifest)
    with pytest.raises(ParallelismError, match=r"spec.workload.activationCheckpointing: selective .* MLP has none"):
        check_activation_checkpointing("selective", MLP(DataInfo(input_shape=(8,), num_classes=2)))
    check_activation_checkpointing("none", MLP(DataInfo(input_shape=(8,), num_classes=2)))


def lm_spec(**workload: Any) -> Any:
    return from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ac"},
                          "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm", "batchSize": 8,
                                                "modelArgs": {"dim": 32, "n_layers": 2, "n_heads": 4},
                                                "optimizer": {"name": "adamw", "lr": 0.01}, **workload}}}).spec


def losses(spec: Any, steps: int = 3) -> list[float]:
    return train_steps(data_plan(spec), steps, 8)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_the_data_plan_trains_the_same_losses_with_checkpointed_blocks(mode):
    assert losses(lm_spec(activationCheckpointing=mode)) == losses(lm_spec())


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_the_planners_count_of_what_a_block_keeps_is_what_torch_keeps(mode):
    """Per block: what a 4-block model keeps less what a 2-block one keeps, halved (the rest cancels)."""
    def kept(n_layers: int) -> int:
        torch.manual_seed(0)
        m = apply_activation_checkpointing(Transformer(INFO, dim=64, n_layers=n_layers, n_heads=4), mode)
        return kept_and_grads(m)[0]
    profile = transformer_profile(dim=64, n_layers=4, n_heads=4, ffn_mult=4, vocab_size=64, seq_len=32)
    assert (kept(4) - kept(2)) / 2 == 8 * block_kept_bytes(profile, 1, mode)  # 8 sequences of 32 tokens


def test_compiled_blocks_recompute_inside_the_compiled_graph():
    """workload.compile over checkpointed blocks: dynamo captures the checkpoint (no graph break at it) and the
    losses are eager's."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = losses(lm_spec(activationCheckpointing="selective", compile=True))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    assert compiled == pytest.approx(losses(lm_spec()), rel=1e-4)


def test_auto_checkpoints_as_far_as_the_device_memory_needs(monkeypatch):
    spec = lm_spec(activationCheckpointing="auto")
    torch.manual_seed(0)
    profile = profile_model(build_workload(spec).model)
    need = {ac: memory_per_device(profile, ParallelDims(dp=1, dp_mode="ddp", ac=ac), 8, "adamw").total
            for ac in ("none", "selective", "full")}
    chosen = {}
    for memory, expected in ((None, "none"), (need["none"], "none"), (need["none"] - 1, "selective"),
                             (need["selective"] - 1, "full")):
        if memory is None:
            monkeypatch.delenv("COHORT_DEVICE_MEMORY", raising=False)
        else:
            monkeypatch.setenv("COHORT_DEVICE_MEMORY", str(int(memory)))
        w, plan, _module, _opt, _runner = data_plan(spec)
        chosen[memory] = (applied_checkpointing(w.model), plan.describe())
        assert chosen[memory] == (expected, "data dp=1 sync=allreduce" + (f" ac={expected}" * (expected != "none")))
    # The losses are those of none, whatever was chosen.
    assert losses(spec) == losses(lm_spec())


def test_device_memory_is_the_override_else_the_pods_limit_on_a_cpu(monkeypatch):
    spec = from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ac"},
                          "spec": {"workload": {"model": "mlp", "dataset": "digits", "activationCheckpointing": "auto"},
                                   "resources": {"limits": {"memory": "2Gi"}}}}).spec
    monkeypatch.delenv("COHORT_DEVICE_MEMORY", raising=False)
    assert device_memory(spec, torch.device("cpu")) == 2 * 2 ** 30
    monkeypatch.setenv("COHORT_DEVICE_MEMORY", "1GiB")
    assert device_memory(spec, torch.device("cpu")) == 2 ** 30
    # auto on a model the planner cannot count (mlp: admitted, no blocks) is none.
    assert checkpointing_for(spec, MLP(DataInfo(input_shape=(64,), num_classes=10)), ParallelDims()).ac == "none"

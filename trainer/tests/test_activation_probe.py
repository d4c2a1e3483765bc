"""activationCheckpointing auto on measured activations (parallel/activation_probe.py, parallel/memory_budget.py).

The oracle is the storage count of test_activation_checkpoint.py (``Kept``) over a whole model's forward at the
job's batch; the probe measures one block in a chain of two at one and two samples, and the memory model scales it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
import torch
from gloo_ranks import data_plan, run_ranks
from test_activation_checkpoint import Kept
from torch import nn

from cohort.api.jobconfig import from_manifest
from cohort.trainer.parallel.activation_checkpoint import applied_checkpointing, apply_activation_checkpointing
from cohort.trainer.parallel.activation_probe import (
    MODES,
    ProbeBatch,
    ProbeError,
    _rest_kept,
    _rest_on,
    _storages,
    measure_activations,
    without_blocks,
)
from cohort.trainer.parallel.auto import plan_for
from cohort.trainer.parallel.base import PlanContext
from cohort.trainer.parallel.dims import ParallelismError
from cohort.trainer.parallel.fsdp import shard_units
from cohort.trainer.parallel.memory_budget import checkpointing_for, memory_profile
from cohort.trainer.parallel.registry import PARALLELISMS
from cohort.trainer.planner.dims import ParallelDims
from cohort.trainer.planner.hardware import Hardware
from cohort.trainer.planner.memory import block_kept_bytes, kept_after_forward, memory_per_device
from cohort.trainer.planner.profile import transformer_profile, with_measured_activations
from cohort.trainer.runtime.device import autocast
from cohort.trainer.sync.base import CommStats
from cohort.trainer.workloads.models import DataInfo, Transformer
from cohort.trainer.workloads.workload import cross_entropy

CPU = torch.device("cpu")
INFO = DataInfo(input_shape=(32,), num_classes=64, vocab_size=64, seq_len=32)
REPLICAS = ParallelDims(dp=1, dp_mode="ddp")


def transformer(n_layers: int = 3) -> Transformer:
    torch.manual_seed(0)
    return Transformer(INFO, dim=64, n_layers=n_layers, n_heads=4)


def tokens(n: int) -> torch.Tensor:
    return torch.randint(0, 64, (n, 32), generator=torch.Generator().manual_seed(1))


PROBE = ProbeBatch(tokens(2), tokens(2), cross_entropy)


def test_measured_in_fp32_is_the_planners_count():
    """Two ways to the same bytes: the planner's count by hand and the probe's storages."""
    acts = measure_activations(transformer(), PROBE, CPU)
    profile = transformer_profile(dim=64, n_layers=3, n_heads=4, ffn_mult=4, vocab_size=64, seq_len=32)
    assert {m: acts.block[m].per_sample for m in MODES} == {m: block_kept_bytes(profile, 1, m) for m in MODES}
    assert {m: acts.block[m].fixed for m in MODES} == {m: 0.0 for m in MODES}  # no weight copies in fp32
    assert acts.rest.per_sample == profile.last_act_bytes
    assert acts.rest.fixed < 1024  # the position indices (32 int64) and the loss's weight


def whole_model_kept(model: nn.Module, batch: int, precision: str) -> int:
    """What a forward of the whole model and its loss leave alive for backward (the oracle)."""
    x = tokens(batch)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with autocast(CPU, precision), Kept() as kept:
        out = model(x)
        loss = cross_entropy(out, x)
    held = kept.bytes(params | {x.untyped_storage().data_ptr()})  # the loss's view of the tokens is not new
    del out, loss
    return held


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", MODES)
def test_the_memory_model_on_measured_activations_is_what_the_whole_model_keeps(precision, mode):
    """4 blocks at a batch of 8: the probe saw 2 copies of one block at 1 and 2 samples. In bf16 autocast also
    keeps a bf16 copy of each weight (bytes whatever the batch), which the fp32 count has no place for."""
    acts = measure_activations(transformer(4), PROBE, CPU, precision)
    profile = with_measured_activations(
        transformer_profile(dim=64, n_layers=4, n_heads=4, ffn_mult=4, vocab_size=64, seq_len=32),
        {m: acts.block[m].per_sample for m in MODES}, {m: acts.block[m].fixed for m in MODES},
        (acts.rest.per_sample, acts.rest.fixed))
    predicted = kept_after_forward(profile, ParallelDims(dp=1, dp_mode="ddp", ac=mode), 0, 8)
    kept = whole_model_kept(apply_activation_checkpointing(transformer(4), mode), 8, precision)
    print(f"{precision} {mode}: kept {kept} B, predicted {predicted:.0f} B")
    assert kept == predicted


def lm_spec(**workload: Any) -> Any:
    return from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ac"},
                          "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm", "batchSize": 8,
                                                "modelArgs": {"dim": 64, "n_layers": 3, "n_heads": 4},
                                                "datasetArgs": {"vocab": 64, "seq_len": 32},
                                                "optimizer": {"name": "adamw", "lr": 0.01}, **workload}}}).spec


def need(spec: Any, model: nn.Module, probe: ProbeBatch | None, ac: str) -> float:
    profile, _why = memory_profile(spec, model, REPLICAS, CPU, probe)
    assert profile is not None
    return memory_per_device(profile, ParallelDims(dp=1, dp_mode="ddp", ac=ac), 8, "adamw").total


def test_auto_in_bf16_fits_what_bf16_keeps(monkeypatch):
    """The fp32 count says no checkpointing does not fit; measured in bf16 it does, and auto checkpoints nothing."""
    spec, model = lm_spec(activationCheckpointing="auto", precision="bf16"), transformer()
    measured, counted = need(spec, model, PROBE, "none"), need(spec, model, None, "none")
    print(f"no checkpointing needs {measured:.0f} B measured in bf16, {counted:.0f} B by the fp32 count")
    assert measured < counted
    monkeypatch.setenv("COHORT_DEVICE_MEMORY", str(int(measured)))
    assert checkpointing_for(spec, model, REPLICAS, CPU, PROBE).ac == "none"
    assert checkpointing_for(spec, model, REPLICAS, CPU).ac != "none"  # no sample: the fp32 count
    w, plan, *_ = data_plan(spec, probe=True)  # the data plan measures on the job's own samples
    assert applied_checkpointing(w.model) == "none" and plan.describe() == "data dp=1 sync=allreduce"


class Residual(nn.Module):
    """A pre-norm MLP block: x + W2 gelu(W1 norm(x)); ``as_tuple`` answers (hidden,) as Hugging Face's blocks do."""

    def __init__(self, dim: int, as_tuple: bool = False):
        super().__init__()
        self.norm, self.w1, self.w2, self.as_tuple = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), \
            nn.Linear(4 * dim, dim), as_tuple

    def forward(self, x: torch.Tensor) -> Any:
        out = x + self.w2(nn.functional.gelu(self.w1(self.norm(x))))
        return (out,) if self.as_tuple else out


class UsersModel(nn.Module):
    """A user's model (not the built-in transformer): features in, classes out, blocks in ``layers``."""

    def __init__(self, features: int = 32, dim: int = 64, n_layers: int = 4, classes: int = 10,
                 as_tuple: bool = False):
        super().__init__()
        self.embed, self.head = nn.Linear(features, dim), nn.Linear(dim, classes)
        self.layers = nn.ModuleList(Residual(dim, as_tuple) for _ in range(n_layers))
        self.as_tuple = as_tuple

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)[0] if self.as_tuple else layer(h)  # as Hugging Face's models read their blocks
        return self.head(h)


def mlp_spec(**workload: Any) -> Any:
    return from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ac"},
                          "spec": {"workload": {"model": "pkg.users:model", "dataset": "digits", "batchSize": 8,
                                                "optimizer": {"name": "adamw", "lr": 0.01}, **workload}}}).spec


USERS_PROBE = ProbeBatch(torch.randn(2, 32), torch.tensor([1, 2]), cross_entropy)


def test_auto_fits_a_users_model_by_its_measured_blocks(monkeypatch):
    spec = mlp_spec(activationCheckpointing="auto")
    torch.manual_seed(0)
    model = UsersModel()
    needs = {ac: need(spec, model, USERS_PROBE, ac) for ac in MODES}
    assert needs["full"] < needs["selective"] < needs["none"]
    for memory, expected in ((needs["none"], "none"), (needs["none"] - 1, "selective"),
                             (needs["selective"] - 1, "full")):
        monkeypatch.setenv("COHORT_DEVICE_MEMORY", str(int(memory)))
        assert checkpointing_for(spec, model, REPLICAS, CPU, USERS_PROBE).ac == expected, memory
    # Without samples to measure with, a user's model is not counted: none.
    assert checkpointing_for(spec, model, REPLICAS, CPU).ac == "none"


def test_blocks_that_answer_a_tuple_measure_as_those_that_answer_a_tensor():
    torch.manual_seed(0)
    plain = measure_activations(UsersModel(), USERS_PROBE, CPU)
    torch.manual_seed(0)
    assert measure_activations(UsersModel(as_tuple=True), USERS_PROBE, CPU) == plain


class Narrowing(Residual):
    def forward(self, x: torch.Tensor) -> Any:
        return super().forward(x)[..., :8]


def test_blocks_that_cannot_be_chained_are_named_and_auto_falls_back(monkeypatch):
    torch.manual_seed(0)
    model = UsersModel()
    model.layers[0] = Narrowing(64)
    with pytest.raises(ProbeError, match="Narrowing returns no tensor shaped like its input"):
        measure_activations(model, USERS_PROBE, CPU)
    monkeypatch.setenv("COHORT_DEVICE_MEMORY", "1")
    assert checkpointing_for(mlp_spec(activationCheckpointing="auto"), model, REPLICAS, CPU, USERS_PROBE).ac == "none"


class FixedBatch(Residual):
    def forward(self, x: torch.Tensor) -> Any:
        if x.shape[0] != 8:
            raise RuntimeError("this block runs batches of 8 only")
        return super().forward(x)


def test_a_model_the_probe_cannot_run_is_planned_without_the_measurement(monkeypatch):
    torch.manual_seed(0)
    model = UsersModel()
    model.layers[0] = FixedBatch(64)
    monkeypatch.setenv("COHORT_DEVICE_MEMORY", "1")
    assert checkpointing_for(mlp_spec(activationCheckpointing="auto"), model, REPLICAS, CPU, USERS_PROBE).ac == "none"


def test_measuring_leaves_the_model_as_it_was():
    model = transformer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measure_activations(model, PROBE, CPU, "bf16")
    assert all("forward" not in block.__dict__ and not block._forward_pre_hooks for block in model.layers.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert applied_checkpointing(model) is None


def test_strategy_auto_plans_with_the_measured_activations():
    """A device that holds the bf16 job without checkpointing as measured, not as the fp32 count has it."""
    spec, model = lm_spec(precision="bf16"), transformer()
    memory = (need(spec, model, PROBE, "none") + need(spec, model, None, "none")) / 2
    best, _ranked = plan_for(spec, model, 1, Hardware(memory_bytes=memory), probe=PROBE, device=CPU)
    assert best.dims.ac == "none" and best.memory.total <= memory
    with pytest.raises(ParallelismError, match="auto found no plan for 1 ranks"):
        plan_for(spec, model, 1, Hardware(memory_bytes=memory))  # no samples: the fp32 count rejects it


def test_strategy_auto_costs_a_bf16_jobs_fsdp_plans_with_bf16_parameters():
    """Each split is costed on the activations it runs with: fp32 parameters under autocast where the model is
    replicated, bf16 parameters and inputs where FSDP shards it (its MixedPrecisionPolicy)."""
    spec, model = lm_spec(precision="bf16"), transformer()
    replicated, _ = memory_profile(spec, model, REPLICAS, CPU, PROBE)
    sharded, _ = memory_profile(spec, model, ParallelDims(dp=2), CPU, PROBE)
    assert replicated is not None and sharded is not None
    _best, ranked = plan_for(spec, model, 2, Hardware(memory_bytes=2 ** 40), probe=PROBE, device=CPU)
    assert {c.dims.fully_sharded for c in ranked} == {True, False}
    for c in ranked:
        own = memory_per_device(sharded if c.dims.fully_sharded else replicated, c.dims, 16, "adamw").total
        other = memory_per_device(replicated if c.dims.fully_sharded else sharded, c.dims, 16, "adamw").total
        assert c.memory.total == own, c.dims.describe()
        if c.dims.fully_sharded:
            assert own < other, c.dims.describe()  # bf16 blocks keep less than fp32 ones under autocast


@pytest.mark.parametrize("make,probe,answers", [(transformer, PROBE, 0), (lambda: UsersModel(as_tuple=True),
                                                                         USERS_PROBE, 1)])
def test_the_rest_measures_the_same_on_a_copy_without_the_blocks(make, probe, answers):
    """A sharded plan's model is on the host: the rest is measured on a copy of its own tensors on the device."""
    model = make()
    blocks = shard_units(model)
    rest = without_blocks(model, blocks, answers)
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    assert sum(p.numel() for p in rest.parameters()) == sum(p.numel() for p in model.parameters()) - in_blocks
    assert not _storages(list(rest.parameters())) & _storages(list(model.parameters()))
    for precision in ("fp32", "bf16"):
        with _rest_on(model, blocks, answers, CPU) as in_place:
            assert in_place is model
            expected = [_rest_kept(in_place, probe, n, CPU, precision) for n in (1, 2)]
        assert [_rest_kept(rest, probe, n, CPU, precision) for n in (1, 2)] == expected


def _tensor_plan_with_own_memory(rank: int, world: int, memory: list[float]) -> str:
    os.environ["COHORT_DEVICE_MEMORY"] = str(int(memory[rank]))
    spec = from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ac"},
                          "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm", "batchSize": 8,
                                                "modelArgs": {"dim": 64, "n_layers": 3, "n_heads": 4},
                                                "datasetArgs": {"vocab": 64, "seq_len": 32},
                                                "optimizer": {"name": "adamw", "lr": 0.01},
                                                "activationCheckpointing": "auto"},
                                   "replicas": {"min": 2, "max": 2, "target": 2},
                                   "parallelism": {"strategy": "tensor", "tensor": 2}}}).spec
    ctx = PlanContext(spec, rank, world, CommStats(), model=transformer(), probe=PROBE)
    return PARALLELISMS["tensor"](ctx).dims.ac


@pytest.mark.dist
def test_ranks_with_different_memory_run_the_most_recomputation_any_chose():
    """Rank 0 fits without checkpointing, rank 1 only with full: both run full (under tp, full runs the forward's
    all-reduces again in backward; ranks that differed would hang)."""
    spec, model = lm_spec(activationCheckpointing="auto"), transformer()
    tp = ParallelDims(dp=1, tp=2, ac="none")
    profile, _why = memory_profile(spec, model, tp, CPU, PROBE)
    assert profile is not None
    needs = {ac: memory_per_device(profile, replace(tp, ac=ac), 8, "adamw").total for ac in MODES}
    assert run_ranks(_tensor_plan_with_own_memory, 2, [needs["none"], needs["selective"] - 1]) == ["full", "full"]

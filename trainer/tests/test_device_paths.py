"""Every strategy x sync x compressor of the API's table trains with its model and data on a non-CPU device.

CI has no GPU, so the device rules are checked on a simulated accelerator
(simulated_device.py): a second device type whose tensors refuse to mix with
host tensors as CUDA's do. Each case runs the real Trainer on 2 gloo ranks
for a few steps, through a checkpoint and the final evaluation, and asserts:

- training finished, with its parameters and optimizer state on the device;
- a replicated plan's ranks ended with the same parameters, bit for bit (decentralised syncs included);
- no op mixed device and host tensors (the simulated device raises, as CUDA would);
- every collective was issued with the same kind of tensors (device or host) on
  both ranks, in the same order: on a GPU the two kinds go to different backends
  (NCCL, gloo), and a rank on the other backend would hang.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch
from gloo_ranks import case_error, run_ranks, run_trainer

from cohort.api.jobconfig import from_manifest
from cohort.api.models import ALL_COMPRESSION, OWN_MOMENTUM, SUPPORTED_COMPRESSION
from cohort.trainer.runtime.ports import free_ports

pytestmark = [pytest.mark.dist]

DIGITS = {"model": "mlp", "dataset": "digits", "modelArgs": {"hidden": 32}}
TINY_GPT = {"model": "transformer", "modelArgs": {"dim": 32, "n_layers": 2, "n_heads": 2},
            "dataset": "synthetic-lm", "datasetArgs": {"sequences": 256, "seq_len": 16, "vocab": 64}}


def case(name: str, workload: dict[str, Any] | None = None, steps: int = 3, **spec: Any) -> tuple[str, dict[str, Any]]:
    w = {**(workload or DIGITS), "epochs": 0, "maxSteps": steps, "batchSize": 8, "evalEveryEpochs": 0}
    method = spec.get("compression", {}).get("method", "none")
    if method in OWN_MOMENTUM:
        w["optimizer"] = {"momentum": 0.0}
    return name, {"workload": w, "replicas": {"min": 2, "max": 2, "target": 2},
                  "checkpoint": {"everySteps": 2, "keep": 1}, "faultTolerance": {"processGroupTimeoutSeconds": 15},
                  **spec}


def api_table() -> list[tuple[str, dict[str, Any]]]:
    """Every pair the API admits: each sync with each compressor it supports (top-k with each collective),
    and each sharded strategy, plus the precisions."""
    cases = []
    for sync, methods in SUPPORTED_COMPRESSION.items():
        steps = 12 if sync == "localsgd" else 3  # local SGD averages only after its 10 warm-up steps
        for method in methods:
            cases.append(case(f"data-{sync}-{method}", steps=steps, sync={"algorithm": sync},
                              compression={"method": method}))
    for collective in ("sparse", "cyclic", "global"):
        cases.append(case(f"data-allreduce-topk-{collective}", compression={"method": "topk",
                                                                             "collective": collective}))
    cases += [
        case("fsdp", TINY_GPT, parallelism={"strategy": "fsdp"}),
        case("tensor", TINY_GPT, parallelism={"strategy": "tensor", "tensor": 2}),
        case("pipeline", TINY_GPT, parallelism={"strategy": "pipeline", "pipeline": 2, "microbatches": 2}),
        case("hybrid", TINY_GPT, parallelism={"strategy": "hybrid", "tensor": 2}),
        case("auto", TINY_GPT, parallelism={"strategy": "auto"}),
        case("data-bf16", {**DIGITS, "precision": "bf16"}),
        case("data-fp16", {**DIGITS, "precision": "fp16", "optimizer": {"gradClipNorm": 1.0}}),
        case("fsdp-bf16-clip", {**TINY_GPT, "precision": "bf16", "optimizer": {"gradClipNorm": 1.0}},
             parallelism={"strategy": "fsdp"}),
        case("pipeline-clip", {**TINY_GPT, "optimizer": {"gradClipNorm": 1.0}},
             parallelism={"strategy": "pipeline", "pipeline": 2, "microbatches": 2}),
        case("data-global-batch", {**DIGITS, "globalBatchSize": 40}),
        # DiLoCo in fragments: the outer step on views of θ and its momentum, on the device (a round after each of
        # steps 10 to 14: the first averages the whole model, then the two fragments take turns).
        case("data-localsgd-diloco-fragments", steps=14, sync={"algorithm": "localsgd", "period": 2,
                                                               "outerOptimizer": {"name": "nesterov"}, "fragments": 2}),
        # ... and with its overlap: each round's allreduce left running on the device for a step, then mixed in
        # (sent after steps 10, 12, 14, 16, applied a step later; the last still in flight when training ends).
        case("data-localsgd-diloco-overlap", steps=16, sync={"algorithm": "localsgd", "period": 4, "fragments": 2,
                                                             "outerOptimizer": {"name": "nesterov"},
                                                             "overlapSteps": 1, "mixing": 0.25}),
    ]
    return cases


CASES = api_table()


def _train_cases(rank: int, world: int, cases: list[tuple[str, dict[str, Any]]], ports: list[int],
                 root: str) -> dict[str, Any]:
    from simulated_device import on_device, simulated_device

    out: dict[str, Any] = {}
    for (name, spec), port in zip(cases, ports, strict=True):
        spec = {**spec, "checkpoint": {**spec["checkpoint"], "path": f"{root}/{name}"}}
        cfg = from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob",
                             "metadata": {"name": "dev"}, "spec": spec})
        os.environ["COHORT_PG_BACKEND"] = "cpu:gloo,sim:gloo"  # the simulated device's tensors go over gloo
        env = {"COHORT_DEVICE": "sim", "COHORT_METRICS_PORT": "0", "COHORT_POD_NAME": f"rank-{rank}",
               "COHORT_TERMINATION_LOG": f"{root}/{name}-{rank}.summary"}
        try:
            with simulated_device() as sim:
                trainer, summary = run_trainer(rank, world, port, cfg, env)
            placed = all(on_device(p) for p in trainer.model.parameters())
            state = [v for s in trainer.optimizer.state.values() for v in s.values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0]
            # A replicated plan's parameters, flat; a sharded plan's DTensors are not flattened (torch 2.11
            # refuses a view across a sharded dimension).
            final = torch.cat([p.detach().reshape(-1).to("cpu") for p in trainer.model.parameters()]) \
                if trainer.plan.replicated else None
            out[name] = {"step": summary["step"], "device": summary["device"], "params_on_device": placed,
                         "params": final,
                         "optimizer_on_device": all(on_device(v) for v in state), "collectives": list(sim.collectives),
                         "error": None}
        except Exception as e:
            out[name] = case_error(e)
    return out


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="cohort-device-") as root:
        ports = free_ports(len(CASES))
        ranks = run_ranks(_train_cases, 2, CASES, ports, root, timeout_s=900, group=False)
    return {name: [r[name] for r in ranks] for name, _ in CASES}


def test_the_table_covers_every_admitted_pair():
    names = {name for name, _ in CASES}
    for sync, methods in SUPPORTED_COMPRESSION.items():
        assert {f"data-{sync}-{m}" for m in methods} <= names
    assert len([n for n in names if n.startswith("data-allreduce-")]) >= len(ALL_COMPRESSION) + 3
    assert {"fsdp", "tensor", "pipeline", "hybrid", "auto"} <= names


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_trains_on_the_device_with_matching_collectives(results, name):
    ranks = results[name]
    errors = [f"rank {r}: {res['error']}" for r, res in enumerate(ranks) if res["error"]]
    assert not errors, "\n".join(errors)
    for res in ranks:
        assert res["step"] >= 3 and res["device"] == "sim:0", res
        assert res["params_on_device"] and res["optimizer_on_device"], res
    if ranks[0]["params"] is not None:  # replicated: training ends with one model (gossip and local SGD too)
        assert torch.equal(ranks[0]["params"], ranks[1]["params"]), "the replicas ended as different models"
    a, b = (res["collectives"] for res in ranks)
    mismatched = [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    assert len(a) == len(b) and not mismatched, \
        f"collectives differ between ranks (index, rank 0, rank 1): {mismatched[:5]}; counts {len(a)} vs {len(b)}"
    assert any(kind == "device" for _, kind in a), "no collective carried device tensors"

"""A sharded plan never holds the whole unsharded model on the device (marker dist).

FSDP exists for models that do not fit on one device: the trainer keeps the unsharded model on the host and
``parallelize`` moves it to the device a unit at a time, each just before FSDP2 shards it (parallel/fsdp.py).
Measured on the simulated accelerator (simulated_device.py, CI has no GPU) by its meter: the most bytes its live
tensors held at once, on 2 gloo ranks with dp = 2.
"""

from __future__ import annotations

import copy
import datetime
import os
import tempfile
from typing import Any

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import new_trainer, run_ranks, run_trainer

from cohort.api.jobconfig import from_manifest
from cohort.trainer.parallel.fsdp import shard_units
from cohort.trainer.parallel.mesh import build_mesh
from cohort.trainer.parallel.parallelize import parallelize
from cohort.trainer.planner.dims import ParallelDims
from cohort.trainer.runtime.ports import free_port, free_ports
from cohort.trainer.workloads.workload import build_workload

pytestmark = [pytest.mark.dist]

# 8 blocks of dim 128, 0.75 MiB each, and the embeddings and head: a block is an eighth of the model.
MANIFEST = {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "placed"},
            "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm",
                                  "modelArgs": {"dim": 128, "n_layers": 8, "n_heads": 4},
                                  "datasetArgs": {"sequences": 64, "seq_len": 16, "vocab": 64}},
                     "parallelism": {"strategy": "fsdp"}}}


def nbytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _place(rank: int, world: int, port: int) -> dict[str, Any]:
    from simulated_device import DeviceMeter, install, on_device

    install()
    dist.init_process_group("cpu:gloo,sim:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    device, dims = torch.device("sim", 0), ParallelDims(dp=world)
    spec = from_manifest(MANIFEST).spec
    out: dict[str, Any] = {}
    for how in ("unit by unit", "whole model first"):  # the second is what the trainer did before
        torch.manual_seed(0)
        model = build_workload(spec).model
        out["model"], out["unit"] = nbytes(model), max(nbytes(b) for b in shard_units(model))
        mesh = build_mesh(dims, device)
        with DeviceMeter() as meter:
            parallelize(model.to(device) if how == "whole model first" else model, dims, mesh, spec.workload,
                        device)
        out[how] = {"peak": meter.peak, "placed": all(on_device(p) for p in model.parameters())}
    dist.barrier()  # rank 0 hosts the store: it must not leave while a rank behind still builds its mesh there
    dist.destroy_process_group()
    return out


def test_fsdp_moves_the_model_to_the_device_a_unit_at_a_time():
    for r in run_ranks(_place, 2, free_port(), group=False, timeout_s=300):
        model, unit = r["model"], r["unit"]
        placed, whole = r["unit by unit"], r["whole model first"]
        print(f"model {model} B, largest unit {unit} B; peak on the device: unit by unit {placed['peak']} B, "
              f"whole model first {whole['peak']} B")
        assert placed["placed"] and whole["placed"]
        assert whole["peak"] >= model  # the meter sees a whole model on the device
        assert placed["peak"] <= model / 2 + unit * 1.05  # this rank's shards and one unit whole (FSDP pads)


def _train(rank: int, world: int, port: int, root: str) -> dict[str, Any]:
    from simulated_device import DeviceMeter, simulated_device

    m = copy.deepcopy(MANIFEST)
    m["spec"]["workload"].update(epochs=0, maxSteps=2, batchSize=2, evalEveryEpochs=0,
                                 optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.0})
    m["spec"]["checkpoint"] = {"everySteps": 0, "path": root}
    os.environ["COHORT_PG_BACKEND"] = "cpu:gloo,sim:gloo"
    env = {"COHORT_DEVICE": "sim", "COHORT_METRICS_PORT": "0", "COHORT_POD_NAME": f"rank-{rank}",
           "COHORT_TERMINATION_LOG": f"{root}/{rank}.summary"}
    with simulated_device(), DeviceMeter() as meter:
        trainer, summary = run_trainer(rank, world, port, from_manifest(m), env)
    assert trainer.pristine is not None
    return {"peak": meter.peak, "model": nbytes(trainer.pristine), "step": summary["step"],
            "plan": summary["plan"]}


def test_the_trainer_never_holds_two_unsharded_models_on_the_device():
    """Before, a sharded strategy's model went to the device when the trainer started and again, copied, when
    the world's plan was made: two whole models at once. Now the device holds what the steps need (shards,
    their gradients, a unit gathered and its gradient, activations) and never the whole model."""
    with tempfile.TemporaryDirectory(prefix="cohort-placed-") as root:
        ranks = run_ranks(_train, 2, free_port(), root, group=False, timeout_s=300)
    for r in ranks:
        print(f"model {r['model']} B; the device's peak over the run {r['peak']} B ({r['plan']})")
        assert r["step"] == 2 and r["plan"] == "dp=2 tp=1 pp=1 fsdp"
        assert r["peak"] < 2 * r["model"]


DIGITS = {"model": "mlp", "dataset": "digits", "modelArgs": {"hidden": 32}, "datasetArgs": {}}


def _auto(rank: int, world: int, ports: list[int], root: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's Trainer on the simulated device: where its model was when it started, and its plan."""
    from simulated_device import on_device, simulated_device

    out = []
    for i, (run, port) in enumerate(zip(runs, ports, strict=True)):
        m = copy.deepcopy(MANIFEST)
        m["spec"]["workload"].update(epochs=0, maxSteps=2, batchSize=2, evalEveryEpochs=0,
                                     optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.0}, **run.get("workload", {}))
        m["spec"].update(checkpoint={"everySteps": 0, "path": f"{root}/{i}"}, parallelism={"strategy": run["strategy"]},
                         sync={"algorithm": run.get("sync", "allreduce")})
        os.environ.update(COHORT_PG_BACKEND="cpu:gloo,sim:gloo", COHORT_DEVICE_MEMORY=run.get("memory", ""))
        env = {**os.environ, "COHORT_DEVICE": "sim", "COHORT_METRICS_PORT": "0", "COHORT_POD_NAME": f"rank-{rank}",
               "COHORT_TERMINATION_LOG": f"{root}/{i}-{rank}.summary"}
        with simulated_device():
            trainer = new_trainer(rank, world, port, from_manifest(m), env)
            at_start = any(on_device(p) for p in trainer.model.parameters())
            summary = trainer.run()
        out.append({"on_device_at_start": at_start, "step": summary["step"], "plan": summary["plan"],
                    "placed": all(on_device(p) for p in trainer.model.parameters())})
    return out


def test_strategy_auto_keeps_the_model_on_the_host_until_a_world_replicates_it():
    """auto may shard: its model waits on the host, and goes to the device when the world's plan replicates it;
    data places it at start, as before."""
    model = nbytes(build_workload(from_manifest(MANIFEST).spec).model)
    runs = [{"strategy": "auto", "memory": str(2 * model)},  # DDP's replicas and gradients do not fit: sharded
            {"strategy": "auto", "workload": DIGITS},  # the planner replicates a small MLP
            {"strategy": "data"}]
    with tempfile.TemporaryDirectory(prefix="cohort-auto-") as root:
        ranks = run_ranks(_auto, 2, free_ports(len(runs)), root, runs, group=False, timeout_s=300)
    for r in ranks:
        assert [(x["on_device_at_start"], x["step"], x["placed"]) for x in r] == \
            [(False, 2, True), (False, 2, True), (True, 2, True)], r
        assert not r[0]["plan"].startswith("auto: data") and r[1]["plan"].startswith("auto: data dp=2"), r

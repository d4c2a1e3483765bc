"""Sharded checkpoints load exactly at another dp (and tp/pp) degree (marker dist).

For each sharded strategy a world trains two steps and saves through the
Checkpointer (DCP, on the plan's checkpoint group), then a world of another
shape loads it into a freshly sharded model. Every parameter and every AdamW
state tensor, gathered to full tensors on both sides, must be bitwise equal.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from cohort.trainer.planner.dims import ParallelDims
from cohort.trainer.runtime.exit import exit_process
from cohort.trainer.runtime.ports import free_port

pytestmark = [pytest.mark.dist]


def _spec():
    from cohort.api.jobconfig import from_manifest

    return from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "r"},
                          "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm", "maxSteps": 2,
                                                "batchSize": 8, "datasetArgs": {"sequences": 256},
                                                "modelArgs": {"dim": 16, "n_layers": 2, "n_heads": 2},
                                                "optimizer": {"name": "adamw", "lr": 0.01}}}}).spec


def _worker(rank: int, world: int, port: int, dims: ParallelDims, root: str, mode: str) -> None:
    from cohort.trainer.checkpoint import Checkpointer
    from cohort.trainer.parallel.base import PlanContext
    from cohort.trainer.parallel.sharded import MeshPlan
    from cohort.trainer.sampler import ElasticSampler
    from cohort.trainer.state import TrainState
    from cohort.trainer.sync.base import CommStats
    from cohort.trainer.workloads.workload import build_workload

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    spec = _spec()
    workload = build_workload(spec)
    plan = MeshPlan(PlanContext(spec, rank, world, CommStats()), dims, batch_size=8 // dims.dp)
    model = plan.apply(workload.model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = TrainState(workload.model, opt, ElasticSampler(len(workload.data.train), 8, 0))
    ckpt = Checkpointer(root, keep=2, async_save=True)
    if mode == "save":
        b = plan.batch_size
        for step in range(2):
            idx = torch.arange(plan.dp_rank * b, (plan.dp_rank + 1) * b) + 8 * step
            opt.zero_grad()
            plan.forward_backward(workload.data.train.x[idx], workload.data.train.y[idx], workload.loss_fn)
            opt.step()
        state.step = 2
        ckpt.save(2, state.checkpoint_state(), {}, coordinator=rank == 0, group=plan.checkpoint_group, sharded=True)
        ckpt.wait()
        dist.barrier()
    else:
        loaded = state.checkpoint_state()
        ckpt.load(2, loaded, sharded=True)
        state.after_checkpoint_load(loaded)
        assert state.step == 2
    full = StateDictOptions(full_state_dict=True)
    model_sd, optim_sd = get_state_dict(workload.model, opt, options=full)
    torch.save({"model": model_sd, "optim": optim_sd["state"]}, Path(root) / f"{mode}-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    exit_process(0)


def _run(dims: ParallelDims, root: Path, mode: str) -> dict:
    mp.start_processes(_worker, args=(dims.world_size, free_port(), dims, str(root), mode), nprocs=dims.world_size,
                       start_method="spawn")
    merged: dict = {"model": {}, "optim": {}}
    for rank in range(dims.world_size):  # pipeline stages hold different layers: take the union
        part = torch.load(root / f"{mode}-{rank}.pt", weights_only=False)
        for key in merged:
            merged[key].update(part[key])
    return merged


PAIRS = {
    "fsdp": (ParallelDims(dp=2), ParallelDims(dp=1)),
    "tensor": (ParallelDims(dp=2, tp=2), ParallelDims(dp=1, tp=2)),
    "pipeline": (ParallelDims(dp=2, pp=2, microbatches=2), ParallelDims(dp=1, pp=2, microbatches=2)),
    "hybrid": (ParallelDims(dp=1, tp=2, pp=2, microbatches=2), ParallelDims(dp=2, tp=2)),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_checkpoint_loads_exactly_at_another_dp_degree(tmp_path, name):
    before, after = PAIRS[name]
    saved = _run(before, tmp_path, "save")
    loaded = _run(after, tmp_path, "load")
    assert saved["model"].keys() == loaded["model"].keys() and len(saved["model"]) == 29
    for k, v in saved["model"].items():
        assert torch.equal(v, loaded["model"][k]), k
    assert saved["optim"].keys() == loaded["optim"].keys()
    for k, states in saved["optim"].items():
        for s, v in states.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(loaded["optim"][k][s])), (k, s)

"""Test helper: run a function on N gloo ranks, each in a fresh process on 127.0.0.1.

``run_ranks(fn, world, *args)`` spawns ``world`` processes, forms a gloo
process group, calls ``fn(rank, world, *args)`` in each, and returns the
ranks' return values (saved with torch.save) in rank order. ``fn`` must be a
module-level function of an importable module (spawn pickles it by name).
With ``group=False`` no group is formed: ``fn`` forms (and ends) its own.
Processes that outlive ``timeout_s`` are killed, and the test fails.
``run_trainer`` runs one job's real Trainer on a rank of such a process, ``case_error`` records a job
that failed there; ``run_jobs`` runs many jobs one after another on one set of ranks with them.
``data_plan`` sets up one rank's data plan, optimizer and StepRunner, as the trainer does, for tests that
drive ``StepRunner.run`` themselves.
"""

from __future__ import annotations

import copy
import datetime
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.support.specs import WORKLOAD

from cohort.api.jobconfig import from_manifest
from cohort.api.models import OWN_MOMENTUM
from cohort.trainer.optim import build_optimizer
from cohort.trainer.parallel.activation_probe import ProbeBatch
from cohort.trainer.parallel.base import PlanContext
from cohort.trainer.parallel.registry import PARALLELISMS
from cohort.trainer.runtime.exit import exit_process
from cohort.trainer.runtime.ports import free_port, free_ports
from cohort.trainer.step import MicroBatching, StepRunner
from cohort.trainer.sync.base import CommStats
from cohort.trainer.workloads.workload import build_workload


def job_spec(sync: str = "allreduce", method: str = "none", topology: str = "ring", period: int = 1,
             outer: dict[str, Any] | None = None, warmup: int = 10, fragments: int = 1, overlap: int = 0,
             mixing: float = 0.0, **compression: Any) -> Any:
    """A defaulted spec (the trainer's own config view) with the given sync (``warmup``: local SGD's
    synchronous steps; ``fragments``: its rounds' slices; ``overlap`` and ``mixing``: their overlap) and
    compression."""
    # dgc and signum keep the momentum themselves: admission requires the optimizer's to be 0.
    workload = {**WORKLOAD, "optimizer": {"momentum": 0.0}} if method in OWN_MOMENTUM else dict(WORKLOAD)
    manifest = {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"},
                "spec": {"workload": workload,
                         "sync": {"algorithm": sync, "topology": topology, "period": period,
                                  "warmupSteps": warmup, "outerOptimizer": outer or {}, "fragments": fragments,
                                  "overlapSteps": overlap, "mixing": mixing},
                         "compression": {"method": method, **compression}}}
    return from_manifest(manifest).spec


class DataPlan(NamedTuple):
    workload: Any
    plan: Any
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    runner: StepRunner


def data_plan(spec: Any, rank: int = 0, world: int = 1, gate: Any = None, probe: bool = False) -> DataPlan:
    """``spec``'s workload (seeded 0) under the data plan of ``rank`` in a world of ``world`` (1 needs no process
    group), its optimizer, and the StepRunner the trainer would use on the CPU (with commit ``gate``, if given;
    ``probe``: the workload's samples to measure activations with, as the trainer gives activationCheckpointing
    auto)."""
    torch.manual_seed(0)
    w = build_workload(spec)
    stats = CommStats()
    plan = PARALLELISMS["data"](PlanContext(spec, rank, world, stats, probe=ProbeBatch.of(w) if probe else None))
    module = plan.apply(w.model)
    optimizer = build_optimizer(module.parameters(), spec.workload.optimizer)
    return DataPlan(w, plan, module, optimizer, StepRunner(spec, torch.device("cpu"), stats, gate))


def train_steps(dp: DataPlan, steps: int, batch: int) -> list[float]:
    """``steps`` steps of ``dp`` on consecutive batches of ``batch`` training samples; their losses."""
    w, plan, _module, optimizer, runner = dp
    losses = []
    for step in range(steps):
        idx = torch.arange(step * batch, (step + 1) * batch)
        r = runner.run(plan, optimizer, lambda idx=idx: w.data.train.fetch(idx), w.loss_fn, MicroBatching(),
                       lambda: None, step + 1)
        losses.append(r.loss)
    return losses


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple, group: bool) -> None:
    torch.set_num_threads(1)
    if group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(out) / f"{rank}.pt")
        if group and rank == 0:
            # Rank 0 hosts the store: it stays until every rank is done with it (a rank behind may still be
            # forming a mesh's groups there). Not a barrier: a case may have shortened the group's timeout.
            while not all((Path(out) / f"{r}.pt").exists() for r in range(world)):
                time.sleep(0.01)
    finally:
        if group:
            dist.destroy_process_group()
    exit_process(0)


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 180,
              group: bool = True, port: int | None = None) -> list[Any]:
    """``fn(rank, world, *args)`` in ``world`` spawned processes, in a gloo group on ``port`` (a free one if
    None) unless ``group`` is False; their results, by rank."""
    with tempfile.TemporaryDirectory(prefix="cohort-ranks-") as out:
        port = free_port() if port is None else port
        ctx = mp.start_processes(_entry, args=(fn, world, port, out, args, group), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} ranks did not finish within {timeout_s}s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]


# Every Trainer run_trainer makes stays alive until the rank process ends (exit_process: os._exit, no
# destructors). Freeing one frees its DDP Reducer and, with it, the case's gloo process group, whose
# destructor joins gloo's worker threads while holding the GIL; a worker that is just dropping a finished
# collective then waits for the GIL forever. Seen as test_device_paths.py's 600 s hang, 1 run in 7 on a
# loaded host, with its simulated device's tensors (main thread: pybind11 dealloc of the Reducer ->
# ~ProcessGroupGloo -> std::thread::join; gloo thread: runLoop -> ~AsyncAllreduceWork ->
# TensorImpl::decref_pyobject -> gil_scoped_acquire), and as test_convergence.py's ranks 0 and 1 stuck at
# the end of its first case with plain CPU tensors. A worker has one Trainer and ends with os._exit.
_TRAINERS: list[Any] = []


def new_trainer(rank: int, world: int, port: int, cfg: Any, env: dict[str, str]) -> Any:
    """One job's real Trainer on this rank, in a static world of ``world`` ranks on ``port`` (torchrun's
    variables), with ``env`` over the process's; kept alive (above) until the rank process ends."""
    from cohort.trainer.trainer import Trainer

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    trainer = Trainer(cfg, {**os.environ, **env})
    _TRAINERS.append(trainer)
    return trainer


def run_trainer(rank: int, world: int, port: int, cfg: Any, env: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """:func:`new_trainer`, run: the Trainer and its summary."""
    trainer = new_trainer(rank, world, port, cfg, env)
    return trainer, trainer.run()


def case_error(e: Exception) -> dict[str, Any]:
    """A failed case's record, so that one broken case does not hide the others; leaves its group."""
    from cohort.trainer.runtime.process_group import Rendezvous

    Rendezvous.leave()
    return {"error": f"{type(e).__name__}: {str(e)[:600]}\n{''.join(traceback.format_tb(e.__traceback__))[-3000:]}"}


def _train_jobs(rank: int, world: int, jobs: list[tuple[str, int, dict[str, Any]]], ports: list[int],
                root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (name, workers, m), port in zip(jobs, ports, strict=True):
        if rank >= workers:
            continue  # a smaller job leaves the higher ranks idle
        m = copy.deepcopy(m)
        m["spec"]["checkpoint"]["path"] = f"{root}/{name}"
        env = {"COHORT_METRICS_PORT": "0", "COHORT_POD_NAME": f"{name}-{rank}",
               "COHORT_TERMINATION_LOG": f"{root}/{name}-{rank}.summary"}
        try:
            out[name] = run_trainer(rank, workers, port, from_manifest(m), env)[1]
        except Exception as e:
            out[name] = case_error(e)
    return out


def run_jobs(jobs: list[tuple[str, int, dict[str, Any]]], world: int = 4, timeout_s: float = 900) -> dict[str, Any]:
    """Every job ``(name, workers, manifest)`` one after another on the same ``world`` rank processes, each the
    real Trainer in its own process group (a new port) on ranks 0 to workers - 1, as ``cohort run --local``
    runs it less the launcher; rank 0's summary of each (what ``cohort run --local`` reports), by name. A
    worker process spends about 4 s of CPU importing torch and the trainer (DDP imports torch._dynamo), which
    new processes per job would pay again each time."""
    with tempfile.TemporaryDirectory(prefix="cohort-jobs-") as root:
        return run_ranks(_train_jobs, world, jobs, free_ports(len(jobs)), root, timeout_s=timeout_s, group=False)[0]

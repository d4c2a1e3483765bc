"""Test helper: run a function on N gloo ranks, each in a fresh process on 127.0.0.1.

``run_ranks(fn, world, *args)`` spawns ``world`` processes, forms a gloo
process group, calls ``fn(rank, world, *args)`` in each, and returns the
ranks' return values (saved with torch.save) in rank order. ``fn`` must be a
module-level function of an importable module (spawn pickles it by name).
With ``group=False`` no group is formed: ``fn`` forms (and ends) its own.
Processes that outlive ``timeout_s`` are killed, and the test fails.
"""

from __future__ import annotations

import datetime
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.support.specs import WORKLOAD

from cohort.api.jobconfig import from_manifest
from cohort.api.models import OWN_MOMENTUM
from cohort.trainer.runtime.ports import free_port
from cohort.trainer.runtime.process_group import exit_process


def job_spec(sync: str = "allreduce", method: str = "none", topology: str = "ring", period: int = 1,
             **compression: Any) -> Any:
    """A defaulted spec (the trainer's own config view) with the given sync and compression."""
    # dgc and signum keep the momentum themselves: admission requires the optimizer's to be 0.
    workload = {**WORKLOAD, "optimizer": {"momentum": 0.0}} if method in OWN_MOMENTUM else dict(WORKLOAD)
    manifest = {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"},
                "spec": {"workload": workload,
                         "sync": {"algorithm": sync, "topology": topology, "period": period},
                         "compression": {"method": method, **compression}}}
    return from_manifest(manifest).spec


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple, group: bool) -> None:
    torch.set_num_threads(1)
    if group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
    try:
        result = fn(rank, world, *args)
    finally:
        if group:
            dist.destroy_process_group()
    torch.save(result, Path(out) / f"{rank}.pt")
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

"""Many world changes in one process leave nothing behind: threads, file descriptors and memory stay flat.

An elastic worker lives through every world change of its job in one
process: it forms each world's process group (runtime/process_group.py),
builds the plan (here DDP), trains, and leaves. Whatever a world leaves
behind, a long job accumulates. Two gloo ranks go through 22 worlds; the
first 2 warm up (imports, allocator pools, the rendezvous store's server);
from world 2 to world 22 the process may not grow by more than 2 threads,
4 file descriptors or 64 MiB of resident memory (measured on 2026-11-28:
0 threads, 0 descriptors, under 10 MiB).
"""

from __future__ import annotations

import os
import threading

import pytest
import torch
from gloo_ranks import job_spec, run_ranks

from cohort.trainer.optim import build_optimizer
from cohort.trainer.parallel.base import PlanContext
from cohort.trainer.parallel.registry import PARALLELISMS
from cohort.trainer.runtime.ports import free_port
from cohort.trainer.runtime.process_group import Rendezvous
from cohort.trainer.runtime.world import Member, World
from cohort.trainer.sync.base import CommStats
from cohort.trainer.workloads.workload import build_workload

pytestmark = [pytest.mark.dist]

WORLDS, WARMUP = 22, 2


def usage() -> dict[str, int]:
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {"threads": len(os.listdir("/proc/self/task")), "python_threads": threading.active_count(),
            "fds": len(os.listdir("/proc/self/fd")), "rss": rss_pages * os.sysconf("SC_PAGE_SIZE")}


def _live_through_worlds(rank: int, world_size: int, port: int) -> list[dict[str, int]]:
    spec = job_spec()
    w = build_workload(spec)
    optimizer = build_optimizer(w.model.parameters(), spec.workload.optimizer)
    rdzv = Rendezvous("127.0.0.1", port, timeout_s=30)
    samples = []
    for version in range(1, WORLDS + 1):
        world = World(version, tuple(Member(r, f"p{r}", "127.0.0.1") for r in range(world_size)), "127.0.0.1", port)
        rdzv.join(world, rank, is_newer=lambda: False)
        plan = PARALLELISMS["data"](PlanContext(spec, rank, world_size, CommStats()))
        module = plan.apply(w.model)
        for step in range(2):
            x, y = w.data.train.fetch(torch.arange(step * 16, (step + 1) * 16))
            optimizer.zero_grad()
            w.loss_fn(module(x), y).backward()
            optimizer.step()
        del plan, module
        Rendezvous.leave()
        samples.append(usage())
    return samples


def test_twenty_world_changes_leak_no_threads_descriptors_or_memory():
    for samples in run_ranks(_live_through_worlds, 2, free_port(), group=False, timeout_s=300):
        warm, last = samples[WARMUP - 1], samples[-1]
        growth = {k: last[k] - warm[k] for k in warm}
        assert growth["threads"] <= 2 and growth["python_threads"] <= 2, (growth, samples)
        assert growth["fds"] <= 4, (growth, samples)
        assert growth["rss"] <= 64 << 20, (growth, samples)

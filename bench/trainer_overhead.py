"""Trainer overhead: Cohort's whole training loop against a bare torch DDP loop (a benchmark, not a test).

    python bench/trainer_overhead.py [--workers 2] [--steps 300] [--repeats 10]

Both sides train the same MLP on the same synthetic data with the same world
size, batch, optimizer and gloo backend, in the same invocation. What is timed
is the loop, from the end of one step to the end of the next: on Cohort's side
that includes the stop and membership checks, the sampler, metrics, progress
and the checkpoint decision (trainer/…/timing.py), on the bare side the batch
slicing and the loss's ``.item()``. Steps 1-10 are warm-up. The two run
interleaved, alternating which goes first, ``--repeats`` times; each repeat
gives one ratio (Cohort's mean loop time / bare's), and the table gives the
mean ratio with its 95 % t interval. Target: <= 1.05x.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.stats import host, t_interval  # noqa: E402

WARMUP = 10


def bare_worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from cohort.trainer.runtime.exit import exit_process
    from cohort.trainer.workloads.datasets import synthetic_classification
    from cohort.trainer.workloads.models import MLP

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    data = synthetic_classification(samples=args.samples, features=args.features, classes=10)
    torch.manual_seed(0)
    model = DDP(MLP(data.info, hidden=args.hidden, depth=args.depth))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(data.train), generator=g)
    walls, ends = [], []
    offset = 0
    for _ in range(args.steps):
        if offset + args.batch * world > len(perm):
            offset = 0
        t0 = time.perf_counter()
        idx = perm[offset + rank * args.batch: offset + (rank + 1) * args.batch]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data.train.x[idx]), data.train.y[idx])
        loss.backward()
        opt.step()
        loss.detach().item()
        offset += args.batch * world
        ends.append(time.perf_counter())
        walls.append(ends[-1] - t0)
    if rank == 0:
        loops = [b - a for a, b in zip(ends[WARMUP:], ends[WARMUP + 1:], strict=False)]
        Path(out).write_text(json.dumps({"step": statistics.median(walls[WARMUP:]), "loop": statistics.fmean(loops)}))
    dist.barrier()
    exit_process(0)


def run_bare(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    import torch.multiprocessing as mp

    out = str(tmp / "bare.json")
    mp.spawn(bare_worker, args=(args.workers, 29711, args, out), nprocs=args.workers, join=True)
    return json.loads(Path(out).read_text())


def run_cohort(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    manifest = {
        "apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "overhead"},
        "spec": {"workload": {"model": "mlp", "modelArgs": {"hidden": args.hidden, "depth": args.depth},
                              "dataset": "synthetic-classification",
                              "datasetArgs": {"samples": args.samples, "features": args.features, "classes": 10},
                              "epochs": 0, "maxSteps": args.steps, "batchSize": args.batch,
                              "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "lrScaling": "none"},
                              "evalEveryEpochs": 0},
                 "replicas": {"min": 1, "max": args.workers, "target": args.workers},
                 "checkpoint": {"everySteps": 0}},
    }
    mf = tmp / "overhead.yaml"
    mf.write_text(yaml.safe_dump(manifest))
    summary = tmp / "summary.json"
    subprocess.run([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers",
                    str(args.workers), "--run-dir", str(tmp / "run"), "--summary-json", str(summary)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(summary.read_text())
    return {"step": result["stepSecondsMedian"], "loop": result["loopSecondsMean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = host()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):  # interleaved, so drift on a shared machine hits both
            tmp = Path(d) / str(i)
            tmp.mkdir()
            if i % 2:
                cohort, bare = run_cohort(args, tmp), run_bare(args, tmp)
            else:
                bare, cohort = run_bare(args, tmp), run_cohort(args, tmp)
            rows.append((bare, cohort))
            print(f"repeat {i + 1}/{args.repeats}: bare {bare['loop'] * 1e3:.2f} ms, "
                  f"Cohort {cohort['loop'] * 1e3:.2f} ms per loop", file=sys.stderr, flush=True)
    print(f"model: MLP hidden={args.hidden} depth={args.depth}, batch {args.batch}/rank, {args.workers} ranks "
          f"(gloo, CPU), {args.steps} steps, {WARMUP} warm-up; started {started}; ended {host()}")
    print("| repeat | bare loop (ms) | Cohort loop (ms) | loop ratio | bare step (ms) | Cohort step (ms) | step ratio |")
    print("|---|---|---|---|---|---|---|")
    for i, (b, c) in enumerate(rows):
        print(f"| {i + 1} | {b['loop'] * 1e3:.2f} | {c['loop'] * 1e3:.2f} | {c['loop'] / b['loop']:.3f} | "
              f"{b['step'] * 1e3:.2f} | {c['step'] * 1e3:.2f} | {c['step'] / b['step']:.3f} |")
    for what in ("loop", "step"):
        ratios = [c[what] / b[what] for b, c in rows]
        mean, low, high = t_interval(ratios)
        print(f"{what} ratio (Cohort / bare): mean **{mean:.3f}**, 95 % interval [{low:.3f}, {high:.3f}] "
              f"(width {high - low:.3f}), min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} repeats")


if __name__ == "__main__":
    main()

"""Trainer overhead: Cohort's step time against a bare torch DDP loop (a benchmark, not a test).

    python bench/trainer_overhead.py [--workers 2] [--steps 300] [--hidden 1024]

Both sides train the same MLP on the same synthetic data with the same world
size, batch, optimizer and gloo backend, in the same invocation. Reported:
median step time over the steps after warm-up, and Cohort's overhead ratio.
Target: <= 1.05x.
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


def bare_worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from cohort.trainer.runtime.process_group import exit_process
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
    perm = torch.randperm(len(data.train_x), generator=g)
    times = []
    offset = 0
    for _ in range(args.steps):
        if offset + args.batch * world > len(perm):
            offset = 0
        t0 = time.perf_counter()
        idx = perm[offset + rank * args.batch: offset + (rank + 1) * args.batch]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
        loss.backward()
        opt.step()
        loss.detach().item()
        times.append(time.perf_counter() - t0)
        offset += args.batch * world
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.barrier()
    exit_process(0)


def run_bare(args: argparse.Namespace, tmp: Path) -> float:
    import torch.multiprocessing as mp

    out = str(tmp / "bare.json")
    mp.spawn(bare_worker, args=(args.workers, 29711, args, out), nprocs=args.workers, join=True)
    times = json.loads(Path(out).read_text())
    return statistics.median(times[10:])


def run_cohort(args: argparse.Namespace, tmp: Path) -> float:
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
    return json.loads(summary.read_text())["stepSecondsMedian"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):  # interleaved, so drift on a shared machine hits both
            tmp = Path(d) / str(i)
            tmp.mkdir()
            bare = run_bare(args, tmp)
            cohort = run_cohort(args, tmp)
            rows.append((bare, cohort))
    print(f"model: MLP hidden={args.hidden} depth={args.depth}, batch {args.batch}/rank, "
          f"{args.workers} ranks (gloo, CPU), {args.steps} steps, median after 10 warm-up steps")
    print("| run | bare DDP step (ms) | Cohort step (ms) | Cohort / bare |")
    print("|---|---|---|---|")
    for i, (b, c) in enumerate(rows):
        print(f"| {i + 1} | {b * 1e3:.2f} | {c * 1e3:.2f} | {c / b:.3f} |")
    b = statistics.median(r[0] for r in rows)
    c = statistics.median(r[1] for r in rows)
    print(f"| median | {b * 1e3:.2f} | {c * 1e3:.2f} | **{c / b:.3f}** |")


if __name__ == "__main__":
    main()

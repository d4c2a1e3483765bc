"""Baseline worker for bench/recovery.py, bench/goodput.py and the GPU proof: a plain torch DDP loop under
torchrun elastic.

It trains the same model on the same data as the Cohort run, saves a
checkpoint (torch.save, atomic rename) every K steps from rank 0, and resumes
from the newest one when torchrun restarts it. ``--device cuda``: every rank
on ``cuda:0`` over NCCL, sharing the GPU with the settings Cohort's local
workers get (launcher.nccl_sharing_env), the manifest's bf16 autocast, and a
device sync before each timestamp. In its first incarnation the
chosen rank SIGKILLs itself at the chosen step. Timestamps go to events-RANK-INCARNATION.jsonl in
the checkpoint directory, as JSON lines,
from every rank: process start (before torch is imported), imports done, the
process group formed, the state loaded, the first step done.
"""

from __future__ import annotations

import json
import os
import time

START = time.time()  # before torch is imported: the process start, as near as Python sees it

import argparse  # noqa: E402
import contextlib  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from cohort.trainer.launcher import nccl_sharing_env, nccl_version_tuple  # noqa: E402
from cohort.trainer.workloads.datasets import digits  # noqa: E402
from cohort.trainer.workloads.models import MLP  # noqa: E402

try:
    from bench import job_workload
except ImportError:  # run as a script: bench/ is not a package on the path
    import job_workload  # type: ignore[no-redef]

IMPORTED = time.time()


EVENTS: list = []  # this rank's event file, opened in main (ranks writing one stdout would interleave lines)


def say(t: float | None = None, **kv: object) -> None:
    EVENTS[0].write(json.dumps({"t": time.time() if t is None else t, **kv}) + "\n")
    EVENTS[0].flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--every", type=int, required=True)
    ap.add_argument("--kill-step", type=int, default=-1, help="-1: never (something else kills the workers)")
    ap.add_argument("--manifest", default="", help="train this TrainingJob's workload instead of the MLP on digits")
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    incarnation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
        os.environ.update(nccl_sharing_env(world, 1, nccl_version_tuple(torch.cuda.nccl.version()),
                                           f"torchrun-{rank}", os.environ))
    # A fresh key prefix per incarnation: with torch 2.13 + gloo, a restarted group that reuses
    # the agent store's keys tries to connect to the dead incarnation's addresses.
    import datetime

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            store=dist.PrefixStore(f"incarnation-{incarnation}", store), rank=rank, world_size=world,
                            **({"device_id": device} if device.type == "cuda" else {}))
    sync(device)
    formed = time.time()
    EVENTS.append(open(Path(args.ckpt_dir) / f"events-{rank}-{incarnation}.jsonl", "w"))  # noqa: SIM115
    say(t=START, event="start", rank=rank, incarnation=incarnation)
    say(t=IMPORTED, event="imported", rank=rank, incarnation=incarnation)
    say(t=formed, event="rendezvous", rank=rank, incarnation=incarnation)
    ids = [device.index] if device.type == "cuda" else None
    if args.manifest:
        job = job_workload.load(args.manifest)
        model = DDP(job.model.to(device), device_ids=ids)
        opt = job.optimizer(model.parameters())
        half = job.autocast_dtype
    else:
        data = digits()
        torch.manual_seed(0)
        model = DDP(MLP(data.info, hidden=128).to(device), device_ids=ids)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        half = None
    ckpt = Path(args.ckpt_dir) / "latest.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
    sync(device)
    say(event="loaded", step=start, rank=rank, incarnation=incarnation)
    n = len(data.train) if not args.manifest else 0
    for step in range(start, args.steps):
        if incarnation == 0 and rank == args.kill_rank and step == args.kill_step:
            say(event="kill", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=half) if half is not None else contextlib.nullcontext():
            if args.manifest:
                x, y = job.batch(step, rank, world)
                loss = job.loss(x.to(device), y.to(device), model)
            else:
                g = torch.Generator().manual_seed(step // (n // (args.batch * world)))
                perm = torch.randperm(n, generator=g)
                offset = (step % (n // (args.batch * world))) * args.batch * world + rank * args.batch
                idx = perm[offset:offset + args.batch]
                loss = F.cross_entropy(model(data.train.x[idx].to(device)), data.train.y[idx].to(device))
        loss.backward()
        opt.step()
        if step == start:
            sync(device)
            say(event="first_step", step=step + 1, rank=rank, incarnation=incarnation)
        if rank == 0 and (step + 1) % args.every == 0:
            t0 = time.time()
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step + 1}, tmp)
            tmp.replace(ckpt)
            say(event="saved", step=step + 1, seconds=time.time() - t0, rank=rank, incarnation=incarnation)
    dist.barrier()
    os._exit(0)


def sync(device: torch.device) -> None:
    """Wait for the GPU's queued work, so a timestamp taken next is when the work was done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()

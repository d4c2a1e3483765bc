"""Baseline worker for bench/recovery.py: torchft's fault-tolerant DDP, one replica group per process.

torchft (PyPI ``torchft`` 0.2.0, with its Rust lighthouse in the wheel) keeps
training on the replicas that are left: a Manager per replica group asks the
lighthouse for a quorum every step, allreduces over the quorum's members only,
and commits a step only if every member's allreduce succeeded. A restarted
replica joins the next quorum and heals: it fetches the live state from a peer
(HTTP checkpoint transport) before its first step. Here each replica group is
one process (a Cohort worker's unit), training the same MLP on the same digits
data as the other systems; the supervisor in bench/recovery.py restarts the
killed replica, as torchft leaves that to the scheduler.

Events go to stdout as JSON lines with wall-clock times: process start (before
torch is imported), imports done, the manager constructed, the state loaded
from a peer (restarted replica), and every step with its quorum's size.
"""

from __future__ import annotations

import json
import os
import time

START = time.time()

import argparse  # noqa: E402
import signal  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo  # noqa: E402

from cohort.trainer.workloads.datasets import digits  # noqa: E402
from cohort.trainer.workloads.models import MLP  # noqa: E402

try:
    from bench import job_workload
except ImportError:  # run as a script: bench/ is not a package on the path
    import job_workload  # type: ignore[no-redef]

IMPORTED = time.time()


def say(**kv: object) -> None:
    print(json.dumps({"t": time.time(), **kv}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--incarnation", type=int, default=0)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--store-port", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--kill-step", type=int, default=-1, help="-1: never (something else kills the replicas)")
    ap.add_argument("--manifest", default="", help="train this TrainingJob's workload instead of the MLP on digits")
    ap.add_argument("--kill-replica", type=int, default=2)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    me = {"replica": args.replica, "incarnation": args.incarnation}
    print(json.dumps({"t": START, "event": "start", **me}), flush=True)
    print(json.dumps({"t": IMPORTED, "event": "imported", **me}), flush=True)
    job = job_workload.load(args.manifest) if args.manifest else None
    if job is not None:
        module = job.model
        inner = job.optimizer(module.parameters())
    else:
        data = digits()
        torch.manual_seed(0)
        module = MLP(data.info, hidden=128)
        inner = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)

    def load_state_dict(state: dict) -> None:
        module.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        say(event="loaded", **me)

    def state_dict() -> dict:
        return {"model": module.state_dict(), "optim": inner.state_dict()}

    # The replica group's own store (a group of one process here).
    # The Manager connects to it by address; this object must live as long as the process (it is the server).
    store = dist.TCPStore("127.0.0.1", args.store_port, 1, is_master=True, timeout=timedelta(seconds=60))
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), load_state_dict=load_state_dict,
                      state_dict=state_dict, min_replica_size=args.replicas - 1, use_async_quorum=False,
                      store_addr="127.0.0.1", store_port=args.store_port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, replica_id=f"replica_{args.replica}",
                      timeout=timedelta(seconds=10))
    say(event="manager", **me)
    model = DistributedDataParallel(manager, module)
    optimizer = Optimizer(manager, inner)
    n = len(data.train) if job is None else 0
    while manager.current_step() < args.steps:
        step = manager.current_step()
        if args.incarnation == 0 and args.replica == args.kill_replica and step == args.kill_step:
            say(event="kill", step=step, **me)
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()  # the quorum (and, for a restarted replica, the heal) happens here
        before = manager.current_step()
        world, rank = manager.num_participants(), manager.participating_rank() or 0
        if job is not None:
            x, y = job.batch(step, rank, world)
            job.loss(x, y, model).backward()
        else:
            per_epoch = max(1, n // (args.batch * world))
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(step // per_epoch))
            offset = (step % per_epoch) * args.batch * world + rank * args.batch
            idx = perm[offset:offset + args.batch]
            F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
        optimizer.step()
        done = manager.current_step()  # steps committed so far (a healed replica jumped to its peers' count)
        say(event="step", step=done, committed=done > before, participants=world, **me)
    say(event="done", step=manager.current_step(), store=bool(store), **me)
    os._exit(0)


if __name__ == "__main__":
    main()

"""Run inside a fresh network namespace: count each sync pair's bytes as Cohort and as the kernel do.

    unshare --net python trainer/tests/wire_probe.py OUT.json

Used by test_wire_bytes.py. Brings the namespace's loopback up and runs 4 gloo
ranks. Rank 0 reads the loopback's tx bytes (``/proc/net/dev``, which shows the
reader's namespace) only when the counter has stopped moving, so no message of
the previous phase is still on its way.

1. Calibration: bare ``all_reduce``, ``all_gather_into_tensor`` and
   ``all_to_all_single`` calls, and ``isend`` messages around a ring, of four
   sizes (SIZES) give the kernel's bytes per call beyond the payload's formula
   (TCP/IP headers, ACKs, gloo's headers): a fixed cost per call, per kind, the
   median over the sizes.
2. Each pair trains an MLP (hidden 1024) with the real Sync for WARM steps,
   then MEASURED steps inside the window (gossip settles its links at the end
   of both, so no message crosses the window's edge). Written per pair:
   Cohort's count (mean over ranks), the kernel's divided by the ranks, and the
   calls made of each kind (counted by wrapping torch.distributed's functions;
   the mean over ranks, since gossip's ranks need not send equally often).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

WORLD, WARM, MEASURED, HIDDEN = 4, 4, 6, 1024
# (sync, method, collective): "-" where the collective field does not apply.
# The pairs whose collectives all go through torch.distributed's Python functions (so they can be
# counted here): dense allreduce runs in DDP's C++ reducer (see the test).
PAIRS = [("allreduce", "fp16", "-"), ("allreduce", "powersgd", "-"), ("allreduce", "topk", "allgather"),
         ("allreduce", "topk", "sparse"), ("allreduce", "topk", "cyclic"), ("allreduce", "topk", "global"),
         ("allreduce", "qsgd", "-"), ("allreduce", "terngrad", "-"),
         ("allreduce", "signsgd", "-"), ("allreduce", "dgc", "-"), ("allreduce", "threshold", "-"),
         ("allreduce", "natural", "-"), ("allreduce", "onebit", "-"), ("allreduce", "signum", "-"),
         ("allreduce", "fp8", "-"), ("localsgd", "none", "-"), ("localsgd", "fp16", "-"), ("localsgd", "fp8", "-"),
         ("gossip", "none", "-"), ("gossip", "qsgd", "-")]
LOCALSGD_PERIOD, LOCALSGD_WARMUP = 2, 2  # so the measured steps hold both local steps and averaging rounds
KINDS = ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast", "isend", "barrier")
# Calibration sizes, bytes per rank: the pairs' calls range from the sparse collective's 16-byte headers to
# whole buckets. The fixed cost is flat from 64 B to 4 KB; at 64 KB an all-to-all costs about 250 B more
# (1,273 against 1,008-1,022 B per call, measured), so the median over the range is the estimate: the mean
# of 4 and 64 KB that was used before over-counted the sparse collective's 18 small all-to-alls by 2-3 %.
SIZES = (64, 512, 4096, 65536)


def _probe(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from bench.netcount import quiet_tx_bytes
    from gloo_ranks import job_spec

    from cohort.trainer.sync.base import CommStats, SyncContext
    from cohort.trainer.sync.registry import SYNCS
    from cohort.trainer.workloads.models import MLP, DataInfo

    calls = dict.fromkeys(KINDS, 0)
    for kind in KINDS:  # count the calls the code under test makes, by kind
        def counted(*args, _real=getattr(dist, kind), _kind=kind, **kwargs):
            group = kwargs.get("group")
            if group is None or dist.get_world_size(group) > 1:  # a one-rank group's call sends nothing
                calls[_kind] += 1
            return _real(*args, **kwargs)
        setattr(dist, kind, counted)

    def window(body: Any, *args: Any) -> tuple[float, dict[str, int]]:
        """Kernel bytes per rank of body(*args) (plus one barrier), and the calls it made."""
        dist.barrier()
        before = quiet_tx_bytes() if rank == 0 else 0
        dist.barrier()
        start = dict(calls)
        body(*args)
        made = {k: calls[k] - start[k] for k in KINDS}
        dist.barrier()
        after = quiet_tx_bytes() if rank == 0 else 0
        total = torch.tensor([after - before], dtype=torch.float64)
        dist.broadcast(total, 0)
        by_rank: list[Any] = [None] * world
        dist.all_gather_object(by_rank, made)  # after the window: its own calls are not in `made`
        return float(total) / world, {k: statistics.mean(m[k] for m in by_rank) for k in KINDS}

    def bare(kind: str, nbytes: int, reps: int) -> None:
        if kind == "all_reduce":
            t = torch.zeros(nbytes // 4)
            for _ in range(reps):
                dist.all_reduce(t)
        elif kind == "all_gather_into_tensor":
            p, gathered = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(world * nbytes, dtype=torch.uint8)
            for _ in range(reps):
                dist.all_gather_into_tensor(gathered, p)
        elif kind == "all_to_all_single":  # nbytes to every rank, itself included (a local copy)
            p, gathered = torch.zeros(world * nbytes, dtype=torch.uint8), torch.empty(world * nbytes, dtype=torch.uint8)
            for _ in range(reps):
                dist.all_to_all_single(gathered, p)
        elif kind == "broadcast":  # nbytes from rank 0 to every other rank
            p = torch.zeros(nbytes, dtype=torch.uint8)
            for _ in range(reps):
                dist.broadcast(p, 0)
        else:  # isend: nbytes to the next rank around a ring, as gossip's messages go
            p, got = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
            for _ in range(reps):
                sending = dist.isend(p, dst=(rank + 1) % world)
                dist.recv(got, src=(rank - 1) % world)
                sending.wait()

    # 1. The fixed cost per call of each kind: the kernel's bytes beyond the formula.
    empty, _ = window(lambda: None)  # one barrier
    per_call = {"barrier": empty}
    # The payload each rank sends, written here and not taken from the code under test.
    formulas = {"all_reduce": lambda b: 2 * (world - 1) * b // world,   # ring: reduce-scatter + allgather
                "all_gather_into_tensor": lambda b: (world - 1) * b,    # ring: P-1 hops of its block
                "all_to_all_single": lambda b: (world - 1) * b,         # b to every other rank
                "broadcast": lambda b: (world - 1) * b / world,         # every rank but the root gets b once
                "isend": lambda b: b}                                   # one message
    by_size: dict[str, dict[int, float]] = {}
    for kind, formula in formulas.items():
        reps, fixed = 10, []
        by_size[kind] = {}
        for nbytes in SIZES:
            kernel, _ = window(bare, kind, nbytes, reps)
            fixed.append((kernel - empty) / reps - formula(nbytes))
            by_size[kind][nbytes] = fixed[-1]
        per_call[kind] = statistics.median(fixed)

    def train(module: Any, sync: Any, opt: Any, g: Any, first: int, count: int, settle: bool) -> None:
        for i in range(first, first + count):
            opt.zero_grad()
            x, y = torch.rand(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
            F.cross_entropy(module(x), y).backward()
            opt.step()
            sync.after_step(module, i + 1)
        if settle:
            sync.settle(module)  # gossip: nothing in flight past here

    # 2. The pairs.
    out = {}
    for sync_name, method, collective in PAIRS:
        extra = {} if collective == "-" else {"collective": collective}
        ctx = SyncContext(rank, world, job_spec(sync=sync_name, method=method, period=LOCALSGD_PERIOD,
                                                warmup=LOCALSGD_WARMUP, **extra), CommStats())
        sync = SYNCS[sync_name](ctx)
        torch.manual_seed(0)
        model = MLP(DataInfo((1, 8, 8), num_classes=10), hidden=HIDDEN)
        module = sync.wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        settle = sync_name == "gossip"
        train(module, sync, opt, g, 0, WARM, settle)
        before = ctx.stats.bytes_sent
        kernel, made = window(train, module, sync, opt, g, WARM, MEASURED, settle)
        cohort = ctx.stats.bytes_sent - before
        counted_by_rank: list[Any] = [None] * world
        dist.all_gather_object(counted_by_rank, cohort)
        out[f"{sync_name}:{method}:{collective}"] = {
            "cohort": statistics.mean(counted_by_rank), "kernel": kernel - empty, "calls": made}
    return {"per_call": per_call, "by_size": by_size, "pairs": out}


def main() -> int:
    up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if up.returncode != 0:
        print(f"cannot bring up the namespace's loopback: {up.stderr.strip()}", file=sys.stderr)
        return 1
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gloo_ranks import run_ranks

    Path(sys.argv[1]).write_text(json.dumps(run_ranks(_probe, WORLD, timeout_s=400)[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

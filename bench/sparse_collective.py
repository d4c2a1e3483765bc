"""Top-k's four collectives, and a dense allreduce, counted by the kernel (a benchmark, needs root).

    sudo python bench/sparse_collective.py [--workload digits|gpt] [--worlds 2,4,8] [--hidden 2048]
                                           [--ratio 0.01] [--steps 20]

For each world size P, P gloo ranks run in a network namespace of their own,
whose loopback carries nothing else, so its tx_bytes counter is exactly what
they sent (TCP/IP headers and ACKs included). The ranks first train a
workload for ``--steps`` steps with top-k (``--ratio``) and error feedback
summed by the sparse allreduce, keeping each step's selection and dense
gradient. The workload is an example's model, data, batch size and optimizer
(at its base lr, no warmup): ``digits`` is examples/digits.yaml with the MLP
``--hidden`` wide, ``gpt`` is examples/gpt-text.yaml (a 4-layer GPT on the
standard library's source). Then, between barriers, they replay those steps' traffic
five ways: a dense ring allreduce of the gradient, an allgather of the top-k
payloads (Cohort's ``collective: allgather``), the sparse allreduce
(``collective: sparse``), CLT-k (``collective: cyclic``: the cycling
leader's top-k indices broadcast, the k values allreduced; its bytes do not
depend on the values) and global top-k (``collective: global``: the sparse
reduce-scatter, then each rank's ceil(k/P) largest sums allgathered; its
phase 1 depends on how the selections spread over the ranks' shares, not on
their overlap); and a loop of barriers alone, subtracted from each.
Each replay runs ``--repeats`` times: the table gives the median and the range.

Per rank and step = the namespace's tx bytes / P / steps (the mean over
ranks). Cohort's own count (what ``cohort_bytes_sent_total`` adds up) is shown
beside, also as the mean over ranks; the busiest rank's is in the last column. "union / Pk" is how much the ranks' selections overlap: 1/P when all
ranks pick the same entries, 1 when they are disjoint (its mean over the steps,
and over the last 5, since error feedback decorrelates the ranks' selections as
training goes on). The sparse allreduce's phase 2 sends (P-1) times its merged
range, so this number decides how its bytes grow with P.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.netcount import lo_tx_bytes  # noqa: E402

EXAMPLES = {"digits": "examples/digits.yaml", "gpt": "examples/gpt-text.yaml"}


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist

    from cohort.api.jobconfig import load_manifest
    from cohort.trainer.compression.base import kept
    from cohort.trainer.compression.cyclic_topk import cyclic_wire_bytes, leaders_indices
    from cohort.trainer.compression.error_feedback import ErrorFeedback
    from cohort.trainer.compression.global_topk import global_topk_allreduce
    from cohort.trainer.compression.sparse_allreduce import sparse_allreduce
    from cohort.trainer.compression.sparsify import TopK, TopKConfig
    from cohort.trainer.optim import build_optimizer
    from cohort.trainer.runtime.exit import exit_process
    from cohort.trainer.sync.base import allgather_bytes, ring_allreduce_bytes
    from cohort.trainer.workloads.workload import build_workload

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    spec = load_manifest(REPO / EXAMPLES[args.workload]).spec
    if args.workload == "digits":
        spec.workload.model_args["hidden"] = args.hidden
    work = build_workload(spec, seed=0)
    model, data, batch = work.model, work.data, spec.workload.batch_size
    params = list(model.parameters())
    opt = build_optimizer(params, spec.workload.optimizer)
    n = sum(p.numel() for p in params)
    topk, ef = TopK(TopKConfig(ratio=args.ratio)), ErrorFeedback()
    k = kept(n, args.ratio)
    steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    unions, cohort_sparse = [], []
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x_in, y_in = data.train.fetch(torch.randint(len(data.train), (batch,), generator=g))
        model.zero_grad()
        work.loss_fn(model(x_in), y_in).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in params])
        x = ef.compensate("all", grad)
        sel = topk.select(x)
        vals = x[sel]
        ef.update("all", x, torch.zeros_like(x).index_put_((sel,), vals))
        done = sparse_allreduce(sel, vals, n, rank, world)
        cohort_sparse.append(done.wire_bytes)
        picked = torch.empty(world * k, dtype=torch.int64)
        dist.all_gather_into_tensor(picked, sel.to(torch.int64))
        unions.append(picked.unique().numel() / (world * k))
        update = done.total / world
        offset = 0
        for p in params:
            p.grad.copy_(update[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        steps.append((sel, vals, grad))

    def dense() -> None:
        for _, _, grad in steps:
            dist.all_reduce(grad.clone())

    def allgather() -> None:
        for sel, vals, _ in steps:
            payload = topk.encode(torch.zeros(n).index_put_((sel,), vals), 0)
            gathered = torch.empty(world * payload.numel(), dtype=torch.uint8)
            dist.all_gather_into_tensor(gathered, payload)

    def sparse() -> None:
        for sel, vals, _ in steps:
            sparse_allreduce(sel, vals, n, rank, world)

    def cyclic() -> None:  # its bytes do not depend on the values: each step's gradient stands in for them
        for step, (_, _, grad) in enumerate(steps):
            chosen = leaders_indices(grad, topk.select, k, step % world, rank)
            dist.all_reduce(grad[chosen])

    cohort_global: list[int] = []

    def global_topk() -> None:
        for sel, vals, _ in steps:
            cohort_global.append(global_topk_allreduce(sel, vals, n, k, rank, world).wire_bytes)

    def barriers() -> None:
        pass

    loops = {"barriers": barriers, "dense": dense, "allgather": allgather, "sparse": sparse, "cyclic": cyclic,
             "global": global_topk}
    kernel: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.repeats):
        for name, loop in loops.items():
            dist.barrier()
            before = lo_tx_bytes()
            loop()
            dist.barrier()
            kernel[name].append(lo_tx_bytes() - before)
    counted = torch.empty(world, dtype=torch.float64)  # every rank's own count: the shares differ
    dist.all_gather_into_tensor(counted, torch.tensor([statistics.mean(cohort_sparse)], dtype=torch.float64))
    counted_global = torch.empty(world, dtype=torch.float64)
    dist.all_gather_into_tensor(counted_global, torch.tensor([statistics.mean(cohort_global)], dtype=torch.float64))
    if rank == 0:
        cohort = {"dense": ring_allreduce_bytes(4 * n, world), "allgather": allgather_bytes(8 * k, world),
                  "sparse": float(counted.mean()), "sparse_max": float(counted.max()),
                  "cyclic": cyclic_wire_bytes(k, world), "global": float(counted_global.mean())}
        Path(out).write_text(json.dumps({"n": n, "k": k, "kernel": kernel, "cohort": cohort,
                                         "union": unions, "steps": args.steps}))
    dist.destroy_process_group()
    exit_process(0)


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def run_world(world: int, args: argparse.Namespace) -> dict[str, Any]:
    """P ranks in a fresh network namespace (only its loopback), this script's --worker mode."""
    ns = f"cohort-sparse-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if made.returncode != 0:
        raise PermissionError(f"`ip netns add {ns}` failed ({made.returncode}): {made.stderr.strip()}")
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, capture_output=True, text=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "--worker", "--world", str(world),
                   "--workload", args.workload, "--hidden", str(args.hidden), "--ratio", str(args.ratio), "--steps", str(args.steps),
                   "--repeats", str(args.repeats), "--out", out.name]
            subprocess.run(cmd, check=True)
            return json.loads(Path(out.name).read_text())
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(EXAMPLES), default="digits")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import torch.multiprocessing as mp
        mp.start_processes(worker, args=(args.world, 29650, args, args.out), nprocs=args.world, start_method="spawn")
        return 0
    started, load = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]
    rows = {}
    for world in (int(w) for w in args.worlds.split(",")):
        print(f"  [{time.strftime('%H:%M:%S')}] P = {world}", file=sys.stderr, flush=True)
        try:
            rows[world] = run_world(world, args)
        except PermissionError as e:  # as bench/comm.py: say why nothing was measured
            print(f"Not measured: the kernel refused the network namespace (run as root):\n\n    {e}")
            return 0
        except subprocess.CalledProcessError as e:
            print(f"P = {world} not measured: `{' '.join(e.cmd)}` failed ({e.returncode}): {e.stderr or ''}")
            return 1
    first = next(iter(rows.values()))
    print(f"## Top-k collectives, bytes per rank per step as the kernel counts them ({started}, "
          f"{os.cpu_count()} CPU cores, load average {load:.1f} at start)\n")
    model = f"digits MLP hidden {args.hidden}" if args.workload == "digits" else "GPT of examples/gpt-text.yaml"
    print(f"{model}: n = {first['n']:,} parameters, top-{args.ratio:g} k = {first['k']:,}; "
          f"{args.steps} steps, {args.repeats} repeats (median, [min-max]); barriers-only loop subtracted.\n")
    per = {world: {name: median_range([(b - a) / world / r["steps"] for a, b in
                                 zip(r["kernel"]["barriers"], r["kernel"][name], strict=True)])
                   for name in ("dense", "allgather", "sparse", "cyclic", "global")} for world, r in rows.items()}

    def cell(world: int, name: str) -> str:
        m, lo, hi = per[world][name]
        return f"{m:,.0f} [{lo:,.0f}-{hi:,.0f}] ({rows[world]['cohort'][name]:,.0f})"

    first_p = next(iter(rows))
    print("| P | dense allreduce: kernel (Cohort) | allgather: kernel (Cohort) | sparse: kernel (Cohort) "
          "| sparse / allgather | sparse / its P=2 | union / Pk: mean [min-max] over steps, last 5 steps "
          "| sparse, busiest rank (Cohort) |")
    print("|---|---|---|---|---|---|---|---|")
    for world, r in rows.items():
        u = r["union"]
        print(f"| {world} | {cell(world, 'dense')} | {cell(world, 'allgather')} | {cell(world, 'sparse')} | "
              f"{per[world]['sparse'][0] / per[world]['allgather'][0]:.2f}x | "
              f"{per[world]['sparse'][0] / per[first_p]['sparse'][0]:.2f}x | "
              f"{statistics.mean(u):.2f} [{min(u):.2f}-{max(u):.2f}], {statistics.mean(u[-5:]):.2f} | "
              f"{r['cohort']['sparse_max']:,.0f} |")
    def ratios_table(name: str, intro: str, second: str, digits: int) -> None:
        """One collective's kernel bytes, and its ratio to the allgather, to ``second`` and to its own P = 2."""
        print(f"\n{intro}\n")
        print(f"| P | {name}: kernel (Cohort) | {name} / allgather | {name} / {second} | {name} / its P=2 |")
        print("|---|---|---|---|---|")
        for world in rows:
            c = per[world][name][0]
            print(f"| {world} | {cell(world, name)} | {c / per[world]['allgather'][0]:.2f}x | "
                  f"{c / per[world][second][0]:.{digits}f}x | {c / per[first_p][name][0]:.2f}x |")

    ratios_table("cyclic", "The cyclic collective (CLT-k: the cycling leader's top-k indices broadcast, the values "
                 "allreduced) on the same steps; its bytes do not depend on the ranks' overlap.", "sparse", 2)
    ratios_table("global", "The global collective (the sparse reduce-scatter, then each rank's ceil(k/P) largest "
                 "sums allgathered) on the same steps.", "dense", 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())

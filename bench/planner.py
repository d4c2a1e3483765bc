"""Planner: predicted against measured step time, and the allreduce α-β fit (a benchmark, not a test).

    python bench/planner.py [--ranks 4] [--steps 8] [--dim 256] [--layers 4] [--batch 32]

1. Calibrates this machine in the same invocation (``cohort calibrate``'s
   measurements: allreduce time against message size for P = 2 and 4, matmul
   throughput alone and shared, memory bandwidth).
2. Prints the allreduce fit: per P (α, β and error of a straight line), and
   each allreduce model of Ben-Nun & Hoefler §2.4 fitted jointly over P, best
   first: the one whose P-dependence matches the backend's curve.
3. Runs every feasible plan the planner enumerates for the model on ``--ranks``
   local ranks (same model, same global batch, real Cohort plans: DDP, FSDP2,
   DTensor TP, pipelining; ``--max-plans N`` measures a seeded random sample of
   N instead, always with the planner's choice and DDP), measures the median
   step time, and prints predicted against measured, the Spearman rank
   correlation with a bootstrap 95 % interval over the plans (target >= 0.8)
   and whether the planner's first choice is within 15% of the best measured
   plan. The baseline row is data parallelism (DDP) on all ranks.

The evaluated model's block (default dim 192, 6 heads) is not the block whose
throughput the calibration times (``calibrate.BLOCK``: dim 256, 4 heads): the
planner has to carry its table to a shape it did not see.

``--nccl`` runs only the allreduce part on the GPUs of this machine.
"""

from __future__ import annotations

import argparse
import datetime
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.stats import bootstrap, host, spearman  # noqa: E402


def _spec(args: argparse.Namespace) -> Any:
    from cohort.api.jobconfig import from_manifest

    manifest = {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "bench"},
                "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm", "epochs": 0, "maxSteps": 1,
                                      "batchSize": args.batch // args.ranks,
                                      "modelArgs": {"dim": args.dim, "n_layers": args.layers, "n_heads": args.heads},
                                      "optimizer": {"name": "adamw", "lr": 0.001}}}}
    return from_manifest(manifest).spec


def _step_worker(rank: int, world: int, port: int, args: argparse.Namespace, plans: list, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from cohort.trainer.parallel.base import PlanContext
    from cohort.trainer.parallel.data import DataParallel
    from cohort.trainer.parallel.sharded import MeshPlan
    from cohort.trainer.runtime.exit import exit_process
    from cohort.trainer.sync.base import CommStats
    from cohort.trainer.workloads.workload import build_workload

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    spec = _spec(args)
    workload = build_workload(spec)
    data = workload.data
    runs = []
    for dims in plans:
        model = build_workload(spec).model
        ctx = PlanContext(spec, rank, world, CommStats())
        plan = DataParallel(ctx) if dims.dp_mode == "ddp" else MeshPlan(ctx, dims, batch_size=args.batch // dims.dp)
        plan.apply(model)
        runs.append((plan, torch.optim.AdamW(model.parameters(), lr=1e-3)))
    times: list[list[float]] = [[] for _ in plans]
    # Round-robin over the plans, a few steps each per round: load from other processes on a shared
    # machine then lands on every plan alike instead of on whichever ran during a busy minute.
    for _round in range(args.rounds):
        for i, (plan, opt) in enumerate(runs):
            b = args.batch // plan.dp_size
            for step in range(args.warmup + args.steps):
                idx = torch.arange(plan.dp_rank * b, (plan.dp_rank + 1) * b) + step * args.batch
                dist.barrier()
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = plan.forward_backward(data.train.x[idx], data.train.y[idx], workload.loss_fn)
                opt.step()
                float(loss)
                # A step ends when the slowest rank ends.
                t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if step >= args.warmup:
                    times[i].append(float(t))
    if rank == 0:
        out.put([statistics.median(t) for t in times])
    dist.destroy_process_group()
    exit_process(0)


def measure_plans(args: argparse.Namespace, plans: list) -> list[float]:
    import torch.multiprocessing as mp

    from cohort.trainer.runtime.ports import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_step_worker, args=(args.ranks, free_port(), args, plans, out), nprocs=args.ranks,
                       start_method="spawn")
    return out.get()


def allreduce_tables(samples: list[tuple]) -> str:
    from cohort.trainer.planner.collectives import fit_all

    lines = ["Allreduce time against message size (median of 7, max over ranks):", "",
             "| bytes | " + " | ".join(f"P={p} ms" for p in sorted({s[1] for s in samples})) + " |",
             "|---:|" + "---:|" * len({s[1] for s in samples})]
    by = {(m, p): t for m, p, t in samples}
    for m in sorted({s[0] for s in samples}):
        lines.append(f"| {m} | " + " | ".join(f"{by[m, p] * 1e3:.3f}" for p in sorted({s[1] for s in samples}))
                     + " |")
    lines += ["", "Per P, a straight line t = a + b·m (what α and β mean at one P):", "",
              "| P | a (µs) | b (ns/B) → GB/s | rel. RMS error |", "|---:|---:|---:|---:|"]
    for p in sorted({s[1] for s in samples}):
        f = fit_all([s for s in samples if s[1] == p])
        # At one P every model is a rescaled line; report the ring fit's line.
        ring = next(x for x in f if x.algorithm == "ring")
        a, b = ring.alpha_s * 2 * (p - 1), ring.beta_s_per_byte * 2 * (p - 1) / p
        lines.append(f"| {p} | {a * 1e6:.1f} | {b * 1e9:.3f} → {1 / b / 1e9 if b else float('inf'):.2f} | "
                     f"{ring.rel_rms_error:.1%} |")
    lines += ["", "Each model fitted jointly over every P (one α, β for the link), best first:", "",
              "| model | α (µs) | β (ns/B) | rel. RMS error |", "|---|---:|---:|---:|"]
    for f in fit_all(samples):
        lines.append(f"| {f.algorithm} | {f.alpha_s * 1e6:.1f} | {f.beta_s_per_byte * 1e9:.3f} | "
                     f"{f.rel_rms_error:.1%} |")
    return "\n".join(lines)


def nccl_report(calibrate: Any) -> int:
    """The allreduce fit on NCCL (one rank per GPU), and the card's matmul throughput."""
    import torch

    if not torch.cuda.is_available():
        print("--nccl: no CUDA device here")
        return 1
    n, name = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    print(f"## NCCL on {n} x {name}\n")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for dtype in (torch.bfloat16, torch.float32):
        x = a.to(dtype)
        for _ in range(3):
            x @ x
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            x @ x
        torch.cuda.synchronize()
        print(f"matmul 8192^3 {dtype}: {2 * 8192 ** 3 * 10 / (time.perf_counter() - t0) / 1e12:.0f} TFLOP/s")
    ps = tuple(x for x in (2, 4, 8) if x <= n)
    if not ps:
        print(f"\nAn allreduce needs at least 2 ranks and NCCL one GPU per rank; this machine has {n}, "
              "so there is no NCCL allreduce curve to fit here.")
        return 0
    samples = [s for p in ps for s in calibrate.measure_allreduce(p)]
    print(allreduce_tables(samples))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="round-robin passes over the plans")
    p.add_argument("--steps", type=int, default=4, help="timed steps per plan per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per plan per round")
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="global batch (every plan trains the same one)")
    p.add_argument("--max-plans", type=int, default=0, help="measure a random sample of this many plans (0: all)")
    p.add_argument("--seed", type=int, default=0, help="the sample's and the bootstrap's seed")
    p.add_argument("--nccl", action="store_true", help="only the allreduce fit, on this machine's GPUs (NCCL)")
    args = p.parse_args()

    from cohort.trainer import calibrate
    from cohort.trainer.planner import format_table, rank_plans
    from cohort.trainer.profiling import profile_model
    from cohort.trainer.workloads.workload import build_workload

    print(f"# bench/planner.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"started {host()}")
    t0 = time.time()
    if args.nccl:
        return nccl_report(calibrate)
    hw, raw = calibrate.calibrate(ps=(2, args.ranks), log=lambda _msg: None)
    alone, shared = raw["flops_alone"], raw["flops_shared"][str(args.ranks)]
    print("## Calibration (`cohort calibrate`'s measurements, this run)\n")
    print(f"matmul {calibrate.MATMUL}: {alone / 1e9:.1f} GFLOP/s alone, {shared / 1e9:.1f} GFLOP/s per rank with "
          f"{args.ranks} ranks at once; memory {hw.memory_bandwidth / 1e9:.1f} GB/s\n")
    print(allreduce_tables(raw["allreduce_samples"]))
    print(f"\nFixed costs: {hw.layer_overhead_s * 1e6:.0f} µs per block forward+backward, "
          f"{hw.tp_layer_overhead_s * 1e6:.0f} µs under DTensor TP, {hw.fsdp_unit_overhead_s * 1e6:.0f} µs per FSDP "
          f"unit, {hw.microbatch_overhead_s * 1e6:.0f} µs per pipeline microbatch. "
          + (f"Shared host: {hw.host_flops / 1e9:.0f} GFLOP/s for all ranks." if hw.host_flops else
             "Ranks do not slow each other's matmuls (no shared-host bound)."))
    print("\nThe planner uses the measured line of each collective and P (m: the full tensor's bytes"
          + (f"; taken with all {args.ranks} ranks busy" if hw.host_flops else "") + "):\n")
    print("| collective | P | a (µs) | b (ns/B) |\n|---|---:|---:|---:|")
    for op, p_, a, b in hw.lines:
        print(f"| {op} | {p_} | {a * 1e6:.1f} | {b * 1e9:.3f} |")
    b = calibrate.BLOCK
    print(f"\nTransformer block (calibration shape: dim {b['dim']}, {b['n_heads']} heads, ffn x{b['ffn_mult']}, "
          f"seq {b['seq']}) forward+backward against its FLOPs:\n")
    print("| GFLOP per call | ms | GFLOP/s |\n|---:|---:|---:|")
    for f, t in hw.block_table:
        print(f"| {f / 1e9:.3f} | {t * 1e3:.2f} | {f / t / 1e9:.1f} |")

    spec = _spec(args)
    model = build_workload(spec).model
    profile = profile_model(model)
    ranked = [c for c in rank_plans(args.ranks, profile, hw, args.batch, "adamw") if not c.rejected]
    chosen = ranked
    sampled = ""
    if 0 < args.max_plans < len(ranked):
        keep = {0} | {i for i, c in enumerate(ranked) if c.dims.dp_mode == "ddp" and c.dims.dp == args.ranks}
        rest = [i for i in range(len(ranked)) if i not in keep]
        keep |= set(random.Random(args.seed).sample(rest, max(0, args.max_plans - len(keep))))
        chosen = [ranked[i] for i in sorted(keep)]
        sampled = f" (a random sample, seed {args.seed}, of the {len(ranked)} feasible plans)"
    same = (args.dim, args.heads) == (b["dim"], b["n_heads"])
    print(f"\n## Plans for {profile.name} (dim {args.dim}, {args.heads} heads, {args.layers} layers), global batch "
          f"{args.batch}, {args.ranks} ranks: {len(chosen)} of {len(ranked)} feasible plans{sampled}\n")
    if same:
        print("**Note: the evaluated block has the calibration's shape; the correlation below flatters the "
              "planner.**\n")
    print("Planner's ranking (predicted, this machine's calibration):\n")
    print("```\n" + format_table(chosen) + "\n```")
    measured = measure_plans(args, [c.dims for c in chosen])
    baseline = next(m for c, m in zip(chosen, measured, strict=True)
                    if c.dims.dp_mode == "ddp" and c.dims.dp == args.ranks)
    print(f"\nPredicted against measured (median of {args.rounds} rounds x {args.steps} steps, round-robin; "
          "ratio = measured / measured DDP baseline):\n")
    print("| planner rank | plan | predicted ms | measured ms | measured rank | vs DDP baseline |")
    print("|---:|---|---:|---:|---:|---:|")
    order = sorted(range(len(measured)), key=lambda i: measured[i])
    for i, (c, m) in enumerate(zip(chosen, measured, strict=True)):
        print(f"| {i + 1} | {c.dims.describe()} | {c.time.total * 1e3:.1f} | {m * 1e3:.1f} | "
              f"{order.index(i) + 1} | {m / baseline:.2f}x |")
    predicted = [c.time.total for c in chosen]
    rho = spearman(predicted, measured)
    low, high = bootstrap(lambda idx: spearman([predicted[i] for i in idx], [measured[i] for i in idx]),
                          len(chosen), seed=args.seed)
    best = min(measured)
    top = measured[0]
    print(f"\nSpearman rank correlation (predicted vs measured, {len(chosen)} plans): {rho:.3f}, bootstrap 95 % "
          f"interval over the plans [{low:.3f}, {high:.3f}] (2000 resamples; target >= 0.8)")
    print(f"Planner's choice ({chosen[0].dims.describe()}) measured {top * 1e3:.1f} ms; best measured "
          f"{chosen[order[0]].dims.describe()} {best * 1e3:.1f} ms: {top / best - 1:+.1%} "
          f"({'within' if top <= 1.15 * best else 'NOT within'} 15%)")
    print(f"\n(total {time.time() - t0:.0f} s; ended {host()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

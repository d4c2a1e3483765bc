"""Activation checkpointing's memory and time against none, counted by the kernel (a benchmark, not a test).

    python bench/activation_checkpointing.py [--dim 256] [--layers 6] [--heads 8] [--seq 256] [--batch 8]
                                             [--steps 5] [--rounds 3]

Each round starts one fresh process per mode (none, full, selective; the order rotates from round to round).
The process builds the built-in transformer (workloads/models.py) with the given size and a vocabulary of
1024, checkpoints its blocks the trainer's way (``apply_activation_checkpointing``), and trains it with AdamW on
random tokens: one step to warm up, then ``--steps`` timed steps. It reports its peak resident set
(``ru_maxrss``, the kernel's count) and its resident set before the first step (``VmRSS``): the peak less that
is what training added (gradients, AdamW's two moments, activations, the allocator's slack), and the modes
differ only in the activations. Beside it, the planner's count of the activations alive at the peak of
backward (planner/memory.py, the same model and batch): its difference from none is what the kernel's
difference should be near. Time per step is the median of the timed steps; the table gives the median over
rounds and their [min-max].
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.stats import host, spread  # noqa: E402

MODES = ("none", "full", "selective")
VOCAB = 1024


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(args: argparse.Namespace) -> dict:
    import torch

    from cohort.trainer.parallel.activation_checkpoint import apply_activation_checkpointing
    from cohort.trainer.workloads.models import DataInfo, Transformer

    torch.manual_seed(0)
    info = DataInfo((args.seq,), vocab_size=VOCAB, seq_len=args.seq)
    model = apply_activation_checkpointing(
        Transformer(info, dim=args.dim, n_layers=args.layers, n_heads=args.heads), args.child)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq))
    before = rss_bytes()
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        out = model(tokens)
        torch.nn.functional.cross_entropy(out.flatten(0, 1), tokens.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        if step:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"before": before, "peak": peak, "step_s": statistics.median(times)}


def planned(args: argparse.Namespace, mode: str) -> float:
    from cohort.trainer.planner.dims import ParallelDims
    from cohort.trainer.planner.memory import activation_bytes
    from cohort.trainer.planner.profile import transformer_profile

    profile = transformer_profile(args.dim, args.layers, args.heads, 4, VOCAB, args.seq)
    return activation_bytes(profile, ParallelDims(ac=mode), 0, args.batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    passed = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("child", "rounds")]
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    print(f"transformer dim {args.dim}, {args.layers} blocks, {args.heads} heads, seq {args.seq}, batch {args.batch}, "
          f"AdamW; {args.rounds} rounds x 3 modes, {args.steps} timed steps each; {host()}", flush=True)
    for r in range(args.rounds):
        for mode in MODES[r % 3:] + MODES[:r % 3]:
            out = subprocess.run([sys.executable, __file__, f"--child={mode}", *passed], check=True,
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  round {r + 1} {mode}: {results[mode][-1]}", flush=True)
    mib = 2 ** 20

    def added(mode: str) -> list[float]:
        return [(x["peak"] - x["before"]) / mib for x in results[mode]]

    base_added, base_s = statistics.median(added("none")), statistics.median(x["step_s"] for x in results["none"])
    print("\n| mode | peak RSS MiB | added by training MiB | vs none MiB | planner's activations MiB (vs none) "
          "| s/step | vs none |\n|---|---|---|---|---|---|---|")
    for mode in MODES:
        peak = [x["peak"] / mib for x in results[mode]]
        step = [x["step_s"] for x in results[mode]]
        act, act0 = planned(args, mode) / mib, planned(args, "none") / mib
        print(f"| {mode} | {spread(peak, '.0f')} | {spread(added(mode), '.0f')} | "
              f"{statistics.median(added(mode)) - base_added:+.0f} | {act:.0f} ({act - act0:+.0f}) | "
              f"{spread(step, '.3f')} | {statistics.median(step) / base_s:.2f}x |")
    print(f"\nafter: {host()}")


if __name__ == "__main__":
    main()

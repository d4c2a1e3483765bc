"""What a world change costs a rank whose loader has worker processes: the first batch of the new world.

    python bench/loader_restart.py [--workers 2] [--rounds 5] [--changes 4] [--mib 0,200]

At a world change (and at each epoch's end, and after a checkpoint load) the
batches the loader's workers fetched ahead for the old order are useless, and
the rank waits for the first batch of the new order: that wait is on a
recovery's critical path. Three modes, each its own ``BatchLoader`` over the
same in-memory samples (``TensorPairs``; --mib 0 is the digits' size, 1797 x 64)
and the same world changes (4 ranks, 3, 4, ...: rank 1's share, batch 32),
interleaved in rotating order --rounds times, --changes world changes each:

- ``kept``: the loader as shipped: its worker processes are started once and
  kept; a world change resets what they prefetch (torch's persistent workers);
- ``new workers``: the loader closed at every world change, as it was before
  (its workers ended, new ones started from the fork server, the samples
  pickled to them again);
- ``in process``: ``dataLoaderWorkers: 0``, each batch fetched when it is needed.

Reported per mode: the first ``get`` of each new world, the other gets and
each world's 4 gets in all (median [min-max] in ms; the loop does nothing
between gets, so the workers cannot fetch far ahead), and the tasks (processes
and threads) the host created per world change, as the kernel counts them
(``processes`` in /proc/stat, every clone: the whole host's, so run it on a
quiet machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from cohort.trainer.loader import BatchLoader
from cohort.trainer.sampler import ElasticSampler
from cohort.trainer.workloads.splits import TensorPairs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.stats import host, spread  # noqa: E402

MODES = ("kept", "new workers", "in process")


def tasks_created() -> int:
    """Tasks (processes and threads) the kernel has created since boot (/proc/stat ``processes``)."""
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("processes "))


def one_round(mode: str, split: TensorPairs, workers: int, changes: int, seed: int) -> tuple[list, list, list, int]:
    """``changes`` world changes of 4 steps each: the first get of each new world, the other gets, each world's
    4 gets in all, and the tasks created."""
    sampler = ElasticSampler(len(split), batch_size=32, seed=seed)
    loader = BatchLoader(split, workers=0 if mode == "in process" else workers)
    first: list[float] = []
    rest: list[float] = []
    worlds: list[float] = []
    forked = 0
    for change in range(changes + 1):  # the first world only starts the loader
        world = 4 if change % 2 == 0 else 3
        if mode == "new workers":
            loader.close()
        before = tasks_created()
        for step in range(4):
            if sampler.offset + sampler.global_batch(world) > len(split):
                sampler.next_epoch()
            idx = sampler.indices(1, world)
            t = time.perf_counter()
            x, y = loader.get(idx, lambda w=world: sampler.upcoming(1, w))
            dt = time.perf_counter() - t
            if not torch.equal(y, idx):
                raise AssertionError(f"{mode}: a batch of the wrong indices")
            if change:
                (first if step == 0 else rest).append(dt)
            sampler.advance(world)
        if change:
            forked += tasks_created() - before
            worlds.append(sum(first[-1:] + rest[-3:]))
    loader.close()
    return first, rest, worlds, forked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="loader worker processes per rank")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--changes", type=int, default=4, help="world changes per round")
    ap.add_argument("--mib", default="0,200", help="sizes of the in-memory samples (0: the digits')")
    args = ap.parse_args()
    print(f"# bench/loader_restart.py --workers {args.workers} --rounds {args.rounds} --changes {args.changes} "
          f"--mib {args.mib}; torch {torch.__version__}; {host()}")
    print("| samples | mode | first get in a new world, ms | other gets, ms | a world's 4 gets in all, ms "
          "| tasks created per world change |")
    print("|---|---|---|---|---|---|")
    for mib in (int(m) for m in args.mib.split(",")):
        n, dim = (1797, 64) if mib == 0 else (max(1, mib * 2**20 // (3072 * 4)), 3072)
        split = TensorPairs(torch.randn(n, dim), torch.arange(n))
        got: dict[str, tuple[list, list, list, int]] = {m: ([], [], [], 0) for m in MODES}
        for r in range(args.rounds):
            for m in MODES[r % 3:] + MODES[:r % 3]:
                first, rest, worlds, forked = one_round(m, split, args.workers, args.changes, seed=r)
                a, b, c, d = got[m]
                got[m] = (a + first, b + rest, c + worlds, d + forked)
        for m in MODES:
            first, rest, worlds, forked = got[m]
            ms = [[v * 1e3 for v in vs] for vs in (first, rest, worlds)]
            print(f"| {n} x {dim} ({n * dim * 4 / 2**20:.0f} MiB) | {m} | {spread(ms[0], '.1f')} "
                  f"| {spread(ms[1], '.2f')} | {spread(ms[2], '.1f')} | {forked / len(first):.1f} |", flush=True)


if __name__ == "__main__":
    main()

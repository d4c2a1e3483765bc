"""Checkpoint stall: what periodic saves cost a training loop, async DCP against a synchronous torch.save.

    python bench/checkpoint_stall.py [--mib 200] [--every 5] [--steps 40] [--repeats 3]

The state is a model plus SGD momentum of about --mib MiB. Each run trains
--steps steps and saves every --every steps; one timer covers the whole loop,
saves and waits included. Three modes, interleaved in rotating order
--repeats times, on the same model, data and filesystem:

- ``none``: no checkpoint (the baseline);
- ``cohort``: ``Checkpointer(async_save=True)`` as the trainer ships it. ``save``
  first waits for the previous write (back-pressure: one save in flight), the
  next optimizer update waits for staging if it is still running, and the
  stager and writer threads share the CPU with training;
- ``torch.save``: the whole state written synchronously.

Reported per mode: the loop's extra seconds per save over ``none`` (the
headline: everything the saves cost, in one timer), the time ``save`` and
``before_update`` blocked, the median step time while a write is in flight
against while none is (the contention), the process's CPU seconds
(``time.process_time``: all threads) and the bytes it wrote as the kernel counts
them (``/proc/self/io`` ``write_bytes``). The last async write's drain after
the loop is reported apart. Target: Cohort's extra per save <= 0.1x torch.save's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from cohort.trainer.checkpoint import Checkpointer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.stats import host, t_interval  # noqa: E402

MODES = ("none", "cohort", "torch.save")


def build(mib: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, int(mib * 2**20 / 2 / (width * width * 4)))  # params + momentum = mib
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, opt


def written_bytes() -> int:
    """Bytes this process caused to be written to storage, as the kernel counts them."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def run(mode: str, model: nn.Module, opt: torch.optim.Optimizer, args: argparse.Namespace, d: Path,
        first_step: int) -> dict[str, float]:
    ck = Checkpointer(str(d / "dcp"), keep=2, async_save=True) if mode == "cohort" else None
    x = torch.randn(16, 2048, generator=torch.Generator().manual_seed(0))
    blocked, busy, idle, saves = 0.0, [], [], 0
    cpu0, io0 = time.process_time(), written_bytes()
    t0 = time.perf_counter()
    for i in range(args.steps):
        s0 = time.perf_counter()
        in_flight = ck is not None and not ck._done.is_set()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        if ck is not None:
            blocked += ck.before_update()
        opt.step()
        (busy if in_flight else idle).append(time.perf_counter() - s0)
        if (i + 1) % args.every == 0:
            saves += 1
            if mode == "cohort":
                assert ck is not None
                blocked += ck.save(first_step + i + 1, {"model": model.state_dict(), "optim": opt.state_dict()}, {})
            elif mode == "torch.save":
                b0 = time.perf_counter()
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, d / "sync.pt")
                blocked += time.perf_counter() - b0
    loop = time.perf_counter() - t0
    d0 = time.perf_counter()
    if ck is not None:
        ck.wait()
    drain = time.perf_counter() - d0
    return {"loop": loop, "drain": drain, "blocked": blocked / max(saves, 1), "saves": saves,
            "busy": statistics.median(busy) if busy else float("nan"),
            "idle": statistics.median(idle) if idle else float("nan"),
            "cpu": time.process_time() - cpu0, "written": written_bytes() - io0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = host()
    model, opt = build(args.mib)
    x = torch.randn(16, 2048)
    model(x).square().mean().backward()
    opt.step()  # momentum buffers exist: the state is its full size
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                       if torch.is_tensor(v))
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(dir=Path.home() / ".cache") as d:
        for r in range(args.repeats):
            order = MODES[r % 3:] + MODES[:r % 3]  # rotate, so no mode always runs first
            for mode in order:
                results[mode].append(run(mode, model, opt, args, Path(d), r * 10 * args.steps))
                res = results[mode][-1]
                print(f"repeat {r + 1}/{args.repeats} {mode}: loop {res['loop']:.2f} s", file=sys.stderr, flush=True)
    saves = int(results["none"][0]["saves"])
    print(f"state: {state_bytes / 2**20:.0f} MiB (model + SGD momentum); {args.steps} steps, a save every "
          f"{args.every} ({saves} saves) per run, {args.repeats} repeats; 1 torch thread; "
          f"started {started}; ended {host()}")
    print("| mode | loop (s) | extra per save vs none (s) | blocked per save (s) | step, write in flight (ms) "
          "| step, no write (ms) | CPU (s) | written, kernel (MiB) | drain after loop (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    extra: dict[str, list[float]] = {}
    for mode in MODES:
        rs = results[mode]
        extra[mode] = [(x["loop"] - b["loop"]) / saves for x, b in zip(rs, results["none"], strict=True)]
        mean, low, high = t_interval(extra[mode])
        cell = "—" if mode == "none" else f"{mean:.3f} [{low:.3f}, {high:.3f}]"

        def med(key: str, scale: float = 1.0, rs: list[dict[str, float]] = rs) -> str:
            values = [x[key] * scale for x in rs]
            return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"
        print(f"| {mode} | {med('loop')} | {cell} | {med('blocked')} | {med('busy', 1e3)} | {med('idle', 1e3)} "
              f"| {med('cpu')} | {statistics.median(x['written'] for x in rs) / 2**20:.0f} | {med('drain')} |")
    ratios = [c / s for c, s in zip(extra["cohort"], extra["torch.save"], strict=True)]
    print(f"Cohort's extra per save / torch.save's: **{statistics.median(ratios):.3f}** "
          f"(per repeat: {', '.join(f'{x:.3f}' for x in ratios)}); cells: median (min–max) over repeats, "
          "extra: mean [95 % t interval]")


if __name__ == "__main__":
    main()

"""Checkpoint stall: training time blocked per async DCP checkpoint vs a synchronous torch.save.

    python bench/checkpoint_stall.py [--mib 200] [--saves 5]

The state is a model plus SGD momentum of about --mib MiB in total. Both sides
save the same state to the same filesystem, in the same invocation, with a
few training steps between saves so every save sees new values. Cohort's
number is the time the training loop is blocked (Checkpointer.save returns
once the state is staged, and the next optimizer step waits for staging to
finish); the baseline is the whole torch.save. Target: <= 0.1x.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from cohort.trainer.checkpoint import Checkpointer


def build(mib: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, int(mib * 2**20 / 2 / (width * width * 4)))  # params + momentum = mib
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, opt


def step(model: nn.Module, opt: torch.optim.Optimizer, ck: Checkpointer | None = None) -> float:
    """One training step; returns seconds blocked waiting for checkpoint staging."""
    x = torch.randn(16, 2048)
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    blocked = ck.before_update() if ck is not None else 0.0
    opt.step()
    return blocked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--saves", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, opt = build(args.mib)
    step(model, opt)
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                       if torch.is_tensor(v))
    sync_s, stall_s, write_s = [], [], []
    with tempfile.TemporaryDirectory(dir=Path.home() / ".cache") as d:
        ck = Checkpointer(str(Path(d) / "dcp"), keep=2, async_save=True)
        for i in range(args.saves):
            for _ in range(3):
                step(model, opt)
            t0 = time.perf_counter()
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, Path(d) / "sync.pt")
            sync_s.append(time.perf_counter() - t0)

            for _ in range(3):
                step(model, opt)
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            t0 = time.perf_counter()
            blocked = ck.save(i + 1, state, {})
            blocked += step(model, opt, ck)  # the next update waits for staging, if it is still running
            stall_s.append(blocked)
            ck.wait()
            write_s.append(time.perf_counter() - t0)
    sync, stall = statistics.median(sync_s), statistics.median(stall_s)
    print(f"state: {state_bytes / 2**20:.0f} MiB (model + SGD momentum), {args.saves} saves each, medians")
    print("| method | training blocked per save (s) | total write (s) | blocked / torch.save |")
    print("|---|---|---|---|")
    print(f"| torch.save (synchronous) | {sync:.3f} | {sync:.3f} | 1.000 |")
    print(f"| Cohort async DCP | {stall:.3f} | {statistics.median(write_s):.3f} | **{stall / sync:.3f}** |")


if __name__ == "__main__":
    main()

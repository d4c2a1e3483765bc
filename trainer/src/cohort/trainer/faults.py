"""Fault injection for tests and demos (documented in docs/contracts.md §2).

``COHORT_FAULT_SLOW=rank=R,factor=F,step=S``: from step S on, the process that
holds rank R computes F times slower, for the rest of its life.
``COHORT_FAULT_KILL=rank=R,step=S``: at step S the process holding rank R
SIGKILLs itself; ``rank=all``: every process does (a whole job lost at once,
at a known step, as the kill-every-worker tests need).
``COHORT_FAULT_HANG=rank=R,step=S,seconds=T``: at step S the process holding rank R
stops for T seconds (default 30) without closing its connections, then SIGKILLs
itself: a peer lost silently, as on a lost node, or as a dead NCCL peer looks to
the others (their collective waits instead of raising).
``COHORT_FAULT_PAUSE=rank=R,step=S,seconds=T``: the same stop (default 10 s),
then the process goes on: a long pause of a live worker (a stalled read, a
host under load), which its peers' collective timeout takes for a lost peer,
a false alarm that the authority answers by re-forming the same members.
``COHORT_FAULT_FREEZE=rank=R,step=S``: at step S the process holding rank R
stops itself (SIGSTOP), every thread of it, until something kills it: a frozen
host, on which the kernel still accepts connections that nothing answers (a
rank 0's rendezvous store among them).
``COHORT_FAULT_PARTIAL=rank=R,step=S``: at step S the process holding rank R
behaves as if its gradients' allreduce failed after writing part of its
result, as NCCL's can: the first half of every gradient is overwritten and
the failure is reported to the commit gate (commit.py) instead of raising
in backward.
``COHORT_FAULT_OOM=rank=R,step=S,mb=M``: at step S the process holding rank R
allocates (and touches) memory in 64 MiB pieces, up to M MiB (default 4096),
so that a container memory limit below that gets it OOM-killed by the kernel;
if it is still alive at M MiB, it SIGKILLs itself.

A fault fires only in a process that was training before step S and reaches
step S for the first time: a newcomer that later takes rank R (a
replacement) is healthy, and the survivors of a kill, which replay step S in
the next world, do not fire it again.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .log import get_logger

log = get_logger(__name__)


EVERY_RANK = -2  # rank=all


def _parse(value: str, name: str) -> dict[str, float]:
    out = {}
    for part in filter(None, value.split(",")):
        key, sep, v = part.partition("=")
        if not sep:
            raise ValueError(f"{name}: expected key=value pairs, got {value!r}")
        key = key.strip()
        out[key] = EVERY_RANK if key == "rank" and v.strip() == "all" else float(v)
    return out


def _targets(fault_rank: int, rank: int) -> bool:
    return fault_rank in (rank, EVERY_RANK)


@dataclass
class Faults:
    slow_rank: int = -1
    slow_factor: float = 1.0
    slow_step: int = 0
    kill_rank: int = -1
    kill_step: int = 0
    hang_rank: int = -1
    hang_step: int = 0
    hang_seconds: float = 30.0
    pause_rank: int = -1
    pause_step: int = 0
    pause_seconds: float = 10.0
    freeze_rank: int = -1
    freeze_step: int = 0
    oom_rank: int = -1
    oom_step: int = 0
    oom_mb: int = 4096
    partial_rank: int = -1
    partial_step: int = 0
    first_step: int | None = None  # first step this process trained
    max_seen: int = -1             # highest step this process has started
    slowed: bool = False
    partial_done: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Faults:
        f = cls()
        if env.get("COHORT_FAULT_SLOW"):
            p = _parse(env["COHORT_FAULT_SLOW"], "COHORT_FAULT_SLOW")
            f.slow_rank, f.slow_factor, f.slow_step = int(p["rank"]), p.get("factor", 2.0), int(p.get("step", 0))
        if env.get("COHORT_FAULT_KILL"):
            p = _parse(env["COHORT_FAULT_KILL"], "COHORT_FAULT_KILL")
            f.kill_rank, f.kill_step = int(p["rank"]), int(p.get("step", 0))
        if env.get("COHORT_FAULT_HANG"):
            p = _parse(env["COHORT_FAULT_HANG"], "COHORT_FAULT_HANG")
            f.hang_rank, f.hang_step = int(p["rank"]), int(p.get("step", 0))
            f.hang_seconds = p.get("seconds", 30.0)
        if env.get("COHORT_FAULT_PAUSE"):
            p = _parse(env["COHORT_FAULT_PAUSE"], "COHORT_FAULT_PAUSE")
            f.pause_rank, f.pause_step = int(p["rank"]), int(p.get("step", 0))
            f.pause_seconds = p.get("seconds", 10.0)
        if env.get("COHORT_FAULT_FREEZE"):
            p = _parse(env["COHORT_FAULT_FREEZE"], "COHORT_FAULT_FREEZE")
            f.freeze_rank, f.freeze_step = int(p["rank"]), int(p.get("step", 0))
        if env.get("COHORT_FAULT_PARTIAL"):
            p = _parse(env["COHORT_FAULT_PARTIAL"], "COHORT_FAULT_PARTIAL")
            f.partial_rank, f.partial_step = int(p["rank"]), int(p.get("step", 0))
        if env.get("COHORT_FAULT_OOM"):
            p = _parse(env["COHORT_FAULT_OOM"], "COHORT_FAULT_OOM")
            f.oom_rank, f.oom_step, f.oom_mb = int(p["rank"]), int(p.get("step", 0)), int(p.get("mb", 4096))
        return f

    def before_step(self, rank: int, step: int) -> None:
        if self.first_step is None:
            self.first_step = step
        before, self.max_seen = self.max_seen, max(self.max_seen, step)
        first = self.first_step

        def crossing(at: int) -> bool:  # this process reaches step `at` now, for the first time
            return before < at <= step and first < max(at, 1)

        if _targets(self.kill_rank, rank) and step == self.kill_step and crossing(self.kill_step):
            log.warning("fault injection: SIGKILL self", extra={"step": step, "t": time.time()})
            logging.shutdown()
            die()
        if _targets(self.hang_rank, rank) and step == self.hang_step and crossing(self.hang_step):
            log.warning("fault injection: hanging, then SIGKILL self",
                        extra={"step": step, "seconds": self.hang_seconds, "t": time.time()})
            logging.shutdown()
            time.sleep(self.hang_seconds)
            die()
        if _targets(self.pause_rank, rank) and step == self.pause_step and crossing(self.pause_step):
            log.warning("fault injection: pausing", extra={"step": step, "seconds": self.pause_seconds,
                                                          "t": time.time()})
            time.sleep(self.pause_seconds)
        if _targets(self.freeze_rank, rank) and step == self.freeze_step and crossing(self.freeze_step):
            log.warning("fault injection: SIGSTOP self", extra={"step": step, "t": time.time()})
            logging.shutdown()
            freeze()
        if _targets(self.oom_rank, rank) and step == self.oom_step and crossing(self.oom_step):
            log.warning("fault injection: allocating memory", extra={"step": step, "mb": self.oom_mb})
            logging.shutdown()
            exhaust_memory(self.oom_mb)
        if not self.slowed and _targets(self.slow_rank, rank) and crossing(self.slow_step):
            log.warning("fault injection: computing slower", extra={"step": step, "factor": self.slow_factor})
            self.slowed = True

    def after_backward(self, rank: int, step: int, params: Iterable[torch.nn.Parameter],
                       report: Callable[[str], None]) -> None:
        """At the partial-write fault's step: corrupt the gradients as a half-written allreduce would, and
        ``report`` the failure (to the commit gate), once per process."""
        if not _targets(self.partial_rank, rank) or step != self.partial_step or self.partial_done:
            return
        self.partial_done = True
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    half = p.grad.view(-1)[: max(p.grad.numel() // 2, 1)]
                    half.mul_(1000.0).add_(1.0)
        log.warning("fault injection: a collective failed after writing part of its result", extra={"step": step})
        report(f"fault injection: the gradients' allreduce failed part-way at step {step}")

    def delay(self, compute_s: float) -> float:
        """Sleep to make this step's compute ``factor`` times longer; returns the added seconds."""
        if not self.slowed or self.slow_factor <= 1:
            return 0.0
        extra = (self.slow_factor - 1.0) * compute_s
        time.sleep(extra)
        return extra


def die() -> None:
    """SIGKILL this process (a module function, so unit tests can record it instead)."""
    os.kill(os.getpid(), signal.SIGKILL)


def freeze() -> None:
    """SIGSTOP this process (a module function, so unit tests can record it instead)."""
    os.kill(os.getpid(), signal.SIGSTOP)


def exhaust_memory(limit_mb: int, chunk_mb: int = 64) -> None:
    """Hold ever more touched memory until the kernel kills us; past ``limit_mb``, die anyway."""
    held = []
    for _ in range(max(limit_mb // chunk_mb, 1)):
        held.append(bytearray(chunk_mb << 20))  # zero-filled: every page is written
    die()

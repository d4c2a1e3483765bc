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


@dataclass(frozen=True)
class Fault:
    """One fault: the rank whose holder it strikes (-1: none; :data:`EVERY_RANK`), at which step, and its
    amount (the slow fault's factor, a hang's or pause's seconds, the OOM fault's MiB)."""

    rank: int = -1
    step: int = 0
    amount: float = 0.0

    def targets(self, rank: int) -> bool:
        return self.rank in (rank, EVERY_RANK)


# The environment variable's suffix (COHORT_FAULT_<KIND>) -> the name of its amount and its default.
KINDS: dict[str, tuple[str, float]] = {
    "slow": ("factor", 2.0), "kill": ("", 0.0), "hang": ("seconds", 30.0), "pause": ("seconds", 10.0),
    "freeze": ("", 0.0), "partial": ("", 0.0), "oom": ("mb", 4096.0)}


def parse(value: str, name: str, amount: str, default: float) -> Fault:
    """``rank=R,step=S[,<amount>=A]`` (``rank=all``: every rank)."""
    p: dict[str, float] = {}
    for part in filter(None, value.split(",")):
        key, sep, v = part.partition("=")
        key = key.strip()
        if not sep or key not in {"rank", "step", amount}:
            raise ValueError(f"{name}: expected rank=R,step=S{f',{amount}=A' if amount else ''}, got {value!r}")
        p[key] = EVERY_RANK if key == "rank" and v.strip() == "all" else float(v)
    if "rank" not in p:
        raise ValueError(f"{name}: rank=R is required, got {value!r}")
    return Fault(int(p["rank"]), int(p.get("step", 0)), p.get(amount, default))


@dataclass
class Faults:
    slow: Fault = Fault()
    kill: Fault = Fault()
    hang: Fault = Fault()
    pause: Fault = Fault()
    freeze: Fault = Fault()
    partial: Fault = Fault()
    oom: Fault = Fault()
    first_step: int | None = None  # first step this process trained
    max_seen: int = -1             # highest step this process has started
    slowed: bool = False
    partial_done: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Faults:
        f = cls()
        for kind, (amount, default) in KINDS.items():
            name = f"COHORT_FAULT_{kind.upper()}"
            if env.get(name):
                setattr(f, kind, parse(env[name], name, amount, default))
        return f

    def before_step(self, rank: int, step: int) -> None:
        if self.first_step is None:
            self.first_step = step
        before, self.max_seen = self.max_seen, max(self.max_seen, step)
        first = self.first_step

        def crossing(at: int) -> bool:  # this process reaches step `at` now, for the first time
            return before < at <= step and first < max(at, 1)

        def fires(fault: Fault) -> bool:  # at exactly its step
            return fault.targets(rank) and step == fault.step and crossing(fault.step)

        if fires(self.kill):
            log.warning("fault injection: SIGKILL self", extra={"step": step, "t": time.time()})
            logging.shutdown()
            die()
        if fires(self.hang):
            log.warning("fault injection: hanging, then SIGKILL self",
                        extra={"step": step, "seconds": self.hang.amount, "t": time.time()})
            logging.shutdown()
            time.sleep(self.hang.amount)
            die()
        if fires(self.pause):
            log.warning("fault injection: pausing", extra={"step": step, "seconds": self.pause.amount,
                                                          "t": time.time()})
            time.sleep(self.pause.amount)
        if fires(self.freeze):
            log.warning("fault injection: SIGSTOP self", extra={"step": step, "t": time.time()})
            logging.shutdown()
            freeze()
        if fires(self.oom):
            log.warning("fault injection: allocating memory", extra={"step": step, "mb": self.oom.amount})
            logging.shutdown()
            exhaust_memory(int(self.oom.amount))
        if not self.slowed and self.slow.targets(rank) and crossing(self.slow.step):  # from its step on
            log.warning("fault injection: computing slower", extra={"step": step, "factor": self.slow.amount})
            self.slowed = True

    def after_backward(self, rank: int, step: int, params: Iterable[torch.nn.Parameter],
                       report: Callable[[str], None]) -> None:
        """At the partial-write fault's step: corrupt the gradients as a half-written allreduce would, and
        ``report`` the failure (to the commit gate), once per process."""
        if not self.partial.targets(rank) or step != self.partial.step or self.partial_done:
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
        if not self.slowed or self.slow.amount <= 1:
            return 0.0
        extra = (self.slow.amount - 1.0) * compute_s
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

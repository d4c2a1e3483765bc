"""The planner's search: enumerate dp x tp x pp x microbatch plans for N devices, reject, rank.

Exhaustive, like the enumeration-based planners Liang et al. survey (the
space for one model on tens of devices is small): every factorisation
``N = dp·tp·pp`` the model can be split by, for pipelines every microbatch
count from ``pp`` up that divides the per-rank batch (1F1B), and for pure data
parallelism both DDP and FSDP. The global batch is held fixed (what data
parallelism on N ranks would process), so every plan trains the same
thing and step times compare directly. A plan that does not fit in memory
is rejected with the reason; the rest are ranked by predicted step time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .dims import CHECKPOINTING_ORDER, ParallelDims
from .hardware import Hardware
from .memory import Memory, memory_per_device
from .profile import ModelProfile
from .step_time import StepTime, step_time


@dataclass(frozen=True)
class Candidate:
    dims: ParallelDims
    time: StepTime
    memory: Memory
    rejected: str = ""       # why the plan cannot run ("" if it can)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_plans(n: int, profile: ModelProfile, global_batch: int, *, tp: int | None = None,
                    pp: int | None = None, max_microbatches: int = 32) -> list[ParallelDims]:
    """Every plan for ``n`` devices the model and batch can be split by (``tp``/``pp`` pin a degree)."""
    plans: list[ParallelDims] = []
    for t in ([tp] if tp else divisors(n)):
        for p in ([pp] if pp else divisors(n // t)):
            if n % (t * p) or not profile.supports_tp(t) or not profile.supports_pp(p):
                continue
            d = n // (t * p)
            if global_batch % d:
                continue
            per_rank = global_batch // d
            if p == 1:
                modes = ["ddp", "fsdp"] if t == 1 and d > 1 else ["fsdp"]
                plans += [ParallelDims(dp=d, tp=t, pp=1, dp_mode=mode) for mode in modes]
                continue
            m = p
            while m <= min(per_rank, max_microbatches):
                if per_rank % m == 0:
                    plans.append(ParallelDims(dp=d, tp=t, pp=p, microbatches=m, schedule="1f1b"))
                m *= 2
    return plans


def rank_plans(n: int, profile: ModelProfile, hw: Hardware, global_batch: int, optimizer: str = "adamw",
               momentum: float = 0.9, *, tp: int | None = None, pp: int | None = None,
               ac: str = "none", sharded_profile: ModelProfile | None = None) -> list[Candidate]:
    """Feasible plans fastest first, then the rejected ones (each with its reason).

    ``ac`` is the activation checkpointing of every plan, or ``auto``: each plan gets the first of none,
    selective and full under which it fits the device's memory (full when none does, then rejected).
    ``sharded_profile``: the profile of the plans FSDP shards (``ParallelDims.fully_sharded``), when their
    activations differ (a bf16 job's, measured with bf16 parameters); else ``profile`` serves every plan."""
    out = []
    for plain in enumerate_plans(n, profile, global_batch, tp=tp, pp=pp):
        profile_of = sharded_profile if sharded_profile is not None and plain.fully_sharded else profile
        dims = fitting_checkpointing(profile_of, plain, global_batch, hw, optimizer, momentum) if ac == "auto" \
            else replace(plain, ac=ac)
        mem = memory_per_device(profile_of, dims, global_batch, optimizer, momentum)
        t = step_time(profile_of, dims, global_batch, hw, optimizer, momentum)
        reason = ""
        if hw.memory_bytes and mem.total > hw.memory_bytes:
            reason = f"needs {_gib(mem.total)} per device, over the {_gib(hw.memory_bytes)} available"
        out.append(Candidate(dims, t, mem, reason))
    return sorted(out, key=lambda c: (bool(c.rejected), c.time.total, c.memory.total))


def fitting_checkpointing(profile: ModelProfile, dims: ParallelDims, global_batch: int, hw: Hardware,
                          optimizer: str = "adamw", momentum: float = 0.9) -> ParallelDims:
    """``dims`` with the first activation checkpointing under which it fits ``hw.memory_bytes`` (none when the
    memory is not known or the model has no blocks; full when nothing fits)."""
    if not hw.memory_bytes or not profile.n_layers:
        return replace(dims, ac="none")
    for ac in CHECKPOINTING_ORDER:
        fitted = replace(dims, ac=ac)
        if memory_per_device(profile, fitted, global_batch, optimizer, momentum).total <= hw.memory_bytes:
            return fitted
    return replace(dims, ac="full")


def best_plan(candidates: list[Candidate]) -> Candidate | None:
    return next((c for c in candidates if not c.rejected), None)


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2 ** 30:.2f} GiB" if nbytes >= 2 ** 28 else f"{nbytes / 2 ** 20:.1f} MiB"

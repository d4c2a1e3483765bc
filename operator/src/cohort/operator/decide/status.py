"""The status phase of a reconcile: phase, the below-min timeout, conditions, counts and progress."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import math
from typing import Any, cast

from cohort.api.models import Phase, TrainingJobStatus

from ..lifecycle import ACTIVE_PHASES, fmt_time, next_phase, parse_time, phase_conditions, seconds_until
from ..world import World
from .decision import Decision, Inputs


def update_phase(observed: Inputs, decision: Decision, world: World, *, lost_member: bool) -> str | None:
    """Move the phase and the conditions on. Returns why the job must fail (the below-min timeout), or None."""
    status, spec, now = decision.status, observed.spec, observed.now
    ft, eff_target = spec.fault_tolerance, observed.effective_target
    prev = status.phase
    status.phase = cast(Phase, next_phase(prev, world_size=world.size, minimum=spec.replicas.min, target=eff_target,
                                          lost_member=lost_member))
    if world.size >= max(spec.replicas.min, 1):
        status.below_min_since = ""
    else:
        since = parse_time(status.below_min_since) or now
        status.below_min_since = fmt_time(since)
        left = seconds_until(since, now) + ft.below_min_timeout_seconds
        # A gang start has min Ready and waits for the rest on purpose: not a failure.
        if left <= 0 and not decision.gang_holding:
            return (f"fewer than replicas.min={spec.replicas.min} workers were "
                    f"Ready for faultTolerance.belowMinTimeoutSeconds={ft.below_min_timeout_seconds}")
        decision.requeue(left)
    if status.phase != prev:
        decision.event(status.phase, phase_message(status.phase, world, spec.replicas.min, eff_target),
                       warning=status.phase == "Recovering")
    status.conditions = phase_conditions(status.conditions, phase=status.phase, world_size=world.size,
                                         target=eff_target, minimum=spec.replicas.min, final_reason="",
                                         final_message="", generation=observed.generation, now=now,
                                         waiting=decision.waiting)
    return None


def phase_message(phase: str, world: World, minimum: int, target: int) -> str:
    if phase == "Running":
        return f"Training with a world of {world.size} workers (target {target})"
    if phase == "Recovering":
        return f"Lost a worker: world of {world.size}, target {target}; replacing it"
    return f"Waiting for at least replicas.min={minimum} Ready workers"


def fill_counts(observed: Inputs, decision: Decision, world: World) -> None:
    status, eff_target = decision.status, observed.effective_target
    running = status.phase in ACTIVE_PHASES
    ready = [view for view in observed.pods if view.owned and view.admissible and view.name not in decision.delete]
    status.replicas.desired = eff_target
    status.replicas.active = world.size if running else 0
    status.replicas.ready = len(ready)
    status.replicas.spares = len(world.spares) if running else 0
    status.replicas.summary = f"{status.replicas.active}/{eff_target}"
    status.world.version = world.version
    status.world.size = world.size
    status.world.members = world.names
    status.world.reason = world.reason


def progress(observed: Inputs, decision: Decision) -> None:
    if observed.progress:
        apply_progress(decision.status, observed.progress, observed.now)


def apply_progress(status: TrainingJobStatus, data: dict[str, Any], now: dt.datetime) -> None:
    """Copy a /progress document (or a termination summary) into the status, if anything changed."""
    pr = copy.deepcopy(status.progress)

    def num(key: str, cast: type) -> Any:
        value = data.get(key)
        try:
            return cast(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    for key, attr, kind in (("step", "step", int), ("epoch", "epoch", int), ("loss", "loss", float),
                            ("samplesPerSecond", "samples_per_second", float), ("accuracy", "accuracy", float),
                            ("tokensPerSecond", "tokens_per_second", float), ("mfu", "mfu", float),
                            ("etaSeconds", "eta_seconds", int), ("evalLoss", "eval_loss", float),
                            ("eval_loss", "eval_loss", float), ("perplexity", "perplexity", float)):
        value = num(key, kind)  # eval_loss: the termination summary's spelling
        if value is not None:
            setattr(pr, attr, value)
    for attr in ("loss", "eval_loss", "perplexity", "tokens_per_second", "mfu"):
        value = getattr(pr, attr)
        if value is not None and math.isfinite(value):
            setattr(pr, attr, float(f"{value:.4g}"))  # as people read a loss (kubectl prints every digit)
    total = num("stepsTotal", int)
    if total:
        pr.percent = round(min(100.0, 100.0 * pr.step / total), 1)
    if isinstance(data.get("plan"), str):
        pr.plan = data["plan"]
    if dataclasses.replace(pr, updated_at="") != dataclasses.replace(status.progress, updated_at=""):
        pr.updated_at = fmt_time(now)
        status.progress = pr
    apply_checkpoint(status, data)


def apply_checkpoint(status: TrainingJobStatus, data: dict[str, Any]) -> None:
    """``lastCheckpoint`` and ``lastDurableCheckpoint`` (the same checkpoint, with its size and the cost of a
    restart now) from a /progress document or a termination summary."""
    durable = status.last_durable_checkpoint
    cost = data.get("restartCostSeconds")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
        durable.restart_cost_seconds = max(0, round(cost))
    ckpt = data.get("lastCheckpoint")
    if not isinstance(ckpt, dict) or ckpt.get("step") is None:
        return
    try:
        step, size = int(ckpt["step"]), int(ckpt.get("bytes") or 0)
    except (TypeError, ValueError):
        return
    t = ckpt.get("time")
    stamp = fmt_time(dt.datetime.fromtimestamp(t, dt.timezone.utc)) if isinstance(t, (int, float)) else str(t or "")
    for target in (status.last_checkpoint, durable):
        target.step, target.location = step, str(ckpt.get("location") or "")
        if stamp:
            target.time = stamp
    durable.bytes = size

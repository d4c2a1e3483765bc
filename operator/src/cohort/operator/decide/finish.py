"""The job-level phases of a reconcile: start and resume, suspend, the deadline, success, failure, clean-up."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from cohort.api.models import Phase, TrainingJobSpec

from ..lifecycle import fmt_time, parse_time, phase_conditions, seconds_until
from ..observe import PodView
from ..world import World
from .decision import Decision, Inputs
from .status import apply_progress, fill_counts

FINISHING_GRACE_S = 10.0
"""How long a member still running when its job Succeeded may take to exit on its own before it is deleted.
Every member trains to the same last step, so it is at most a save or an exit behind rank 0; one that exits
keeps its log and its termination message, one that is deleted loses both."""


def finished(observed: Inputs, decision: Decision) -> None:
    """A finished job only cleans up its pods, and deletes itself after ttlSecondsAfterFinished.

    A failed job's pods go at once. A succeeded job's spares go at once, and its members still running get
    :data:`FINISHING_GRACE_S` from the completion time to exit on their own."""
    status = decision.status
    members = set(observed.world.names) if status.phase == "Succeeded" else set()
    done_at = parse_time(status.completion_time)
    grace_left = seconds_until(done_at, observed.now) + FINISHING_GRACE_S if done_at else 0.0
    for view in observed.pods:
        if not (view.owned and view.active):
            continue
        if view.name in members and grace_left > 0:
            decision.requeue(grace_left)
        else:
            decision.remove(view, f"job {status.phase}")
    expire_after_ttl(observed.spec.run_policy.ttl_seconds_after_finished, observed.now, decision)
    status.replicas.active = 0
    status.replicas.ready = 0
    status.replicas.spares = 0


def suspend(observed: Inputs, decision: Decision, *, reason: str = "Suspended",
            message: str = "runPolicy.suspend is true: workers deleted", event: str = "") -> None:
    """runPolicy.suspend, or a Kueue queue that admits nothing: delete the workers and publish
    an empty world; the status stays. ``reason``/``message`` go to the Suspended condition."""
    status = decision.status
    active = [view for view in observed.pods if view.owned and view.active]
    if status.phase != "Suspended":
        decision.event("Suspended", event or f"runPolicy.suspend is true: deleting {len(active)} workers")
    for view in active:
        decision.remove(view, "job suspended" if reason == "Suspended" else f"{reason}: {message}"[:200])
    if observed.world.members or observed.world.spares:
        decision.world = World(version=observed.world.version + (1 if observed.world.members else 0),
                               reason="job suspended")
        if observed.world.members:
            decision.event("WorldPublished", f"World v{decision.world.version}: 0 members; job suspended")
    status.phase, status.backoff_until, status.below_min_since = "Suspended", "", ""
    status.conditions = phase_conditions(status.conditions, phase="Suspended", world_size=0,
                                         target=observed.effective_target, minimum=observed.spec.replicas.min,
                                         final_reason="", final_message="", generation=observed.generation,
                                         now=observed.now, suspended_reason=reason, suspended_message=message)
    fill_counts(observed, decision, decision.world or observed.world)


def start(observed: Inputs, decision: Decision) -> None:
    """A resumed job starts again from Pending; a job's clock starts at its first active reconcile."""
    status = decision.status
    if status.phase == "Suspended":
        admission = observed.admission
        decision.event("Resumed", f"Kueue admitted {admission.workers} workers (Workload {admission.workload}): "
                                  "creating the workers" if admission else
                                  "runPolicy.suspend is false: recreating the workers")
        status.phase, status.start_time, status.below_min_since, status.backoff_until = "Pending", "", "", ""
    if not status.start_time:
        status.start_time = fmt_time(observed.now)


def past_deadline(observed: Inputs, decision: Decision) -> bool:
    """runPolicy.activeDeadlineSeconds: fail the job when it passed (True), else requeue for it."""
    deadline_s = observed.spec.run_policy.active_deadline_seconds
    if not deadline_s:
        return False
    left = seconds_until(parse_time(decision.status.start_time), observed.now) + deadline_s
    if left <= 0:
        fail(observed, decision, "DeadlineExceeded", f"the job ran longer than runPolicy.activeDeadlineSeconds={deadline_s}")
        return True
    decision.requeue(left)
    return False


def succeeded(spec: TrainingJobSpec, world: World, done: set[str]) -> bool:
    """successPolicy: rank 0, or every member, exited 0."""
    if spec.run_policy.success_policy == "rank0":
        return world.members[0].pod in done
    return all(n in done for n in world.names)


def succeed(observed: Inputs, decision: Decision, rank0: PodView | None) -> None:
    summary = rank0.termination_summary() if rank0 else {}
    if summary:
        apply_progress(decision.status, summary, observed.now)
    decision.status.progress.percent, decision.status.progress.eta_seconds = 100.0, 0
    if observed.spec.run_policy.success_policy == "rank0":
        _finish(observed, decision, "Succeeded", "Rank0Succeeded", f"rank 0 ({rank0.name if rank0 else '?'}) exited 0")
    else:
        _finish(observed, decision, "Succeeded", "AllWorkersSucceeded", f"all {observed.world.size} members exited 0")


def fail(observed: Inputs, decision: Decision, reason: str, message: str) -> None:
    _finish(observed, decision, "Failed", reason, message)


def _finish(observed: Inputs, decision: Decision, phase: str, reason: str, message: str) -> None:
    status = decision.status
    status.phase = cast(Phase, phase)
    status.completion_time = fmt_time(observed.now)
    status.backoff_until = status.below_min_since = ""
    status.conditions = phase_conditions(status.conditions, phase=phase, world_size=0,
                                         target=observed.effective_target, minimum=observed.spec.replicas.min,
                                         final_reason=reason, final_message=message,
                                         generation=observed.generation, now=observed.now)
    decision.event(phase, f"{reason}: {message}", warning=phase == "Failed")
    finished(observed, decision)
    status.world.size = observed.world.size


def expire_after_ttl(ttl: int | None, now: datetime, decision: Decision) -> None:
    """Delete a finished job ``ttl`` seconds after its completionTime (runPolicy.ttlSecondsAfterFinished)."""
    done_at = parse_time(decision.status.completion_time)
    if ttl is None or done_at is None:
        return
    left = seconds_until(done_at, now) + ttl
    if left <= 0:
        decision.delete_job = True
        decision.event("TTLExpired", f"Deleting the job: runPolicy.ttlSecondsAfterFinished={ttl} passed")
    else:
        decision.requeue(left)

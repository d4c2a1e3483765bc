"""A job in a Kueue queue: wait, suspended, until Kueue admits it; drain when evicted (docs/kueue.md)."""

from __future__ import annotations

from ..lifecycle import get_condition, parse_time, seconds_until, set_condition
from .decision import Decision, Inputs
from .finish import suspend


def queued(observed: Inputs, decision: Decision) -> bool:
    """True when Kueue admits nothing now: the job is Suspended with Kueue's reason, and has no pods."""
    admission = observed.admission
    if admission is None or admission.workers:
        return False
    status = decision.status
    if admission.evicted:
        active = [v for v in observed.pods if v.owned and v.active]
        ckpt, step = status.last_checkpoint.step, status.progress.step
        saved = (f"newest checkpoint at step {ckpt}, training was at step {step}; rank 0 checkpoints as it stops"
                 if ckpt else "no checkpoint yet; rank 0 checkpoints as it stops")
        event = (f"Kueue evicted Workload {admission.workload} ({admission.reason}: {admission.message}); "
                 f"deleting {len(active)} workers, then queueing again ({saved})")
    else:
        event = f"Waiting in Kueue queue {admission.queue}: {admission.reason}: {admission.message}"
    suspend(observed, decision, reason=admission.reason, message=admission.message, event=event)
    status.replicas.admitted = 0
    status.conditions = set_condition(status.conditions, "Admitted", False, admission.reason, admission.message,
                                      generation=observed.generation, now=observed.now)
    return True


def admitted(observed: Inputs, decision: Decision) -> None:
    """For a running queued job: how many workers Kueue admitted, in status and the Admitted condition."""
    admission = observed.admission
    if admission is None:
        decision.status.replicas.admitted = None
        return
    status = decision.status
    if not status.replicas.admitted:
        before = get_condition(observed.status.conditions, "Admitted")
        since = parse_time(before.last_transition_time) if before and before.status == "False" else \
            parse_time(str(observed.job["metadata"].get("creationTimestamp") or ""))
        decision.admitted_after = max(0.0, -seconds_until(since, observed.now)) if since else 0.0
    elif status.replicas.admitted != admission.workers:
        decision.event("AdmissionChanged", f"Kueue now admits {admission.workers} workers "
                       f"(Workload {admission.workload}); the job runs {observed.target} of "
                       f"replicas.target={observed.spec.replicas.target}")
    status.replicas.admitted = admission.workers
    decision.placement = dict(admission.placement)
    status.conditions = set_condition(
        status.conditions, "Admitted", True, "Admitted",
        f"Kueue admitted {admission.workers} workers in queue {admission.queue} (Workload {admission.workload})",
        generation=observed.generation, now=observed.now)

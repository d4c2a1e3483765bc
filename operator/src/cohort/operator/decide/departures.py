"""Who leaves, in a reconcile: pods that are not the job's, pods already counted, failed workers, lost members."""

from __future__ import annotations

import datetime as dt

from ..lifecycle import backoff_seconds, fmt_time_ceil
from ..naming import selector_string
from ..observe import PodView
from ..world import World
from .decision import Decision, Departures, Inputs


def claim(observed: Inputs, decision: Decision) -> list[PodView]:
    """The job's own pods. Others carrying its labels are deleted; pods counted before a restart
    (status.retiring) are deleted again; podIndex never falls behind an existing pod."""
    status = decision.status
    ours = [view for view in observed.pods if view.owned]
    for view in observed.pods:
        if not view.owned:
            decision.remove(view, "carries the job's labels but was not created for it")
            if not view.terminating:
                decision.event("ExtraPodDeleted",
                               f"Deleted pod {view.name}: it carries the job's labels but is not its worker",
                               warning=True)
    existing = {view.name for view in ours}
    status.retiring = [n for n in status.retiring if n in existing]
    for view in ours:
        if view.name in status.retiring:
            decision.remove(view, "replaced")  # counted before a restart, not yet deleted: finish the job
    status.pod_index = max([status.pod_index] + [view.index + 1 for view in ours])
    status.observed_generation = observed.generation
    status.selector = selector_string(observed.job["metadata"]["name"])
    return ours


def failures(observed: Inputs, decision: Decision, ours: list[PodView], world: World,
             departures: Departures) -> str | None:
    """Count each failed worker once (status.retiring), delete it, and take it out of the world. A hung one
    (its peers found it absent and the operator checked: reports.stuck) is a failed one whose process lives.
    Returns why the job must fail (past faultTolerance.maxRestarts), or None."""
    status, ft, now = decision.status, observed.spec.fault_tolerance, observed.now
    for view in ours:
        if not ((view.failed or view.hung) and not view.terminating):
            continue
        if view.name not in status.retiring:
            status.retiring.append(view.name)
            status.restarts += 1
            status.replacements.failure += 1
            decision.replaced["failure"] += 1
            delay = backoff_seconds(status.restarts, ft.backoff_seconds, ft.max_backoff_seconds)
            status.backoff_until = fmt_time_ceil(now + dt.timedelta(seconds=delay))
            decision.event("WorkerFailed", f"Worker {view.name} failed ({view.describe_exit()}); failure "
                           f"{status.restarts} of faultTolerance.maxRestarts={ft.max_restarts}; replacement in "
                           f"{delay:g}s", warning=True)
            if status.restarts > ft.max_restarts:
                decision.remove(view, "failed")
                return (f"{status.restarts} worker failures exceed faultTolerance.maxRestarts={ft.max_restarts}; "
                        f"the last: {view.name} ({view.describe_exit()})")
        if view.name in world.names:
            departures.lose(view.name, "failed")
        decision.remove(view, "failed")
    return None


def lost_members(decision: Decision, world: World, by_name: dict[str, PodView], departures: Departures) -> None:
    """Members deleted, unreachable (their peers said so and the operator checked), or no longer Ready,
    leave the world."""
    for m in world.members:
        member = by_name.get(m.pod)
        if member is None or member.terminating:
            departures.lose(m.pod, "was deleted")
            decision.event("WorkerLost", f"Worker {m.pod} (rank {world.rank_of(m.pod)}) was deleted", warning=True)
        elif member.active and member.unreachable:
            # Its peers' collective failed and nothing listens on its port: gone, though its kubelet
            # has not said so yet (it counts as a failure once its pod is seen Failed).
            departures.lose(m.pod, "is unreachable")
            decision.event("WorkerLost", f"Worker {m.pod} (rank {world.rank_of(m.pod)}) is unreachable: "
                           f"{member.unreachable}", warning=True)
        elif member.active and not member.ready:
            departures.lose(m.pod, "is no longer Ready")
            decision.event("WorkerLost", f"Worker {m.pod} (rank {world.rank_of(m.pod)}) is no longer Ready",
                           warning=True)

"""Scale: delete surplus pods or create missing ones (failure replacements only after the backoff)."""

from __future__ import annotations

from ..lifecycle import parse_time, seconds_until
from ..observe import PodView
from ..world import World
from .decision import Decision, Inputs, PodRequest


def scale(observed: Inputs, decision: Decision, world: World, ours: list[PodView], *, completing: bool,
          swap_pending: bool) -> None:
    """Delete surplus pods (never members; not-Ready, then newest first) or create missing ones."""
    status, spec, now = decision.status, observed.spec, observed.now
    active = [view for view in ours if view.active and view.name not in decision.delete]
    desired = observed.target + observed.spares + (1 if swap_pending else 0)
    if len(active) > desired:
        keep = set(world.names) | {view.name for view in active if view.replaces and swap_pending}
        victims = sorted((view for view in active if view.name not in keep), key=lambda view: (view.ready, -view.index))
        for view in victims[: len(active) - desired]:
            decision.remove(view, "scaled down")
            decision.event("PodDeleted", f"Deleted worker {view.name}: replicas.target={spec.replicas.target}"
                           + (f", {observed.target} admitted by Kueue" if observed.admission else ""))
        return
    missing = desired - len(active) - len(decision.create)
    if missing <= 0 or completing:
        return
    wait = seconds_until(parse_time(status.backoff_until), now)
    if wait > 0:
        decision.requeue(wait)
        return
    for _ in range(missing):
        decision.create.append(PodRequest(index=status.pod_index))
        status.pod_index += 1

"""Membership (docs/contracts.md §3): the next world, published at once (no backoff on membership)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from ..lifecycle import fmt_time, parse_time, seconds_until
from ..observe import PodView
from ..world import Member, World, next_world
from .decision import Decision, Departures, Inputs


def publish(observed: Inputs, decision: Decision, world: World, ours: list[PodView], by_name: dict[str, PodView],
            departures: Departures, exclude: set[str]) -> World:
    """The next world from the Ready workers (minus stragglers being swapped out); records the swaps."""
    status, spec = decision.status, observed.spec
    ready = [Member(view.name, view.uid, view.ip) for view in ours
             if view.admissible and view.name not in exclude and view.name not in status.retiring]
    minimum = gang_minimum(observed, decision, world, ready_count=len(ready))
    new_world = next_world(world, ready, target=observed.target,
                           unit=spec.parallelism.tensor * spec.parallelism.pipeline, minimum=minimum,
                           why=departures.why, prefer=departures.joining)
    if observed.reform and new_world.version == world.version and world.members:
        new_world = dataclasses.replace(new_world, version=world.version + 1,
                                        reason=f"the same members re-form: {observed.reform}")
        decision.event("WorldReformed", f"World v{new_world.version}: the same {new_world.size} members re-form "
                       f"in place; {observed.reform}", warning=True)
    if new_world.version != world.version:
        promoted = [m.pod for m in new_world.members if m.pod in {s.pod for s in world.spares}
                    and (departures.lost_member or exclude)]
        for pod in promoted:
            node = by_name[pod].node if pod in by_name else ""
            decision.event("SparePromoted", f"Spare {pod} joined the world at once" + (f" (node {node})" if node else ""))
        decision.event("WorldPublished", f"World v{new_world.version}: {new_world.size} members "
                       f"[{', '.join(new_world.names)}]; {new_world.reason}")
    if new_world != world:
        decision.world = new_world
    for s in exclude:
        if s not in new_world.names and s in by_name:
            replacement = [m for m in new_world.names if m not in world.names]
            status.retiring.append(s)
            status.replacements.straggler += 1
            decision.replaced["straggler"] += 1
            decision.remove(by_name[s], "replaced as a straggler")
            decision.event("StragglerReplaced", f"Worker {s} was replaced as a straggler by "
                           f"{', '.join(replacement) or 'a spare'}")
    return new_world


def gang_minimum(observed: Inputs, decision: Decision, world: World, *, ready_count: int) -> int:
    """The fewest members the next world may have: a gang start holds out for the target.

    While no world exists (start, resume, or after a full restart), forming one
    with fewer than the effective target would be re-formed a moment later as
    the rest turn Ready. So the first world waits for the target, or for
    ``replicas.startupGraceSeconds`` of having no world (``below_min_since``),
    after which ``replicas.min`` is enough.
    """
    spec, minimum, eff_target = observed.spec, observed.spec.replicas.min, observed.effective_target
    if world.members or ready_count >= eff_target or eff_target <= minimum:
        return minimum
    grace = spec.replicas.startup_grace_seconds
    since = parse_time(observed.status.below_min_since) or observed.now
    left = seconds_until(since, observed.now) + grace
    if left > 0:
        decision.requeue(left)
        decision.gang_holding = ready_count >= minimum
        until = fmt_time(since + dt.timedelta(seconds=grace))
        decision.waiting = (f"gang start: waiting for replicas.target={eff_target} Ready workers ({ready_count} "
                            f"Ready) until {until} (replicas.startupGraceSeconds={grace}), then for at least "
                            f"replicas.min={minimum}")
        return eff_target
    if ready_count >= minimum:
        decision.event("GangStartTimedOut", f"replicas.startupGraceSeconds={grace} passed with {ready_count} of "
                       f"{eff_target} workers Ready: starting with what is Ready (replicas.min={minimum})",
                       warning=True)
    return minimum

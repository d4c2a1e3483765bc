"""Straggler swaps: a slow member is replaced from another node, and leaves once its replacement is Ready.

The prober's verdict (operator/stragglers.py) is acted on only in a full,
quiet world: no member just lost, the job not completing, no swap under way.
A Ready spare on another node is swapped in at once; otherwise (no spare, or
only spares on the straggler's node, which a throttled node or a noisy
neighbour would slow as much) a replacement pod is created away from that
node, and the straggler leaves the world when its replacement is Ready.
"""

from __future__ import annotations

from ..observe import PodView
from ..world import World
from .decision import Decision, Departures, Inputs, PodRequest


def advance_swaps(observed: Inputs, decision: Decision, world: World, by_name: dict[str, PodView],
                  departures: Departures, *, quiet: bool, full: bool) -> tuple[set[str], bool]:
    """Returns (members to swap out now, a replacement is still starting)."""
    exclude: set[str] = set()
    pending = False
    members = set(world.names)
    for r in by_name.values():
        if not r.replaces or not r.active:
            continue
        s = by_name.get(r.replaces)
        if s is None or not s.active or r.replaces in observed.status.retiring:
            continue  # the straggler is gone anyway: r is an ordinary worker now
        if r.replaces in members and r.ready:
            exclude.add(r.replaces)
            departures.why[r.replaces] = "was replaced as a straggler"
            departures.joining.append(r.name)  # the place is its, not a spare's that may share the slow node
        elif r.replaces in members:
            pending = True
        elif r.name in members:
            exclude.add(r.replaces)  # the swap was published before a restart: finish it
    verdict = observed.straggler
    if exclude or pending or verdict is None or quiet or not full or verdict.pod not in members:
        return exclude, pending
    s = by_name.get(verdict.pod)
    if s is None or not s.ready:
        return exclude, pending
    decision.straggler_handled = True
    policy = observed.spec.stragglers.policy
    if policy == "ignore":
        decision.event("StragglerDetected", f"{verdict.describe()} (stragglers.policy=ignore: no action)", warning=True)
        return exclude, pending
    spares = [m.pod for m in world.spares if m.pod in by_name and by_name[m.pod].admissible
              and not (s.node and by_name[m.pod].node == s.node)]
    if spares:
        exclude.add(s.name)
        departures.why[s.name] = "was replaced as a straggler"
        departures.joining.append(spares[0])
        where = f" on node {by_name[spares[0]].node}" if by_name[spares[0]].node else ""
        decision.event("StragglerDetected", f"{verdict.describe()}; swapping in spare {spares[0]}{where}, away "
                       f"from node {s.node or '(unknown)'}", warning=True)
        return exclude, pending
    index = decision.status.pod_index
    decision.status.pod_index += 1
    decision.create.append(PodRequest(index=index, replaces=s.name, avoid_nodes=(s.node,) if s.node else ()))
    decision.event("StragglerDetected", f"{verdict.describe()}; starting a replacement away from node "
                   f"{s.node or '(unknown)'}", warning=True)
    return exclude, True

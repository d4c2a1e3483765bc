"""One reconcile's decisions for one job, as a pure function: observations in, a Decision out.

``decide`` is the whole lifecycle of issue 3 §4 and the operator's side of
membership (docs/contracts.md §3) in one readable pass, in this order:

1. extra pods (the job's labels, not its owner reference) are deleted;
2. finished jobs only clean up (and honour ``ttlSecondsAfterFinished``);
3. suspended jobs, and jobs in a Kueue queue that admits nothing now (or
   evicted them), delete their pods and publish an empty world;
4. ``activeDeadlineSeconds``;
5. ``successPolicy``: the current rank 0 (or every member) exited 0 (checked
   before failures: peers of a finished rank 0 may fail on their way out);
6. failed workers are counted once (``status.retiring``), deleted, and leave
   the world; past ``maxRestarts`` the job fails;
7. stragglers: a replacement avoiding the slow pod's node is started, and
   swapped in once Ready;
8. the next world is published at once (no backoff on membership);
9. surplus pods are deleted (never members; newest first), missing ones are
   created, failure replacements only after the exponential backoff;
10. phase, belowMin timeout, conditions and counters;
11. the time since the last reconcile goes into the job's time ledger.

Each phase has its module: departures (1, 6), finish (2-5), swaps (7),
membership (8), scale (9), status (10), goodput (11); decision holds the types.

The reconciler executes the Decision in a crash-safe order: world, status (which
persists ``podIndex`` before any pod with that index exists), deletions,
creations, Events.
"""

from __future__ import annotations

import copy

from ..lifecycle import FINAL_PHASES
from .decision import Decision, Departures, EventSpec, Inputs, PodRequest
from .departures import claim, failures, lost_members
from .finish import fail, finished, past_deadline, start, succeed, succeeded, suspend
from .goodput import account
from .membership import publish
from .queue import admitted, queued
from .scale import scale
from .status import fill_counts, progress, update_phase
from .swaps import advance_swaps

__all__ = ["Decision", "EventSpec", "Inputs", "PodRequest", "decide"]


def decide(observed: Inputs) -> Decision:
    decision = _decide(observed)
    account(observed, decision)  # the time since the last reconcile, by what the job was doing (goodput.py)
    return decision


def _decide(observed: Inputs) -> Decision:
    decision = Decision(status=copy.deepcopy(observed.status))
    status, spec, world = decision.status, observed.spec, observed.world
    ours = claim(observed, decision)
    if status.phase in FINAL_PHASES:
        finished(observed, decision)
        return decision
    if spec.run_policy.suspend:
        suspend(observed, decision)
        return decision
    if queued(observed, decision):
        return decision
    start(observed, decision)
    admitted(observed, decision)
    if past_deadline(observed, decision):
        return decision

    by_name = {view.name: view for view in ours}
    done = {view.name for view in ours if view.succeeded}
    # Success first: when rank 0 finishes, its peers often fail on the way out
    # (their collectives lose a peer); that is not a failure of the job.
    if world.members and succeeded(spec, world, done):
        succeed(observed, decision, by_name.get(world.members[0].pod))
        return decision

    departures = Departures()
    too_many = failures(observed, decision, ours, world, departures)
    if too_many:
        fail(observed, decision, "TooManyRestarts", too_many)
        return decision
    # A member finished: the job is completing. Freeze membership and creation
    # so the others can finish too instead of being re-formed into a new world.
    completing = any(n in done for n in world.names)
    if not completing:
        lost_members(decision, world, by_name, departures)

    exclude, swap_pending = advance_swaps(observed, decision, world, by_name, departures,
                                          quiet=departures.lost_member or completing,
                                          full=world.size >= observed.effective_target)
    new_world = world if completing else publish(observed, decision, world, ours, by_name, departures, exclude)
    scale(observed, decision, new_world, ours, completing=completing, swap_pending=swap_pending)

    below_min = update_phase(observed, decision, new_world, lost_member=departures.lost_member)
    if below_min:
        fail(observed, decision, "BelowMinTimeout", below_min)
        return decision
    fill_counts(observed, decision, new_world)
    progress(observed, decision)
    return decision

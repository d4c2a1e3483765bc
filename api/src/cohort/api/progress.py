"""A worker's ``/progress`` as a membership authority reads it (docs/contracts.md §3, Reports; §4).

The operator and the local launcher judge a live member hung from the same document, by one rule: a member
whose trainer is still in a step of an older world than the one it was published into, or still forming
that world's process group, is stuck there, either once its peers waited out the newer world's rendezvous
without it (it was named absent), or as soon as its trainer is past its own deadline for what it does there
(``overdueSeconds``, by its own clock: for a step, twice the timeout its collectives have; for the forming,
the bound after which it exits by itself). A live member's collectives fail by then (its peers left that
world), and a forming one leaves one group timeout after a newer world appears, so it would have left too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# How far past its deadline a member still in an older world's step may be before it counts as hung: the
# time between a collective's timeout and the trainer leaving the step is milliseconds; this allows for a
# process slowed by its host (the deadline is its own clock's, so no skew between hosts enters).
OVERDUE_GRACE_S = 2.0


def in_old_world(progress: Mapping[str, Any], version: int) -> str:
    """What holds the trainer in an older world than ``version`` (the current one), as evidence: a step of it,
    or forming its process group (NCCL's communicator init waits for a dead member with no bound); '' when it
    is in none (waiting for a world, recovering, or not known)."""
    try:
        at, state = int(progress.get("worldVersion") or 0), str(progress.get("state") or "")
    except (TypeError, ValueError):
        return ""
    if at >= version:
        return ""
    if state == "training":
        return f"its trainer is still in a step of world v{at}"
    if state == "forming":
        return f"its trainer is still forming world v{at}'s process group"
    return ""


def overdue(progress: Mapping[str, Any], version: int) -> str:
    """Why the trainer is hung in an older world, past its deadline for what it does there; '' if it is not
    (or not known)."""
    held = in_old_world(progress, version)
    try:
        late = float(progress.get("overdueSeconds"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if not held or late <= OVERDUE_GRACE_S:
        return ""
    return f"{held}, {late:.0f}s past its own deadline"


def in_old_worlds(found: Mapping[str, Mapping[str, Any] | None], version: int) -> dict[str, str]:
    """Of the members' ``/progress`` (name -> document, None where none was read), those whose trainer is
    still in an older world than ``version`` (:func:`in_old_world`): name -> evidence that it is hung there,
    past its own deadline (:func:`overdue`), or '' while it is not yet."""
    return {name: overdue(doc, version) for name, doc in found.items()
            if doc is not None and in_old_world(doc, version)}

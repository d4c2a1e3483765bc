"""A worker's ``/progress`` as a membership authority reads it (docs/contracts.md §3, Reports; §4).

The operator and the local launcher judge a live member hung from the same document, by one rule: a member
whose trainer is still in a step of an older world than the one it was published into is stuck there,
either once its peers waited out the newer world's rendezvous without it (it was named absent), or as soon
as its trainer is past its own deadline for that step (``overdueSeconds``: twice the timeout its step's
collectives have, by its own clock). A live member's collectives fail by then (its peers left that world),
so it would have left too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# How far past its deadline a member still in an older world's step may be before it counts as hung: the
# time between a collective's timeout and the trainer leaving the step is milliseconds; this allows for a
# process slowed by its host (the deadline is its own clock's, so no skew between hosts enters).
OVERDUE_GRACE_S = 2.0


def in_old_world(progress: Mapping[str, Any], version: int) -> int | None:
    """The older world whose step the trainer is in, if it is in one (``version`` is the current world)."""
    try:
        at, state = int(progress.get("worldVersion") or 0), str(progress.get("state") or "")
    except (TypeError, ValueError):
        return None
    return at if state == "training" and at < version else None


def in_a_step_of(at: int) -> str:
    """The evidence that a member's trainer is in a step of world ``at`` (older than the current one)."""
    return f"its trainer is still in a step of world v{at}"


def overdue(progress: Mapping[str, Any], version: int) -> str:
    """Why the trainer is hung in an older world's step, past its deadline; '' if it is not (or not known)."""
    at = in_old_world(progress, version)
    try:
        late = float(progress.get("overdueSeconds"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if at is None or late <= OVERDUE_GRACE_S:
        return ""
    return f"{in_a_step_of(at)}, {late:.0f}s past the time it allows a step"


def in_old_worlds(found: Mapping[str, Mapping[str, Any] | None], version: int) -> dict[str, str]:
    """Of the members' ``/progress`` (name -> document, None where none was read), those whose trainer is
    still in a step of an older world than ``version``: name -> evidence that it is hung there, past its own
    deadline (:func:`overdue`), or '' while it is not yet."""
    return {name: overdue(doc, version) for name, doc in found.items()
            if doc is not None and in_old_world(doc, version) is not None}

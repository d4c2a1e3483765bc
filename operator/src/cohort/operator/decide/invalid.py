"""A stored spec the operator cannot run ends the job, cleanly. Pure.

The API server admits a spec by the same rules the operator parses it with
(cohort.api; tests/contract/test_admission_parity.py holds the two to one
truth), so a spec reaches here only when it was stored under older rules: a
job created before a CRD upgrade tightened them. Kubernetes keeps such a field
(validation ratcheting lets the rest of the object change around it), and an
operator that only flagged it left the job Pending with ``Failed=True`` for
good, or Running with ``Failed=True`` while its pods trained unwatched.

Now the job fails like any failed job, whatever phase it was in: phase
``Failed``, condition ``Failed`` with reason ``InvalidSpec`` and the parser's
message (the field first), ``completionTime``, every pod deleted, and (in the
reconciler) its Kueue Workloads finished, so the quota goes back. A job that
had already finished keeps its phase and only loses its pods. The phase is
final: correcting the spec afterwards does not restart the job (as with a
batch Job); create it again. ``runPolicy.ttlSecondsAfterFinished`` still applies
when that section of the spec can be read.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from typing import Any

from cohort.api.models import TrainingJobStatus

from ..lifecycle import FINAL_PHASES, fmt_time, phase_conditions
from ..naming import selector_string
from ..observe import PodView
from ..world import World
from .decision import Decision
from .finish import expire_after_ttl

REASON = "InvalidSpec"


@dataclasses.dataclass
class Refused:
    """What a reconcile observed of a job whose spec the operator cannot parse."""

    job: dict[str, Any]
    status: TrainingJobStatus
    world: World
    pods: list[PodView]
    now: dt.datetime
    message: str  # the parser's: "spec.<field>: <why>"
    ttl_seconds_after_finished: int | None = None  # from spec.runPolicy, if that section parses

    @property
    def generation(self) -> int:
        return int(self.job["metadata"].get("generation") or 0)


def decide_invalid(observed: Refused) -> Decision:
    decision = Decision(status=copy.deepcopy(observed.status))
    status = decision.status
    status.observed_generation = observed.generation
    status.selector = selector_string(observed.job["metadata"]["name"])
    status.retiring = []
    status.pod_index = max([status.pod_index] + [view.index + 1 for view in observed.pods if view.owned])
    why = f"{REASON}: {observed.message}"[:200]
    for view in observed.pods:
        if view.active:
            decision.remove(view, why)
    if status.phase not in FINAL_PHASES:
        status.phase = "Failed"
        status.completion_time = fmt_time(observed.now)
        status.backoff_until = status.below_min_since = ""
        status.conditions = phase_conditions(
            status.conditions, phase="Failed", world_size=0, target=status.replicas.desired, minimum=1,
            final_reason=REASON, final_message=observed.message, generation=observed.generation, now=observed.now)
        decision.event(REASON, f"The job failed: its spec cannot run: {observed.message}", warning=True)
    status.replicas.active = status.replicas.ready = status.replicas.spares = 0  # as finish.finished
    expire_after_ttl(observed.ttl_seconds_after_finished, observed.now, decision)
    return decision

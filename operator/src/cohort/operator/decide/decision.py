"""What one reconcile observed (:class:`Inputs`) and what it decided (:class:`Decision`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from cohort.api.models import TrainingJobSpec, TrainingJobStatus

from ..kueue import Admission
from ..lifecycle import effective_target
from ..observe import PodView
from ..stragglers import Straggler
from ..world import World


@dataclasses.dataclass(frozen=True)
class PodRequest:
    """A worker pod to create: its ordinal, and for a straggler's replacement what it replaces."""

    index: int
    replaces: str = ""
    avoid_nodes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclasses.dataclass
class Inputs:
    job: dict[str, Any]
    spec: TrainingJobSpec
    status: TrainingJobStatus
    world: World
    pods: list[PodView]
    now: dt.datetime
    straggler: Straggler | None = None
    progress: dict[str, Any] | None = None
    admission: Admission | None = None  # what Kueue admitted (None: the job is not in a queue)
    reform: str = ""  # why the current world re-forms with the same members (a false alarm, reports.py)

    @property
    def generation(self) -> int:
        return int(self.job["metadata"].get("generation") or 0)

    @property
    def target(self) -> int:
        """replicas.target, within what Kueue admitted for a queued job."""
        if self.admission is None:
            return self.spec.replicas.target
        return min(self.spec.replicas.target, self.admission.workers)

    @property
    def spares(self) -> int:
        if self.admission is None:
            return self.spec.replicas.spares
        return min(self.spec.replicas.spares, self.admission.spares)

    @property
    def effective_target(self) -> int:
        """The target rounded down to a whole number of model-parallel units (tensor x pipeline)."""
        return effective_target(self.target, self.spec.parallelism.tensor * self.spec.parallelism.pipeline)


@dataclasses.dataclass
class Decision:
    status: TrainingJobStatus
    world: World | None = None
    create: list[PodRequest] = dataclasses.field(default_factory=list)
    delete: dict[str, str] = dataclasses.field(default_factory=dict)  # pod -> why
    events: list[EventSpec] = dataclasses.field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    straggler_handled: bool = False  # the prober's verdict was acted on (starts its cooldown)
    waiting: str = ""  # why no world is formed yet, when it is not the usual "fewer than min"
    gang_holding: bool = False  # min are Ready, but a gang start holds out for the target
    replaced: dict[str, int] = dataclasses.field(default_factory=lambda: {"failure": 0, "straggler": 0})
    placement: dict[str, Any] = dataclasses.field(default_factory=dict)  # Kueue's flavor: nodeSelector, tolerations
    admitted_after: float | None = None  # Kueue admitted the job in this reconcile, after waiting this long (s)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(EventSpec("Warning" if warning else "Normal", reason, message))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.5)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def remove(self, pod: PodView, why: str) -> None:
        if not pod.terminating and pod.name not in self.delete:
            self.delete[pod.name] = why


@dataclasses.dataclass
class Departures:
    """Members leaving the world in this reconcile, and why (the published world's reason)."""

    why: dict[str, str] = dataclasses.field(default_factory=dict)
    lost_member: bool = False  # a member failed, was deleted or is no longer Ready
    joining: list[str] = dataclasses.field(default_factory=list)  # spares to take their places first

    def lose(self, pod: str, why: str) -> None:
        self.why[pod], self.lost_member = why, True

"""What the operator remembers about each job between reconciles, in memory.

Nothing here is needed for correctness after a restart: the durable truth is
the TrainingJob's status (counters, ``podIndex``, ``retiring``, timers), the
``<job>-world`` ConfigMap and the pods themselves. Memory saves API calls
(objects known to exist, the last status written) and holds what only a
running process can know (the latest /progress, metric samples, a straggler
verdict waiting for the reconciler).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from cohort.api.models import TrainingJobStatus

from .stragglers import ComputeWindow, Straggler
from .world import World

JobKey = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass
class JobMemory:
    key: JobKey
    body: dict[str, Any] | None = None  # the newest TrainingJob seen in a watch event
    fingerprint: str = ""  # what, besides status, the last enqueued event carried
    loaded: bool = False  # status and world were read from the API after (re)start
    ignored: bool = False  # spec.managedBy names another controller (logged once)
    # Our own writes the pod index may not show yet (controller "expectations"):
    expected: dict[str, tuple[float, dict[str, Any]]] = dataclasses.field(default_factory=dict)  # created
    deleting: dict[str, float] = dataclasses.field(default_factory=dict)  # deleted, maybe still listed
    uid: str = ""
    status: TrainingJobStatus = dataclasses.field(default_factory=TrainingJobStatus)  # working copy
    written: dict[str, Any] = dataclasses.field(default_factory=dict)  # the status as last persisted
    world: World = dataclasses.field(default_factory=World)
    ensured: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (kind, name) known to exist
    lost: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # seen deleted: recreate and say so
    config_text: str = ""  # job.json as last written
    gang_key: str = ""  # the gang API whose object exists
    progress: dict[str, Any] | None = None
    window: ComputeWindow = dataclasses.field(default_factory=ComputeWindow)
    verdict: Straggler | None = None
    cooldown_until: float = 0.0
    probe_after: dict[str, float] = dataclasses.field(default_factory=dict)  # pod -> next probe (monotonic)
    probe_failures: dict[str, int] = dataclasses.field(default_factory=dict)
    unreachable: dict[str, str] = dataclasses.field(default_factory=dict)  # pod -> evidence (reports.py)
    hung: dict[str, str] = dataclasses.field(default_factory=dict)  # pod -> evidence (reports.stuck)
    report_checked: tuple[int, float] = (0, 0.0)  # world version, monotonic time of the last check
    reform: tuple[int, str] = (0, "")  # re-form this world version with the same members, and why (reports.py)
    reformed_at: float = float("-inf")  # monotonic time of the last re-form asked for
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    def reset_for_new_uid(self, uid: str) -> None:
        """A job deleted and created again under the same name shares nothing with the old one."""
        fresh = JobMemory(key=self.key, body=self.body)
        for f in dataclasses.fields(self):
            if f.name not in ("key", "body", "lock"):
                setattr(self, f.name, getattr(fresh, f.name))
        self.uid = uid


def fingerprint(body: dict[str, Any]) -> str:
    """The parts of a TrainingJob that call for a reconcile: everything but status.

    The operator's own status patches come back as watch events; comparing
    fingerprints lets them pass without a reconcile each.
    """
    meta = body.get("metadata") or {}
    return json.dumps([meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"),
                       meta.get("labels"), body.get("spec")], sort_keys=True, default=str)

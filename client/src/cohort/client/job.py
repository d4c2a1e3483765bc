"""A TrainingJob as the client returns it: the stored object, typed by the API models.

``spec`` and ``status`` are ``cohort.api.models`` dataclasses parsed from what
the API server stores (so ``job.status.progress.step`` is an int, never a
missing key); ``raw`` is the object as it came, for anything else.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cohort.api.models import Condition, Progress, TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import parse

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    name: str
    namespace: str
    spec: TrainingJobSpec
    status: TrainingJobStatus
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> TrainingJob:
        meta = obj.get("metadata") or {}
        return cls(name=str(meta.get("name", "")), namespace=str(meta.get("namespace", "")),
                   spec=parse(TrainingJobSpec, obj.get("spec") or {}, "spec"),
                   status=parse(TrainingJobStatus, obj.get("status") or {}, "status"), raw=obj)

    @property
    def phase(self) -> str:
        """The phase; ``Pending`` until the operator has written a status."""
        return self.status.phase

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def progress(self) -> Progress:
        return self.status.progress

    @property
    def recoveries(self) -> int:
        """Workers replaced, for failing or for being slow: each one is a world change the job survived."""
        return self.status.replacements.failure + self.status.replacements.straggler

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.status.conditions if c.type == type_), None)

    def failure_reason(self) -> str:
        """``Reason: message`` of the Failed condition ('' unless the job failed)."""
        c = self.condition("Failed")
        if self.phase != "Failed" or c is None:
            return ""
        return f"{c.reason}: {c.message}" if c.message else c.reason

"""What the operator sees of a worker pod: a small, typed view of the Pod dict.

The decision (:mod:`.decide`) reasons about ``PodView``s only, so the rules for "Ready",
"failed" and "succeeded" live here, once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from .naming import ANNOTATION_REPLACES, controller_uid, pod_index
from .pods import CONTAINER


@dataclasses.dataclass(frozen=True)
class PodView:
    name: str
    uid: str = ""
    index: int = -1
    ip: str = ""
    node: str = ""
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    deletion_deadline: str = ""  # metadata.deletionTimestamp: when a terminating pod should be gone
    failed: bool = False
    succeeded: bool = False
    owned: bool = True
    exit_code: int | None = None
    reason: str = ""
    message: str = ""  # the trainer's termination message (JSON by contract)
    replaces: str = ""
    unreachable: str = ""  # why its peers' report was confirmed: nothing listens on its port (reports.py)
    hung: str = ""  # why it is hung: absent from a rendezvous, its trainer stuck (reports.stuck): a failure

    @property
    def active(self) -> bool:
        """Counts toward the job's pods: not going away and not finished."""
        return not (self.terminating or self.failed or self.succeeded)

    @property
    def admissible(self) -> bool:
        """May be a member or a spare."""
        return self.active and self.ready and not self.unreachable and not self.hung

    def describe_exit(self) -> str:
        if self.hung and not self.failed:
            return f"hung: {self.hung}"
        parts = []
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.reason:
            parts.append(self.reason)
        said = self.error()
        return ", ".join(parts + ([said] if said else [])) or f"phase {self.phase}"

    def error(self) -> str:
        """What a failed worker said: the trainer's ``{"error": ...}`` termination message, else the last
        line of the log tail the kubelet put there in its place (FallbackToLogsOnError: a traceback's
        last line, or a JSON log record's exception or message); '' when it said nothing."""
        summary = self.termination_summary()
        if "error" in summary:
            return _clip(str(summary["error"]))
        if summary and "msg" not in summary:  # the trainer's summary: nothing went wrong in it
            return ""
        lines = [line.strip() for line in self.message.splitlines() if line.strip()]
        if not lines:
            return ""
        try:
            record = json.loads(lines[-1])
        except ValueError:
            return _clip(lines[-1])
        if isinstance(record, dict):
            exc = str(record.get("exc") or "").strip().splitlines()
            return _clip(exc[-1] if exc else str(record.get("msg") or lines[-1]))
        return _clip(lines[-1])

    def termination_summary(self) -> dict[str, Any]:
        """The JSON summary the trainer wrote on exit (docs/contracts.md §5), or {}."""
        try:
            data = json.loads(self.message) if self.message else {}
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == CONTAINER or len(statuses) == 1:
            term = (cs.get("state") or {}).get("terminated")
            if term:
                return dict(term)
    return None


def view_pod(pod: dict[str, Any], job_uid: str) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    terminating = bool(meta.get("deletionTimestamp"))
    term = _terminated(pod)
    exit_code = int(term["exitCode"]) if term and term.get("exitCode") is not None else None
    failed = phase == "Failed" or (exit_code is not None and exit_code != 0)
    succeeded = not failed and (phase == "Succeeded" or exit_code == 0)
    ready = (phase == "Running" and not terminating and not failed and not succeeded and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []))
    name = str(meta.get("name", ""))
    return PodView(
        name=name,
        uid=str(meta.get("uid", "")),
        index=pod_index(name),
        ip=str(status.get("podIP") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        phase=phase,
        ready=ready,
        terminating=terminating,
        deletion_deadline=str(meta.get("deletionTimestamp") or ""),
        failed=failed,
        succeeded=succeeded,
        owned=bool(job_uid) and controller_uid(pod) == job_uid,
        exit_code=exit_code,
        reason=str((term or {}).get("reason") or status.get("reason") or ""),
        message=str((term or {}).get("message") or ""),
        replaces=str((meta.get("annotations") or {}).get(ANNOTATION_REPLACES, "")),
    )


def trim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Pod that :func:`view_pod` reads: what the operator keeps in memory per pod.

    A full Pod (managedFields included) is several kilobytes; at thousands of
    pods the index would otherwise dominate the operator's memory.
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp", "ownerReferences")
                     if k in meta}
                    | {"annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                       if k == ANNOTATION_REPLACES}},
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {k: status[k] for k in ("phase", "podIP", "reason", "conditions", "containerStatuses")
                   if k in status},
    }


def view_pods(pods: Iterable[dict[str, Any]], job_uid: str, unreachable: dict[str, str] | None = None,
              hung: dict[str, str] | None = None) -> list[PodView]:
    """Views sorted by ordinal (oldest first); ``unreachable`` and ``hung``: pod -> the evidence its peers'
    report was checked by (reports.py)."""
    unreachable, hung = unreachable or {}, hung or {}
    views = [view_pod(p, job_uid) for p in pods]
    if unreachable or hung:
        views = [dataclasses.replace(v, unreachable=unreachable.get(v.name, ""), hung=hung.get(v.name, ""))
                 for v in views]
    return sorted(views, key=lambda v: (v.index, v.name))

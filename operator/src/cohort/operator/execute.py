"""Carrying out a Decision, in the crash-safe order of the reconciler's docstring.

World, status (which persists ``podIndex`` before any pod with that index
exists, and ``retiring`` before any pod is counted twice), deletions,
creations, Events. Pods are created and deleted with bounded concurrency
(``--api-concurrency``), and our own writes are remembered as expectations
(``JobMemory.expected``/``deleting``) until the pod watch shows them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cohort.api.models import TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import to_dict

from .decide import Decision
from .events import EventRecorder
from .jobstate import JobMemory
from .kubeapi import ApiError, Kube, gather_limited
from .manifests import POD
from .metrics import OperatorMetrics
from .naming import job_path
from .owned import OwnedObjects
from .pods import build_worker_pod
from .settings import Settings
from .workqueue import WorkQueue


class Executor:
    def __init__(self, kube: Kube, settings: Settings, metrics: OperatorMetrics, recorder: EventRecorder,
                 queue: WorkQueue, owned: OwnedObjects):
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.recorder = recorder
        self.queue = queue
        self.owned = owned

    async def execute(self, mem: JobMemory, job: dict[str, Any], spec: TrainingJobSpec | None, decision: Decision,
                       gang_fields: dict[str, Any], prerequisites: asyncio.Future[Any]) -> bool:
        """Carry out the decision; False when the job is gone. ``spec`` is None for a job whose spec
        cannot be parsed (decide.invalid), whose decision creates no pod."""
        ns, name = mem.key
        try:
            if decision.world is not None:
                old_version = mem.world.version
                await self.owned.write_world(mem, job, decision.world)
                if decision.world.version != old_version:
                    self.metrics.world_changes.inc()
            if to_dict(decision.status) != mem.written and not await self.patch_status(mem, job, decision.status):
                return False
        finally:
            await prerequisites  # its errors surface here, before any pod is created
        mem.status = decision.status
        if decision.delete_job:
            for ev in decision.events:
                await self.recorder.post(job, ev.type, ev.reason, ev.message)  # before the job (and its Events) go
            try:
                await self.kube.request("DELETE", job_path(ns, name), body={"propagationPolicy": "Background"})
            except ApiError as e:
                if e.status != 404:
                    raise
            return False
        deleted = await self._delete_pods(mem, decision)
        created = await self._create_pods(mem, job, spec, decision, gang_fields)
        if decision.admitted_after is not None:
            self.metrics.queue_admissions.inc()
            self.metrics.queue_wait.observe(decision.admitted_after)
        for reason, count in decision.replaced.items():
            if count:
                self.metrics.replacements.labels(reason=reason).inc(count)
        # Pod creations and deletions are announced in one Event per batch,
        # naming every pod: the same story at a fraction of the API calls.
        for ev in decision.events:
            if ev.reason != "PodDeleted":
                self.recorder.emit(job, ev.type, ev.reason, ev.message)
        for why, pods in deleted.items():
            self.recorder.emit(job, "Normal", "PodDeleted", f"Deleted worker pods {', '.join(pods)}: {why}")
        if created:
            self.recorder.emit(job, "Normal", "PodCreated", "Created worker pods " + ", ".join(created))
        if decision.straggler_handled and spec is not None:
            mem.verdict = None
            mem.window.clear()
            mem.cooldown_until = time.monotonic() + spec.stragglers.window_seconds
        if decision.requeue_after is not None:
            self.queue.add_after(mem.key, decision.requeue_after)
        return True

    async def patch_status(self, mem: JobMemory, job: dict[str, Any], status: TrainingJobStatus) -> bool:
        ns, name = mem.key
        try:
            await self.kube.patch(job_path(ns, name, "status"), {"status": to_dict(status)})
        except ApiError as e:
            if e.status == 404:
                return False  # deleted meanwhile; the DELETED event cleans up
            raise
        mem.status = status
        mem.written = to_dict(status)
        return True

    async def _delete_pods(self, mem: JobMemory, decision: Decision) -> dict[str, list[str]]:
        ns = mem.key[0]
        names = list(decision.delete)
        results = await gather_limited([self.kube.delete(POD.path(ns, n)) for n in names],
                                       self.settings.api_concurrency)
        out: dict[str, list[str]] = {}
        for n, r in zip(names, results, strict=True):
            if isinstance(r, BaseException):
                raise r
            mem.deleting[n] = time.monotonic()
            if r:
                self.metrics.pods_deleted.inc()
                out.setdefault(decision.delete[n], []).append(n)
        return out

    async def _create_pods(self, mem: JobMemory, job: dict[str, Any], spec: TrainingJobSpec | None,
                           decision: Decision, gang_fields: dict[str, Any]) -> list[str]:
        ns = mem.key[0]
        if not decision.create:
            return []
        assert spec is not None, "a job whose spec cannot be parsed creates no pod"
        pods = [build_worker_pod(job, spec, r.index, defaults=self.settings.pod_defaults, gang=gang_fields,
                                 replaces=r.replaces, avoid=list(r.avoid_nodes), placement=decision.placement)
                for r in decision.create]
        results = await gather_limited([self.kube.create_if_absent(POD.path(ns), p) for p in pods],
                                       self.settings.api_concurrency)
        created = []
        for pod, r in zip(pods, results, strict=True):
            if isinstance(r, ApiError) and r.status in (400, 403, 422):
                # Refused by an admission (the namespace's Pod Security level, a policy, a quota): the
                # reconcile retries, and the user is told why, as a ReplicaSet's FailedCreate does.
                self.recorder.emit(job, "Warning", "FailedCreate",
                                   f"Error creating worker pod {pod['metadata']['name']}: {r.message}")
            if isinstance(r, BaseException):
                raise r
            mem.expected[pod["metadata"]["name"]] = (time.monotonic(), {**pod, "status": {"phase": "Pending"}})
            if r:
                self.metrics.pods_created.inc()
                created.append(pod["metadata"]["name"])
        return created

"""Reading and writing a queued job's Kueue Workloads (the decisions are :mod:`.kueue`'s)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from .events import EventRecorder
from .kubeapi import ApiError, Kube
from .kueue import (
    FLAVORS_PATH,
    REPLACES_ANNOTATION,
    WORKERS,
    WORKLOAD,
    Action,
    Admission,
    Create,
    Delete,
    Finish,
    MarkPodsReady,
    Requeue,
    Shrink,
    Slice,
    admission_of,
    current,
    label_selector,
    parse_slice,
    pods_ready_patch,
    queue_name,
    requeue_patch,
)
from .lifecycle import fmt_time
from .metrics import OperatorMetrics
from .naming import controller_uid

log = logging.getLogger(__name__)
JSON_PATCH = "application/json-patch+json"
FLAVOR_TTL_S = 30.0


class Queues:
    def __init__(self, kube: Kube, metrics: OperatorMetrics, recorder: EventRecorder):
        self.kube, self.metrics, self.recorder = kube, metrics, recorder
        self._flavors: dict[str, tuple[float, dict[str, Any]]] = {}
        self._refused: set[tuple[str, str, int]] = set()  # (namespace, Workload, count) Kueue would not shrink to

    async def observe(self, job: dict[str, Any]) -> tuple[list[Slice], Admission | None]:
        """The job's Workloads, and what they admit (None: the job is in no queue, or no longer)."""
        meta = job["metadata"]
        items = await self.kube.list(WORKLOAD.path(meta["namespace"]), label_selector=label_selector(meta["name"]))
        slices = [parse_slice(w) for w in items if controller_uid(w) == meta.get("uid")]
        now = current(slices)
        flavors = {name: await self._flavor(name) for name in (now.flavors if now else ())}
        queue = queue_name(job)
        return slices, admission_of(queue, slices, flavors) if queue else None

    async def _priority(self, ref: dict[str, Any]) -> int | None:
        path = (f"/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses/{ref['name']}"
                if ref["group"] == "kueue.x-k8s.io" else f"/apis/scheduling.k8s.io/v1/priorityclasses/{ref['name']}")
        obj = await self.kube.get(path)
        return None if obj is None else int(obj.get("value") or 0)

    async def _flavor(self, name: str) -> dict[str, Any]:
        cached = self._flavors.get(name)
        if cached and time.monotonic() - cached[0] < FLAVOR_TTL_S:
            return cached[1]
        flavor = await self.kube.get(f"{FLAVORS_PATH}/{name}") or {}
        self._flavors[name] = (time.monotonic(), flavor)
        return flavor

    async def apply(self, job: dict[str, Any], actions: list[Action]) -> None:
        ns = job["metadata"]["namespace"]
        for a in actions:
            if isinstance(a, Create):
                manifest = {**a.manifest, "spec": dict(a.manifest["spec"])}
                ref = manifest["spec"].get("priorityClassRef")
                if ref:  # Kueue wants the value too, as its own integrations resolve it
                    value = await self._priority(ref)
                    if value is None:
                        self.recorder.emit(job, "Warning", "PriorityClassNotFound",
                                           f"{ref['kind']} {ref['name']} does not exist: the job is not queued")
                        continue
                    manifest["spec"]["priority"] = value
                if await self.kube.create_if_absent(WORKLOAD.path(ns), manifest):
                    spec = a.manifest["spec"]
                    workers = spec["podSets"][0]
                    asked = f"{workers['count']} workers" + (f" (at least {workers['minCount']})"
                                                           if "minCount" in workers else "")
                    grow = a.manifest["metadata"]["annotations"].get(REPLACES_ANNOTATION)
                    self.recorder.emit(job, "Normal", "WorkloadCreated",
                                       f"Kueue Workload {a.manifest['metadata']['name']} asks queue "
                                       f"{spec['queueName']} for {asked}" + (f", to replace {grow}" if grow else ""))
            elif isinstance(a, Delete):
                if await self.kube.delete(WORKLOAD.path(ns, a.name)):
                    self.recorder.emit(job, "Normal", "WorkloadDeleted", f"Deleted Kueue Workload {a.name}: {a.why}")
            elif isinstance(a, Shrink):
                if (ns, a.name, a.workers) in self._refused:
                    continue
                ops: list[dict[str, Any]] = [
                    {"op": "test", "path": "/spec/podSets/0/name", "value": WORKERS},
                    {"op": "replace", "path": "/spec/podSets/0/count", "value": a.workers}]
                if a.spares is not None:
                    ops.append({"op": "replace", "path": "/spec/podSets/1/count", "value": a.spares})
                try:
                    await self.kube.patch(WORKLOAD.path(ns, a.name), ops, content_type=JSON_PATCH)
                except ApiError as e:
                    if e.status != 422:
                        raise
                    self._refused.add((ns, a.name, a.workers))
                    self.recorder.emit(job, "Warning", "WorkloadNotShrunk",
                                       f"Kueue refused to lower Workload {a.name} to {a.workers} workers "
                                       f"(Kueue's feature gate ElasticJobsViaWorkloadSlices off?): the job runs "
                                       f"fewer workers but keeps the quota it was admitted with. {e.message}"[:1000])
                    continue
                self.recorder.emit(job, "Normal", "WorkloadShrunk",
                                   f"Kueue Workload {a.name} lowered to {a.workers} workers: quota released in place")
            elif isinstance(a, Requeue):
                wl = await self.kube.get(WORKLOAD.path(ns, a.name))
                if wl is None:
                    continue
                now = fmt_time(dt.datetime.now(dt.timezone.utc))
                await self.kube.patch(WORKLOAD.path(ns, a.name) + "/status", requeue_patch(wl, now),
                                      content_type=JSON_PATCH)
                self.metrics.evictions.labels(reason=a.reason or "Evicted").inc()
                self.recorder.emit(job, "Normal", "Requeued", f"Kueue Workload {a.name} gave its quota back "
                                   f"after its eviction ({a.reason}) and waits in the queue again")
            elif isinstance(a, MarkPodsReady):
                wl = await self.kube.get(WORKLOAD.path(ns, a.name))
                if wl is None:
                    continue
                now = fmt_time(dt.datetime.now(dt.timezone.utc))
                try:
                    await self.kube.patch(WORKLOAD.path(ns, a.name) + "/status",
                                          pods_ready_patch(wl, a.ready, a.reason, now), content_type=JSON_PATCH)
                except ApiError as e:
                    if e.status not in (404, 409, 422):  # gone, or changed since read: the next reconcile retries
                        raise
            elif isinstance(a, Finish):
                cond = {"type": "Finished", "status": "True", "reason": a.reason, "message": a.message[:1000],
                        "lastTransitionTime": fmt_time(dt.datetime.now(dt.timezone.utc))}
                try:
                    await self.kube.patch(WORKLOAD.path(ns, a.name) + "/status",
                                          [{"op": "add", "path": "/status/conditions/-", "value": cond}],
                                          content_type=JSON_PATCH)
                except ApiError as e:
                    if e.status != 404:
                        raise

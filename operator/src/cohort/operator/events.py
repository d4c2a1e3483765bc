"""Kubernetes Events about TrainingJobs: what ``kubectl describe tj/NAME`` shows.

Every action the operator takes is announced here. An Event repeated within
:data:`AGGREGATE_S` bumps the count of the first one instead of adding a new
object, as the kubelet's recorder does. Each carries ``eventTime`` to the
microsecond, so readers can order the Events of one second (``cohort events``).
Posting is best effort: a failure is logged and counted, never allowed to fail
a reconcile.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

from .kubeapi import ApiError, Kube
from .lifecycle import fmt_micro_time, fmt_time
from .manifests import EVENT
from .metrics import OperatorMetrics
from .naming import MANAGER

log = logging.getLogger(__name__)
AGGREGATE_S = 600.0
MAX_DEFER_S = 30.0
MAX_MESSAGE = 1024


class EventRecorder:
    """Posts Events; :meth:`emit` queues them so a reconcile never waits for its Events.

    Events of one object go through one queue, so they keep their order.
    """

    def __init__(self, kube: Kube, metrics: OperatorMetrics, identity: str, workers: int = 4):
        self.kube = kube
        self.metrics = metrics
        self.identity = identity
        self._seen: dict[tuple[str, str, str, str], tuple[str, int, float]] = {}
        self._queues: list[asyncio.Queue[tuple[dict[str, Any], str, str, str]]] = [
            asyncio.Queue() for _ in range(max(workers, 1))]

    def start(self, busy: Callable[[], bool] | None = None) -> list[asyncio.Task[None]]:
        """Start the posting workers. While ``busy()`` (reconciles waiting), Events wait up to
        :data:`MAX_DEFER_S`: on a loaded API server the workers' pods come first."""
        async def drain(queue: asyncio.Queue[tuple[dict[str, Any], str, str, str]]) -> None:
            while True:
                obj, type_, reason, message = await queue.get()
                deadline = time.monotonic() + MAX_DEFER_S
                while busy is not None and busy() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await self.post(obj, type_, reason, message)

        return [asyncio.create_task(drain(q), name=f"events-{i}") for i, q in enumerate(self._queues)]

    def emit(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an Event about ``obj`` (only its identity is kept)."""
        meta = obj["metadata"]
        ref = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
               "metadata": {k: meta.get(k, "") for k in ("name", "namespace", "uid", "resourceVersion")}}
        queue = self._queues[zlib.crc32(str(meta.get("uid", meta["name"])).encode()) % len(self._queues)]
        queue.put_nowait((ref, type_, reason, message))

    @property
    def pending(self) -> int:
        return sum(q.qsize() for q in self._queues)

    async def post(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        ns, uid = meta["namespace"], meta.get("uid", "")
        message = message[:MAX_MESSAGE]
        at = dt.datetime.now(dt.timezone.utc)
        now = fmt_time(at)
        key = (uid, type_, reason, message)
        seen = self._seen.get(key)
        try:
            if seen and time.monotonic() - seen[2] < AGGREGATE_S:
                name, count, _ = seen
                await self.kube.patch(EVENT.path(ns, name), {"count": count + 1, "lastTimestamp": now})
                self._seen[key] = (name, count + 1, time.monotonic())
                return
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
                "involvedObject": {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
                                   "name": meta["name"], "namespace": ns, "uid": uid,
                                   "resourceVersion": meta.get("resourceVersion", "")},
                "type": type_, "reason": reason, "message": message,
                "source": {"component": MANAGER},
                "reportingComponent": MANAGER, "reportingInstance": self.identity[:128],
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
                # To the microsecond (firstTimestamp has whole seconds): what orders one second's Events, which
                # the API server lists by their random names. A core/v1 Event with eventTime needs an action.
                "eventTime": fmt_micro_time(at), "action": reason,
            }
            created = await self.kube.create(EVENT.path(ns), body)
            self._seen[key] = (created["metadata"]["name"], 1, time.monotonic())
            if len(self._seen) > 10000:
                self._prune()
        except (ApiError, OSError, TimeoutError) as e:
            if seen:
                self._seen.pop(key, None)  # the aggregated Event may be gone: start a new one next time
            self.metrics.errors.labels(where="events").inc()
            log.warning("could not post Event %s for %s/%s: %s", reason, ns, meta["name"], e)

    def _prune(self) -> None:
        cutoff = time.monotonic() - AGGREGATE_S
        self._seen = {k: v for k, v in self._seen.items() if v[2] >= cutoff}

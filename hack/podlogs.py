"""Keeps every worker's log, even after its pod is deleted (as a log shipper would).

A kubelet drops a container's log with its pod, and the operator deletes a
failed or replaced worker at once, so the demo and the end-to-end tests follow
each worker's log through the API server (``kubectl logs -f``) into
``<dir>/<namespace>_<pod>_<container>.log`` while it runs.

    with PodLogs(core, namespace, "demo", directory):   # the job's name
        ...  # run the job
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from cohort.operator.naming import LABEL_JOB


class PodLogs:
    def __init__(self, core: Any, namespace: str, job: str, directory: Path, container: str = "trainer"):
        self.core, self.namespace, self.selector = core, namespace, f"{LABEL_JOB}={job}"  # every pod of the job
        self.directory, self.container = Path(directory), container
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stop = threading.Event()
        self._following: set[str] = set()
        self.nodes: dict[str, str] = {}  # pod -> the node it ran on

    def clear(self, prefix: str) -> None:
        """Remove logs left by an earlier run of pods named ``prefix*``."""
        for old in self.directory.glob(f"{self.namespace}_{prefix}*_{self.container}.log"):
            old.unlink()

    def path(self, pod: str) -> Path:
        return self.directory / f"{self.namespace}_{pod}_{self.container}.log"

    def __enter__(self) -> PodLogs:
        threading.Thread(target=self._watch, name="podlogs-watch", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                   timeout_seconds=10):
                    pod = ev["object"]
                    if pod.spec.node_name:
                        self.nodes[pod.metadata.name] = pod.spec.node_name
                    started = any(s.state and (s.state.running or s.state.terminated)
                                  for s in pod.status.container_statuses or [])
                    if started and pod.metadata.name not in self._following:
                        self._following.add(pod.metadata.name)
                        threading.Thread(target=self._follow, args=(pod.metadata.name,), daemon=True).start()
                    if self._stop.is_set():
                        break
            except (ApiException, OSError, ValueError):
                self._stop.wait(1)

    def _follow(self, pod: str) -> None:
        try:
            resp = self.core.read_namespaced_pod_log(pod, self.namespace, container=self.container, follow=True,
                                                     _preload_content=False)
            with self.path(pod).open("ab") as out:
                for chunk in resp.stream(4096):
                    out.write(chunk)
                    out.flush()
        except (ApiException, OSError, ValueError):
            pass  # the pod went away before its log could be opened

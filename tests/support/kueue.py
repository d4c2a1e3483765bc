"""The local Kueue for tests (hack/kueue.sh), and queues to put jobs in.

``kueue`` (a session fixture) reuses a running hack/kueue.sh instance or
starts one, and stops only one it started. ``queue`` (per test) makes a
ResourceFlavor, a ClusterQueue with cpu quota and a LocalQueue in the test's
namespace, and deletes the cluster-scoped ones afterwards. Use them from a
test module with::

    from tests.support.kueue import kueue, queue  # noqa: F401  (fixtures)
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from cohort.operator.naming import LABEL_JOB
from tests.support.kube import Cluster

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "kueue.sh"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Cluster:
    running = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True).returncode == 0
    if not running:
        proc = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"could not start Kueue (hack/kueue.sh up):\n{proc.stderr[-4000:]}", pytrace=False)
    yield cluster
    if not running and not os.environ.get("COHORT_KEEP_CLUSTER"):
        subprocess.run([str(SCRIPT), "down"], check=False)


def restart_kueue(**env: str) -> None:
    """hack/kueue.sh restart with ``env`` (e.g. COHORT_KUEUE_PODS_READY_TIMEOUT): another configuration."""
    proc = subprocess.run([str(SCRIPT), "restart"], capture_output=True, text=True, env={**os.environ, **env})
    if proc.returncode != 0:
        pytest.fail(f"could not restart Kueue (hack/kueue.sh restart):\n{proc.stderr[-4000:]}", pytrace=False)


@pytest.fixture
def pods_ready_timeout(kueue: Cluster):
    """Kueue with waitForPodsReady's timeout at 8 s for one test, then as hack/kueue.sh starts it."""
    restart_kueue(COHORT_KUEUE_PODS_READY_TIMEOUT="8s")
    yield 8.0
    restart_kueue()


class Queue:
    """A LocalQueue (``name``) in a test namespace over its own ClusterQueue (cpu quota as given,
    memory without limit) and ResourceFlavor."""

    def __init__(self, cluster: Cluster, namespace: str):
        self.cluster, self.namespace = cluster, namespace
        self.name = "team"
        self.cluster_queue = f"cq-{uuid.uuid4().hex[:6]}"
        self.flavor = f"rf-{self.cluster_queue[3:]}"
        self.priorities: list[str] = []

    def create(self, cpu: str, *, node_labels: dict[str, str] | None = None,
               tolerations: list[dict[str, Any]] | None = None, preemption: bool = False) -> Queue:
        api = self.cluster.custom
        flavor_spec: dict[str, Any] = {}
        if node_labels:
            flavor_spec["nodeLabels"] = node_labels
        if tolerations:
            flavor_spec["tolerations"] = tolerations
        api.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": self.flavor},
            "spec": flavor_spec})
        cq_spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            # Memory is covered (Kueue admits no request it does not cover) but never the limit.
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                {"name": self.flavor, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                    {"name": "memory", "nominalQuota": "1Ti"}]}]}]}
        if preemption:
            cq_spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        api.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": self.cluster_queue},
            "spec": cq_spec})
        api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "localqueues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue", "metadata": {"name": self.name},
            "spec": {"clusterQueue": self.cluster_queue}})
        return self

    def priority(self, name: str, value: int) -> str:
        full = f"{name}-{self.cluster_queue[3:]}"
        self.cluster.custom.create_cluster_custom_object(GROUP, VERSION, "workloadpriorityclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkloadPriorityClass", "metadata": {"name": full},
            "value": value})
        self.priorities.append(full)
        return full

    def set_quota(self, cpu: str) -> None:
        cq = self.cluster.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", self.cluster_queue)
        cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = cpu
        self.cluster.custom.replace_cluster_custom_object(GROUP, VERSION, "clusterqueues", self.cluster_queue, cq)

    def usage(self) -> str:
        """The ClusterQueue's cpu in use, as Kueue reports it ("0" when none)."""
        cq = self.cluster.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", self.cluster_queue)
        for flavor in (cq.get("status") or {}).get("flavorsUsage") or []:
            for r in flavor.get("resources") or []:
                if r["name"] == "cpu":
                    return str(r.get("total", "0"))
        return "0"

    def workloads(self, job: str) -> list[dict[str, Any]]:
        out = self.cluster.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "workloads",
                                                                label_selector=f"{LABEL_JOB}={job}")
        return sorted(out["items"], key=lambda w: w["metadata"]["creationTimestamp"] + w["metadata"]["name"])

    def delete(self) -> None:
        api = self.cluster.custom
        for plural, name in [("clusterqueues", self.cluster_queue), ("resourceflavors", self.flavor),
                             *(("workloadpriorityclasses", p) for p in self.priorities)]:
            try:
                api.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def queue(kueue: Cluster, namespace: str):
    q = Queue(kueue, namespace)
    yield q
    q.delete()


def queued(job: dict[str, Any], queue_name: str = "team", priority: str = "") -> dict[str, Any]:
    """``job`` with the labels that put it in a Kueue queue (and give it a WorkloadPriorityClass)."""
    labels = job["metadata"].setdefault("labels", {})
    labels[QUEUE_LABEL] = queue_name
    if priority:
        labels[PRIORITY_LABEL] = priority
    return job

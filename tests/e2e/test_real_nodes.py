"""End to end on real nodes: the operator runs a TrainingJob whose workers are
containers from the trainer image built here, under the restricted Pod
Security Standard, and one worker is OOM-killed by the kernel for exceeding
its memory limit.

Checked from where a user would see it: the worker's uid and read-only root
from inside the running container, the kubelet's OOMKilled verdict in the
operator's Event, the failure counted and replaced, and the job succeeding
with the accuracy target.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.kube import wait_for
from tests.support.operator import TEST_INSTANCE, kubectl
from tests.support.realnodes import real_nodes, restrict  # noqa: F401
from tests.support.training import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ACCURACY = 0.96


def real_job(name: str, **env: str) -> dict:
    job = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    job["metadata"] = {"name": name, "labels": {"cohort.dev/operator": TEST_INSTANCE}}
    spec = job["spec"]
    spec["replicas"] = {"min": 2, "max": 3, "target": 3}
    spec["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    spec["faultTolerance"] = {"backoffSeconds": 1, "maxBackoffSeconds": 4, "belowMinTimeoutSeconds": 120}
    spec["resources"] = {"limits": {"memory": "1536Mi", "cpu": "2"}, "requests": {"memory": "256Mi", "cpu": "100m"}}
    if env:
        spec["podTemplate"] = {"spec": {"containers": [
            {"name": "trainer", "env": [{"name": k, "value": v} for k, v in env.items()]}]}}
    return job


def test_job_in_containers_survives_an_oom_killed_worker(cluster, namespace, real_nodes, operator):  # noqa: F811
    restrict(cluster, namespace)
    cluster.create_job(namespace, real_job("oom", COHORT_FAULT_OOM="rank=1,step=150,mb=4096"))

    # From inside a running worker: the image's user and a read-only root file system.
    def running_worker() -> str | None:
        for p in cluster.job_pods(namespace, "oom"):
            if p.status.phase == "Running" and all(c.ready for c in p.status.container_statuses or []):
                return p.metadata.name
        return None
    worker = wait_for(running_worker, 180, 1, what="a Ready worker container")
    out = kubectl(cluster, "exec", "-n", namespace, worker, "--", "python", "-c",
                  "import json, os\ntry:\n    open('/probe', 'w'); ro = False\n"
                  "except OSError as e:\n    ro = e.errno == 30\n"
                  "print(json.dumps({'uid': os.getuid(), 'read_only_root': ro}))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"uid": 65532, "read_only_root": True}

    def finished() -> dict | None:
        job = cluster.get_job(namespace, "oom")
        return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
    job = wait_for(finished, 420, 1, what="the job finished")
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"]["accuracy"] >= ACCURACY, status["progress"]
    assert status["replacements"]["failure"] >= 1, status
    failed = [e.message for e in cluster.events(namespace, "oom") if e.reason == "WorkerFailed"]
    assert any("OOMKilled" in m and "exit code 137" in m for m in failed), failed
    nodes = {p.spec.node_name for p in cluster.job_pods(namespace, "oom")}
    assert nodes <= set(real_nodes)

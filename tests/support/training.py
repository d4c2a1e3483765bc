"""Helpers for end-to-end training jobs on real nodes: manifests, progress, worker logs.

Jobs run in a namespace that enforces the restricted Pod Security Standard.
Their workers' logs are followed through the API server while they run
(hack/podlogs.py), because the kubelet drops a log with its pod and the
operator deletes failed and replaced workers at once.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube import Cluster, wait_for
from tests.support.operator import TEST_INSTANCE
from tests.support.paths import cluster_dir
from tests.support.realnodes import restrict

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = cluster_dir()
LOG_DIR = CLUSTER_DIR / "logs/pods"
_spec = importlib.util.spec_from_file_location("podlogs", REPO / "hack/podlogs.py")
assert _spec and _spec.loader
podlogs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(podlogs)
FOLLOWERS: list[Any] = []  # stopped after each test (tests/e2e/conftest.py)


def training_job(name: str, env: dict[str, str] | None = None, **sections: Any) -> dict[str, Any]:
    """examples/digits.yaml on real nodes, handled by the test operator; ``sections`` override spec sections."""
    job = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    job["metadata"] = {"name": name, "labels": {"cohort.dev/operator": TEST_INSTANCE}}
    spec = job["spec"]
    spec["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    spec["faultTolerance"] = {"backoffSeconds": 1, "maxBackoffSeconds": 4, "belowMinTimeoutSeconds": 120}
    spec["checkpoint"] = {"everySteps": 100, "keep": 2,
                          "volume": {"persistentVolumeClaim": {"claimName": f"{name}-checkpoints"}}}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **copy.deepcopy(value)}
        else:
            spec[key] = copy.deepcopy(value)
    if env:
        spec["podTemplate"] = {"spec": {"containers": [
            {"name": "trainer", "env": [{"name": k, "value": v} for k, v in env.items()]}]}}
    return job


def create(cluster: Cluster, ns: str, job: dict[str, Any]) -> None:
    """Apply the job (and its checkpoint claim) in a restricted namespace, and follow its workers' logs."""
    restrict(cluster, ns)
    name = job["metadata"]["name"]
    follow_logs(cluster, ns, name)
    claim = job["spec"]["checkpoint"].get("volume", {}).get("persistentVolumeClaim", {}).get("claimName")
    if claim:
        cluster.core.create_namespaced_persistent_volume_claim(ns, {
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    cluster.create_job(ns, job)


def follow_logs(cluster: Cluster, ns: str, name: str) -> None:
    """Follow the job's workers' logs into LOG_DIR (worker_records reads them) until the test ends."""
    follower = podlogs.PodLogs(cluster.core, ns, name, LOG_DIR)
    follower.clear(f"{name}-worker-")
    FOLLOWERS.append(follower.__enter__())


def progress(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.get_job(ns, name).get("status", {}).get("progress", {}) or {}


def wait_step(cluster: Cluster, ns: str, name: str, step: int, timeout_s: float = 120) -> dict[str, Any]:
    with explained(cluster, ns, name):
        return wait_for(lambda: (p := progress(cluster, ns, name)) and p.get("step", 0) >= step and p,
                        timeout_s, 0.2, what=f"{name} at step {step}")


def wait_finished(cluster: Cluster, ns: str, name: str, timeout_s: float = 240) -> dict[str, Any]:
    with explained(cluster, ns, name):
        return wait_for(lambda: (j := cluster.get_job(ns, name)).get("status", {}).get("phase") in
                        ("Succeeded", "Failed") and j, timeout_s, 0.5, what=f"{name} finished")


@contextlib.contextmanager
def explained(cluster: Cluster, ns: str, name: str):
    """On a timeout, add what the job and its workers were doing (the logs are gone after the session)."""
    try:
        yield
    except AssertionError as e:
        status = cluster.get_job(ns, name).get("status", {})
        pods = [(p.metadata.name, p.status.phase, p.status.pod_ip)
                for p in cluster.job_pods(ns, name)]
        tails = []
        for path in sorted(LOG_DIR.glob(f"{ns}_{name}-worker-*_trainer.log")):
            lines = path.read_text(errors="replace").splitlines()[-6:]
            tails.append(f"--- {path.name}\n" + "\n".join(line[:400] for line in lines))
        raise AssertionError(f"{e}\nstatus: {json.dumps(status)[:3000]}\npods: {pods}\n" + "\n".join(tails)) from e


def worker_records(ns: str, name: str) -> list[dict[str, Any]]:
    """Every JSON log record of every worker pod the job ever had, with the pod name added."""
    out = []
    for path in sorted(LOG_DIR.glob(f"{ns}_{name}-worker-*_trainer.log")):
        pod = path.name[len(ns) + 1:].rsplit("_", 1)[0]
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append({**json.loads(line), "_pod": pod})
    return sorted(out, key=lambda r: r.get("ts", ""))


def steps_lost(records: list[dict[str, Any]]) -> list[int]:
    """For every member that left a world: the steps it had completed minus the step the next world
    resumed at. Positive values are steps computed twice; in-place recovery gives 0 (or less)."""
    resumed: dict[int, int] = {}
    for r in records:
        if r.get("msg") == "joined world" and r.get("source") in ("peer", "checkpoint"):
            resumed.setdefault(r["world_version"], r["step"])
    lost = []
    for r in records:
        if r.get("msg") == "left world":
            later = [v for v in resumed if v > r["world_version"]]
            if later:
                lost.append(r["step"] - resumed[min(later)])
    return lost


def world_sizes(records: list[dict[str, Any]], pod: str) -> list[int]:
    """The world sizes one worker trained in, in order."""
    return [r["size"] for r in records if r.get("msg") == "joined world" and r["_pod"] == pod]

"""The real operator as a subprocess, for integration tests, plus job and kubelet helpers.

``operator`` (a fixture) runs ``cohort-operator`` limited to the test's
namespace, on free ports, with short resync and probe intervals. The handle
can SIGKILL and restart it. Use it from a test module with::

    from tests.support.operator import operator_fixture  # noqa: F401  (the ``operator`` fixture)

Helpers here act where a kubelet or scheduler would: tests on kwok nodes
bind pods by hand (``schedulerName: manual`` keeps the scheduler away),
and make pods fail or succeed through the pods/status subresource.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from cohort.trainer.runtime.ports import free_ports
from tests.support.kube import Cluster, condition, wait_for
from tests.support.paths import kubectl_bin
from tests.support.specs import WORKLOAD

REPO = Path(__file__).resolve().parents[2]
MANUAL_SCHEDULER = "manual"  # no scheduler serves it: tests bind pods themselves
# Test jobs carry cohort.dev/operator=<this> and the test operators handle only
# those, so a development operator running on the shared cluster (which
# handles unlabelled jobs) never acts on a test's job, and vice versa.
TEST_INSTANCE = "test"
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


class Operator:
    """One ``cohort-operator`` process (restartable) and its log file."""

    def __init__(self, cluster: Cluster, namespaces: list[str], log_path: Path, *extra: str,
                 standalone: bool = True, instance: str = TEST_INSTANCE):
        self.cluster = cluster
        self.instance = instance
        self.namespaces = namespaces
        self.log_path = log_path
        self.extra = list(extra)
        self.standalone = standalone
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = self.health_port = 0

    def start(self) -> Operator:
        self.metrics_port, self.health_port = free_ports(2)
        args = [sys.executable, "-m", "cohort.operator.main",
                "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port),
                "--resync-seconds", "5", "--progress-seconds", "1", "--http-timeout-seconds", "0.5",
                "--discovery-seconds", "1", *self.extra]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        if self.instance:
            args += ["--instance", self.instance]
        if self.standalone:
            args.append("--standalone")
        env = {**os.environ, "KUBECONFIG": self.cluster.kubeconfig, "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return self

    def wait_ready(self, role: str = "leader", timeout_s: float = 30) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
            return self.readyz().get("role") == role

        wait_for(ready, timeout_s, 0.2, what=f"operator role {role}")

    def readyz(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return {}

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            return str(r.read().decode())

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like an OOM kill or a node failure."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start().wait_ready()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@pytest.fixture(name="operator")
def operator_fixture(cluster: Cluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest):
    """The operator watching only this test's namespace; its log is shown if the test fails."""
    failed_before = request.session.testsfailed
    op = Operator(cluster, [namespace], tmp_path / "operator.log").start()
    op.wait_ready()
    yield op
    op.stop()
    if request.session.testsfailed > failed_before:  # the call's report is in before teardown
        print(f"\n--- operator log (tail) ---\n{op.log_tail(80)}")


# --- TrainingJobs ---------------------------------------------------------------

def job_manifest(name: str, *, manual: bool = False, **sections: Any) -> dict[str, Any]:
    """A small TrainingJob for kwok nodes with short timers; ``sections`` override spec sections."""
    spec: dict[str, Any] = {
        "workload": dict(WORKLOAD),
        "replicas": {"min": 2, "max": 4, "target": 2},
        "faultTolerance": {"backoffSeconds": 1, "maxBackoffSeconds": 2, "maxRestarts": 5,
                           "belowMinTimeoutSeconds": 60},
        "scheduling": {"nodeSelector": {"type": "kwok"}, "tolerations": [KWOK_TOLERATION]},
        "stragglers": {"policy": "ignore"},
    }
    if manual:
        spec["scheduling"]["schedulerName"] = MANUAL_SCHEDULER
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **copy.deepcopy(value)}
        else:
            spec[key] = copy.deepcopy(value)
    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "labels": {"cohort.dev/operator": TEST_INSTANCE}}, "spec": spec}


def phase_is(cluster: Cluster, ns: str, name: str, phase: str):
    def check() -> dict[str, Any] | None:
        job = cluster.get_job(ns, name)
        return job if job.get("status", {}).get("phase") == phase else None
    return check


def wait_phase(cluster: Cluster, ns: str, name: str, phase: str, timeout_s: float = 30) -> dict[str, Any]:
    return wait_for(phase_is(cluster, ns, name, phase), timeout_s, what=f"{name} phase {phase}")


def wait_condition(cluster: Cluster, ns: str, name: str, type_: str, status: str = "True",
                   timeout_s: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = cluster.get_job(ns, name)
        c = condition(job, type_)
        return c if c and c["status"] == status else None
    return wait_for(check, timeout_s, what=f"{name} condition {type_}={status}")


def pods(cluster: Cluster, ns: str, name: str, *, live: bool = True) -> list[Any]:
    """The job's pods (by default only those not being deleted), oldest ordinal first."""
    items = [p for p in cluster.job_pods(ns, name) if not (live and p.metadata.deletion_timestamp)]
    return sorted(items, key=lambda p: int(p.metadata.name.rsplit("-", 1)[-1]))


def pod_names(cluster: Cluster, ns: str, name: str) -> list[str]:
    return [p.metadata.name for p in pods(cluster, ns, name)]


def world(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    cm = cluster.core.read_namespaced_config_map(f"{name}-world", ns)
    return dict(json.loads(cm.data["world.json"]))


def event_reasons(cluster: Cluster, ns: str, name: str) -> list[str]:
    return [e.reason for e in cluster.events(ns, name) if e.involved_object.kind == "TrainingJob"]


def wait_event(cluster: Cluster, ns: str, name: str, reason: str, timeout_s: float = 15) -> None:
    wait_for(lambda: reason in event_reasons(cluster, ns, name), timeout_s, what=f"Event {reason} on {name}")


# --- acting as scheduler and kubelet --------------------------------------------------

def kwok_nodes(cluster: Cluster) -> list[str]:
    return sorted(n.metadata.name for n in cluster.core.list_node(label_selector="type=kwok").items)


def bind(cluster: Cluster, ns: str, pod: str, node: str | None = None) -> None:
    """Bind a pod to a kwok node (what the scheduler would do); kwok then makes it Running and Ready."""
    node = node or kwok_nodes(cluster)[0]
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    cluster.core.create_namespaced_binding(ns, body, _preload_content=False)


def terminate(cluster: Cluster, ns: str, pod: str, exit_code: int, message: str = "") -> None:
    """Report the trainer container as exited (Failed or Succeeded), as the kubelet would."""
    term: dict[str, Any] = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}
    if message:
        term["message"] = message
    status = {"phase": "Succeeded" if exit_code == 0 else "Failed",
              "conditions": [{"type": "Ready", "status": "False"}],
              "containerStatuses": [{"name": "trainer", "image": "x", "imageID": "", "ready": False,
                                     "restartCount": 0, "state": {"terminated": term}}]}
    cluster.core.patch_namespaced_pod_status(pod, ns, {"status": status})


def gone(read, *args: Any) -> bool:
    try:
        read(*args)
        return False
    except ApiException as e:
        return e.status == 404


def kubectl(cluster: Cluster, *args: str, timeout_s: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the pinned kubectl. A non-zero exit fails the test with kubectl's stderr,
    unless ``check=False`` (for a test that asserts on the failure itself)."""
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
    out = subprocess.run([kubectl_bin(), *args], capture_output=True, text=True, env=env, timeout=timeout_s)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return out


def sleep_s(seconds: float) -> None:
    """For the few places where time must pass (a backoff is being asserted)."""
    time.sleep(seconds)

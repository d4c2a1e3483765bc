"""Progress polling and straggler replacement over real HTTP (contract §4, issue 6 §3).

No trainer here: the test is the kubelet and the workers. Pods are bound to
fake nodes that nothing manages; the test reports them Running and Ready
with loopback IPs (127.0.93.x), and serves each worker's /metrics, /progress
and /healthz there on port 9400, with one worker computing 4x slower.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.kube import condition, wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    MANUAL_SCHEDULER,
    bind,
    job_manifest,
    operator_fixture,
    pod_names,
    pods,
    wait_event,
    wait_phase,
)

pytestmark = pytest.mark.k8s
STEPS_PER_S = 10.0


class FakeWorker:
    """A worker's HTTP endpoints: compute time per step ``compute_s``, steps at a fixed rate."""

    def __init__(self, ip: str, compute_s: float, rank0: bool = False):
        self.ip, self.compute_s, self.rank0 = ip, compute_s, rank0
        self.started = time.monotonic()
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                steps = int((time.monotonic() - worker.started) * STEPS_PER_S)
                path = self.path.split("?")[0]  # the operator asks /progress?ledgerAt=... (docs/contracts.md §4)
                if path == "/metrics":
                    body = ("# TYPE cohort_step_compute_seconds histogram\n"
                            f'cohort_step_compute_seconds_bucket{{le="+Inf"}} {steps}\n'
                            f"cohort_step_compute_seconds_sum {steps * worker.compute_s}\n"
                            f"cohort_step_compute_seconds_count {steps}\n")
                elif path == "/progress":
                    body = json.dumps({"rank": 0, "worldVersion": 1, "step": steps, "epoch": 1, "loss": 0.25,
                                       "samplesPerSecond": 640.0, "accuracy": 0.5, "plan": "dp",
                                       "lastCheckpoint": {"step": 10, "location": "/c/step-00000010",
                                                          "time": "2026-01-01T00:00:00Z"},
                                       "state": "training"})
                else:
                    body = "ok\n"
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((ip, 9400), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_nodes(cluster):
    """Two Nodes no kubelet manages: pods bound to them are driven by the test."""
    names = [f"fake-{uuid.uuid4().hex[:5]}-{i}" for i in range(2)]
    for name in names:
        cluster.core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                                          "cohort.dev/test": "true"}}})
    yield names
    for name in names:
        cluster.core.delete_node(name)


def report_ready(cluster, ns: str, pod: str, ip: str) -> None:
    now = "2026-01-01T00:00:00Z"
    cluster.core.patch_namespaced_pod_status(pod, ns, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "trainer", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
                               "started": True, "state": {"running": {"startedAt": now}}}]}})


def test_progress_is_read_and_a_slow_worker_is_replaced_away_from_its_node(cluster, namespace, operator, fake_nodes):
    node_a, node_b = fake_nodes
    base = 10 + int(uuid.uuid4().int % 200)
    ips = [f"127.0.93.{base + i}" for i in range(4)]
    cluster.create_job(namespace, job_manifest(
        "slow", manual=True, replicas={"min": 2, "max": 4, "target": 3},
        stragglers={"policy": "replace", "threshold": 1.5, "windowSeconds": 3}))
    assert job_manifest("x", manual=True)["spec"]["scheduling"]["schedulerName"] == MANUAL_SCHEDULER
    names = wait_for(lambda: (lambda n: n if len(n) == 3 else None)(pod_names(cluster, namespace, "slow")), 15,
                     what="3 pods")
    workers = [FakeWorker(ips[0], 0.1, rank0=True), FakeWorker(ips[1], 0.4), FakeWorker(ips[2], 0.1)]
    try:
        for name, ip in zip(names, ips, strict=False):
            bind(cluster, namespace, name, node_a)
            report_ready(cluster, namespace, name, ip)
        job = wait_phase(cluster, namespace, "slow", "Running")
        assert job["status"]["world"]["members"] == names

        # rank 0's /progress becomes status.progress and status.lastCheckpoint
        job = wait_for(lambda: (lambda j: j if j["status"]["progress"].get("step", 0) > 0 else None)(
            cluster.get_job(namespace, "slow")), 15, what="progress in the status")
        assert job["status"]["progress"]["loss"] == 0.25 and job["status"]["progress"]["plan"] == "dp"
        assert job["status"]["lastCheckpoint"]["step"] == 10

        # After a full window the 4x-slower worker is judged, and a replacement avoids its node.
        wait_event(cluster, namespace, "slow", "StragglerDetected", timeout_s=20)
        replacement = wait_for(lambda: next((p for p in pods(cluster, namespace, "slow")
                                             if p.metadata.name not in names), None), 10, what="replacement pod")
        assert replacement.metadata.annotations["cohort.dev/replaces"] == names[1]
        terms = replacement.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        rule = terms.node_selector_terms[0].match_expressions[-1]
        assert (rule.key, rule.operator, rule.values) == ("kubernetes.io/hostname", "NotIn", [node_a])
        assert cluster.get_job(namespace, "slow")["status"]["world"]["members"] == names  # not before it is Ready

        workers.append(FakeWorker(ips[3], 0.1))
        bind(cluster, namespace, replacement.metadata.name, node_b)
        report_ready(cluster, namespace, replacement.metadata.name, ips[3])
        job = wait_for(lambda: (lambda j: j if j["status"]["replacements"]["straggler"] == 1 else None)(
            cluster.get_job(namespace, "slow")), 15, what="straggler replaced")
        # One new version: the straggler out, the replacement appended.
        assert job["status"]["world"]["members"] == [names[0], names[2], replacement.metadata.name]
        wait_event(cluster, namespace, "slow", "StragglerReplaced")
        straggler = cluster.core.read_namespaced_pod(names[1], namespace)
        assert straggler.metadata.deletion_timestamp is not None  # no kubelet here to finish it
        assert condition(job, "Ready")["status"] == "True" and job["status"]["phase"] == "Running"
    finally:
        for w in workers:
            w.close()

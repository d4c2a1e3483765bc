"""cohort.client and the ``cohort`` CLI against the real API server, with the real operator and kwok nodes.

The test plays the kubelet as tests/integration/test_operator_lifecycle.py does
(kwok runs no containers): rank 0 "exits 0" with a summary, and the job
succeeds. On kwok nodes a pod has no log to read, so the logs test checks
which pods ``logs`` picks (by rank through the world ConfigMap, or all) and
that reading one asks the API server for that pod's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cohort.client import ApiError, Client, CohortError, JobFailed, NotFound
from tests.support.kube import wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    job_manifest,
    operator_fixture,
    terminate,
    world,
)

pytestmark = pytest.mark.k8s

SUMMARY = json.dumps({"step": 120, "epoch": 3, "loss": 0.05, "accuracy": 0.96, "samplesPerSecond": 800.0})


def write(tmp_path: Path, manifest: dict) -> Path:
    path = tmp_path / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def cli(cluster, namespace: str, *args: str, **kwargs) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
    return subprocess.Popen([sys.executable, "-m", "cohort.client.cli", *args, "-n", namespace], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_submit_wait_scale_progress_events_delete(cluster, namespace, operator, tmp_path):
    c = Client(kubeconfig=cluster.kubeconfig, namespace=namespace)
    job = c.submit(write(tmp_path, job_manifest("sdk", replicas={"min": 1, "max": 4, "target": 2})))
    assert (job.name, job.namespace) == ("sdk", namespace)
    assert job.spec.replicas.target == 2 and job.spec.checkpoint.keep == 3  # typed, with the server's defaults
    job = c.wait("sdk", "Running", timeout_s=30)
    assert job.status.world.size == 2 and [j.name for j in c.list()] == ["sdk"]

    assert c.scale("sdk", 3) == 3
    job = wait_for(lambda: (lambda j: j if j.status.replicas.active == 3 else None)(c.get("sdk")), 20,
                   what="3 active workers")
    assert job.spec.replicas.target == 3 and job.status.world.members == [f"sdk-worker-{i}" for i in range(3)]
    with pytest.raises(ApiError) as err:  # the scale subresource is checked by the CRD's rules too
        c.scale("sdk", 9)
    assert "spec.replicas.target must be <= spec.replicas.max" in str(err.value) and err.value.status == 422

    with pytest.raises(TimeoutError):
        c.wait("sdk", "Succeeded", timeout_s=1, interval_s=0.2)
    terminate(cluster, namespace, job.status.world.members[0], 0, SUMMARY)
    job = c.wait("sdk", "Succeeded", timeout_s=20, interval_s=0.2)
    progress = c.progress("sdk")
    assert (progress.step, progress.percent, progress.eta_seconds, progress.loss) == (120, 100.0, 0, 0.05)
    assert progress.samples_per_second == 800.0
    wait_for(lambda: {"Running", "Succeeded"} <= {e.reason for e in c.events("sdk")}, 10, what="the job's Events")
    assert all(e.object == "TrainingJob/sdk" for e in c.events("sdk"))
    # The API server took the operator's Events with eventTime to the microsecond (what orders one second's).
    raw = cluster.events(namespace, "sdk")
    assert raw and all(e.event_time and e.action == e.reason for e in raw), [(e.reason, e.event_time) for e in raw]
    if all(e.count == 1 for e in raw):  # none repeated: the client's order is the order they were posted in
        assert [e.reason for e in c.events("sdk")] == [e.reason for e in sorted(raw, key=lambda e: e.event_time)]
    out, err = cli(cluster, namespace, "status", "sdk").communicate(timeout=60)
    assert "Succeeded" in out and "  goodput     " in out, (out, err)

    c.delete("sdk")
    wait_for(lambda: not c.list(), 20, what="the job gone")
    with pytest.raises(NotFound) as err:
        c.get("sdk")
    assert str(err.value) == 'Error from server (NotFound): trainingjobs.cohort.dev "sdk" not found'
    # A new job of the same name: its Events are its own (chosen by uid), none of the deleted job's.
    c.submit(write(tmp_path, job_manifest("sdk", replicas={"min": 1, "max": 4, "target": 2})))
    wait_for(lambda: c.events("sdk"), 20, what="the new job's first Event")
    assert "Succeeded" not in {e.reason for e in c.events("sdk", pods=True)}, c.events("sdk", pods=True)
    out, err = cli(cluster, namespace, "status", "sdk").communicate(timeout=60)
    assert " event " in out and " Succeeded:" not in out, (out, err)  # `cohort status` reads them by uid too
    c.delete("sdk")


def test_a_refused_manifest_names_the_field_as_kubectl_does(cluster, namespace, tmp_path):
    c = Client(kubeconfig=cluster.kubeconfig, namespace=namespace)
    with pytest.raises(ApiError) as err:
        c.submit(job_manifest("bad", replicas={"min": 0, "target": 1}))
    assert err.value.status == 422 and err.value.fields == ("spec.replicas.min",)
    assert str(err.value).startswith('The TrainingJob "bad" is invalid: spec.replicas.min: Invalid value: 0'), \
        str(err.value)
    # Strict, as kubectl apply is: a typo is refused, not dropped.
    typo = job_manifest("typo")
    typo["spec"]["replicas"]["minimum"] = 2
    with pytest.raises(ApiError) as err:
        c.submit(write(tmp_path, typo))
    assert err.value.status == 400 and 'unknown field "spec.replicas.minimum"' in str(err.value), str(err.value)
    # The CLI prints the same line and exits 1.
    proc = cli(cluster, namespace, "submit", str(write(tmp_path, job_manifest("bad", replicas={"min": 0}))))
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 1 and 'error: The TrainingJob "bad" is invalid: spec.replicas.min' in errs, errs
    assert not c.list()


def test_logs_pick_the_rank_through_the_world_or_every_worker(cluster, namespace, operator):
    c = Client(kubeconfig=cluster.kubeconfig, namespace=namespace)
    c.submit(job_manifest("logs", replicas={"min": 1, "max": 4, "target": 3}))
    c.wait("logs", "Running", timeout_s=30)
    # Worker 0 fails: its replacement (worker 3) joins last, so ranks no longer follow the pods' ordinals.
    terminate(cluster, namespace, "logs-worker-0", 137)
    wait_for(lambda: c.get("logs").status.world.members == ["logs-worker-1", "logs-worker-2", "logs-worker-3"],
             20, what="the world after a replacement")
    members = {m["rank"]: m["pod"] for m in world(cluster, namespace, "logs")["members"]}
    assert members == {0: "logs-worker-1", 1: "logs-worker-2", 2: "logs-worker-3"}
    for rank, pod in members.items():
        assert c.log_pods("logs", rank=rank) == [pod]
    wait_for(lambda: c.log_pods("logs") == ["logs-worker-1", "logs-worker-2", "logs-worker-3"], 20,
             what="the failed pod deleted")
    with pytest.raises(CohortError, match=r"no rank 7 \(ranks: 0, 1, 2\)"):
        c.log_pods("logs", rank=7)
    with pytest.raises(NotFound):
        c.log_pods("nope")
    # kwok nodes have no kubelet to serve a log: the API server's answer, for the pod asked for.
    with pytest.raises(ApiError) as err:
        list(c.logs("logs", rank=1))
    assert str(err.value).startswith(f"pod/{members[1]}: Error from server"), str(err.value)
    with pytest.raises(ApiError, match=r"^pod/logs-worker-1: Error from server"):
        list(c.logs("logs"))


def test_cli_submit_watch_exits_0_on_success_and_1_with_the_reason_on_failure(cluster, namespace, operator,
                                                                             tmp_path):
    c = Client(kubeconfig=cluster.kubeconfig, namespace=namespace)
    proc = cli(cluster, namespace, "submit", str(write(tmp_path, job_manifest("watched"))), "--watch")
    wait_for(lambda: [j.name for j in c.list()] == ["watched"], 30, what="the CLI's job")
    job = c.wait("watched", "Running", timeout_s=30)
    terminate(cluster, namespace, job.status.world.members[0], 0, SUMMARY)
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 0, errs
    lines = out.splitlines()
    assert lines[0] == f"trainingjob.cohort.dev/watched created (namespace {namespace})"
    assert any(" Running " in line and "world 2 (v1)" in line for line in lines), out
    assert "100.0%  step 120" in out and lines[-1].startswith("TrainingJob watched succeeded: 120 steps"), out

    proc = cli(cluster, namespace, "submit", str(write(tmp_path, job_manifest(
        "doomed", runPolicy={"activeDeadlineSeconds": 3}))), "--watch")
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "error: TrainingJob doomed failed: DeadlineExceeded" in errs, (out, errs)
    with pytest.raises(JobFailed, match="DeadlineExceeded"):
        c.wait("doomed", "Succeeded", timeout_s=5)

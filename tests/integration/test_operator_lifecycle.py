"""Every lifecycle path of issue 3 §4, against the real control plane with kwok nodes.

The real operator runs as a subprocess (tests/support/operator.py). Tests act
as the scheduler (binding pods of ``schedulerName: manual`` jobs) and as the
kubelet (reporting exits through pods/status), and assert phases,
conditions, Events, the world ConfigMap and the pods.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.kube import condition, wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    bind,
    event_reasons,
    gone,
    job_manifest,
    kubectl,
    operator_fixture,
    pod_names,
    pods,
    terminate,
    wait_condition,
    wait_event,
    wait_phase,
    world,
)

pytestmark = pytest.mark.k8s


def test_gang_start_waits_for_the_target_then_forms_one_world(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("pend", manual=True, replicas={"min": 2, "max": 4, "target": 3}))
    names = wait_for(lambda: pod_names(cluster, namespace, "pend") if len(pod_names(cluster, namespace, "pend")) == 3
                     else None, 15, what="3 pods")
    assert names == ["pend-worker-0", "pend-worker-1", "pend-worker-2"]
    job = wait_condition(cluster, namespace, "pend", "Running", "False")
    assert cluster.get_job(namespace, "pend")["status"]["phase"] == "Pending"
    assert job["reason"] == "WaitingForWorkers"
    bind(cluster, namespace, names[0])
    bind(cluster, namespace, names[1])
    time.sleep(2)  # min are Ready, but a gang start waits for the target (default grace 120 s)
    job = cluster.get_job(namespace, "pend")
    assert job["status"]["phase"] == "Pending" and job["status"].get("world", {}).get("version", 0) == 0
    assert "gang start" in condition(job, "Running")["message"]
    bind(cluster, namespace, names[2])
    job = wait_phase(cluster, namespace, "pend", "Running")
    st = job["status"]
    assert st["world"]["version"] == 1 and st["world"]["members"] == names  # one world: no re-form after start
    assert st["replicas"]["active"] == 3 and st["replicas"]["desired"] == 3
    assert st["selector"] == "cohort.dev/job=pend,cohort.dev/role=worker"
    assert condition(job, "Running")["status"] == "True"
    assert condition(job, "Ready")["status"] == "True"
    assert all(c["observedGeneration"] == job["metadata"]["generation"] for c in st["conditions"])
    w = world(cluster, namespace, "pend")
    assert [m["pod"] for m in w["members"]] == names and w["master"]["port"] == 29400
    for reason in ("PodCreated", "WorldPublished", "Running"):
        wait_event(cluster, namespace, "pend", reason)


def test_gang_start_grace_then_min_is_enough(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("grace", manual=True,
                                               replicas={"min": 2, "max": 4, "target": 3, "startupGraceSeconds": 4}))
    names = wait_for(lambda: pod_names(cluster, namespace, "grace") if len(pod_names(cluster, namespace, "grace")) == 3
                     else None, 15, what="3 pods")
    bind(cluster, namespace, names[0])
    time.sleep(1.5)  # one Ready worker is not enough: still Pending
    assert cluster.get_job(namespace, "grace")["status"]["phase"] == "Pending"
    bind(cluster, namespace, names[1])
    job = wait_phase(cluster, namespace, "grace", "Running", 15)
    st = job["status"]
    assert st["world"]["version"] == 1 and st["world"]["members"] == names[:2]
    assert condition(job, "Ready")["status"] == "False"  # 2 of 3
    wait_event(cluster, namespace, "grace", "GangStartTimedOut")
    bind(cluster, namespace, names[2])
    wait_condition(cluster, namespace, "grace", "Ready")
    assert world(cluster, namespace, "grace")["version"] == 2


def test_failed_worker_leaves_the_world_at_once_and_is_replaced_after_backoff(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("fail", faultTolerance={"backoffSeconds": 2}))
    wait_phase(cluster, namespace, "fail", "Running")
    v1 = world(cluster, namespace, "fail")
    failed_at = time.monotonic()
    terminate(cluster, namespace, "fail-worker-1", 137)
    w = wait_for(lambda: (lambda w: w if w["version"] > v1["version"] else None)(world(cluster, namespace, "fail")),
                 5, 0.05, what="a new world without the failed worker")
    published_s = time.monotonic() - failed_at
    assert "fail-worker-1" not in [m["pod"] for m in w["members"]] and "failed" in w["reason"]
    assert published_s < 2.0, f"world published {published_s:.2f}s after the failure: not at once"
    job = wait_phase(cluster, namespace, "fail", "Recovering", 5)
    assert job["status"]["restarts"] == 1 and job["status"]["replacements"]["failure"] == 1
    replacement = wait_for(lambda: "fail-worker-2" in pod_names(cluster, namespace, "fail"), 10,
                           what="replacement pod")
    assert replacement and time.monotonic() - failed_at >= 1.9, "replaced before backoffSeconds"
    job = wait_phase(cluster, namespace, "fail", "Running", 15)
    assert job["status"]["world"]["members"] == ["fail-worker-0", "fail-worker-2"]
    assert pod_names(cluster, namespace, "fail") == ["fail-worker-0", "fail-worker-2"]
    wait_for(lambda: {"WorkerFailed", "Recovering", "PodDeleted"} <= set(event_reasons(cluster, namespace, "fail")),
             10, what="the Events of the recovery")
    story = kubectl(cluster, "describe", "tj/fail", "-n", namespace).stdout
    for line in ("Phase:", "Restarts:", "Conditions:", "WorkerFailed", "WorldPublished", "exit code 137"):
        assert line in story, f"kubectl describe lacks {line!r}:\n{story}"


def test_spare_is_promoted_at_once(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("spare", replicas={"spares": 1},
                                               faultTolerance={"backoffSeconds": 30, "maxBackoffSeconds": 30}))
    job = wait_for(lambda: (lambda j: j if j.get("status", {}).get("replicas", {}).get("spares") == 1 else None)(
        cluster.get_job(namespace, "spare")), 20, what="a Ready spare")
    assert job["status"]["world"]["members"] == ["spare-worker-0", "spare-worker-1"]
    assert [s["pod"] for s in world(cluster, namespace, "spare")["spares"]] == ["spare-worker-2"]
    terminate(cluster, namespace, "spare-worker-0", 1)
    w = wait_for(lambda: (lambda w: w if w["version"] == 2 else None)(world(cluster, namespace, "spare")), 5, 0.05,
                 what="world v2")
    # The spare joined in the same version that removed the failed rank 0; the survivor is rank 0 now.
    assert [m["pod"] for m in w["members"]] == ["spare-worker-1", "spare-worker-2"]
    assert w["master"]["addr"] == w["members"][0]["ip"]
    wait_event(cluster, namespace, "spare", "SparePromoted")
    job = wait_phase(cluster, namespace, "spare", "Running", 10)
    assert condition(job, "Ready")["status"] == "True"


def test_too_many_restarts_fail_the_job(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("flaky", faultTolerance={"maxRestarts": 1, "backoffSeconds": 0}))
    wait_phase(cluster, namespace, "flaky", "Running")
    terminate(cluster, namespace, "flaky-worker-0", 1)
    wait_for(lambda: "flaky-worker-2" in pod_names(cluster, namespace, "flaky"), 10, what="replacement")
    terminate(cluster, namespace, "flaky-worker-1", 1)
    out = kubectl(cluster, "wait", "--for=condition=Failed", "tj/flaky", "-n", namespace, "--timeout=20s")
    assert out.returncode == 0, out.stderr
    job = cluster.get_job(namespace, "flaky")
    assert job["status"]["phase"] == "Failed" and condition(job, "Failed")["reason"] == "TooManyRestarts"
    assert job["status"]["restarts"] == 2 and job["status"]["completionTime"]
    assert condition(job, "Running")["status"] == "False"
    wait_for(lambda: pod_names(cluster, namespace, "flaky") == [], 15, what="pods deleted")
    wait_event(cluster, namespace, "flaky", "Failed")


def test_below_min_timeout_fails_the_job(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("starved", manual=True, faultTolerance={"belowMinTimeoutSeconds": 2}))
    job = wait_phase(cluster, namespace, "starved", "Failed", 15)
    assert condition(job, "Failed")["reason"] == "BelowMinTimeout"
    assert "belowMinTimeoutSeconds=2" in condition(job, "Failed")["message"]


@pytest.mark.parametrize("policy", ["rank0", "all"])
def test_success_policy_then_ttl_cleans_up(cluster, namespace, operator, policy):
    cluster.create_job(namespace, job_manifest("done", replicas={"spares": 1},
                                               runPolicy={"successPolicy": policy, "ttlSecondsAfterFinished": 3}))
    job = wait_for(lambda: (lambda j: j if j.get("status", {}).get("replicas", {}).get("spares") == 1 else None)(
        cluster.get_job(namespace, "done")), 20, what="running with a spare")
    rank0, rank1 = job["status"]["world"]["members"]
    summary = json.dumps({"step": 120, "epoch": 3, "loss": 0.05, "accuracy": 0.96, "samplesPerSecond": 800.0,
                          "tokensPerSecond": 800.0})
    if policy == "all":
        terminate(cluster, namespace, rank1, 0, summary)
        time.sleep(1.5)
        assert cluster.get_job(namespace, "done")["status"]["phase"] == "Running"  # not every member yet
    terminate(cluster, namespace, rank0, 0, summary)
    out = kubectl(cluster, "wait", "--for=condition=Succeeded", "tj/done", "-n", namespace, "--timeout=20s")
    assert out.returncode == 0, out.stderr
    table = kubectl(cluster, "get", "tj/done", "-n", namespace).stdout.splitlines()  # before the 3 s TTL
    assert table[0].split() == ["NAME", "PHASE", "READY", "STEP", "PROGRESS", "ETA", "LOSS", "TOKENS/S", "GOODPUT",
                                "AGE"], table
    # Goodput 0: these kwok workers never answered /progress, so the job never got past starting.
    assert table[1].split()[3:9] == ["120", "100", "0", "0.05", "800", "0"], table
    job = cluster.get_job(namespace, "done")
    st = job["status"]
    assert st["phase"] == "Succeeded" and st["completionTime"]
    assert condition(job, "Succeeded")["reason"] == ("Rank0Succeeded" if policy == "rank0" else "AllWorkersSucceeded")
    assert st["progress"]["step"] == 120 and st["progress"]["accuracy"] == 0.96
    assert st["progress"]["percent"] == 100.0 and st["progress"]["etaSeconds"] == 0
    # The spare is deleted, a running member after the finishing grace (here the 3 s TTL comes first);
    # finished pods stay for their logs until the TTL.
    wait_for(lambda: all(p.status.phase == "Succeeded" for p in pods(cluster, namespace, "done")), 10,
             what="only finished pods left")
    wait_event(cluster, namespace, "done", "Succeeded")
    wait_for(lambda: gone(cluster.get_job, namespace, "done"), 20, what="ttlSecondsAfterFinished deletion")


def test_suspend_keeps_status_and_resume_recreates(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("nap"))
    wait_phase(cluster, namespace, "nap", "Running")
    terminate(cluster, namespace, "nap-worker-1", 1)
    wait_for(lambda: (lambda j: j if j["status"].get("phase") == "Running" and j["status"]["restarts"] == 1 else None)(
        cluster.get_job(namespace, "nap")), 15, what="recovered once")
    cluster.patch_job(namespace, "nap", {"spec": {"runPolicy": {"suspend": True}}})
    job = wait_phase(cluster, namespace, "nap", "Suspended")
    assert condition(job, "Suspended")["status"] == "True" and condition(job, "Running")["status"] == "False"
    wait_for(lambda: pod_names(cluster, namespace, "nap") == [], 15, what="pods deleted on suspend")
    assert world(cluster, namespace, "nap")["members"] == []
    job = cluster.get_job(namespace, "nap")
    assert job["status"]["restarts"] == 1 and job["status"]["replicas"]["active"] == 0  # status kept
    wait_event(cluster, namespace, "nap", "Suspended")
    cluster.patch_job(namespace, "nap", {"spec": {"runPolicy": {"suspend": False}}})
    job = wait_phase(cluster, namespace, "nap", "Running", 20)
    assert condition(job, "Suspended")["status"] == "False"
    names = pod_names(cluster, namespace, "nap")
    assert len(names) == 2 and "nap-worker-0" not in names  # new pods, new names
    assert job["status"]["restarts"] == 1
    wait_event(cluster, namespace, "nap", "Resumed")


def test_active_deadline_fails_with_deadline_exceeded(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("late", runPolicy={"activeDeadlineSeconds": 3}))
    wait_phase(cluster, namespace, "late", "Running")
    job = wait_phase(cluster, namespace, "late", "Failed", 15)
    assert condition(job, "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: pod_names(cluster, namespace, "late") == [], 15, what="pods deleted")


def test_kubectl_scale_adds_and_removes_workers(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("elastic", replicas={"min": 1, "max": 4, "target": 2}))
    wait_phase(cluster, namespace, "elastic", "Running")
    out = kubectl(cluster, "scale", "tj/elastic", "-n", namespace, "--replicas=4")
    assert out.returncode == 0, out.stderr
    job = wait_for(lambda: (lambda j: j if j["status"]["replicas"]["active"] == 4 else None)(
        cluster.get_job(namespace, "elastic")), 20, what="4 active workers")
    assert job["status"]["world"]["members"] == [f"elastic-worker-{i}" for i in range(4)]
    out = kubectl(cluster, "get", "tj/elastic", "-n", namespace, "-o", "jsonpath={.status.replicas.active}")
    assert out.stdout == "4"
    version = world(cluster, namespace, "elastic")["version"]
    out = kubectl(cluster, "scale", "tj/elastic", "-n", namespace, "--replicas=2")
    assert out.returncode == 0, out.stderr
    w = wait_for(lambda: (lambda w: w if w["version"] > version else None)(world(cluster, namespace, "elastic")),
                 10, 0.05, what="world without the newest workers")
    assert [m["pod"] for m in w["members"]] == ["elastic-worker-0", "elastic-worker-1"]
    wait_for(lambda: pod_names(cluster, namespace, "elastic") == ["elastic-worker-0", "elastic-worker-1"], 15,
             what="newest pods deleted")
    job = cluster.get_job(namespace, "elastic")
    assert job["status"]["replicas"]["active"] == 2 and job["status"]["phase"] == "Running"
    out = kubectl(cluster, "scale", "tj/elastic", "-n", namespace, "--replicas=9", check=False)
    assert out.returncode != 0 and "spec.replicas.target must be <= spec.replicas.max" in out.stderr


def test_deleting_the_job_lets_the_garbage_collector_remove_everything(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("bye"))
    wait_phase(cluster, namespace, "bye", "Running")
    owned = [
        (cluster.core.read_namespaced_config_map, "bye-config"),
        (cluster.core.read_namespaced_config_map, "bye-world"),
        (cluster.core.read_namespaced_service, "bye"),
        (cluster.core.read_namespaced_service_account, "bye-worker"),
        (cluster.rbac.read_namespaced_role, "bye-worker"),
        (cluster.rbac.read_namespaced_role_binding, "bye-worker"),
        (cluster.policy.read_namespaced_pod_disruption_budget, "bye"),
    ]
    for read, name in owned:
        obj = read(name, namespace)
        (ref,) = obj.metadata.owner_references
        assert ref.controller and ref.kind == "TrainingJob" and ref.name == "bye"
    assert cluster.policy.read_namespaced_pod_disruption_budget("bye", namespace).spec.min_available == 2
    cluster.delete_job(namespace, "bye")
    for read, name in owned:
        wait_for(lambda r=read, n=name: gone(r, n, namespace), 60, what=f"garbage collection of {name}")
    wait_for(lambda: cluster.job_pods(namespace, "bye") == [], 60, what="pods garbage-collected")

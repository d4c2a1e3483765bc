"""TrainingJobs behind the real Kueue (hack/kueue.sh) on the real control plane, workers on kwok nodes.

Kueue decides, from the Workloads the operator makes: a job over quota waits
Suspended with Kueue's reason, starts when quota is released, runs with what
partial admission grants, follows its quota in place (a bigger admission
replaces its Workload slice; a scale-down shrinks it), is evicted by a
higher-priority job and queues again. A job whose spec.managedBy names another
controller is left alone.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.kube import condition, wait_for
from tests.support.kueue import kueue, pods_ready_timeout, queue, queued  # noqa: F401  (fixtures)
from tests.support.operator import (
    KWOK_TOLERATION,
    event_reasons,
    job_manifest,
    kubectl,
    operator_fixture,  # noqa: F401  (the `operator` fixture)
    pod_names,
    pods,
    terminate,
    wait_phase,
    world,
)

pytestmark = [pytest.mark.k8s]
CPU = {"requests": {"cpu": "1"}}
DONE = json.dumps({"step": 50, "epoch": 1, "loss": 0.1, "accuracy": 0.97})


def queued_job(name: str, *, priority: str = "", **sections):
    return queued(job_manifest(name, resources=CPU, **sections), priority=priority)


def status(cluster, ns: str, name: str) -> dict:
    return cluster.get_job(ns, name).get("status", {})


def wait_running_with(cluster, ns: str, name: str, size: int, timeout_s: float = 30) -> dict:
    return wait_for(lambda: (s := status(cluster, ns, name)).get("phase") == "Running"
                    and s["world"]["size"] == size and s, timeout_s, what=f"{name} running with {size} workers")


def finish(cluster, ns: str, name: str) -> None:
    """Rank 0 exits 0 (as the kubelet would report it): the job succeeds."""
    terminate(cluster, ns, world(cluster, ns, name)["members"][0]["pod"], 0, DONE)
    wait_phase(cluster, ns, name, "Succeeded", 20)


def test_over_quota_job_waits_with_kueues_reason_and_starts_when_quota_is_released(cluster, namespace, queue,  # noqa: F811
                                                                                   operator):
    queue.create(cpu="2")
    cluster.create_job(namespace, queued_job("first"))
    assert wait_running_with(cluster, namespace, "first", 2)["replicas"]["admitted"] == 2
    wait_for(lambda: queue.usage() == "2", 10, what="Kueue counts 2 cpu in use")
    cluster.create_job(namespace, queued_job("second"))
    wait_phase(cluster, namespace, "second", "Suspended")
    # The first reason is the operator's own "Queued" (Kueue has not looked at the Workload yet); the
    # job must then show Kueue's. Reading it at the first "Suspended" raced with Kueue (failed once in CI).
    job = wait_for(lambda: (j := cluster.get_job(namespace, "second")) and
                   (condition(j, "Suspended") or {}).get("reason") == "Pending" and j, 20,
                   what="Kueue's reason (Pending) on second's Suspended condition")
    suspended = condition(job, "Suspended")
    assert suspended["status"] == "True", suspended
    assert "insufficient unused quota for cpu" in suspended["message"], suspended
    assert condition(job, "Admitted")["status"] == "False"
    time.sleep(2)  # it stays queued: no pod is ever made
    assert pod_names(cluster, namespace, "second") == []
    assert status(cluster, namespace, "second")["phase"] == "Suspended"
    [wl] = queue.workloads("second")
    assert wl["spec"]["podSets"][0]["count"] == 2 and "minCount" not in wl["spec"]["podSets"][0]
    assert wl["metadata"]["ownerReferences"][0]["name"] == "second"

    # An operator upgrade (another default image in every worker's template) keeps the pending Workload,
    # and with it the job's place in the queue; the workers it starts later get the new image.
    operator.extra += ["--default-image", "cohort-trainer:upgraded"]
    operator.restart()
    wait_for(lambda: 'kind="target",trainingjob="second"' in operator.metrics(), 15,
             what="the new operator's reconcile of the queued job (its queue gauge)")
    assert [w["metadata"]["uid"] for w in queue.workloads("second")] == [wl["metadata"]["uid"]]

    finish(cluster, namespace, "first")
    # The operator finishes the Workload after it sees the job succeed: wait for that write.
    first_wl = wait_for(lambda: (w := queue.workloads("first")[0]) and condition(w, "Finished") and w, 30,
                        what="the first job's Workload Finished")
    assert condition(first_wl, "Finished")["status"] == "True" and condition(first_wl, "Finished")["reason"] == \
        "Rank0Succeeded"
    job = wait_running_with(cluster, namespace, "second", 2)
    assert condition(cluster.get_job(namespace, "second"), "Admitted")["status"] == "True"
    assert job["replicas"]["admitted"] == 2
    assert "Resumed" in event_reasons(cluster, namespace, "second")
    assert {p.spec.containers[0].image for p in pods(cluster, namespace, "second")} == {"cohort-trainer:upgraded"}
    # Its time ledger holds the wait: at least the 2 s above, all of it before the admission.
    goodput = job["goodput"]
    assert goodput["seconds"]["queued"] >= 2 and goodput["seconds"]["queued"] <= goodput["wallSeconds"], goodput


def test_partial_admission_runs_what_kueue_admits_and_follows_the_quota_in_place(cluster, namespace, queue,  # noqa: F811
                                                                                 operator):
    # The flavor carries the node placement: the job itself names no node selector.
    queue.create(cpu="3", node_labels={"type": "kwok"}, tolerations=[KWOK_TOLERATION])
    job = queued_job("part", replicas={"min": 2, "max": 4, "target": 4}, scheduling={})
    cluster.create_job(namespace, job)
    st = wait_running_with(cluster, namespace, "part", 3)
    assert st["replicas"]["admitted"] == 3 and len(pod_names(cluster, namespace, "part")) == 3
    pod = pods(cluster, namespace, "part")[0]
    assert pod.spec.node_selector == {"type": "kwok"}
    assert any(t.key == KWOK_TOLERATION["key"] for t in pod.spec.tolerations)
    first, grow = wait_for(lambda: (w := queue.workloads("part")) and len(w) == 2 and w, 10,
                           what="a second Workload slice")
    assert first["spec"]["podSets"][0]["minCount"] == 2
    # A bigger admission is asked for without giving up the running one: all 4 (at least 3 + 1).
    assert grow["spec"]["podSets"][0]["count"] == 4 and "minCount" not in grow["spec"]["podSets"][0]
    assert grow["metadata"]["annotations"]["kueue.x-k8s.io/workload-slice-replacement-for"] == \
        f"{namespace}/{first['metadata']['name']}"
    version = world(cluster, namespace, "part")["version"]
    members = [m["pod"] for m in world(cluster, namespace, "part")["members"]]

    queue.set_quota("4")  # more quota: Kueue swaps the slices, and the job grows in place
    st = wait_running_with(cluster, namespace, "part", 4, 40)
    assert st["replicas"]["admitted"] == 4
    w = world(cluster, namespace, "part")
    assert w["version"] > version and [m["pod"] for m in w["members"]][:3] == members  # nobody restarted
    assert condition(queue.workloads("part")[0], "Finished")["reason"] == "WorkloadSliceReplaced"
    wait_for(lambda: queue.usage() == "4", 10, what="Kueue counts 4 cpu in use")

    kubectl(cluster, "scale", "tj/part", "-n", namespace, "--replicas=2")  # less: the quota goes back at once
    wait_running_with(cluster, namespace, "part", 2)
    wait_for(lambda: queue.usage() == "2", 20, what="Kueue's usage down to 2 cpu")
    live = [w for w in queue.workloads("part") if condition(w, "Finished") is None]
    assert len(live) == 1 and live[0]["spec"]["podSets"][0]["count"] == 2
    assert [m["pod"] for m in world(cluster, namespace, "part")["members"]] == members[:2]


def test_higher_priority_job_evicts_and_the_evicted_job_queues_again(cluster, namespace, queue, operator):  # noqa: F811
    operator.extra += ["--stuck-terminating-seconds", "2"]
    operator.restart()
    queue.create(cpu="2", preemption=True)
    low, high = queue.priority("low", 10), queue.priority("high", 1000)
    cluster.create_job(namespace, queued_job("low", priority=low))
    wait_running_with(cluster, namespace, "low", 2)
    first = queue.workloads("low")[0]["metadata"]["name"]
    # One of its pods will be stuck Terminating (as on a dead node): a finalizer nobody removes.
    hold = {"metadata": {"finalizers": ["cohort.dev/test-hold"]}}
    cluster.core.patch_namespaced_pod("low-worker-0", namespace, hold)
    try:
        cluster.create_job(namespace, queued_job("high", priority=high))
        job = wait_phase(cluster, namespace, "low", "Suspended", 30)
        assert condition(job, "Suspended")["reason"] == "Preempted", condition(job, "Suspended")
        wait_for(lambda: pod_names(cluster, namespace, "low") == [], 20, what="low's pods deleted")
        assert world(cluster, namespace, "low")["members"] == []
        # 2 s past its deletion deadline the stuck pod no longer holds the quota: the preemptor runs.
        wait_running_with(cluster, namespace, "high", 2)
        stuck = cluster.core.read_namespaced_pod("low-worker-0", namespace)
        assert stuck.metadata.deletion_timestamp is not None
    finally:
        cluster.core.patch_namespaced_pod("low-worker-0", namespace, {"metadata": {"finalizers": None}})
    # The same Workload gave its quota back and waits in the queue again, as Kueue's integrations do.
    [wl] = queue.workloads("low")
    assert wl["metadata"]["name"] == first and "admission" not in wl["status"], wl["status"]
    assert condition(wl, "QuotaReserved")["status"] == "False"
    assert condition(wl, "Requeued")["status"] == "True" and condition(wl, "Requeued")["reason"] == "Preempted"
    messages = [e.message for e in cluster.events(namespace, "low") if e.reason == "Suspended"]
    assert any("Kueue evicted Workload" in m for m in messages), messages
    assert 'cohort_operator_queue_evictions_total{reason="Preempted"} 1.0' in operator.metrics()

    finish(cluster, namespace, "high")
    wait_running_with(cluster, namespace, "low", 2, 40)
    assert "low-worker-0" not in pod_names(cluster, namespace, "low")  # new pods
    assert [w["metadata"]["name"] for w in queue.workloads("low")] == [first]
    metrics = operator.metrics()
    assert "cohort_operator_queue_admissions_total 3.0" in metrics  # low, high, low again
    assert f'cohort_operator_queue_workers{{job_namespace="{namespace}",kind="admitted",trainingjob="low"}} 2.0' in metrics


def test_waitforpodsready_keeps_a_training_job_and_evicts_one_whose_pods_never_start(
        cluster, namespace, queue, operator, pods_ready_timeout):  # noqa: F811
    queue.create(cpu="4")
    cluster.create_job(namespace, queued_job("ready"))
    wait_running_with(cluster, namespace, "ready", 2)
    wait_for(lambda: (condition(queue.workloads("ready")[0], "PodsReady") or {}).get("reason") == "Started", 10,
             what="the operator's PodsReady=True (Started) on ready's Workload")
    # Its pods are never scheduled (no scheduler serves them): never ready, evicted at Kueue's timeout.
    cluster.create_job(namespace, queued_job("stuck", manual=True))
    job = wait_for(lambda: (j := cluster.get_job(namespace, "stuck")) and
                   (condition(j, "Suspended") or {}).get("reason") == "PodsReadyTimeout" and j,
                   pods_ready_timeout + 30, what="stuck evicted by Kueue's waitForPodsReady")
    assert job["status"]["phase"] == "Suspended"
    wait_for(lambda: pod_names(cluster, namespace, "stuck") == [], 20, what="stuck's pods deleted")
    # The training job, admitted longer ago than the timeout, was left alone.
    [wl] = queue.workloads("ready")
    assert condition(wl, "Admitted")["status"] == "True" and condition(wl, "Evicted") is None, wl["status"]
    assert status(cluster, namespace, "ready")["phase"] == "Running"


def test_a_job_managed_by_another_controller_is_left_alone(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("elsewhere", managedBy="kueue.x-k8s.io/multikueue"))
    cluster.create_job(namespace, job_manifest("here"))
    wait_phase(cluster, namespace, "here", "Running")  # the operator is working...
    time.sleep(2)
    job = cluster.get_job(namespace, "elsewhere")  # ...and has not touched this one
    assert "status" not in job or not job["status"], job.get("status")
    assert pod_names(cluster, namespace, "elsewhere") == []
    out = kubectl(cluster, "patch", "tj/elsewhere", "-n", namespace, "--type=merge",
                  "-p", '{"spec":{"managedBy":""}}', check=False)
    assert out.returncode != 0 and "spec.managedBy is immutable" in out.stderr

"""The operator is level-based and safe to kill (issue 3 §6-§7).

Drift is repaired (a deleted pod, Service or ConfigMap comes back; an extra
pod goes), a SIGKILLed operator restarted three times mid-run leaves exactly
the expected pods, two replicas elect one leader, a SIGTERM or a stolen Lease
ends the operator at once, and /metrics and the health endpoints answer.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import signal
import time
import urllib.request

import pytest
from kubernetes import client

from cohort.operator.naming import pod_index
from tests.support.kube import PodsCreated, wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    Operator,
    job_manifest,
    operator_fixture,
    pod_names,
    pods,
    terminate,
    wait_event,
    wait_phase,
    world,
)

pytestmark = pytest.mark.k8s


def running_with(cluster, ns: str, name: str, active: int, total: int) -> dict:
    """Wait until the world has ``active`` members and the job exactly ``total`` live pods, all Ready."""
    def check():
        job = cluster.get_job(ns, name)
        st = job.get("status", {})
        live = pods(cluster, ns, name)
        ready = [p for p in live if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        if st.get("phase") == "Running" and st["replicas"]["active"] == active and len(live) == total == len(ready):
            return job
        return None
    return wait_for(check, 30, what=f"{name}: Running, {active} members, {total} Ready pods")


def test_repairs_drift(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("rep"))
    wait_phase(cluster, namespace, "rep", "Running")
    before = world(cluster, namespace, "rep")

    svc_uid = cluster.core.read_namespaced_service("rep", namespace).metadata.uid
    cluster.core.delete_namespaced_service("rep", namespace)
    wait_for(lambda: cluster.core.read_namespaced_service("rep", namespace).metadata.uid != svc_uid, 15,
             what="Service recreated")
    config = cluster.core.read_namespaced_config_map("rep-config", namespace)
    cluster.core.delete_namespaced_config_map("rep-config", namespace)
    wait_for(lambda: cluster.core.read_namespaced_config_map("rep-config", namespace).metadata.uid
             != config.metadata.uid, 15, what="config ConfigMap recreated")
    assert cluster.core.read_namespaced_config_map("rep-config", namespace).data == config.data
    cluster.core.delete_namespaced_config_map("rep-world", namespace)
    wait_for(lambda: world(cluster, namespace, "rep") == before, 15, what="world ConfigMap recreated as it was")
    wait_event(cluster, namespace, "rep", "Repaired")

    extra = {"metadata": {"name": "intruder", "labels": {"cohort.dev/job": "rep"}},
             "spec": {"containers": [{"name": "c", "image": "x"}], "nodeSelector": {"type": "kwok"},
                      "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]}}
    cluster.core.create_namespaced_pod(namespace, extra)
    wait_for(lambda: "intruder" not in [p.metadata.name for p in cluster.job_pods(namespace, "rep")
                                        if not p.metadata.deletion_timestamp], 15, what="extra pod deleted")
    wait_event(cluster, namespace, "rep", "ExtraPodDeleted")

    cluster.core.delete_namespaced_pod("rep-worker-0", namespace)
    w = wait_for(lambda: (lambda w: w if w["version"] > before["version"] else None)(world(cluster, namespace, "rep")),
                 10, 0.05, what="world without the deleted pod")
    assert "rep-worker-0" not in [m["pod"] for m in w["members"]]
    # With min = target = 2 the survivor waits alone (an empty world) until the replacement is Ready.
    wait_for(lambda: any("worker rep-worker-0 was deleted" in e.message for e in cluster.events(namespace, "rep")
                         if e.reason == "WorldPublished"), 10, what="the world's reason names the deletion")
    job = running_with(cluster, namespace, "rep", 2, 2)
    assert pod_names(cluster, namespace, "rep") == ["rep-worker-1", "rep-worker-2"]
    assert job["status"]["restarts"] == 0  # a deletion is not a failure
    wait_event(cluster, namespace, "rep", "WorkerLost")


def _index_persisted(cluster, ns: str, name: str, before: int) -> None:
    """Return the moment the job's status shows a podIndex past ``before``: the operator has reserved the
    index of the pod it is about to create (reconciler.py's step 4), and may not have created it yet."""
    wait_for(lambda: cluster.get_job(ns, name)["status"]["podIndex"] != before, 10, 0.005,
             what=f"{name}: podIndex past {before}")


@pytest.mark.parametrize("kill_at", ["random", "index-persisted"])
def test_sigkill_and_restart_three_times_leaves_exactly_the_expected_pods(cluster, namespace, operator, kill_at):
    rng = random.Random(7)
    cluster.create_job(namespace, job_manifest("tough", replicas={"min": 2, "max": 4, "target": 3, "spares": 1},
                                               faultTolerance={"backoffSeconds": 0}))
    running_with(cluster, namespace, "tough", 3, 4)
    disruptions = [
        ("fail rank 1", lambda: terminate(cluster, namespace, world(cluster, namespace, "tough")["members"][1]["pod"], 1)),
        ("scale to 4", lambda: cluster.patch_job(namespace, "tough", {"spec": {"replicas": {"target": 4}}})),
        ("delete rank 0", lambda: cluster.core.delete_namespaced_pod(
            world(cluster, namespace, "tough")["members"][0]["pod"], namespace)),
    ]
    expected = [(3, 4), (4, 5), (4, 5)]
    with PodsCreated(cluster, namespace, "tough") as seen:
        for (what, disrupt), (active, total) in zip(disruptions, expected, strict=True):
            index = cluster.get_job(namespace, "tough")["status"]["podIndex"]
            disrupt()
            if kill_at == "random":
                time.sleep(rng.uniform(0.0, 0.4))  # somewhere in the middle of the reconcile it triggered
            else:
                _index_persisted(cluster, namespace, "tough", index)  # before or just after the pod's creation
            operator.kill()
            operator.start().wait_ready()
            job = running_with(cluster, namespace, "tough", active, total)
            names = pod_names(cluster, namespace, "tough")
            assert len(names) == len(set(names)) == total, f"after {what}: {names}"
            members = job["status"]["world"]["members"]
            assert len(members) == len(set(members)) == active and set(members) <= set(names), f"after {what}"
            assert world(cluster, namespace, "tough")["version"] == job["status"]["world"]["version"]
    # Four first pods, then one per replaced or added worker: nothing created twice, no name used twice.
    created = seen.uids
    job = cluster.get_job(namespace, "tough")
    assert len(created) == 7 and all(len(uids) == 1 for uids in created.values()), sorted(created)
    # podIndex is persisted before a pod with that index is created, so an operator killed between the two
    # leaves that index unused (never reused: a newcomer is never taken for a departed member): at most one
    # index per kill, as each disruption here creates one pod.
    indices = {pod_index(n) for n in created}
    assert job["status"]["podIndex"] == max(indices) + 1, job["status"]
    assert len(set(range(job["status"]["podIndex"])) - indices) <= len(disruptions), (created, job["status"])
    assert job["status"]["restarts"] == 1 and job["status"]["replacements"]["failure"] == 1
    all_pods = cluster.job_pods(namespace, "tough")
    assert len({p.metadata.name for p in all_pods}) == len(all_pods)


def test_two_replicas_elect_one_leader_and_fail_over(cluster, namespace, tmp_path):
    args = ("--lease-namespace", namespace, "--lease-seconds", "3")
    first = Operator(cluster, [namespace], tmp_path / "a.log", *args, "--identity", "op-a", standalone=False).start()
    first.wait_ready("leader")
    second = Operator(cluster, [namespace], tmp_path / "b.log", *args, "--identity", "op-b", standalone=False).start()
    try:
        second.wait_ready("standby")
        cluster.create_job(namespace, job_manifest("ha"))
        wait_phase(cluster, namespace, "ha", "Running")
        coord = client.CoordinationV1Api(cluster.api)
        assert coord.read_namespaced_lease("cohort-operator-test", namespace).spec.holder_identity == "op-a"
        first.kill()
        second.wait_ready("leader", timeout_s=20)
        assert coord.read_namespaced_lease("cohort-operator-test", namespace).spec.holder_identity == "op-b"
        terminate(cluster, namespace, "ha-worker-0", 1)
        wait_for(lambda: "ha-worker-2" in pod_names(cluster, namespace, "ha"), 20, what="the new leader replaces")
        job = wait_phase(cluster, namespace, "ha", "Running", 20)
        assert job["status"]["restarts"] == 1
    finally:
        first.stop()
        second.stop()


def test_sigterm_stops_the_operator_at_once_releasing_the_lease_and_a_stolen_lease_exits_3(cluster, namespace, tmp_path):
    """A pod's SIGTERM (a rolling update, a drain) ends the operator in well under a second, releasing its
    Lease for a standby to take at once; a leader whose Lease another holder took stops leading and exits 3
    (EXIT_LOST_LEASE), to restart as a standby.

    With a stop flag passed to kopf (as main.py did until this test), kopf waited 5 s on SIGTERM for the
    flag's waiter, which nothing would wake: 5.3 s here.
    """
    args = ("--lease-namespace", namespace, "--lease-seconds", "3", "--identity", "op-a")
    op = Operator(cluster, [namespace], tmp_path / "a.log", *args, standalone=False).start()
    op.wait_ready("leader")
    # Once kopf watches (a job reconciled): a SIGTERM in its first ~50 ms, while kopf still reads API
    # discovery, can take 5 s (kopf closes its sessions under those requests, which retry until it
    # gives up on them as hung tasks; seen once).
    cluster.create_job(namespace, job_manifest("j"))
    wait_for(lambda: cluster.get_job(namespace, "j").get("status", {}).get("phase"), 20, 0.2, what="j reconciled")
    assert op.proc is not None
    t0 = time.monotonic()
    op.proc.send_signal(signal.SIGTERM)
    assert op.proc.wait(15) == 0, op.log_tail()
    assert time.monotonic() - t0 < 2, f"SIGTERM took {time.monotonic() - t0:.1f} s"
    coord = client.CoordinationV1Api(cluster.api)
    assert not coord.read_namespaced_lease("cohort-operator-test", namespace).spec.holder_identity, "not released"

    op.start().wait_ready("leader", timeout_s=20)
    lease = coord.read_namespaced_lease("cohort-operator-test", namespace)
    assert lease.spec.holder_identity == "op-a"
    lease.spec.holder_identity, lease.spec.lease_duration_seconds = "usurper", 60
    lease.spec.renew_time = dt.datetime.now(dt.timezone.utc)
    coord.replace_namespaced_lease("cohort-operator-test", namespace, lease)
    try:
        assert op.proc.wait(15) == 3, op.log_tail()
    finally:
        op.kill()
    assert "lost the Lease to another replica" in op.log_tail()


def operator_metric(operator, series: str) -> float:
    for line in operator.metrics().splitlines():
        if line.rsplit(" ", 1)[0] == series:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} missing from /metrics")


def test_a_write_the_api_server_refuses_counts_as_a_reconcile_error(cluster, namespace, operator):
    # A ResourceQuota of zero pods: every pod creation is refused (403), and the operator retries.
    errors = 'cohort_operator_errors_total{where="reconcile"}'
    assert operator_metric(operator, errors) == 0
    cluster.core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-pods"},
                                                              "spec": {"hard": {"pods": "0"}}})
    cluster.create_job(namespace, job_manifest("refused"))
    wait_for(lambda: operator_metric(operator, errors) >= 2, 20, what="reconcile errors counted (and retried)")
    assert "exceeded quota" in operator.log_tail(), operator.log_tail()
    assert pod_names(cluster, namespace, "refused") == []


def test_metrics_and_health_endpoints(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("obs"))
    wait_phase(cluster, namespace, "obs", "Running")
    terminate(cluster, namespace, "obs-worker-1", 1)
    wait_for(lambda: "obs-worker-2" in pod_names(cluster, namespace, "obs"), 15, what="replacement")

    def metric(series: str) -> float:
        return operator_metric(operator, series)

    assert wait_for(lambda: metric('cohort_operator_jobs{phase="Running"}') == 1.0, 15, what="jobs gauge")
    assert metric("cohort_operator_pods_created_total") >= 3
    assert metric("cohort_operator_pods_deleted_total") >= 1
    assert metric('cohort_operator_replacements_total{reason="failure"}') == 1
    assert metric("cohort_operator_world_changes_total") >= 2
    assert metric("cohort_operator_reconcile_seconds_count") > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=2) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/readyz", timeout=2) as r:
        assert json.loads(r.read()) == {"role": "leader"}

"""A survivor's report (docs/contracts.md §3, operator/reports.py) on the local cluster: the real API server,
RBAC and operator; kwok pods whose addresses are local to this machine (hack/cluster.sh), where the test
answers /healthz on a port to play a live worker, listens without answering for a hung one, and has nothing
listen for a dead one. A hung one is found in two steps: a report while it does not answer re-forms the
world, and a report that names it absent from that world's rendezvous gets it counted, deleted and replaced."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.healthz import serving
from tests.support.kube import Cluster, wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    event_reasons,
    job_manifest,
    operator_fixture,
    pods,
    terminate,
    wait_event,
    world,
)

pytestmark = pytest.mark.k8s
METRICS_PORT = 9400


def as_worker(cluster: Cluster, namespace: str, job: str) -> client.CoreV1Api:
    """The job's workers' own identity: its ServiceAccount."""
    api = client.ApiClient(cluster.api.configuration)
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{job}-worker")
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    return client.CoreV1Api(api)


def report(worker: client.CoreV1Api, namespace: str, job: str, pod: str, version: int,
           absent: tuple[str, ...] = ()) -> None:
    """What the trainer writes when its collective failed or members never arrived at its rendezvous
    (runtime/world.py), as a JSON merge patch."""
    doc = {"pod": pod, "version": version, "at": time.time(), "error": "Connection closed by peer"}
    if absent:
        doc.update(error=f"world {version}: only 1/2 members arrived within 60s", absent=list(absent))
    text = json.dumps(doc)
    worker.patch_namespaced_config_map(f"{job}-reports", namespace, {"data": {"report.json": text}},
                                       _content_type="application/merge-patch+json")


@contextlib.contextmanager
def listening(ip: str):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, METRICS_PORT))
        except OSError as e:
            pytest.fail(f"cannot listen on the kwok pod address {ip}: {e}; hack/cluster.sh makes kwok's pod "
                        "range local when run as root (ip route show table local)")
        s.listen()
        yield


def test_a_reported_member_leaves_the_world_only_when_nothing_listens_and_a_false_alarm_re_forms(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("rep", replicas={"spares": 1},
                                               faultTolerance={"backoffSeconds": 30, "maxBackoffSeconds": 30}))
    w = wait_for(lambda: (lambda w: w if w["spares"] else None)(world(cluster, namespace, "rep")), 20,
                 what="a world with a spare")
    (rank0, ip0), (rank1, ip1) = [(m["pod"], m["ip"]) for m in w["members"]]
    spare = w["spares"][0]["pod"]
    worker = as_worker(cluster, namespace, "rep")
    # The workers may patch the reports ConfigMap, and not their world.
    with pytest.raises(ApiException) as refused:
        worker.patch_namespaced_config_map("rep-world", namespace, {"data": {"world.json": "{}"}})
    assert refused.value.status == 403

    with listening(ip0), listening(ip1):
        report(worker, namespace, "rep", rank0, w["version"])
        time.sleep(2)  # checked within ~0.6 s: both accept and neither answers (hung?): nothing changes
        assert world(cluster, namespace, "rep")["version"] == w["version"]
    # Both answer /healthz: a false alarm (a timeout too short, say). The same members re-form.
    with serving(ip0, METRICS_PORT), serving(ip1, METRICS_PORT):
        report(worker, namespace, "rep", rank0, w["version"])
        w = wait_for(lambda: (lambda x: x if x["version"] > w["version"] else None)(world(cluster, namespace, "rep")),
                     5, 0.05, what="the re-formed world")
    assert [m["pod"] for m in w["members"]] == [rank0, rank1] and w["spares"][0]["pod"] == spare, w
    assert "the same members re-form" in w["reason"], w["reason"]
    # The operator posts Events from a queue after writing the world, deferred up to events.MAX_DEFER_S
    # (30 s) while reconciles wait: wait for them.
    wait_event(cluster, namespace, "rep", "WorldReformed", 35)
    assert event_reasons(cluster, namespace, "rep").count("WorldReformed") == 1
    with listening(ip0):
        # Rank 1's trainer is gone (nothing listens); its pod is still Running as far as its kubelet said.
        report(worker, namespace, "rep", rank0, w["version"])
        after = wait_for(lambda: (lambda x: x if x["version"] > w["version"] else None)(world(cluster, namespace, "rep")),
                         5, 0.05, what="the next world")
    assert [m["pod"] for m in after["members"]] == [rank0, spare]
    assert "unreachable" in after["reason"], after["reason"]
    wait_event(cluster, namespace, "rep", "WorkerLost", 35)
    lost = [e.message for e in cluster.events(namespace, "rep") if e.reason == "WorkerLost"]
    assert lost == [f"Worker {rank1} (rank 1) is unreachable: nothing listens on {ip1}:{METRICS_PORT}"], lost
    # Not deleted and not yet counted: its kubelet reports it, and then it counts as a failure.
    job = cluster.get_job(namespace, "rep")
    assert job["status"]["restarts"] == 0
    assert rank1 in [p.metadata.name for p in pods(cluster, namespace, "rep") if not p.metadata.deletion_timestamp]
    terminate(cluster, namespace, rank1, 137)
    wait_for(lambda: cluster.get_job(namespace, "rep")["status"]["restarts"] == 1, 10, what="the failure counted")


def test_a_silent_member_is_re_formed_and_once_absent_from_the_rendezvous_counted_deleted_and_replaced(
        cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("hang"))
    w = wait_for(lambda: (lambda w: w if len(w["members"]) == 2 else None)(world(cluster, namespace, "hang")), 20,
                 what="a world of 2")
    (rank0, ip0), (rank1, ip1) = [(m["pod"], m["ip"]) for m in w["members"]]
    worker = as_worker(cluster, namespace, "hang")
    with serving(ip0, METRICS_PORT), listening(ip1):  # rank 1 accepts and says nothing: a stopped process
        report(worker, namespace, "hang", rank0, w["version"])
        w2 = wait_for(lambda: (lambda x: x if x["version"] > w["version"] else None)(world(cluster, namespace, "hang")),
                      5, 0.05, what="the re-formed world")
        assert [m["pod"] for m in w2["members"]] == [rank0, rank1] and "the same members re-form" in w2["reason"], w2
        assert cluster.get_job(namespace, "hang")["status"]["restarts"] == 0
        # Rank 0 waited out the re-formed world's rendezvous: rank 1 never came.
        report(worker, namespace, "hang", rank0, w2["version"], absent=(rank1,))
        wait_for(lambda: cluster.get_job(namespace, "hang")["status"]["restarts"] == 1, 10,
                 what="the hung worker counted as a failure")
    after = world(cluster, namespace, "hang")
    assert rank1 not in [m["pod"] for m in after["members"]], after
    assert rank1 not in [p.metadata.name for p in pods(cluster, namespace, "hang") if not p.metadata.deletion_timestamp]
    wait_event(cluster, namespace, "hang", "WorkerFailed", 35)
    failed = [e.message for e in cluster.events(namespace, "hang") if e.reason == "WorkerFailed"]
    assert len(failed) == 1 and f"Worker {rank1} failed (hung: it never arrived at world v{w2['version']}" in failed[0] \
        and "does not answer" in failed[0], failed


def test_a_member_still_in_an_older_world_past_its_deadline_is_hung_at_once(cluster, namespace, operator):
    """Rank 1's trainer answers, and is still in a step of the world its peer left, 30 s past the deadline it
    gives a step (``overdueSeconds``): hung. After the re-form the operator finds it so from its /progress and
    replaces it, without waiting the rendezvous timeout (600 s here) for an absent report (before: it did)."""
    cluster.create_job(namespace, job_manifest("late", faultTolerance={"processGroupTimeoutSeconds": 600}))
    w = wait_for(lambda: (lambda w: w if len(w["members"]) == 2 else None)(world(cluster, namespace, "late")), 20,
                 what="a world of 2")
    (rank0, ip0), (rank1, ip1) = [(m["pod"], m["ip"]) for m in w["members"]]
    v = w["version"]
    worker = as_worker(cluster, namespace, "late")
    with serving(ip0, METRICS_PORT, progress={"state": "recovering", "worldVersion": v}), \
            serving(ip1, METRICS_PORT, progress={"state": "training", "worldVersion": v, "overdueSeconds": 30.0}):
        report(worker, namespace, "late", rank0, v)
        w2 = wait_for(lambda: (lambda x: x if x["version"] > v else None)(world(cluster, namespace, "late")),
                      5, 0.05, what="the re-formed world")
        assert "the same members re-form" in w2["reason"], w2
        wait_for(lambda: cluster.get_job(namespace, "late")["status"]["restarts"] == 1, 15,
                 what="the hung worker counted as a failure")
    assert rank1 not in [p.metadata.name for p in pods(cluster, namespace, "late") if not p.metadata.deletion_timestamp]
    wait_event(cluster, namespace, "late", "WorkerFailed", 35)
    failed = [e.message for e in cluster.events(namespace, "late") if e.reason == "WorkerFailed"]
    assert len(failed) == 1 and f"Worker {rank1} failed (hung: its trainer is still in a step of world v{v}, 30s " \
        "past" in failed[0], failed

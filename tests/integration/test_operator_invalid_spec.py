"""Nothing admitted gets stuck: a stored spec the operator cannot run ends the job cleanly (issue 32 item 2).

The API server and the operator's parser now refuse the same specs
(tests/contract/test_admission_parity.py), so no spec admitted today reaches
the operator's invalid-spec path. A spec stored under older rules does: a job
created, or patched, before a CRD upgrade tightened them (Kubernetes keeps the
field: validation ratcheting lets the rest of the object change around it).
These tests make exactly that happen: they put back the CRD as it was before
issue 32 (workload.model's pattern unanchored, so ``mlp-v2`` passes), store the
spec, and restore today's CRD before the operator is looked at.

Before the fix, a new job sat in Pending with Failed=True for good, and a
running one showed Running, Ready=True and Failed=True while its pods trained on.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.support.kube import Cluster, condition, wait_for
from tests.support.kueue import GROUP as KUEUE
from tests.support.kueue import VERSION as KUEUE_VERSION
from tests.support.kueue import kueue, queue, queued  # noqa: F401  (fixtures)
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    event_reasons,
    job_manifest,
    operator_fixture,
    pod_names,
    pods,
    wait_phase,
)

pytestmark = pytest.mark.k8s
REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds/trainingjobs.cohort.dev.yaml"
STALE = "mlp-v2"  # admitted by the CRD before issue 32


def _model_schema(crd: dict[str, Any]) -> dict[str, Any]:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["workload"]["properties"]["model"]


def _admits_stale_model(cluster: Cluster, namespace: str) -> bool:
    body = job_manifest("probe", workload={"model": STALE})
    try:
        cluster.custom.create_namespaced_custom_object("cohort.dev", "v1alpha1", namespace, "trainingjobs", body,
                                                       dry_run="All", field_validation="Strict")
    except ApiException as e:
        if e.status != 422:
            raise
        return False
    return True


@contextlib.contextmanager
def crd_before_issue_32(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Today's CRD with workload.model's pattern unanchored, as generated before issue 32; restored on exit."""
    crd = yaml.safe_load(CRD.read_text())
    old = copy.deepcopy(crd)
    pattern = _model_schema(old)["pattern"]
    assert pattern.startswith("^(?:") and pattern.endswith(")$"), pattern
    _model_schema(old)["pattern"] = pattern[len("^(?:"):-len(")$")]
    current = cluster.ext.read_custom_resource_definition(old["metadata"]["name"])
    old["metadata"]["resourceVersion"] = current.metadata.resource_version
    cluster.ext.replace_custom_resource_definition(old["metadata"]["name"], old)
    try:
        wait_for(lambda: _admits_stale_model(cluster, namespace), 30, what="the old CRD in effect")
        yield
    finally:
        cluster.ensure_crds(CRD.parent)
        wait_for(lambda: not _admits_stale_model(cluster, namespace), 30, what="today's CRD back in effect")


def assert_failed_invalid(job: dict[str, Any]) -> None:
    st = job["status"]
    assert st["phase"] == "Failed" and st["completionTime"], st
    failed = condition(job, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec", failed
    assert failed["message"].startswith("spec.workload.model:") and STALE in failed["message"], failed
    assert condition(job, "Running")["status"] == "False" and condition(job, "Ready")["status"] == "False"


def test_a_job_stored_with_a_spec_the_operator_cannot_run_fails(cluster, namespace, operator):
    with crd_before_issue_32(cluster, namespace):
        cluster.create_job(namespace, job_manifest("stale", workload={"model": STALE}))
    job = wait_phase(cluster, namespace, "stale", "Failed", 30)  # before: Pending with Failed=True for good
    assert_failed_invalid(job)
    assert pod_names(cluster, namespace, "stale") == []
    wait_for(lambda: "InvalidSpec" in event_reasons(cluster, namespace, "stale"), 15, what="the InvalidSpec Event")


def test_a_running_job_patched_to_a_spec_the_operator_cannot_run_fails_and_its_pods_go(cluster, namespace, operator):
    cluster.create_job(namespace, job_manifest("patched"))
    wait_phase(cluster, namespace, "patched", "Running", 30)
    assert len(pod_names(cluster, namespace, "patched")) == 2
    with crd_before_issue_32(cluster, namespace):
        cluster.patch_job(namespace, "patched", {"spec": {"workload": {"model": STALE}}})
    job = wait_phase(cluster, namespace, "patched", "Failed", 30)  # before: Running, Ready=True and Failed=True
    assert_failed_invalid(job)
    assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    wait_for(lambda: pods(cluster, namespace, "patched", live=False) == [], 30, what="the workers deleted")
    # Its pods stay gone: the job is final, and the next resyncs create nothing.
    cluster.patch_job(namespace, "patched", {"spec": {"replicas": {"target": 3}}})  # ratcheting: the rest moves
    wait_for(lambda: cluster.get_job(namespace, "patched")["status"]["observedGeneration"]
             == cluster.get_job(namespace, "patched")["metadata"]["generation"], 15, what="the patch reconciled")
    assert pods(cluster, namespace, "patched", live=False) == []
    assert cluster.get_job(namespace, "patched")["status"]["phase"] == "Failed"


def _workloads(cluster: Cluster, namespace: str, job: str) -> list[dict[str, Any]]:
    return cluster.custom.list_namespaced_custom_object(KUEUE, KUEUE_VERSION, namespace, "workloads",
                                                        label_selector=f"cohort.dev/job={job}")["items"]


def _finished(wl: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("conditions") or []
                 if c["type"] == "Finished" and c["status"] == "True"), None)


def test_a_queued_job_patched_to_such_a_spec_finishes_its_workload(cluster, namespace, queue, operator):  # noqa: F811
    queue.create(cpu="2")
    cluster.create_job(namespace, queued(job_manifest("queued", resources={"requests": {"cpu": "1"}})))
    wait_phase(cluster, namespace, "queued", "Running", 60)
    [admitted] = [wl for wl in _workloads(cluster, namespace, "queued") if not _finished(wl)]
    with crd_before_issue_32(cluster, namespace):
        cluster.patch_job(namespace, "queued", {"spec": {"workload": {"model": STALE}}})
    assert_failed_invalid(wait_phase(cluster, namespace, "queued", "Failed", 30))
    done = wait_for(lambda: _finished(next(wl for wl in _workloads(cluster, namespace, "queued")
                                           if wl["metadata"]["name"] == admitted["metadata"]["name"])),
                    30, what="the admitted Workload Finished")
    assert done["reason"] == "InvalidSpec" and STALE in done["message"], done  # quota released
    wait_for(lambda: pods(cluster, namespace, "queued", live=False) == [], 30, what="the workers deleted")

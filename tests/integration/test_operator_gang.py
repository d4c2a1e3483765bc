"""Gang scheduling (issue 3 §8): a PodGroup when the cluster has one, a clear condition when not.

Our 1.34 control plane has neither the native Workload/PodGroup API nor a
PodGroup CRD, so the first test sees the "Unsupported" branch. The second
installs a minimal scheduler-plugins PodGroup CRD (removed afterwards) and
checks the PodGroup and the pod label the coscheduling plugin expects.
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from tests.support.kube import condition, wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    gone,
    job_manifest,
    operator_fixture,
    pods,
    wait_condition,
    wait_event,
    wait_phase,
)

pytestmark = pytest.mark.k8s

GROUP, VERSION, PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
PODGROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"cohort.dev/test": "true"}},
    "spec": {
        "group": GROUP, "scope": "Namespaced",
        "names": {"kind": "PodGroup", "listKind": "PodGroupList", "plural": PLURAL, "singular": "podgroup"},
        "versions": [{"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


def podgroup_crd_installed(cluster) -> bool:
    return not gone(cluster.ext.read_custom_resource_definition, f"{PLURAL}.{GROUP}")


@pytest.fixture
def podgroup_crd(cluster):
    """The scheduler-plugins PodGroup CRD, installed for one test only."""
    created = False
    if not podgroup_crd_installed(cluster):
        cluster.ext.create_custom_resource_definition(PODGROUP_CRD)
        created = True
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         cluster.ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status.conditions or []),
             30, what="PodGroup CRD Established")
    yield
    if created:
        try:
            cluster.ext.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
        except ApiException as e:
            if e.status != 404:
                raise


def test_no_gang_api_is_a_clear_condition_not_silence(cluster, namespace, operator):
    if podgroup_crd_installed(cluster):
        pytest.fail("a PodGroup CRD is installed cluster-wide; this test needs a cluster without one")
    cluster.create_job(namespace, job_manifest("solo", scheduling={"gang": True}))
    cond = wait_condition(cluster, namespace, "solo", "GangScheduling", "False")
    assert cond["reason"] == "Unsupported"
    assert "no gang scheduling API" in cond["message"] and "PodGroup" in cond["message"]
    wait_event(cluster, namespace, "solo", "GangSchedulingUnsupported")
    job = wait_phase(cluster, namespace, "solo", "Running")  # workers are still scheduled, one by one
    assert condition(job, "GangScheduling")["status"] == "False"


def test_podgroup_crd_gets_a_podgroup_and_labelled_pods(cluster, namespace, podgroup_crd, operator):
    cluster.create_job(namespace, job_manifest("gang", scheduling={"gang": True},
                                               replicas={"min": 2, "max": 4, "target": 3}))
    cond = wait_condition(cluster, namespace, "gang", "GangScheduling", "True")
    assert cond["reason"] == "SchedulerPlugins"
    group = wait_for(lambda: cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gang"),
                     15, what="PodGroup")
    assert group["spec"] == {"minMember": 2}
    (owner,) = group["metadata"]["ownerReferences"]
    assert owner["kind"] == "TrainingJob" and owner["name"] == "gang" and owner["controller"]
    live = wait_for(lambda: (lambda p: p if len(p) == 3 else None)(pods(cluster, namespace, "gang")), 15,
                    what="3 pods")
    assert all(p.metadata.labels.get("scheduling.x-k8s.io/pod-group") == "gang" for p in live)
    cluster.delete_job(namespace, "gang")
    wait_for(lambda: gone(cluster.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, "gang"),
             60, what="PodGroup garbage-collected")

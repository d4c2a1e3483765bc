"""What a user who may create TrainingJobs, but not pods, can and cannot do (docs/security.md), asked of the
real API server: its SubjectAccessReview for the permissions, and, as that user (impersonated), a job whose
pod template asks for a host path in a namespace at the restricted Pod Security level.

The operator creates pods from the user's template, so a job's pods are exactly as safe as the namespace's
Pod Security level: here the API server refuses the pod the operator builds, and the operator says why.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.kube import GROUP, PLURAL, VERSION, Cluster, wait_for
from tests.support.operator import job_manifest, operator_fixture, pod_names  # noqa: F401  (the fixture)
from tests.support.realnodes import restrict

pytestmark = pytest.mark.k8s
USER = "alice@example.test"


def _grant_job_author(cluster: Cluster, ns: str) -> None:
    """A Role a platform team would give a team: TrainingJobs, read-only pods and logs, nothing else."""
    cluster.rbac.create_namespaced_role(ns, {"metadata": {"name": "job-author"}, "rules": [
        {"apiGroups": ["cohort.dev"], "resources": ["trainingjobs"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch"]}]})
    cluster.rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "job-author"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "job-author"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]})


def _may(cluster: Cluster, ns: str, verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
    attrs = {"verb": verb, "resource": resource, "group": group, "namespace": ns, "subresource": subresource}
    review = cluster.authz.create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": USER, "groups": ["system:authenticated"],
                 "resourceAttributes": {k: v for k, v in attrs.items() if v}}})
    return bool(review.status.allowed)


def _as_user(cluster: Cluster) -> client.CustomObjectsApi:
    api = client.ApiClient(cluster.api.configuration)
    api.set_default_header("Impersonate-User", USER)
    api.set_default_header("Impersonate-Group", "system:authenticated")
    return client.CustomObjectsApi(api)


def test_a_job_author_gets_pods_only_as_the_namespaces_pod_security_level_allows(cluster, namespace, operator):
    restrict(cluster, namespace)
    _grant_job_author(cluster, namespace)
    allowed = [("create", "trainingjobs", "cohort.dev", ""), ("get", "pods", "", "log")]
    denied = [("create", "pods", "", ""), ("create", "pods", "", "exec"), ("delete", "pods", "", ""),
              ("get", "secrets", "", ""), ("create", "roles", "rbac.authorization.k8s.io", ""),
              ("patch", "trainingjobs", "cohort.dev", "status"), ("create", "serviceaccounts", "", "token")]
    # The RBAC authorizer sees a new RoleBinding through its informer, a moment after the create returns.
    with contextlib.suppress(AssertionError):  # reported below, with the permissions that differ
        wait_for(lambda: all(_may(cluster, namespace, *a) for a in allowed), timeout_s=10,
                 what="the job author's Role in the authorizer")
    wrong = [a for a in allowed if not _may(cluster, namespace, *a)]
    wrong += [d for d in denied if _may(cluster, namespace, *d)]
    assert not wrong, f"the job author's access differs from docs/security.md: {wrong}"

    user = _as_user(cluster)
    # Template fields the CRD does not take never reach the operator: refused with strict field validation
    # (what kubectl asks for), dropped from the stored object otherwise.
    privileged = job_manifest("privileged", podTemplate={"spec": {"hostNetwork": True}})
    with pytest.raises(ApiException) as refused:
        user.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, privileged, field_validation="Strict")
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 400 and 'unknown field "spec.podTemplate.spec.hostNetwork"' in message, message
    stored = user.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, privileged)
    assert "hostNetwork" not in stored["spec"]["podTemplate"]["spec"], stored["spec"]["podTemplate"]

    # A host path is a volume the template may name: the job is admitted, and its pods meet Pod Security.
    job = job_manifest("hostpath", podTemplate={"spec": {
        "volumes": [{"name": "host", "hostPath": {"path": "/etc"}}],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "host", "mountPath": "/host"}]}]}})
    user.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)

    def refusal() -> str:
        events = [e for e in cluster.events(namespace, "hostpath") if e.reason == "FailedCreate"]
        return events[0].message if events else ""

    message = wait_for(refusal, 30, what="the operator's FailedCreate Event on the job")
    assert 'violates PodSecurity "restricted' in message and "hostPath" in message, message
    assert pod_names(cluster, namespace, "hostpath") == []

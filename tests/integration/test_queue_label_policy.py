"""Kueue's rule on the real API server: the queue of a TrainingJob that is not suspended cannot change
(issue 32 item 3; the chart's ValidatingAdmissionPolicy, templates/queue-label-policy.yaml).

Before the policy, removing the label from a running job was accepted (its Workloads were then deleted and
it trained outside any quota), and adding one to a running job deleted its pods at once.
No operator runs here: the job's phase is set through the status subresource, as the operator would.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.support.helm import find, render
from tests.support.kube import GROUP, PLURAL, VERSION, Cluster, wait_for
from tests.support.kueue import QUEUE_LABEL
from tests.support.operator import job_manifest
from tests.support.paths import kubectl_bin

pytestmark = pytest.mark.k8s


@pytest.fixture
def policy(cluster: Cluster, namespace: str):
    """The chart's policy and binding, bound to this test's namespace only (the cluster is shared)."""
    release = f"qlp-{uuid.uuid4().hex[:5]}"
    docs = render({"operator": {"watchNamespaces": [namespace]}}, release=release)
    objs = find(docs, "ValidatingAdmissionPolicy") + find(docs, "ValidatingAdmissionPolicyBinding")
    assert len(objs) == 2
    manifest = yaml.safe_dump_all(objs)
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}  # with HOME: kubectl's cache goes there, not here
    subprocess.run([kubectl_bin(), "apply", "-f", "-"], input=manifest, text=True, check=True, capture_output=True,
                   env=env)
    yield
    subprocess.run([kubectl_bin(), "delete", "--ignore-not-found", "-f", "-"], input=manifest, text=True,
                   check=True, capture_output=True, env=env)


def _set_phase(cluster: Cluster, namespace: str, name: str, phase: str) -> None:
    cluster.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                         {"status": {"phase": phase}})


def _relabel(cluster: Cluster, namespace: str, name: str, queue: str | None, dry_run: bool = False) -> Any:
    patch = {"metadata": {"labels": {QUEUE_LABEL: queue}}}
    return cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch,
                                                         dry_run="All" if dry_run else None)


def _refusal(fn: Any) -> str:
    try:
        fn()
    except ApiException as e:
        if e.status in (403, 422):
            return str(json.loads(e.body)["message"])
        raise
    return ""


def test_the_queue_of_a_running_job_cannot_change_until_it_is_suspended(cluster, namespace, policy):
    job = job_manifest("queued")
    job["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team-a"
    cluster.create_job(namespace, job)
    _set_phase(cluster, namespace, "queued", "Running")
    # a new policy takes a moment to reach the API server's admission chain: ask with dry runs until it has
    wait_for(lambda: _refusal(lambda: _relabel(cluster, namespace, "queued", None, dry_run=True)), 30, 0.5,
             what="the policy to refuse a queue label removal")

    for queue in (None, "team-b"):  # removed, or moved to another queue
        message = _refusal(lambda q=queue: _relabel(cluster, namespace, "queued", q))
        assert f"metadata.labels[{QUEUE_LABEL}]: the queue of a Running job cannot change" in message, message
        assert "spec.runPolicy.suspend: true" in message
    assert cluster.get_job(namespace, "queued")["metadata"]["labels"][QUEUE_LABEL] == "team-a"

    # other changes to a running job still go through
    cluster.patch_job(namespace, "queued", {"metadata": {"labels": {"team": "ml"}}})
    # suspended first, its queue may change; so may a finished job's
    cluster.patch_job(namespace, "queued", {"spec": {"runPolicy": {"suspend": True}}})
    _relabel(cluster, namespace, "queued", "team-b")
    cluster.patch_job(namespace, "queued", {"spec": {"runPolicy": {"suspend": False}}})
    _set_phase(cluster, namespace, "queued", "Succeeded")
    _relabel(cluster, namespace, "queued", None)
    assert QUEUE_LABEL not in cluster.get_job(namespace, "queued")["metadata"]["labels"]

    # a running job without a queue cannot be put in one either
    cluster.create_job(namespace, job_manifest("unqueued"))
    _set_phase(cluster, namespace, "unqueued", "Running")
    message = _refusal(lambda: _relabel(cluster, namespace, "unqueued", "team-a"))
    assert 'from "" to "team-a"' in message, message

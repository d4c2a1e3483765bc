"""Helm and the chart for tests: the pinned helm binary, rendering, a release on
real nodes, and SubjectAccessReview questions.

A release installed with :func:`real_node_values` runs the operator as a
pod of the chart's Deployment on a real node, under the chart's
ServiceAccount token (see tests/support/incluster.py), limited to one
namespace and to TrainingJobs labelled ``cohort.dev/operator=<instance>``, so
it never competes with a development operator on the shared cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube import Cluster, wait_for
from tests.support.paths import cache_dir, pinned

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "cohort"
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
MONITORING_API_VERSIONS = tuple(f"monitoring.coreos.com/v1/{k}" for k in MONITORING_KINDS)


def helm_bin() -> str:
    path = cache_dir() / "bin" / f"helm-{pinned('HELM_VERSION')}" / "helm"
    assert path.is_file(), f"helm not found at {path}: run hack/build-binaries.sh"
    return str(path)


def run(cmd: list[str], *, kubeconfig: str = "", stdin: str | None = None, check: bool = True,
        timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """Run helm/kubectl (in a private helm home, so tests leave no repositories or cache behind)."""
    env = {**os.environ}
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    home = cache_dir() / "helm-test-home"
    env.setdefault("HELM_CACHE_HOME", str(home / "cache"))
    env.setdefault("HELM_CONFIG_HOME", str(home / "config"))
    env.setdefault("HELM_DATA_HOME", str(home / "data"))
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def set_args(values: dict[str, Any] | None) -> list[str]:
    """``--set-json`` per top-level key (Helm merges them into the chart's defaults)."""
    return [arg for key, value in (values or {}).items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def template(values: dict[str, Any] | None = None, *, namespace: str = "cohort-system", release: str = "cohort",
             api_versions: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> str:
    """``helm template`` of the chart; the rendered YAML."""
    cmd = [helm_bin(), "template", release, str(CHART), "--namespace", namespace, *set_args(values), *extra]
    for av in api_versions:
        cmd += ["--api-versions", av]
    return run(cmd).stdout


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The chart's objects as dicts."""
    return [d for d in yaml.safe_load_all(template(values, **kwargs)) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


# --- a release on real nodes -------------------------------------------------------

def real_node_values(namespace: str) -> dict[str, Any]:
    """Values that run the chart's operator on a real node, for this namespace and instance only.

    The operator pod runs the image built here (cohort-operator:<appVersion>,
    already on every node) with the chart's own securityContext, command and
    service-account token, as a user's install does.
    """
    return {
        "crds": {"enabled": False},  # the test session owns the shared CRD
        "networkPolicy": {"enabled": True},  # the operator then creates one per job; kube-router enforces them
        "operator": {
            "nodeSelector": {"cohort.dev/node-kind": "real"},
            "watchNamespaces": [namespace],
            "instance": namespace,
            "resyncSeconds": 5,
            "progressSeconds": 1,
            "httpTimeoutSeconds": 0.5,
            "terminationGracePeriodSeconds": 5,
            "leaderElection": {"enabled": True, "leaseSeconds": 5},
        },
    }


def install(cluster: Cluster, release: str, namespace: str, values: dict[str, Any], *, upgrade: bool = False,
            timeout_s: int = 120) -> subprocess.CompletedProcess[str]:
    verb = ["upgrade"] if upgrade else ["install"]
    return run([helm_bin(), *verb, release, str(CHART), "--namespace", namespace, *set_args(values),
                "--wait", "--timeout", f"{timeout_s}s"], kubeconfig=cluster.kubeconfig, timeout_s=timeout_s + 30)


def uninstall(cluster: Cluster, release: str, namespace: str) -> subprocess.CompletedProcess[str]:
    return run([helm_bin(), "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s"],
               kubeconfig=cluster.kubeconfig, check=False)


def operator_pods(cluster: Cluster, namespace: str, release: str) -> list[Any]:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def ready_operator_pod(cluster: Cluster, namespace: str, release: str, timeout_s: float = 60) -> Any:
    def ready() -> Any:
        for p in operator_pods(cluster, namespace, release):
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []):
                return p
        return None
    return wait_for(ready, timeout_s, 0.5, what=f"a Ready operator pod of release {release}")


def lease_holder(cluster: Cluster, namespace: str, name: str) -> str:
    from kubernetes import client

    lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(name, namespace)
    return str(lease.spec.holder_identity or "")


def http_get(url: str, timeout_s: float = 3) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return str(r.read().decode())


# --- RBAC questions -----------------------------------------------------------------

def can(cluster: Cluster, sa_namespace: str, sa_name: str, verb: str, resource: str, *, namespace: str = "",
        group: str = "", name: str = "", subresource: str = "") -> bool:
    """Asks the API server (SubjectAccessReview) whether the ServiceAccount may do this, with the
    groups its token authenticates with."""
    attrs = {"verb": verb, "resource": resource, "group": group, "namespace": namespace, "name": name,
             "subresource": subresource}
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": f"system:serviceaccount:{sa_namespace}:{sa_name}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}", "system:authenticated"],
        "resourceAttributes": {k: v for k, v in attrs.items() if v}}}
    review = cluster.authz.create_subject_access_review(body)
    return bool(review.status.allowed)


def describe(check: tuple[Any, ...]) -> str:
    verb, resource, kw = check[0], check[1], check[2] if len(check) > 2 else {}
    where = kw.get("namespace") or "cluster"
    res = "/".join(x for x in (kw.get("group"), resource, kw.get("subresource")) if x)
    return f"{verb} {res}{' ' + kw['name'] if kw.get('name') else ''} in {where}"

"""The Helm chart (helm/cohort) against the local control plane.

- ``helm lint`` is clean, and values.schema.json refuses bad values;
- ``helm template | kubectl apply --dry-run=server`` passes with and without
  the optional features (the prometheus-operator kinds against minimal
  monitoring.coreos.com CRDs installed for the test and removed after);
- the rendered operator follows its values (leader election, namespaces, security);
- a release on real nodes, in a namespace enforcing the restricted standard:
  the operator runs from the image built here as uid 65532 with a read-only
  root (read inside its container), under the chart's ServiceAccount token,
  takes its Lease, reconciles a job to Succeeded, and
  each ServiceAccount (operator, the job's workers) passes its must-allow and
  must-deny SubjectAccessReview checks; then upgrade and uninstall.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.support import helm
from tests.support.kube import Cluster, wait_for
from tests.support.operator import kubectl
from tests.support.paths import kubectl_bin
from tests.support.prometheus import exported_names
from tests.support.realnodes import RESTRICTED, real_nodes  # noqa: F401  (a session fixture)

pytestmark = pytest.mark.k8s

ALL_FEATURES = {
    "operator": {"replicas": 2, "watchNamespaces": ["ns-placeholder"]},
    "networkPolicy": {"enabled": True},
    "crds": {"enabled": False},
    "grafana": {"dashboard": {"annotations": {"grafana_folder": "Cohort"}}},
    "prometheusRule": {"additionalLabels": {"team": "ml"}},
}


def _with_namespace(values: dict, ns: str) -> dict:
    return yaml.safe_load(yaml.safe_dump(values).replace("ns-placeholder", ns))


# --- lint and schema ---------------------------------------------------------------

@pytest.mark.parametrize("values", [None, ALL_FEATURES], ids=["defaults", "all-features"])
def test_helm_lint_is_clean(values):
    proc = helm.run([helm.helm_bin(), "lint", "--strict", str(helm.CHART), *helm.set_args(values)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("values, message", [
    ({"operator": {"replicas": -1}}, "/operator/replicas"),
    ({"operator": {"watchnamespaces": ["a"]}}, "watchnamespaces"),
    ({"operator": {"logLevel": "LOUD"}}, "/operator/logLevel"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"metrics": {"podMonitor": {"interval": "often"}}}, "/metrics/podMonitor/interval"),
    ({"gpu": {"shmSize": "8GB"}}, "/gpu/shmSize"),
    ({"gpu": {"shmSize": 8589934592}}, "/gpu/shmSize"),  # Helm would render the number as 8.589934592e+09
])
def test_schema_refuses_bad_values(values, message):
    proc = helm.run([helm.helm_bin(), "template", "x", str(helm.CHART), *helm.set_args(values)], check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# --- rendering ---------------------------------------------------------------------

def test_single_replica_runs_standalone_with_a_restricted_pod():
    docs = helm.render()
    (dep,) = helm.find(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert "--standalone" in c["args"] and not any(a.startswith("--lease") for a in c["args"])
    assert dep["spec"]["strategy"]["type"] == "Recreate"  # two standalone operators must never overlap
    assert "--default-image=cohort-trainer:0.1.0" in c["args"]
    assert {"--default-cuda-image=cohort-trainer:0.1.0-cuda", "--gpu-shm-size=8Gi"} <= set(c["args"])
    assert c["image"] == "cohort-operator:0.1.0"
    assert spec["serviceAccountName"] == "cohort"
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["seccompProfile"]["type"] == \
        "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    # Cluster-wide by default: a ClusterRole for the jobs, no Role, no Lease permissions.
    assert helm.find(docs, "ClusterRole", "cohort-system-cohort") and not helm.find(docs, "Role")
    # No prometheus-operator kinds without monitoring.coreos.com/v1.
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")]
    (cm,) = helm.find(docs, "ConfigMap", "cohort-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_replicas_elect_a_leader_and_watched_namespaces_get_roles():
    docs = helm.render({"operator": {"replicas": 3, "watchNamespaces": ["ml", "research"]}}, namespace="ops")
    (dep,) = helm.find(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" not in args
    assert {"--lease-name=cohort", "--lease-namespace=ops", "--namespace=ml", "--namespace=research"} <= set(args)
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in helm.find(docs, "Role")}
    assert roles == {("ml", "ops-cohort"), ("research", "ops-cohort"), ("ops", "cohort-leader-election")}
    (lease_role,) = helm.find(docs, "Role", "cohort-leader-election")
    named = [r for r in lease_role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["cohort"],
                      "verbs": ["get", "update"]}]
    # Nothing cluster-wide but read access: CRDs, namespaces, and Kueue's flavors and priorities.
    (cr,) = helm.find(docs, "ClusterRole")
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in cr["rules"])
    assert {r for rule in cr["rules"] if "get" in rule["verbs"] for r in rule["resources"]} == {
        "resourceflavors", "workloadpriorityclasses", "priorityclasses"}


@pytest.mark.parametrize("enabled", [False, True])
def test_network_policy_switches_the_operator_flag_and_its_rbac_together(enabled):
    docs = helm.render({"networkPolicy": {"enabled": enabled}})
    (dep,) = helm.find(docs, "Deployment")
    assert ("--network-policy" in dep["spec"]["template"]["spec"]["containers"][0]["args"]) is enabled
    (role,) = helm.find(docs, "ClusterRole", "cohort-system-cohort")
    granted = {v for r in role["rules"] if "networkpolicies" in r["resources"] for v in r["verbs"]}
    assert granted == ({"list", "watch", "create"} if enabled else set())
    policies = helm.find(docs, "NetworkPolicy")
    assert len(policies) == int(enabled)
    for policy in policies:  # the namespace policy opens only the metrics port; same-job traffic is the operator's
        assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [9400]


def test_monitoring_kinds_render_only_when_served():
    docs = helm.render(api_versions=helm.MONITORING_API_VERSIONS)
    kinds = {d["kind"] for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"}
    assert kinds == set(helm.MONITORING_KINDS)
    (pm,) = helm.find(docs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    relabel = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_cohort_dev_job"], "targetLabel": "trainingjob"} in relabel
    (rule,) = helm.find(docs, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {"CohortTrainingJobFailed", "CohortTrainingJobNoProgress", "CohortStragglerReplaced",
                      "CohortRecoveryStorm"}
    off = helm.render({"metrics": {"serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": False}},
                       "prometheusRule": {"enabled": False}}, api_versions=helm.MONITORING_API_VERSIONS)
    assert not [d for d in off if d["apiVersion"] == "monitoring.coreos.com/v1"]


def test_alert_thresholds_and_labels_come_from_values():
    docs = helm.render({"prometheusRule": {"noProgressMinutes": 25, "recoveryStorm": {"recoveries": 7},
                                           "additionalLabels": {"team": "ml"}}},
                       api_versions=helm.MONITORING_API_VERSIONS)
    rules = {r["alert"]: r for g in helm.find(docs, "PrometheusRule")[0]["spec"]["groups"] for r in g["rules"]}
    assert "[25m]" in rules["CohortTrainingJobNoProgress"]["expr"]
    assert rules["CohortRecoveryStorm"]["expr"].rstrip().endswith("> 7")
    assert all(r["labels"]["team"] == "ml" and r["labels"]["severity"] for r in rules.values())
    assert "{{ $labels.trainingjob }}" in rules["CohortTrainingJobNoProgress"]["annotations"]["description"]


def test_image_references_from_registry_and_digest():
    digest = "sha256:" + "ab" * 32
    docs = helm.render({"global": {"imageRegistry": "registry.example"},
                        "image": {"digest": digest}, "trainer": {"image": {"tag": "1.2.3"}}})
    c = helm.find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == f"registry.example/cohort-operator@{digest}"
    assert "--default-image=registry.example/cohort-trainer:1.2.3" in c["args"]
    assert "--default-cuda-image=registry.example/cohort-trainer:0.1.0-cuda" in c["args"]
    docs = helm.render({"trainer": {"cudaImage": {"registry": "gpu.example", "tag": "1.2.3-cu130"}},
                        "gpu": {"shmSize": "32Gi"}})
    args = helm.find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--default-cuda-image=gpu.example/cohort-trainer:1.2.3-cu130", "--gpu-shm-size=32Gi"} <= set(args)


# --- server-side dry run ------------------------------------------------------------------

def _minimal_crd(kind: str) -> dict:
    plural = kind.lower() + "s"
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com", "labels": {"cohort.dev/test": "true"}},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Cluster):
    """Minimal prometheus-operator CRDs for the dry run; removed after (unless they were there already)."""
    created = []
    for kind in helm.MONITORING_KINDS:
        crd = _minimal_crd(kind)
        try:
            cluster.ext.create_custom_resource_definition(crd)
            created.append(crd["metadata"]["name"])
        except ApiException as e:
            if e.status != 409:
                raise
    for name in created:
        wait_for(lambda n=name: any(c.type == "Established" and c.status == "True"
                                    for c in cluster.ext.read_custom_resource_definition(n).status.conditions or []),
                 30, what=f"CRD {name} Established")
    yield
    for name in created:
        with contextlib.suppress(ApiException):
            cluster.ext.delete_custom_resource_definition(name)


@pytest.mark.parametrize("variant", ["defaults", "all-features", "monitoring"])
def test_templates_pass_server_side_dry_run(cluster, namespace, monitoring_crds, variant):
    values = {"defaults": None, "all-features": _with_namespace(ALL_FEATURES, namespace),
              "monitoring": {"operator": {"watchNamespaces": [namespace]}}}[variant]
    api_versions = helm.MONITORING_API_VERSIONS if variant == "monitoring" else ()
    release = f"dry-{uuid.uuid4().hex[:5]}"
    rendered = helm.template(values, namespace=namespace, release=release, api_versions=api_versions)
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    if variant == "monitoring":
        assert set(helm.MONITORING_KINDS) <= kinds
    if variant == "all-features":
        assert "NetworkPolicy" in kinds and "CustomResourceDefinition" not in kinds
    proc = helm.run([kubectl_bin(), "apply", "--dry-run=server", "-f", "-"], kubeconfig=cluster.kubeconfig,
                    stdin=rendered, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len([d for d in yaml.safe_load_all(rendered) if d])


# --- a release on real nodes -------------------------------------------------------------

RELEASE = "cohort"
JOB = "digits"


@pytest.fixture(scope="module")
def release(cluster: Cluster, real_nodes):  # noqa: F811
    """The chart installed in its own restricted namespace, its operator on a real node (module scope: install once)."""
    ns = f"helm-release-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": ns, "labels": {"cohort.dev/test": "true", **RESTRICTED}}})
    values = helm.real_node_values(ns)
    try:
        helm.install(cluster, RELEASE, ns, values)
        yield {"namespace": ns, "values": values}
    finally:
        helm.uninstall(cluster, RELEASE, ns)
        cluster.delete_namespace(ns)


def _digits_job(instance: str) -> dict:
    job = yaml.safe_load((helm.REPO / "examples/digits.yaml").read_text())
    job["metadata"] = {"name": JOB, "labels": {"cohort.dev/operator": instance}}
    job["spec"]["replicas"] = {"min": 2, "max": 4, "target": 2}
    job["spec"]["workload"]["epochs"] = 10
    job["spec"]["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    return job


@pytest.mark.e2e
def test_operator_runs_under_the_chart_service_account_and_reconciles_a_job(cluster, release):
    ns = release["namespace"]
    pod = helm.ready_operator_pod(cluster, ns, RELEASE)
    # The pod runs the built image as the chart's ServiceAccount, with its token mounted (in a pod
    # the operator loads only its service-account token), as uid 65532 on a read-only root.
    assert pod.spec.service_account_name == "cohort"
    assert pod.spec.containers[0].image == "cohort-operator:0.1.0"
    inside = kubectl(cluster, "exec", "-n", ns, pod.metadata.name, "--", "python", "-c",
                     "import os\ntry:\n    open('/probe', 'w'); print(os.getuid(), 'rw')\n"
                     "except OSError as e:\n    print(os.getuid(), 'ro' if e.errno == 30 else e)")
    assert inside.stdout.split() == ["65532", "ro"], inside
    assert any(v.projected and any(s.service_account_token for s in v.projected.sources or [])
               for v in pod.spec.volumes or [])
    # Its requests are authorised as that account: it took the Lease it alone may update ...
    wait_for(lambda: helm.lease_holder(cluster, ns, "cohort") == pod.metadata.name, 30,
             what="the operator pod holding its Lease")
    # ... and runs a job end to end with nothing but the chart's RBAC.
    cluster.create_job(ns, _digits_job(ns))
    job = wait_for(lambda: (j := cluster.get_job(ns, JOB)).get("status", {}).get("phase") in ("Succeeded", "Failed")
                   and j, 150, 1, what=f"{JOB} finished")
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert job["status"]["progress"]["step"] > 0
    owned = {(kind, o.metadata.name) for kind, items in (
        ("ServiceAccount", cluster.core.list_namespaced_service_account(ns).items),
        ("Role", cluster.rbac.list_namespaced_role(ns).items),
        ("RoleBinding", cluster.rbac.list_namespaced_role_binding(ns).items)) for o in items
        if (o.metadata.labels or {}).get("cohort.dev/job") == JOB}
    assert owned == {(k, f"{JOB}-worker") for k in ("ServiceAccount", "Role", "RoleBinding")}, owned
    # The job's own NetworkPolicy: its workers admit only its workers (the chart's adds port 9400).
    policies = {p.metadata.name: p for p in cluster.networking.list_namespaced_network_policy(ns).items}
    workers = {"cohort.dev/job": JOB, "cohort.dev/role": "worker"}
    assert JOB in policies and f"{RELEASE}-workers" in policies, sorted(policies)
    mine = policies[JOB]
    assert mine.spec.pod_selector.match_labels == workers
    assert [[peer.pod_selector.match_labels for peer in rule.var_from] for rule in mine.spec.ingress] == [[workers]]
    assert mine.metadata.owner_references[0].kind == "TrainingJob"
    # Nothing it did was refused for lack of permission. (A reconcile may still be retried
    # after a transient error: the operator creates a worker's Role and RoleBinding at the
    # same time, and without the `bind` verb, which it does not get, the API server refuses
    # a RoleBinding whose Role does not exist yet, with a 404.)
    log = cluster.core.read_namespaced_pod_log(pod.metadata.name, ns)
    assert "403" not in log and "Forbidden" not in log and "forbidden" not in log, log[-3000:]
    metrics = helm.http_get(f"http://{pod.status.pod_ip}:8080/metrics")
    assert 'cohort_operator_errors_total{where="events"} 0.0' in metrics, log[-3000:]
    assert "cohort_operator_pods_created_total" in exported_names(metrics)


OPERATOR_ALLOWED = [
    ("create", "pods", {}), ("delete", "pods", {}), ("list", "pods", {}), ("watch", "pods", {}),
    ("get", "trainingjobs", {"group": "cohort.dev"}), ("watch", "trainingjobs", {"group": "cohort.dev"}),
    ("delete", "trainingjobs", {"group": "cohort.dev"}),
    ("patch", "trainingjobs", {"group": "cohort.dev", "subresource": "status"}),
    ("update", "trainingjobs", {"group": "cohort.dev", "subresource": "finalizers"}),
    ("create", "configmaps", {}), ("patch", "configmaps", {}), ("get", "configmaps", {}),
    ("create", "services", {}), ("create", "serviceaccounts", {}), ("create", "poddisruptionbudgets",
                                                                    {"group": "policy"}),
    ("create", "roles", {"group": "rbac.authorization.k8s.io"}),
    ("create", "rolebindings", {"group": "rbac.authorization.k8s.io"}),
    ("create", "events", {}), ("patch", "events", {}),
    ("create", "networkpolicies", {"group": "networking.k8s.io"}),
    ("list", "networkpolicies", {"group": "networking.k8s.io"}),
    ("create", "podgroups", {"group": "scheduling.x-k8s.io"}),
    ("list", "customresourcedefinitions", {"group": "apiextensions.k8s.io", "namespace": ""}),
    ("update", "leases", {"group": "coordination.k8s.io", "name": "cohort"}),
    ("create", "leases", {"group": "coordination.k8s.io"}),
    ("create", "workloads", {"group": "kueue.x-k8s.io"}), ("watch", "workloads", {"group": "kueue.x-k8s.io"}),
    ("patch", "workloads", {"group": "kueue.x-k8s.io"}), ("delete", "workloads", {"group": "kueue.x-k8s.io"}),
    ("patch", "workloads", {"group": "kueue.x-k8s.io", "subresource": "status"}),
    ("get", "resourceflavors", {"group": "kueue.x-k8s.io", "namespace": ""}),
    ("get", "workloadpriorityclasses", {"group": "kueue.x-k8s.io", "namespace": ""}),
]
OPERATOR_DENIED = [
    ("get", "secrets", {}), ("list", "secrets", {}), ("watch", "secrets", {}),
    ("list", "secrets", {"namespace": ""}), ("get", "secrets", {"namespace": "kube-system"}),
    ("create", "pods", {"namespace": "default"}), ("list", "trainingjobs", {"group": "cohort.dev",
                                                                           "namespace": "default"}),
    ("create", "trainingjobs", {"group": "cohort.dev"}), ("update", "trainingjobs", {"group": "cohort.dev"}),
    ("patch", "trainingjobs", {"group": "cohort.dev"}),
    ("update", "configmaps", {}), ("delete", "configmaps", {}), ("delete", "services", {}),
    ("delete", "networkpolicies", {"group": "networking.k8s.io"}),
    ("patch", "networkpolicies", {"group": "networking.k8s.io"}),
    ("create", "pods", {"subresource": "exec"}), ("update", "pods", {}), ("patch", "pods", {}),
    ("create", "deployments", {"group": "apps"}),
    ("escalate", "roles", {"group": "rbac.authorization.k8s.io"}),
    ("bind", "roles", {"group": "rbac.authorization.k8s.io"}),
    ("create", "clusterroles", {"group": "rbac.authorization.k8s.io", "namespace": ""}),
    ("create", "clusterrolebindings", {"group": "rbac.authorization.k8s.io", "namespace": ""}),
    ("update", "leases", {"group": "coordination.k8s.io", "name": "someone-elses"}),
    ("create", "serviceaccounts", {"subresource": "token"}),
    ("impersonate", "serviceaccounts", {}),
    ("patch", "nodes", {"namespace": ""}), ("delete", "namespaces", {"namespace": ""}),
    ("create", "customresourcedefinitions", {"group": "apiextensions.k8s.io", "namespace": ""}),
    ("create", "clusterqueues", {"group": "kueue.x-k8s.io", "namespace": ""}),
    ("patch", "resourceflavors", {"group": "kueue.x-k8s.io", "namespace": ""}),
    ("update", "workloads", {"group": "kueue.x-k8s.io", "subresource": "status"}),
    ("create", "workloads", {"group": "kueue.x-k8s.io", "namespace": "default"}),
]


def _check_access(cluster, sa_ns, sa, ns, checks, expected):
    wrong = []
    for verb, resource, kw in checks:
        kw = {"namespace": ns, **kw}
        if helm.can(cluster, sa_ns, sa, verb, resource, **kw) != expected:
            wrong.append(helm.describe((verb, resource, kw)))
    return wrong


@pytest.mark.e2e
def test_least_privilege_operator_service_account(cluster, release):
    ns = release["namespace"]
    wrong = _check_access(cluster, ns, "cohort", ns, OPERATOR_ALLOWED, True)
    assert not wrong, f"the operator may not: {wrong}"
    wrong = _check_access(cluster, ns, "cohort", ns, OPERATOR_DENIED, False)
    assert not wrong, f"the operator may (and must not): {wrong}"


@pytest.mark.e2e
def test_least_privilege_worker_service_account(cluster, release):
    ns = release["namespace"]
    wait_for(lambda: cluster.core.read_namespaced_service_account(f"{JOB}-worker", ns), 30,
             what="the worker ServiceAccount (created by the operator for the job)")
    world, reports = {"name": f"{JOB}-world"}, {"name": f"{JOB}-reports"}
    allowed = [("get", "configmaps", world), ("watch", "configmaps", world), ("list", "configmaps", world),
               ("patch", "configmaps", reports)]  # a survivor's report (docs/contracts.md §3)
    denied = [
        ("get", "configmaps", reports), ("update", "configmaps", reports), ("delete", "configmaps", reports),
        ("patch", "configmaps", {"name": "other-reports"}),
        ("get", "configmaps", {"name": f"{JOB}-config"}), ("get", "configmaps", {"name": "other-world"}),
        ("list", "configmaps", {}), ("watch", "configmaps", {}),
        ("patch", "configmaps", world), ("update", "configmaps", world), ("delete", "configmaps", world),
        ("get", "secrets", {}), ("list", "secrets", {}), ("list", "secrets", {"namespace": ""}),
        ("create", "pods", {}), ("list", "pods", {}), ("delete", "pods", {}),
        ("get", "trainingjobs", {"group": "cohort.dev"}),
        ("patch", "trainingjobs", {"group": "cohort.dev", "subresource": "status"}),
        ("create", "events", {}), ("get", "configmaps", {"name": f"{JOB}-world", "namespace": "default"}),
        ("create", "serviceaccounts", {"subresource": "token", "name": f"{JOB}-worker"}),
    ]
    wrong = _check_access(cluster, ns, f"{JOB}-worker", ns, allowed, True)
    assert not wrong, f"the workers may not: {wrong}"
    wrong = _check_access(cluster, ns, f"{JOB}-worker", ns, denied, False)
    assert not wrong, f"the workers may (and must not): {wrong}"


@pytest.mark.e2e
def test_a_frozen_worker_is_killed_by_its_kubelet_and_replaced(cluster, release):
    """A worker that answers nothing (COHORT_FAULT_FREEZE: SIGSTOP, every thread of it; the kernel still
    accepts its connections) leaves the world once its kubelet finds it not Ready (15 s). Before, its pod
    then stayed Running for good, holding its place, so nothing replaced it and the job ran a worker short.
    Its liveness probe (pods.probes: /livez, processGroupTimeoutSeconds of silence) now has its kubelet kill
    it; the operator counts the failure and a new worker brings the world back to its target."""
    ns, name = release["namespace"], "frozen"
    job = _digits_job(ns)
    job["metadata"]["name"] = name
    job["spec"]["replicas"] = {"min": 2, "max": 4, "target": 3}
    job["spec"]["workload"].update({"epochs": 0, "maxSteps": 10**6, "evalEveryEpochs": 0})  # deleted below
    job["spec"]["checkpoint"] = {"everySteps": 0}
    # A group timeout past readiness's 15 s: the frozen member leaves on its readiness, and the re-formed
    # world never waits its rendezvous out (that path finds a hung member by itself; not this test's).
    job["spec"]["faultTolerance"] = {"collectiveTimeoutSeconds": 2, "processGroupTimeoutSeconds": 30,
                                     "backoffSeconds": 0}
    job["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "COHORT_FAULT_FREEZE", "value": "rank=1,step=30"}]}]}}
    cluster.create_job(ns, job)
    def world(st: dict) -> list[str]:
        return (st.get("world") or {}).get("members") or []

    def status() -> dict:
        return cluster.get_job(ns, name).get("status", {})
    try:
        members = wait_for(lambda: len(m := world(status())) == 3 and m, 120, 1, what="a world of 3")
        frozen = members[1]
        wait_for(lambda: frozen not in world(status()), 60, 1, what=f"{frozen} out of the world")

        def killed() -> str | None:
            events = cluster.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={frozen}").items
            return next((e.message for e in events if e.reason == "Unhealthy" and "Liveness" in (e.message or "")),
                        None)
        why = wait_for(killed, 60, 1, what=f"{frozen}'s kubelet failing its liveness probe")
        assert "/livez" in why or "Liveness probe failed" in why, why

        def back() -> dict | None:
            st = status()
            return st if len(now := world(st)) == 3 and frozen not in now else None
        st = wait_for(back, 90, 1, what="a world of 3 again, without the frozen worker")
        assert st["restarts"] == 1, st  # its failure, counted once
    finally:
        cluster.delete_job(ns, name)


@pytest.mark.e2e
def test_upgrade_hands_over_the_lease_then_uninstall_removes_the_release(cluster, release):
    ns, values = release["namespace"], release["values"]
    old = helm.ready_operator_pod(cluster, ns, RELEASE).metadata.name
    # The old and the new pod run side by side during the rolling update (the new one as a standby).
    new_values = yaml.safe_load(yaml.safe_dump(values))
    new_values["operator"].update(resyncSeconds=7)
    helm.install(cluster, RELEASE, ns, new_values, upgrade=True)
    status = helm.run([helm.helm_bin(), "status", RELEASE, "-n", ns, "-o", "json"],
                      kubeconfig=cluster.kubeconfig).stdout
    assert yaml.safe_load(status)["version"] == 2
    new = wait_for(lambda: [p for p in helm.operator_pods(cluster, ns, RELEASE) if p.metadata.name != old
                            and "--resync-seconds=7" in p.spec.containers[0].args], 60,
                   what="the upgraded operator pod")[0].metadata.name
    wait_for(lambda: helm.lease_holder(cluster, ns, "cohort") == new, 60, 0.5,
             what="the upgraded pod leading (the old one released the Lease as it stopped)")

    helm.uninstall(cluster, RELEASE, ns)
    assert wait_for(lambda: not helm.operator_pods(cluster, ns, RELEASE), 60, 0.5, what="operator pods gone")
    assert not [d for d in cluster.apps.list_namespaced_deployment(ns).items]
    assert not [r for r in cluster.rbac.list_cluster_role().items if r.metadata.name.startswith(f"{ns}-cohort")]
    assert not [b for b in cluster.rbac.list_cluster_role_binding().items
                if b.metadata.name.startswith(f"{ns}-cohort")]
    assert not [r for r in cluster.rbac.list_namespaced_role(ns).items if "cohort" in r.metadata.name
                and not (r.metadata.labels or {}).get("cohort.dev/job")]
    with pytest.raises(ApiException) as e:
        cluster.core.read_namespaced_service_account("cohort", ns)
    assert e.value.status == 404
    # The shared CRD and the user's jobs are not the release's to delete.
    cluster.ext.read_custom_resource_definition("trainingjobs.cohort.dev")
    assert cluster.get_job(ns, JOB)["status"]["phase"] == "Succeeded"

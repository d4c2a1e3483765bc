"""The objects a job owns besides its pods, as manifest dicts.

Pure builders: the headless Service, the config and world ConfigMaps, the
PodDisruptionBudget, the workers' RBAC (ServiceAccount, Role, RoleBinding)
and, where enabled, the job's NetworkPolicy.
Each carries a controller owner reference, so deleting the job lets the real
garbage collector remove everything. :func:`owned_objects` lists them in the
order the reconciler creates them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cohort.api.jobconfig import render_job_config
from cohort.api.models import TrainingJobSpec

from .naming import (
    CONFIG_KEY,
    METRICS_PORT,
    RDZV_PORT,
    WORLD_KEY,
    config_map_name,
    object_meta,
    reports_map_name,
    selector_labels,
    service_name,
    worker_account_name,
    world_map_name,
)
from .world import World


@dataclasses.dataclass(frozen=True)
class Kind:
    """Where an object kind lives in the API."""

    api_version: str
    kind: str
    plural: str

    def path(self, namespace: str, name: str = "") -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        out = f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{out}/{name}" if name else out


CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
SERVICE = Kind("v1", "Service", "services")
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
POD = Kind("v1", "Pod", "pods")
EVENT = Kind("v1", "Event", "events")
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
PDB = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")


def build_service(job: dict[str, Any]) -> dict[str, Any]:
    """Headless, and publishing not-ready addresses: workers find each other before Ready."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": object_meta(job, service_name(name), "service"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(name),
            "ports": [
                {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"},
                {"name": "rendezvous", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"},
            ],
        },
    }


def build_config_map(job: dict[str, Any]) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": object_meta(job, config_map_name(name), "config"),
        "data": {CONFIG_KEY: render_job_config(job)},
    }


def build_world_map(job: dict[str, Any], world: World) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": object_meta(job, world_map_name(name), "world"),
        "data": {WORLD_KEY: world.render()},
    }


def build_reports_map(job: dict[str, Any]) -> dict[str, Any]:
    """Empty until a member's collective fails (reports.py); workers may patch it and nothing else."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": object_meta(job, reports_map_name(job["metadata"]["name"]), "reports"),
        "data": {},
    }


def build_pdb(job: dict[str, Any], spec: TrainingJobSpec) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": object_meta(job, name, "disruption-budget"),
        "spec": {"minAvailable": spec.replicas.min, "selector": {"matchLabels": selector_labels(name)}},
    }


def build_network_policy(job: dict[str, Any]) -> dict[str, Any]:
    """The job's workers accept connections on any port (rendezvous, and gloo/NCCL's ephemeral
    ports) only from the same job's workers. Policies add up: the chart's namespace policy
    admits the operator and Prometheus to the metrics port."""
    name = job["metadata"]["name"]
    workers = {"matchLabels": selector_labels(name)}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": object_meta(job, name, "network-policy"),
        "spec": {"podSelector": workers, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": workers}]}]},
    }


def build_worker_rbac(job: dict[str, Any], spec: TrainingJobSpec) -> list[dict[str, Any]]:
    """Read access to this job's world ConfigMap and patch access to its reports ConfigMap, nothing else.

    When the podTemplate names its own ServiceAccount, the Role is bound to it
    and no ServiceAccount is created.
    """
    name = job["metadata"]["name"]
    account = worker_account_name(name)
    user_account = spec.pod_template.spec.service_account_name
    out: list[dict[str, Any]] = []
    if not user_account:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(job, account, "worker")})
    out.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": object_meta(job, account, "worker"),
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": [world_map_name(name)], "verbs": ["get", "watch", "list"]},
                  {"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": [reports_map_name(name)], "verbs": ["patch"]}],
    })
    out.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": object_meta(job, account, "worker"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": user_account or account,
                      "namespace": job["metadata"]["namespace"]}],
    })
    return out


def owned_objects(job: dict[str, Any], spec: TrainingJobSpec, *, network_policy: bool = False
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Everything but pods and the world, as (needed before the pods, the rest).

    A pod cannot be admitted before its ServiceAccount exists, and it mounts
    the config; the Service, Role, RoleBinding and PDB can follow the pods,
    which gets workers started sooner on a busy API server. The NetworkPolicy
    comes first: a worker must never be reachable without it.
    """
    rbac = build_worker_rbac(job, spec)
    before = [build_config_map(job), build_reports_map(job)] + [o for o in rbac if o["kind"] == "ServiceAccount"]
    if network_policy:
        before.append(build_network_policy(job))
    after = [build_service(job)] + [o for o in rbac if o["kind"] != "ServiceAccount"] + [build_pdb(job, spec)]
    return before, after


def kind_of(obj: dict[str, Any]) -> Kind:
    for k in (CONFIG_MAP, SERVICE, SERVICE_ACCOUNT, POD, ROLE, ROLE_BINDING, PDB, LEASE, EVENT, NETWORK_POLICY):
        if k.api_version == obj["apiVersion"] and k.kind == obj["kind"]:
            return k
    raise KeyError(f"unknown kind {obj['apiVersion']}/{obj['kind']}")

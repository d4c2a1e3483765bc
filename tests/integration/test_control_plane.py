"""The local control plane is real: scheduler, RBAC, garbage collector, CRDs, versions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from cohort.trainer.runtime.ports import ephemeral_range, free_ports
from tests.support.kube import wait_for
from tests.support.paths import kubectl_bin, pinned
from tests.support.specs import with_workload

pytestmark = pytest.mark.k8s
REPO = Path(__file__).resolve().parents[2]


def test_pod_is_scheduled_to_a_kwok_node_and_runs(cluster, namespace):
    pod = {
        "metadata": {"name": "probe"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            # Process nodes (untainted, started by the e2e tests) may be up in the same session.
            "nodeSelector": {"type": "kwok"},
        },
    }
    cluster.core.create_namespaced_pod(namespace, pod)
    p = wait_for(lambda: (lambda p: p if p.status.phase == "Running" else None)(
        cluster.core.read_namespaced_pod("probe", namespace)), 30, what="pod Running")
    assert p.spec.node_name.startswith("kwok-"), p.spec.node_name
    node = cluster.core.read_node(p.spec.node_name)
    assert node.status.allocatable["nvidia.com/gpu"] == "8"


def test_unprivileged_service_account_is_denied_by_rbac(cluster, namespace):
    def review(verb: str, resource: str) -> bool:
        body = {"spec": {"user": f"system:serviceaccount:{namespace}:default",
                         "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource}}}
        return cluster.authz.create_subject_access_review(body).status.allowed

    assert review("create", "pods") is False
    assert review("list", "secrets") is False
    # The admin user (system:masters) is allowed: the denial above is RBAC, not a broken authorizer.
    body = {"spec": {"user": "cohort-admin", "groups": ["system:masters"],
                     "resourceAttributes": {"namespace": namespace, "verb": "create", "resource": "pods"}}}
    assert cluster.authz.create_subject_access_review(body).status.allowed is True


def test_garbage_collector_deletes_owned_objects(cluster, namespace):
    owner = cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    cluster.core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def child_gone() -> bool:
        try:
            cluster.core.read_namespaced_config_map("child", namespace)
            return False
        except ApiException as e:
            return e.status == 404

    wait_for(child_gone, 60, what="garbage collection of the owned ConfigMap")


def test_trainingjob_crd_is_served_with_defaults(cluster, namespace):
    job = {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "served"},
           "spec": with_workload({"replicas": {"min": 1, "max": 2, "target": 1}})}
    cluster.create_job(namespace, job)
    got = cluster.get_job(namespace, "served")
    assert got["spec"]["workload"]["batchSize"] == 64  # defaulted by the API server from the schema
    assert got["spec"]["checkpoint"]["keep"] == 3


def test_server_reports_the_pinned_version(cluster):
    out = subprocess.run([kubectl_bin(), "version", "-o", "json"], capture_output=True, text=True, check=True,
                         env={**os.environ, "KUBECONFIG": cluster.kubeconfig})
    version = json.loads(out.stdout)
    assert version["serverVersion"]["gitVersion"] == pinned("K8S_VERSION")
    assert version["clientVersion"]["gitVersion"] == pinned("K8S_VERSION")


def _second_cluster_env(tmp_path: Path) -> dict[str, str]:
    # The control plane alone: real nodes are one cluster's per machine (the session's).
    base = {"COHORT_CLUSTER_DIR": str(tmp_path / "cluster"), "COHORT_REAL_NODES": "0"}
    # etcd uses its port + 1 for peers: pick ports whose etcd pair is free and apart from the others.
    while True:
        ports = free_ports(5)
        etcd = ports[1]
        if etcd + 1 in ports or etcd + 1 >= ephemeral_range()[0]:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", etcd + 1))
            break
        except OSError:
            continue
    for var, port in zip(("APISERVER", "ETCD", "KCM", "SCHEDULER", "KWOK"), ports, strict=True):
        base[f"COHORT_{var}_PORT"] = str(port)
    return {**os.environ, **base}


def _kwok_route() -> bool:
    """hack/cluster.sh's local route for kwok's pod addresses (made as root)."""
    table = subprocess.run(["ip", "route", "show", "table", "local"], capture_output=True, text=True).stdout
    return "local 10.89.0.0/16 dev lo" in table


@pytest.mark.slow
def test_cluster_down_leaves_no_process_and_up_reuses(tmp_path):
    env = _second_cluster_env(tmp_path)
    route_before = _kwok_route()  # the session's cluster made it, if one is up
    up = subprocess.run([str(REPO / "hack/cluster.sh"), "up"], env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    pids_dir = tmp_path / "cluster/pids"
    pids = {f.stem: int(f.read_text()) for f in pids_dir.glob("*.pid")}
    assert set(pids) >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
    again = subprocess.run([str(REPO / "hack/cluster.sh"), "up"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "reusing" in again.stderr, again.stderr
    assert {f.stem: int(f.read_text()) for f in pids_dir.glob("*.pid")} == pids  # nothing restarted
    subprocess.run([str(REPO / "hack/cluster.sh"), "down"], env=env, check=True, capture_output=True)
    alive = [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/status").read_text().find("zombie") < 0]
    assert alive == [], f"still running after cluster-down: {alive}"
    # A second cluster shares kwok's pod range and leaves its route as it found it: a clean-clone run once
    # lost the session cluster's route here, and a later test could not listen on a kwok pod's address.
    assert _kwok_route() == route_before


def test_cluster_up_names_the_component_whose_port_is_taken(tmp_path):
    env = _second_cluster_env(tmp_path)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", int(env["COHORT_APISERVER_PORT"])))
        blocker.listen()
        proc = subprocess.run([str(REPO / "hack/cluster.sh"), "up"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "kube-apiserver" in proc.stderr and "already in use" in proc.stderr
    assert str(tmp_path / "cluster/logs/kube-apiserver.log") in proc.stderr

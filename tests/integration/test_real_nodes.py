"""Real nodes: kubelets with containerd and runc, running the images built here.

What a user's cluster enforces is enforced here too, and each test reads it
from inside a running container or from the kubelet's own verdict: the user
id, the read-only root, capabilities and seccomp, Pod Security admission,
memory limits (the kernel's OOM killer), pod networking across nodes and to
the API server through the `kubernetes` Service, and kubelets that refuse
anonymous callers and can only touch their own Node.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.kube import wait_for
from tests.support.operator import kubectl
from tests.support.paths import cluster_dir
from tests.support.realnodes import pod, real_nodes, restrict, wait_pod, wait_running  # noqa: F401

pytestmark = pytest.mark.k8s

OPERATOR_IMAGE = "cohort-operator:0.1.0"
CLUSTER_DIR = cluster_dir()
SLEEP = ["python", "-c", "import time; time.sleep(3600)"]


def exec_py(cluster, namespace: str, name: str, code: str) -> str:
    out = kubectl(cluster, "exec", "-n", namespace, name, "--", "python", "-c", code)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_nodes_run_the_pinned_kubelet_and_containerd(cluster, real_nodes):  # noqa: F811
    for i, name in enumerate(real_nodes):
        node = cluster.core.read_node(name)
        info = node.status.node_info
        assert info.kubelet_version == "v1.34.4"
        assert info.container_runtime_version == "containerd://2.4.2"
        # Every node is this machine: one InternalIP (the kubelets differ by port).
        assert [a.address for a in node.status.addresses if a.type == "InternalIP"] == ["10.87.0.1"]
        assert node.status.daemon_endpoints.kubelet_endpoint.port == 12250 + i
        assert not node.spec.taints


def test_kubelets_refuse_anonymous_callers(real_nodes):  # noqa: F811
    ctx = ssl.create_default_context(cafile=str(CLUSTER_DIR / "pki/ca.crt"))
    for i, name in enumerate(real_nodes):
        port = 12250 + i
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"https://10.87.0.1:{port}/pods", context=ctx, timeout=10)
        assert err.value.code == 401, f"{name}: anonymous request got {err.value.code}"


def test_a_kubelet_identity_can_change_only_its_own_node(cluster, real_nodes):  # noqa: F811
    """Each kubelet is system:node:<name>: NodeRestriction lets it label itself, not its peer."""
    own, peer = real_nodes
    api = client.CoreV1Api(client.ApiClient(_config(CLUSTER_DIR / "nodes" / own / "kubeconfig")))
    patch = {"metadata": {"labels": {"cohort.dev/probe": "x"}}}
    with pytest.raises(ApiException) as err:
        api.patch_node(peer, patch)
    message = json.loads(err.value.body)["message"]
    assert err.value.status == 403 and f'node "{own}" is not allowed to modify node "{peer}"' in message, message
    api.patch_node(own, patch)
    api.patch_node(own, {"metadata": {"labels": {"cohort.dev/probe": None}}})


def _config(path: Path) -> client.Configuration:
    from kubernetes import config as kconfig
    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(path), client_configuration=cfg)
    return cfg


def test_operator_image_runs_restricted_as_65532_with_a_read_only_root(cluster, namespace, real_nodes):  # noqa: F811
    restrict(cluster, namespace)
    cluster.core.create_namespaced_pod(namespace, pod("op", OPERATOR_IMAGE, SLEEP))
    wait_running(cluster, namespace, "op")
    seen = json.loads(exec_py(cluster, namespace, "op", """
import json, os
try:
    open('/probe', 'w'); ro = False
except OSError as e:
    ro = e.errno == 30
status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)
print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'read_only_root': ro,
                  'cap_eff': status['CapEff'].strip(), 'seccomp': status['Seccomp'].strip(),
                  'no_new_privs': status['NoNewPrivs'].strip()}))
"""))
    assert seen == {"uid": 65532, "gid": 65532, "read_only_root": True, "cap_eff": "0000000000000000",
                    "seccomp": "2", "no_new_privs": "1"}


def test_restricted_namespace_refuses_a_privileged_pod(cluster, namespace, real_nodes):  # noqa: F811
    restrict(cluster, namespace)
    bad = pod("root", OPERATOR_IMAGE, SLEEP)
    bad["spec"]["securityContext"] = {}
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_pod(namespace, bad)
    message = json.loads(err.value.body)["message"]
    assert err.value.status == 403 and 'violates PodSecurity "restricted:latest"' in message, message


def test_pods_reach_each_other_across_nodes_and_the_api_server(cluster, namespace, real_nodes):  # noqa: F811
    node_a, node_b = real_nodes
    restrict(cluster, namespace)
    server = pod("server", OPERATOR_IMAGE, ["python", "-m", "http.server", "8080", "--directory", "/opt"],
                 node=node_a, ports=[{"containerPort": 8080}])
    cluster.core.create_namespaced_pod(namespace, server)
    cluster.core.create_namespaced_pod(namespace, pod("client", OPERATOR_IMAGE, SLEEP, node=node_b))
    ip = wait_running(cluster, namespace, "server").status.pod_ip
    assert wait_running(cluster, namespace, "client").status.pod_ip.startswith("10.88.1.")
    assert ip.startswith("10.88.0.")
    got = exec_py(cluster, namespace, "client", f"""
import os, ssl, urllib.request
print(urllib.request.urlopen('http://{ip}:8080/', timeout=10).status)
sa = '/var/run/secrets/kubernetes.io/serviceaccount/'
ctx = ssl.create_default_context(cafile=sa + 'ca.crt')
url = 'https://' + os.environ['KUBERNETES_SERVICE_HOST'] + '/version'  # the Service's ClusterIP
req = urllib.request.Request(url, headers={{'Authorization': 'Bearer ' + open(sa + 'token').read()}})
print(urllib.request.urlopen(req, context=ctx, timeout=10).read().decode())
""")
    status, version = got.split("\n", 1)
    assert status == "200"
    assert json.loads(version)["gitVersion"] == "v1.34.4"


def test_a_pod_over_its_memory_limit_is_oom_killed(cluster, namespace, real_nodes):  # noqa: F811
    restrict(cluster, namespace)
    hog = pod("hog", OPERATOR_IMAGE, ["python", "-c", "x = [bytearray(32 << 20) for _ in range(32)]"],
              limits={"memory": "64Mi", "cpu": "500m"})
    cluster.core.create_namespaced_pod(namespace, hog)
    p = wait_pod(cluster, namespace, "hog", ("Failed",), 60)
    term = p.status.container_statuses[0].state.terminated
    assert (term.reason, term.exit_code) == ("OOMKilled", 137)


def test_kubectl_logs_come_from_the_container(cluster, namespace, real_nodes):  # noqa: F811
    restrict(cluster, namespace)
    cluster.core.create_namespaced_pod(namespace, pod("hello", OPERATOR_IMAGE, ["python", "-c", "print('hi from', __import__('os').getuid())"]))
    wait_pod(cluster, namespace, "hello", ("Succeeded",), 60)
    out = wait_for(lambda: (o := kubectl(cluster, "logs", "-n", namespace, "hello", check=False)).returncode == 0 and o.stdout, 20,
                   what="the pod's log")
    assert out.strip() == "hi from 65532"


def test_a_claim_is_provisioned_and_shared_by_pods_on_both_nodes(cluster, namespace, real_nodes):  # noqa: F811
    node_a, node_b = real_nodes
    restrict(cluster, namespace)
    cluster.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "shared"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    volume = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]}
    mount = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    writer = pod("writer", OPERATOR_IMAGE, ["python", "-c", "open('/data/hello', 'w').write('from a')"],
                 node=node_a, **mount)
    writer["spec"].update(volume)
    cluster.core.create_namespaced_pod(namespace, writer)
    wait_pod(cluster, namespace, "writer", ("Succeeded",), 90)
    reader = pod("reader", OPERATOR_IMAGE, ["python", "-c", "print(open('/data/hello').read())"], node=node_b, **mount)
    reader["spec"].update(volume)
    cluster.core.create_namespaced_pod(namespace, reader)
    wait_pod(cluster, namespace, "reader", ("Succeeded",), 60)
    assert kubectl(cluster, "logs", "-n", namespace, "reader").stdout.strip() == "from a"
    claim = cluster.core.read_namespaced_persistent_volume_claim("shared", namespace)
    assert claim.spec.storage_class_name == "local-path" and claim.status.phase == "Bound"

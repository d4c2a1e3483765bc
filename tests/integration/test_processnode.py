"""Process nodes run pods as real local processes: exit codes, env, IPs, volumes, deletion."""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest
from kubernetes.client import CoordinationV1Api
from kubernetes.client.rest import ApiException

from tests.support.kube import wait_for
from tests.support.processnodes import pod_log, pod_manifest, process_nodes, wait_phase  # noqa: F401

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("process_nodes")]
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def py(code: str, *args: str) -> list[str]:
    return ["python", "-c", code, *args]


def create(cluster, namespace, manifest):
    return cluster.core.create_namespaced_pod(namespace, manifest)


def finished(cluster, namespace, name, timeout_s: float = 30):
    return wait_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout_s)


def terminated(pod):
    return pod.status.container_statuses[0].state.terminated


def gone(cluster, namespace, name) -> bool:
    try:
        cluster.core.read_namespaced_pod(name, namespace)
        return False
    except ApiException as e:
        return e.status == 404


def ready(cluster, namespace, name):
    p = cluster.core.read_namespaced_pod(name, namespace)
    return p if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) else None


def test_nodes_are_untainted_with_fake_gpus_and_a_lease(cluster, process_nodes):  # noqa: F811
    node = cluster.core.read_node(process_nodes[0])
    assert node.metadata.labels["type"] == "process"
    assert node.metadata.labels["cohort.dev/node-kind"] == "process"
    assert not node.spec.taints
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
    assert CoordinationV1Api(cluster.api).read_namespaced_lease(process_nodes[0], "kube-node-lease").spec.renew_time


def test_pod_succeeds_and_the_logs_command_prints_its_output(cluster, namespace):
    create(cluster, namespace, pod_manifest("ok", py("print('hello from a process node')")))
    pod = finished(cluster, namespace, "ok")
    assert pod.status.phase == "Succeeded"
    assert terminated(pod).exit_code == 0 and terminated(pod).reason == "Completed"
    assert pod.spec.node_name.startswith("process-")
    assert "hello from a process node" in pod_log(namespace, "ok")


def test_failing_pod_reports_its_exit_code(cluster, namespace):
    create(cluster, namespace, pod_manifest("bad", py("import sys; sys.exit(3)")))
    create(cluster, namespace, pod_manifest("nocmd", ["no-such-command-xyz"]))
    pod = finished(cluster, namespace, "bad")
    assert pod.status.phase == "Failed"
    assert terminated(pod).exit_code == 3 and terminated(pod).reason == "Error"
    pod = finished(cluster, namespace, "nocmd")
    assert pod.status.phase == "Failed" and terminated(pod).reason == "ContainerCannotRun"
    assert "no-such-command-xyz" in terminated(pod).message


def test_downward_api_env_and_var_expansion(cluster, namespace):
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           POD_IP_ENV,
           {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "GREETING", "value": "hi $(POD_NAME)"}]
    code = ("import json, os, sys; print(json.dumps({**{k: os.environ[k] for k in ('POD_NAME', 'POD_NS', 'POD_IP', "
            "'NODE', 'GREETING', 'KUBERNETES_SERVICE_HOST')}, 'arg': sys.argv[1]}))")
    create(cluster, namespace, pod_manifest("env", py(code, "$(POD_IP)"), env=env))
    pod = finished(cluster, namespace, "env")
    got = json.loads(pod_log(namespace, "env").strip().splitlines()[-1])
    assert got == {"POD_NAME": "env", "POD_NS": namespace, "POD_IP": pod.status.pod_ip, "NODE": pod.spec.node_name,
                   "GREETING": "hi env", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "arg": pod.status.pod_ip}
    assert pod.status.pod_ip.startswith("127.") and pod.status.pod_ip != "127.0.0.1"


def test_two_pods_serve_on_their_own_loopback_ips_and_become_ready(cluster, namespace):
    server = py("import http.server, os; http.server.ThreadingHTTPServer((os.environ['POD_IP'], 8080), "
                "http.server.SimpleHTTPRequestHandler).serve_forever()")
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    for name in ("web-a", "web-b"):  # the same port on both: only distinct addresses make that work
        create(cluster, namespace, pod_manifest(name, server, grace_s=1, readinessProbe=probe, env=[POD_IP_ENV],
                                                ports=[{"name": "http", "containerPort": 8080}]))
    a, b = (wait_for(lambda n=n: ready(cluster, namespace, n), 30, what=f"{n} Ready") for n in ("web-a", "web-b"))
    assert a.status.pod_ip != b.status.pod_ip
    for p in (a, b):
        assert p.status.container_statuses[0].ready is True
        with urllib.request.urlopen(f"http://{p.status.pod_ip}:8080/", timeout=5) as r:
            assert r.status == 200


def test_configmap_volume_is_read_at_the_mapped_mount_path_and_kept_current(cluster, namespace):
    cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "cfg"}, "data": {"greeting": "v1"}})
    code = ("import json, os, sys, time\n"
            "path = sys.argv[1]\n"
            "mapped = json.loads(os.environ['COHORT_PATH_MAP'])['/etc/' + 'cfg']\n"  # split: args are path-mapped too
            "print('first', open(path).read(), mapped, path, flush=True)\n"
            "while open(path).read() != 'v2': time.sleep(0.1)\n"
            "print('then v2')\n")
    create(cluster, namespace, pod_manifest("cm", py(code, "/etc/cfg/greeting"),
                                            volumeMounts=[{"name": "cfg", "mountPath": "/etc/cfg"}],
                                            volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}]))
    wait_for(lambda: "first v1" in pod_log(namespace, "cm"), 30, what="the pod read the ConfigMap")
    _, _, local_dir, path = pod_log(namespace, "cm").split()
    assert path == f"{local_dir}/greeting" and not local_dir.startswith("/etc/cfg")
    cluster.core.patch_namespaced_config_map("cfg", namespace, {"data": {"greeting": "v2"}})
    pod = finished(cluster, namespace, "cm")
    assert pod.status.phase == "Succeeded" and "then v2" in pod_log(namespace, "cm")


def test_pvc_directory_persists_across_pods(cluster, namespace):
    cluster.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    mount = {"volumeMounts": [{"name": "d", "mountPath": "/data"}],
             "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
    create(cluster, namespace, pod_manifest("writer", py("import sys; open(sys.argv[1], 'w').write('kept')",
                                                         "/data/file.txt"), **mount))
    assert finished(cluster, namespace, "writer").status.phase == "Succeeded"
    create(cluster, namespace, pod_manifest("reader", py("import sys; print('read', open(sys.argv[1]).read())",
                                                         "/data/file.txt"), **mount))
    assert finished(cluster, namespace, "reader").status.phase == "Succeeded"
    assert "read kept" in pod_log(namespace, "reader")
    assert cluster.core.read_namespaced_persistent_volume_claim("data", namespace).status.phase == "Bound"


TRAP_TERM = ("import signal, sys, time\n"
             "def bye(*_):\n"
             "    print('got SIGTERM, exiting cleanly', flush=True); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, bye)\n"
             "print('started', flush=True)\n"
             "while True: time.sleep(0.05)\n")
IGNORE_TERM = ("import signal, time\n"
               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
               "print('started', flush=True)\n"
               "while True: time.sleep(0.05)\n")


def _pid(pod) -> int:
    return int(pod.status.container_statuses[0].container_id.rsplit("/", 1)[1])


def test_deletion_sends_sigterm_and_a_clean_exit_ends_it_early(cluster, namespace):
    create(cluster, namespace, pod_manifest("trap", py(TRAP_TERM), grace_s=30))
    wait_for(lambda: "started" in pod_log(namespace, "trap"), 30, what="the handler installed")
    pid = _pid(cluster.core.read_namespaced_pod("trap", namespace))
    t0 = time.monotonic()
    cluster.core.delete_namespaced_pod("trap", namespace)
    wait_for(lambda: gone(cluster, namespace, "trap"), 20, what="pod deleted")
    assert time.monotonic() - t0 < 10  # well inside the 30 s grace period
    assert "got SIGTERM, exiting cleanly" in pod_log(namespace, "trap")
    assert not os.path.exists(f"/proc/{pid}")


def test_deletion_sigkills_a_process_that_ignores_sigterm_after_the_grace_period(cluster, namespace):
    create(cluster, namespace, pod_manifest("stubborn", py(IGNORE_TERM), grace_s=2))
    wait_for(lambda: "started" in pod_log(namespace, "stubborn"), 30, what="SIGTERM ignored")
    pid = _pid(cluster.core.read_namespaced_pod("stubborn", namespace))
    t0 = time.monotonic()
    cluster.core.delete_namespaced_pod("stubborn", namespace)
    time.sleep(1.0)
    assert os.path.exists(f"/proc/{pid}")  # still alive inside the grace period
    wait_for(lambda: gone(cluster, namespace, "stubborn"), 20, what="pod deleted")
    assert 1.9 <= time.monotonic() - t0 < 10
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 5, what="the process killed")


def test_restart_policy_on_failure_restarts_and_counts(cluster, namespace):
    code = ("import os, sys\n"
            "p = '/scratch/runs'\n"  # an emptyDir: it outlives container restarts
            "n = int(open(p).read()) if os.path.exists(p) else 0\n"
            "open(p, 'w').write(str(n + 1)); print('run', n, flush=True)\n"
            "sys.exit(0 if n >= 2 else 1)\n")
    create(cluster, namespace, pod_manifest("flaky", py(code), restart="OnFailure",
                                            volumeMounts=[{"name": "s", "mountPath": "/scratch"}],
                                            volumes=[{"name": "s", "emptyDir": {}}]))
    pod = finished(cluster, namespace, "flaky")
    cs = pod.status.container_statuses[0]
    assert pod.status.phase == "Succeeded" and cs.restart_count == 2
    assert cs.last_state.terminated.exit_code == 1
    assert pod_log(namespace, "flaky").split() == ["run", "0", "run", "1", "run", "2"]


def test_termination_message_from_file_and_fallback_to_logs(cluster, namespace):
    create(cluster, namespace, pod_manifest(
        "msg", py("import sys; open(sys.argv[1], 'w').write('{\"step\": 42}')", "/dev/termination-log")))
    create(cluster, namespace, pod_manifest(
        "crash", py("import sys; print('boom: bad config', file=sys.stderr); sys.exit(2)"),
        terminationMessagePolicy="FallbackToLogsOnError"))
    assert terminated(finished(cluster, namespace, "msg")).message == '{"step": 42}'
    assert "boom: bad config" in terminated(finished(cluster, namespace, "crash")).message


def test_service_account_token_reaches_the_api_server_as_the_pod(cluster, namespace):
    code = ("import json, os, ssl, urllib.error, urllib.request\n"
            "d = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
            "token, ns = open(d + '/token').read(), open(d + '/namespace').read()\n"
            "ctx = ssl.create_default_context(cafile=d + '/ca.crt')\n"
            "url = 'https://%s:%s/api/v1/namespaces/%s/secrets' % (os.environ['KUBERNETES_SERVICE_HOST'], "
            "os.environ['KUBERNETES_SERVICE_PORT'], ns)\n"
            "try:\n"
            "    urllib.request.urlopen(urllib.request.Request(url, headers={'Authorization': 'Bearer ' + token}), "
            "context=ctx)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code, json.loads(e.read())['message'])\n")
    create(cluster, namespace, pod_manifest("sa", py(code)))
    assert finished(cluster, namespace, "sa").status.phase == "Succeeded"
    out = pod_log(namespace, "sa")
    assert out.startswith("403") and f"system:serviceaccount:{namespace}:default" in out, out

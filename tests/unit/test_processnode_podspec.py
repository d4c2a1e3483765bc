"""Pure parts of process nodes: $(VAR) expansion, env resolution, path mapping, pod phase."""

from __future__ import annotations

import base64
import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
podspec = importlib.import_module("processnode.podspec")
status = importlib.import_module("processnode.status")

POD = {"metadata": {"name": "w-0", "namespace": "ns", "uid": "u1", "labels": {"app": "x"},
                    "annotations": {"a/b": "c"}},
       "spec": {"nodeName": "process-0", "serviceAccountName": "sa",
                "containers": [{"name": "main", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}}}]},
       "status": {"podIP": "127.0.0.11", "hostIP": "127.0.0.1"}}


@pytest.mark.parametrize(("text", "want"), [
    ("$(A)-$(B)", "1-$(B)"),          # undefined references stay as written
    ("$$(A)", "$(A)"),                # escaped
    ("$$$(A)", "$1"),
    ("cost $5 $(A", "cost $5 $(A"),   # no closing paren
    ("$(A)$(A)", "11"),
])
def test_expand_follows_the_kubelet_rules(text, want):
    assert podspec.expand(text, {"A": "1"}) == want


def test_field_refs():
    assert podspec.field_ref(POD, "metadata.labels['app']") == "x"
    assert podspec.field_ref(POD, "metadata.annotations['a/b']") == "c"
    assert podspec.field_ref(POD, "status.podIP") == "127.0.0.11"
    assert podspec.field_ref(POD, "spec.serviceAccountName") == "sa"
    with pytest.raises(podspec.ConfigError):
        podspec.field_ref(POD, "spec.nope")


def test_resolve_env_order_refs_and_optional():
    objs = {("ConfigMap", "ns", "cm"): {"data": {"K": "from-cm", "X": "x"}},
            ("Secret", "ns", "s"): {"data": {"P": base64.b64encode(b"pw").decode()}}}
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "URL", "value": "http://$(IP):$(PORT)/$(MISSING)"},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "P"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": True}}},
                {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}],
        "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}},
    }
    env = podspec.resolve_env(POD, container, lambda k, ns, n: objs.get((k, ns, n)), {"PORT": "80"}, {})
    assert env == {"CM_K": "from-cm", "CM_X": "x", "IP": "127.0.0.11", "URL": "http://127.0.0.11:80/$(MISSING)",
                   "PW": "pw", "CPU": "2", "MEM": "1024"}
    missing = {"name": "main", "env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]}
    with pytest.raises(podspec.ConfigError, match='configmap "gone" not found'):
        podspec.resolve_env(POD, missing, lambda *_: None, {}, {})


def test_path_map_rewrites_whole_paths_only():
    pm = podspec.PathMap({"/etc/cohort": "/L/cfg", "/etc/cohort/sub": "/L/sub", "/data": "/L/data",
                          "/dev/termination-log": "/L/term"})
    assert pm.rewrite("/etc/cohort/job.json") == "/L/cfg/job.json"
    assert pm.rewrite("--config=/etc/cohort/job.json") == "--config=/L/cfg/job.json"
    assert pm.rewrite("/etc/cohort/sub/x") == "/L/sub/x"           # the longest mount wins
    assert pm.rewrite("/etc/cohortx/y") == "/etc/cohortx/y"         # not a whole path
    assert pm.rewrite("/var/data/x") == "/var/data/x"               # inside another path
    assert pm.rewrite("file:/data") == "file:/L/data"
    assert pm.rewrite("open('/dev/termination-log')") == "open('/L/term')"
    assert pm.rewrite("/data /data/a") == "/L/data /L/data/a"


def test_pod_phase():
    S = status.ContainerState
    running = S("a", "", state="running")
    done = S("b", "", state="terminated", exit_code=0)
    failed = S("c", "", state="terminated", exit_code=1)
    backoff = S("d", "", state="waiting", reason="CrashLoopBackOff", last={"exitCode": 1})
    assert status.pod_phase([S("x", "")], True, False) == "Pending"
    assert status.pod_phase([running, done], True, False) == "Running"
    assert status.pod_phase([backoff], True, False) == "Running"
    assert status.pod_phase([done], True, False) == "Succeeded"
    assert status.pod_phase([done, failed], True, False) == "Failed"
    assert status.pod_phase([running], False, True) == "Failed"

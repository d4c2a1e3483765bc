"""Process nodes for tests: a session fixture and small pod helpers.

``process_nodes`` makes sure Ready process nodes exist (running
``hack/processnodes.sh up`` when they do not) and stops at the end of the session
only a daemon it started itself. Use it from a test module with::

    from tests.support.processnodes import process_nodes  # noqa: F401  (a fixture)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import Cluster, wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "processnodes.sh"
SELECTOR = "cohort.dev/node-kind=process"


def ready_process_nodes(cluster: Cluster) -> list[str]:
    nodes = cluster.core.list_node(label_selector=SELECTOR).items
    return [n.metadata.name for n in nodes
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]


@pytest.fixture(scope="session")
def process_nodes(cluster: Cluster) -> list[str]:
    """Names of Ready process nodes; the daemon is started here (and stopped at the end) if needed."""
    started = False
    if not ready_process_nodes(cluster):
        env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
        proc = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            pytest.fail(f"could not start process nodes (hack/processnodes.sh up):\n{proc.stderr[-4000:]}",
                        pytrace=False)
        started = "reusing" not in proc.stderr
    names = wait_for(lambda: ready_process_nodes(cluster), 30, what="Ready process nodes")
    yield names
    if started and not os.environ.get("COHORT_KEEP_CLUSTER"):
        subprocess.run([str(SCRIPT), "down"], check=False, capture_output=True)


def pod_manifest(name: str, command: list[str], *, restart: str = "Never", grace_s: int | None = None,
                 volumes: list[dict[str, Any]] | None = None, **container: Any) -> dict[str, Any]:
    """A single-container pod for process nodes (the image is ignored there); container
    fields (env, args, volumeMounts, readinessProbe...) come as keyword arguments."""
    spec: dict[str, Any] = {"restartPolicy": restart, "nodeSelector": {"type": "process"},
                            "containers": [{"name": "main", "image": "ignored", "command": command, **container}]}
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_phase(cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...], timeout_s: float = 30) -> Any:
    """Wait until the pod's phase is one of phases; return the pod."""
    def check() -> Any:
        p = cluster.core.read_namespaced_pod(name, namespace)
        return p if p.status.phase in phases else None
    return wait_for(check, timeout_s, what=f"pod {namespace}/{name} in phase {'/'.join(phases)}")


def pod_log(namespace: str, name: str, container: str | None = None) -> str:
    """The container's output so far, through ``hack/processnodes.sh logs`` ("" before it starts)."""
    cmd = [str(SCRIPT), "logs", namespace, name] + (["-c", container] if container else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""

"""Real nodes for tests: the session fixture and pod helpers.

``real_nodes`` returns the Ready real nodes (kubelet + containerd) that
``hack/cluster.sh up`` started; with none it fails and says why (it never
skips). Pods here run the images ``hack/images.sh`` built, under the
kubelet's enforcement of their securityContext and limits.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.support.kube import Cluster, wait_for
from tests.support.paths import REPO, cache_dir

SELECTOR = "cohort.dev/node-kind=real"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}
# What the restricted Pod Security Standard asks of every container.
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"}}


def ready_real_nodes(cluster: Cluster) -> list[str]:
    nodes = cluster.core.list_node(label_selector=SELECTOR).items
    return sorted(n.metadata.name for n in nodes
                  if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []))


@pytest.fixture(scope="session")
def real_nodes(cluster: Cluster) -> list[str]:
    names = ready_real_nodes(cluster)
    if len(names) < 2:
        pytest.fail(f"want 2 Ready real nodes ({SELECTOR}), have {names}: start them with hack/cluster.sh up "
                    "(COHORT_REAL_NODES=2, as root)", pytrace=False)
    stale = not_imported(names)
    if stale:
        pytest.fail(f"the real nodes run older images than this tree builds: {stale} not imported "
                    "(hack/nodes.sh images imports them)", pytrace=False)
    return names


def not_imported(nodes: list[str]) -> list[str]:
    """This tree's image builds that a node's containerd has no import record of (``hack/images.sh mark``
    names the record an import of the current build writes into the node's containerd root)."""
    missing = []
    for image in ("pause", "operator", "trainer"):
        mark = subprocess.run([str(REPO / "hack/images.sh"), "mark", image], capture_output=True, text=True,
                              check=True).stdout.strip()
        missing += [f"{node}: {mark.removeprefix(f'imported-{image}-')}" for node in nodes
                    if not (cache_dir() / "containerd" / node / mark).exists()]
    return missing


def restrict(cluster: Cluster, namespace: str) -> None:
    """Label the namespace for the restricted Pod Security Standard, enforced, and return once the API
    server enforces it: Pod Security admission reads namespaces from the server's informer cache, so a
    pod created right after the label may still be judged by the old labels."""
    cluster.core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    probe = pod("pod-security-probe", "cohort.invalid/probe", ["true"])
    probe["spec"]["containers"][0]["securityContext"] = {"privileged": True}

    def enforced() -> bool:
        try:
            cluster.core.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            return e.status == 403 and "PodSecurity" in str(e.body)
        return False
    wait_for(enforced, 10, 0.1, what=f"restricted Pod Security enforced in {namespace}")


def pod(name: str, image: str, command: list[str], *, node: str = "", limits: dict[str, str] | None = None,
        **container: Any) -> dict[str, Any]:
    """A restricted single-container pod (uid 65532, read-only root, no capabilities)."""
    c: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
                         "securityContext": dict(RESTRICTED_CONTAINER), **container}
    if limits:
        c["resources"] = {"limits": limits, "requests": limits}
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [c], "terminationGracePeriodSeconds": 2,
                            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                                "seccompProfile": {"type": "RuntimeDefault"}},
                            "nodeSelector": {"cohort.dev/node-kind": "real"}}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_pod(cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...], timeout_s: float = 60) -> Any:
    def check() -> Any:
        p = cluster.core.read_namespaced_pod(name, namespace)
        return p if p.status.phase in phases else None
    return wait_for(check, timeout_s, what=f"pod {namespace}/{name} in {'/'.join(phases)}")


def wait_running(cluster: Cluster, namespace: str, name: str, timeout_s: float = 60) -> Any:
    def check() -> Any:
        p = cluster.core.read_namespaced_pod(name, namespace)
        if p.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} ended: {p.status}")
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        return p if ready else None
    return wait_for(check, timeout_s, what=f"pod {namespace}/{name} Ready")

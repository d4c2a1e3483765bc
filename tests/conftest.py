"""Session fixtures for cross-component tests: the real local control plane.

``cluster`` reuses the cluster named by $KUBECONFIG when it answers, else starts
one with ``hack/cluster.sh up`` and stops it at the end of the session. It never
skips: if no cluster can be had, every k8s test fails and says why.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support import kube

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "e2e" in item.keywords and "k8s" not in item.keywords:
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def cluster() -> kube.Cluster:
    """A reachable cluster; started here (and stopped at the end) if needed."""
    started = False
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not (kubeconfig and kube.reachable(kubeconfig)):
        proc = subprocess.run([str(REPO / "hack/cluster.sh"), "up"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"could not start the local cluster (hack/cluster.sh up):\n{proc.stderr[-4000:]}",
                        pytrace=False)
        started = "reusing" not in proc.stderr
        kubeconfig = proc.stdout.strip().splitlines()[-1]
        os.environ["KUBECONFIG"] = kubeconfig
    c = kube.Cluster(kubeconfig)
    c.ensure_crds(REPO / "crds")
    yield c
    if started and not os.environ.get("COHORT_KEEP_CLUSTER"):
        subprocess.run([str(REPO / "hack/cluster.sh"), "down"], check=False)


@pytest.fixture
def namespace(cluster: kube.Cluster, request) -> str:
    """A fresh namespace per test, deleted afterwards."""
    base = request.node.name.lower().replace("_", "-")
    base = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": name, "labels": {"cohort.dev/test": "true"}}})
    yield name
    cluster.delete_namespace(name)

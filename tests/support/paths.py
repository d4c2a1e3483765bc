"""Where hack/ keeps what it builds and runs, and the versions it pins: the one home tests read them from.

The defaults follow hack/lib.sh (``COHORT_CACHE``, else ``$XDG_CACHE_HOME/cohort``,
else ``~/.cache/cohort``) and hack/cluster.sh (``COHORT_CLUSTER_DIR``, else
the cache's ``cluster/``), so a run with another cache finds its own cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    if os.environ.get("COHORT_CACHE"):
        return Path(os.environ["COHORT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cohort"


def cluster_dir() -> Path:
    return Path(os.environ.get("COHORT_CLUSTER_DIR") or cache_dir() / "cluster")


def pinned(name: str) -> str:
    """A version from hack/versions.env."""
    for line in (REPO / "hack/versions.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{name} missing from hack/versions.env")


def kubectl_bin() -> str:
    path = cache_dir() / "bin" / f"kubernetes-{pinned('K8S_VERSION')}" / "kubectl"
    assert path.is_file(), f"kubectl not found at {path}: run hack/build-binaries.sh"
    return str(path)

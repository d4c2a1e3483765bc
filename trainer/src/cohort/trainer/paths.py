"""Where a path in the job config lives on this machine (docs/contracts.md §2).

``cohort run --local`` runs workers as host processes: it maps the paths a pod
would see (``/checkpoints``) to host directories through ``COHORT_PATH_MAP``.
In a pod the map is empty and every path is itself.
"""

from __future__ import annotations

import json
import os


def map_path(path: str) -> str:
    """Apply COHORT_PATH_MAP (longest prefix first)."""
    mapping = json.loads(os.environ.get("COHORT_PATH_MAP", "{}") or "{}")
    for src in sorted(mapping, key=len, reverse=True):
        if path == src or path.startswith(src.rstrip("/") + "/"):
            return str(mapping[src]) + path[len(src):]
    return path

"""The job config document (docs/contracts.md §1), rendered from a TrainingJob.

The trainer reads this file and nothing else about the job, so it is the
operator's half of the contract. ``spec`` is the spec exactly as the API
server returns it (defaults applied), so workers see what
``kubectl get tj -o yaml`` shows.
"""

from __future__ import annotations

import json
from typing import Any

from .naming import API_VERSION, METRICS_PORT, RDZV_PORT

CONFIG_KIND = "JobConfig"


def build_job_config(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": CONFIG_KIND,
        "job": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid", "")},
        "spec": job.get("spec") or {},
        "runtime": {"metricsPort": METRICS_PORT, "rendezvousPort": RDZV_PORT},
    }


def render_job_config(job: dict[str, Any]) -> str:
    """The ``job.json`` text. Sorted keys keep it stable, so an unchanged spec is never rewritten."""
    return json.dumps(build_job_config(job), indent=2, sort_keys=True) + "\n"

"""Names, labels and owner references of everything the operator creates for a job.

One home for these facts: the builders, the reconciler, the tests and the
benchmark all derive object names and selectors from here, so a rename
happens in one place.
"""

from __future__ import annotations

import re
from typing import Any

# The job config's own (cohort.api.jobconfig), re-exported for the builders.
from cohort.api.jobconfig import API_VERSION as API_VERSION
from cohort.api.jobconfig import METRICS_PORT as METRICS_PORT
from cohort.api.jobconfig import RDZV_PORT as RDZV_PORT
from cohort.api.models import CONFIG_DIR as CONFIG_DIR
from cohort.api.models import KIND, PLURAL

MANAGER = "cohort-operator"

LABEL_JOB = "cohort.dev/job"
LABEL_ROLE = "cohort.dev/role"
# On a TrainingJob: which operator instance handles it (see Settings.instance).
LABEL_OPERATOR = "cohort.dev/operator"
ROLE_WORKER = "worker"
# Set on a replacement pod started for a straggler: the pod it replaces. The
# annotation is the only record of a swap in progress, so it survives restarts.
ANNOTATION_REPLACES = "cohort.dev/replaces"
ANNOTATION_INDEX = "cohort.dev/index"

CONFIG_KEY = "job.json"
WORLD_KEY = "world.json"
REPORT_KEY = "report.json"  # the last survivor's report in the reports ConfigMap (docs/contracts.md §3)
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"

_POD_NAME = re.compile(r"^(?P<job>.+)-worker-(?P<index>\d+)$")


def pod_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def pod_index(name: str) -> int:
    """The ordinal in a worker pod's name (-1 if the name is not one of ours)."""
    m = _POD_NAME.match(name)
    return int(m.group("index")) if m else -1


def config_map_name(job: str) -> str:
    return f"{job}-config"


def world_map_name(job: str) -> str:
    return f"{job}-world"


def reports_map_name(job: str) -> str:
    """The ConfigMap a member writes to when its collective failed (the one object workers may patch)."""
    return f"{job}-reports"


def service_name(job: str) -> str:
    return job


def worker_account_name(job: str) -> str:
    """The ServiceAccount, Role and RoleBinding that let workers read the world."""
    return f"{job}-worker"


def selector_labels(job: str) -> dict[str, str]:
    """The labels that select a job's worker pods (Service, PDB, scale subresource)."""
    return {LABEL_JOB: job, LABEL_ROLE: ROLE_WORKER}


def selector_string(job: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(job).items())


def common_labels(job: str, component: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels plus the job label."""
    return {
        "app.kubernetes.io/name": "cohort",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": "cohort",
        LABEL_JOB: job,
    }


def worker_labels(job: str) -> dict[str, str]:
    return {**common_labels(job, ROLE_WORKER), LABEL_ROLE: ROLE_WORKER}


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The controller reference that hands cleanup to the garbage collector."""
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(job: dict[str, Any], name: str, component: str) -> dict[str, Any]:
    """Metadata for an owned object (everything but pods, which add more)."""
    meta = job["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": common_labels(meta["name"], component),
        "ownerReferences": [owner_reference(job)],
    }


def controller_uid(obj: dict[str, Any]) -> str:
    """UID of the object's controller (empty when it has none)."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid", ""))
    return ""


def job_path(namespace: str, name: str = "", sub: str = "") -> str:
    """The API path of a namespace's TrainingJobs, of one of them, or of its subresource."""
    out = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    return out + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

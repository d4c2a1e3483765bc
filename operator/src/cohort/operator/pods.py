"""The worker Pod manifest (docs/contracts.md §2), built from the job and nothing else.

Pure: a job dict and a few choices in, a Pod dict out. The reconciler decides
*which* pods exist; this module decides what each one looks like:

- the contract's env (downward API included), ports, readiness probe and the
  job config mounted at /etc/cohort;
- the checkpoint volume at ``checkpoint.path`` (emptyDir unless the spec names a
  volume; no mount at all for a URL such as ``s3://...``);
- resources and scheduling fields passed through;
- the restricted Pod Security profile (non-root, no privilege escalation, drop
  ALL, seccomp RuntimeDefault);
- the user's ``podTemplate`` fragment merged in (labels, annotations, env,
  volumes, volumeMounts, imagePullSecrets, serviceAccountName).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cohort.api.models import TemplateContainer, TrainingJobSpec
from cohort.api.schema import to_dict

from .naming import (
    ANNOTATION_INDEX,
    ANNOTATION_REPLACES,
    CONFIG_DIR,
    CONFIG_PATH,
    METRICS_PORT,
    RDZV_PORT,
    config_map_name,
    owner_reference,
    pod_name,
    worker_account_name,
    worker_labels,
    world_map_name,
)

CONTAINER = "trainer"
CONFIG_VOLUME = "cohort-config"
CHECKPOINT_VOLUME = "cohort-checkpoints"
# A non-root UID for images that do not set USER; runAsNonRoot alone would
# refuse to start such an image.
SCRATCH_VOLUME = "scratch"
DEFAULT_UID = 65532  # the images' user (images/*.Dockerfile)


def _downward(field_path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def contract_env(job_name: str) -> list[dict[str, Any]]:
    """The environment every worker gets (docs/contracts.md §2)."""
    return [
        {"name": "COHORT_CONFIG", "value": CONFIG_PATH},
        {"name": "COHORT_JOB_NAME", "value": job_name},
        {"name": "COHORT_NAMESPACE", **_downward("metadata.namespace")},
        {"name": "COHORT_POD_NAME", **_downward("metadata.name")},
        {"name": "COHORT_POD_IP", **_downward("status.podIP")},
        {"name": "COHORT_METRICS_PORT", "value": str(METRICS_PORT)},
        {"name": "COHORT_WORLD", "value": f"configmap:{world_map_name(job_name)}"},
    ]


def _merge_env(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The contract variables win: a template cannot point a worker at another
    # job's world. Everything else the user adds is kept, in order.
    taken = {e["name"] for e in ours}
    return ours + [copy.deepcopy(e) for e in theirs if e.get("name") not in taken]


def _merge_named(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    taken = {v.get("name") for v in ours}
    return ours + [copy.deepcopy(v) for v in theirs if v.get("name") not in taken]


def checkpoint_mount(spec: TrainingJobSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The checkpoint (volume, volumeMount), or None when checkpoints go to a URL."""
    path = spec.checkpoint.path
    if "://" in path:
        return None
    source = copy.deepcopy(spec.checkpoint.volume) or {"emptyDir": {}}
    return {"name": CHECKPOINT_VOLUME, **source}, {"name": CHECKPOINT_VOLUME, "mountPath": path}


def avoid_nodes(affinity: Mapping[str, Any], nodes: list[str]) -> dict[str, Any]:
    """The affinity plus a required rule keeping the pod off ``nodes``.

    Node selector terms are ORed, so the rule is added to every term (or forms
    the only term) to hold whichever term matches.
    """
    out = copy.deepcopy(dict(affinity))
    if not nodes:
        return out
    rule = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(nodes)}
    required = out.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(copy.deepcopy(rule))
    return out


def build_worker_pod(
    job: dict[str, Any],
    spec: TrainingJobSpec,
    index: int,
    *,
    default_image: str,
    gang: Mapping[str, Any] | None = None,
    replaces: str = "",
    avoid: list[str] | None = None,
    placement: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Pod for worker ``index`` of ``job``.

    ``placement`` adds the node labels and tolerations of the flavors Kueue
    admitted a queued job on (see :mod:`.kueue`).
    ``gang`` carries what the gang scheduler in use expects on each pod
    (``labels``, ``annotations``, ``spec`` fields; see :mod:`.gang`).
    ``replaces``/``avoid`` mark a straggler's replacement and the nodes it must avoid.
    """
    meta = job["metadata"]
    name = meta["name"]
    t_meta, t_spec = spec.pod_template.metadata, spec.pod_template.spec
    t_container = t_spec.containers[0] if t_spec.containers else TemplateContainer()
    gang = gang or {}

    labels = {**t_meta.labels, **(gang.get("labels") or {}), **worker_labels(name)}
    annotations = {**t_meta.annotations, **(gang.get("annotations") or {}), ANNOTATION_INDEX: str(index)}
    if replaces:
        annotations[ANNOTATION_REPLACES] = replaces

    # The root file system is read-only: /tmp (and HOME, which the image points there) is an emptyDir.
    volumes: list[dict[str, Any]] = [{"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(name)}},
                                     {"name": SCRATCH_VOLUME, "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
                                    {"name": SCRATCH_VOLUME, "mountPath": "/tmp"}]
    ckpt = checkpoint_mount(spec)
    if ckpt:
        volumes.append(ckpt[0])
        mounts.append(ckpt[1])
    volumes = _merge_named(volumes, t_spec.volumes)
    mounts = _merge_named(mounts, t_container.volume_mounts)

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or default_image,
        "command": ["cohort-train"],
        "args": ["--config", CONFIG_PATH],
        "env": _merge_env(contract_env(name), t_container.env),
        "ports": [
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            {"name": "rendezvous", "containerPort": RDZV_PORT, "protocol": "TCP"},
        ],
        # Generous timeouts: a busy trainer answers /healthz from a thread that
        # competes for the GIL, and a flapping probe would churn the world.
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3,
        },
        "resources": {k: v for k, v in to_dict(spec.resources).items() if v},  # only what the user set
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if t_container.image_pull_policy:
        container["imagePullPolicy"] = t_container.image_pull_policy

    t_security = t_spec.security_context
    uid = t_security.run_as_user if t_security.run_as_user is not None else DEFAULT_UID
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": t_spec.service_account_name or worker_account_name(name),
        "enableServiceLinks": False,
        # The pause process is PID 1 and reaps zombies; the trainer is then not
        # PID 1, which the kernel shields from signals it has no handler for.
        "shareProcessNamespace": True,
        "containers": [container],
        "volumes": volumes,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": t_security.run_as_group if t_security.run_as_group is not None else uid,
            "fsGroup": t_security.fs_group if t_security.fs_group is not None else uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    sched = spec.scheduling
    placement = placement or {}
    if sched.scheduler_name:
        pod_spec["schedulerName"] = sched.scheduler_name
    if sched.priority_class_name:
        pod_spec["priorityClassName"] = sched.priority_class_name
    node_selector = {**sched.node_selector, **(placement.get("nodeSelector") or {})}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = copy.deepcopy(sched.tolerations)
    tolerations += [copy.deepcopy(t) for t in placement.get("tolerations") or [] if t not in tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    affinity = avoid_nodes(sched.affinity, avoid or [])
    if affinity:
        pod_spec["affinity"] = affinity
    if t_spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = copy.deepcopy(t_spec.image_pull_secrets)
    pod_spec.update(copy.deepcopy(dict(gang.get("spec") or {})))

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, index),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": pod_spec,
    }

"""The worker Pod manifest (docs/contracts.md §2), built from the job and nothing else.

Pure: a job dict and a few choices in, a Pod dict out. The reconciler decides
*which* pods exist; this module decides what each one looks like:

- the contract's env (downward API included), ports, probes (:func:`probes`) and the
  job config mounted at /etc/cohort;
- the checkpoint volume at ``checkpoint.path`` (emptyDir unless the spec names a
  volume; no mount at all for a URL such as ``s3://...``);
- resources and scheduling fields passed through;
- the device defaults (:data:`GPU_ENV_DEFAULTS`, :data:`CPU_ENV_DEFAULTS`): a
  worker that asks for ``nvidia.com/gpu`` gets the CUDA image when
  ``spec.image`` is empty, a memory-backed /dev/shm and NCCL's variables; one
  that asks for none is told to see no GPU. The user's env overrides each;
- the restricted Pod Security profile (non-root, no privilege escalation, drop
  ALL, seccomp RuntimeDefault);
- the user's ``podTemplate`` fragment merged in (labels, annotations, env,
  volumes, volumeMounts, imagePullSecrets, serviceAccountName).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from cohort.api.models import (
    CHECKPOINT_VOLUME,
    CONFIG_VOLUME,
    GPU_RESOURCE,
    SCRATCH_DIR,
    SCRATCH_VOLUME,
    SHM_VOLUME,
    Resources,
    TemplateContainer,
    TrainingJobSpec,
)
from cohort.api.schema import quantity_value, to_dict

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
    reports_map_name,
    worker_account_name,
    worker_labels,
    world_map_name,
)

CONTAINER = "trainer"
# The operator's volumes (CONFIG_VOLUME, SCRATCH_VOLUME, CHECKPOINT_VOLUME, SHM_VOLUME) are named in
# cohort.api.models, whose admission rules refuse a podTemplate volume or volumeMount by those names.
# A non-root UID for images that do not set USER; runAsNonRoot alone would
# refuse to start such an image.
DEFAULT_UID = 65532  # the images' user (images/*.Dockerfile)
SHM_PATH = "/dev/shm"

# The env a worker gets by default, by device: each is left out when the
# user's podTemplate env names it (the user's value wins, and no name appears
# twice). docs/contracts.md §2 lists them; keep the two together.
GPU_ENV_DEFAULTS: tuple[tuple[str, str], ...] = (
    # NCCL's warnings (a failed or aborted communicator, a transport fallback)
    # reach the pod log; INFO would print every communicator's topology.
    ("NCCL_DEBUG", "WARN"),
    # The pod network's interface: the runtime names it eth0 for every CNI
    # plugin (CNI_IFNAME), the local cluster's bridge included. Left to itself
    # NCCL takes the first interface that is not lo or docker*, which on a
    # multi-network pod (Multus, a storage NIC) may not reach the other pods.
    ("NCCL_SOCKET_IFNAME", "eth0"),
)
CPU_ENV_DEFAULTS: tuple[tuple[str, str], ...] = (
    # The CUDA image bakes NVIDIA_VISIBLE_DEVICES=all, and on a GPU node the
    # NVIDIA runtime would then hand a pod that asked for no GPU every GPU of
    # the node (NVIDIA/k8s-device-plugin#61); "void" gives it none.
    ("NVIDIA_VISIBLE_DEVICES", "void"),
)


@dataclasses.dataclass(frozen=True)
class PodDefaults:
    """What the operator's settings choose for a worker where the spec leaves it open."""

    image: str
    """Trainer image of a worker without a GPU when spec.image is empty."""
    cuda_image: str
    """Trainer image of a worker that asks for nvidia.com/gpu when spec.image is empty."""
    shm_size: str
    """sizeLimit of a GPU worker's memory-backed /dev/shm when spec.resources.shmSize is unset."""


PROBE_PERIOD_S = 5
STARTUP_ALLOWANCE_S = 300  # from the container's start to its trainer's HTTP server (imports, a cold cache)


def probes(group_timeout_s: int) -> dict[str, dict[str, Any]]:
    """The trainer container's probes, on its metrics port. Generous timeouts: a busy trainer answers from a
    thread that competes for the GIL, and a flapping probe would churn the world.

    - readiness, ``/healthz``: able to join a world (503 while the workload builds); a member not Ready for
      3 probes leaves the world;
    - liveness, ``/livez``: the process answers at all. One that answers nothing for the group's timeout
      (``faultTolerance.processGroupTimeoutSeconds``, the longest a healthy trainer may keep its peers
      waiting: a first step, an evaluation, a save) is frozen or stuck holding the GIL: its kubelet kills
      it, and the operator counts the failure and replaces it. Without it, a frozen worker left the world
      when it stopped being Ready but kept its pod, so nothing took its place;
    - startup, ``/livez``: liveness starts once the HTTP server runs (:data:`STARTUP_ALLOWANCE_S`).
    """
    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "metrics"}, "periodSeconds": PROBE_PERIOD_S,
                "timeoutSeconds": PROBE_PERIOD_S}
    return {
        "startupProbe": {**get("/livez"), "failureThreshold": STARTUP_ALLOWANCE_S // PROBE_PERIOD_S},
        "readinessProbe": {**get("/healthz"), "failureThreshold": 3},
        "livenessProbe": {**get("/livez"), "failureThreshold": max(3, -(-group_timeout_s // PROBE_PERIOD_S))},
    }


def asks_for_gpu(resources: Resources) -> bool:
    """Whether a worker asks for ``nvidia.com/gpu`` (in its limits or requests, more than 0)."""
    return any(quantity_value(q) > 0 for section in (resources.limits, resources.requests)
               if (q := section.get(GPU_RESOURCE)) is not None)


def container_resources(resources: Resources) -> dict[str, Any]:
    """The trainer container's core/v1 ResourceRequirements: what the user set (shmSize is the volume's).

    A GPU asked for in requests only is also its limit: Kubernetes refuses an extended resource
    without a limit ("Limit must be set for non overcommitable resources"), and a GPU is never shared.
    """
    out = {k: copy.deepcopy(v) for k, v in to_dict(resources).items() if v and k in ("limits", "requests", "claims")}
    gpu = resources.requests.get(GPU_RESOURCE)
    if gpu is not None and GPU_RESOURCE not in resources.limits:
        out.setdefault("limits", {})[GPU_RESOURCE] = gpu
    return out


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
        {"name": "COHORT_REPORTS", "value": f"configmap:{reports_map_name(job_name)}"},
    ]


def _env_defaults(env: list[dict[str, Any]], defaults: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    taken = {e.get("name") for e in env}
    return [{"name": name, "value": value} for name, value in defaults if name not in taken]


def shm_mount(spec: TrainingJobSpec, default_size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU worker's /dev/shm (volume, volumeMount): memory-backed, as large as spec.resources.shmSize.

    The container runtime's /dev/shm is 64 MiB: DataLoader worker processes hand
    their batches over through it, and NCCL keeps shared-memory buffers there.
    A Memory emptyDir counts against the pod's memory limit.
    """
    size = spec.resources.shm_size if spec.resources.shm_size is not None else default_size
    return ({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}},
            {"name": SHM_VOLUME, "mountPath": SHM_PATH})


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
    defaults: PodDefaults,
    gang: Mapping[str, Any] | None = None,
    replaces: str = "",
    avoid: list[str] | None = None,
    placement: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Pod for worker ``index`` of ``job``.

    ``defaults`` are the operator's choices for what the spec leaves open
    (image, /dev/shm size).
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
    gpu = asks_for_gpu(spec.resources)

    labels = {**t_meta.labels, **(gang.get("labels") or {}), **worker_labels(name)}
    annotations = {**t_meta.annotations, **(gang.get("annotations") or {}), ANNOTATION_INDEX: str(index)}
    if replaces:
        annotations[ANNOTATION_REPLACES] = replaces

    # The root file system is read-only: /tmp (and HOME, which the image points there) is an emptyDir.
    volumes: list[dict[str, Any]] = [{"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(name)}},
                                     {"name": SCRATCH_VOLUME, "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
                                    {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}]
    ckpt = checkpoint_mount(spec)
    if ckpt:
        volumes.append(ckpt[0])
        mounts.append(ckpt[1])
    # A /dev/shm the user mounts in the template is theirs (two mounts at one path are invalid).
    if gpu and not any(m.get("mountPath") == SHM_PATH for m in t_container.volume_mounts):
        shm = shm_mount(spec, defaults.shm_size)
        volumes.append(shm[0])
        mounts.append(shm[1])
    # Admission refuses a template volume or mount named like ours (models.RESERVED_VOLUMES), or a mount at our
    # paths (RESERVED_MOUNT_PATHS, the checkpoint path): nothing is dropped, and the pod is valid.
    volumes += copy.deepcopy(t_spec.volumes)
    mounts += copy.deepcopy(t_container.volume_mounts)

    # Admission refuses a template setting a contract variable (models.CONTRACT_ENV): nothing is dropped.
    env = contract_env(name) + copy.deepcopy(t_container.env)
    env += _env_defaults(env, GPU_ENV_DEFAULTS if gpu else CPU_ENV_DEFAULTS)

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or (defaults.cuda_image if gpu else defaults.image),
        "command": ["cohort-train"],
        "args": ["--config", CONFIG_PATH],
        "env": env,
        "ports": [
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            {"name": "rendezvous", "containerPort": RDZV_PORT, "protocol": "TCP"},
        ],
        **probes(spec.fault_tolerance.process_group_timeout_seconds),
        "resources": container_resources(spec.resources),
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

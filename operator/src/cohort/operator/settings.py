"""Every operator setting, from command-line flags or ``COHORT_*`` environment variables.

A flag beats its environment variable, which beats the default. The table
in docs/operator.md is written from :data:`OPTIONS`; keep the two together.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from cohort.api.schema import quantity_value

from .pods import PodDefaults

DEFAULT_IMAGE = "cohort-trainer:0.1.0"  # built from images/; charts set the registry
DEFAULT_CUDA_IMAGE = DEFAULT_IMAGE + "-cuda"  # images/trainer-cuda.Dockerfile: the CPU image's tag plus -cuda


@dataclasses.dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means every namespace."""
    instance: str = ""
    """Handle only TrainingJobs labelled cohort.dev/operator=<instance>; empty: only jobs without that label.
    Lets a second operator (a canary, a test) run beside the main one without both acting on a job."""
    default_image: str = DEFAULT_IMAGE
    """Trainer image for jobs whose spec.image is empty and whose workers ask for no nvidia.com/gpu."""
    default_cuda_image: str = DEFAULT_CUDA_IMAGE
    """Trainer image for jobs whose spec.image is empty and whose workers ask for nvidia.com/gpu."""
    gpu_shm_size: str = "8Gi"
    """Size of a GPU worker's memory-backed /dev/shm when spec.resources.shmSize is unset (a Quantity)."""
    resync_s: float = 300.0
    """Every job is reconciled at least this often, events or not (watches and timers do the rest)."""
    progress_s: float = 10.0
    """How often rank 0's /progress and the members' /metrics are read."""
    max_concurrent_reconciles: int = 32
    """Jobs reconciled at the same time (one at a time per job)."""
    api_concurrency: int = 32
    """Open requests to the API server at most."""
    metrics_port: int = 8080
    """Port of /metrics (Prometheus)."""
    health_port: int = 8081
    """Port of /healthz (liveness) and /readyz (readiness)."""
    standalone: bool = False
    """Skip leader election: only safe with a single replica."""
    lease_name: str = "cohort-operator"
    """The coordination.k8s.io Lease the replicas elect a leader with."""
    lease_namespace: str = "default"
    """Namespace of that Lease (the operator's own namespace in a cluster)."""
    lease_s: float = 15.0
    """Lease duration: a dead leader is replaced after at most this long."""
    identity: str = ""
    """This replica's name in the Lease (pod name in a cluster)."""
    http_timeout_s: float = 2.0
    """Timeout of each /progress and /metrics request to a worker."""
    discovery_s: float = 30.0
    """How long the answer to 'which gang scheduling API is served' is cached."""
    stuck_terminating_s: float = 120.0
    """A worker pod still there this long after its deletion deadline (metadata.deletionTimestamp, its grace period
    included) no longer holds its job's Kueue quota: a pod stuck Terminating on a dead node would hold it for good."""
    log_level: str = "INFO"
    """Python logging level."""
    ignore_reports: bool = False
    """Leave survivors' reports of a failed collective unchecked (docs/contracts.md §3): a dead worker then
    leaves the world when its kubelet reports it, as before reports. For comparison, or where this operator
    cannot connect to the workers' metrics port."""
    network_policy: bool = False
    """Give each job a NetworkPolicy that admits, on any port, only that job's own worker pods. The chart turns
    it on with networkPolicy.enabled; its namespace policy admits the operator and Prometheus to the metrics port."""

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @property
    def pod_defaults(self) -> PodDefaults:
        """What worker pods get where their job's spec leaves it open."""
        return PodDefaults(image=self.default_image, cuda_image=self.default_cuda_image,
                           shm_size=self.gpu_shm_size)


# (field, flag, env var, type): the single list the parser and docs/operator.md use;
# the help text is the docstring under the field.
OPTIONS: tuple[tuple[str, str, str, type], ...] = (
    ("namespaces", "--namespace", "COHORT_NAMESPACES", str),
    ("instance", "--instance", "COHORT_INSTANCE", str),
    ("default_image", "--default-image", "COHORT_DEFAULT_IMAGE", str),
    ("default_cuda_image", "--default-cuda-image", "COHORT_DEFAULT_CUDA_IMAGE", str),
    ("gpu_shm_size", "--gpu-shm-size", "COHORT_GPU_SHM_SIZE", str),
    ("resync_s", "--resync-seconds", "COHORT_RESYNC_SECONDS", float),
    ("progress_s", "--progress-seconds", "COHORT_PROGRESS_SECONDS", float),
    ("max_concurrent_reconciles", "--max-concurrent-reconciles", "COHORT_MAX_CONCURRENT_RECONCILES", int),
    ("api_concurrency", "--api-concurrency", "COHORT_API_CONCURRENCY", int),
    ("metrics_port", "--metrics-port", "COHORT_METRICS_PORT", int),
    ("health_port", "--health-port", "COHORT_HEALTH_PORT", int),
    ("standalone", "--standalone", "COHORT_STANDALONE", bool),
    ("lease_name", "--lease-name", "COHORT_LEASE_NAME", str),
    ("lease_namespace", "--lease-namespace", "COHORT_LEASE_NAMESPACE", str),
    ("lease_s", "--lease-seconds", "COHORT_LEASE_SECONDS", float),
    ("identity", "--identity", "COHORT_IDENTITY", str),
    ("http_timeout_s", "--http-timeout-seconds", "COHORT_HTTP_TIMEOUT_SECONDS", float),
    ("discovery_s", "--discovery-seconds", "COHORT_DISCOVERY_SECONDS", float),
    ("stuck_terminating_s", "--stuck-terminating-seconds", "COHORT_STUCK_TERMINATING_SECONDS", float),
    ("log_level", "--log-level", "COHORT_LOG_LEVEL", str),
    ("ignore_reports", "--ignore-reports", "COHORT_IGNORE_REPORTS", bool),
    ("network_policy", "--network-policy", "COHORT_NETWORK_POLICY", bool),
)


def field_doc(name: str) -> str:
    """A setting's documentation (the docstring under its field)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Settings))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name and i + 1 < len(body):
            value = getattr(body[i + 1], "value", None)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    return ""


def _truthy(value: str) -> bool:
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cohort-operator",
                                 description="The Cohort operator: runs TrainingJobs (cohort.dev/v1alpha1).")
    defaults = Settings()
    for name, flag, env, tp in OPTIONS:
        help_ = f"{field_doc(name)} [env {env}; default {getattr(defaults, name)!r}]"
        if name == "namespaces":
            ap.add_argument(flag, dest=name, action="append", default=None, metavar="NS",
                            help=help_ + " (repeatable; the env var takes a comma-separated list)")
        elif tp is bool:
            ap.add_argument(flag, dest=name, action="store_true", default=None, help=help_)
        else:
            ap.add_argument(flag, dest=name, type=tp, default=None, help=help_)
    return ap


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from flags, then ``COHORT_*`` env, then defaults. Raises ValueError on a bad value."""
    env = os.environ if environ is None else environ
    args = parser().parse_args(list(argv) if argv is not None else None)
    values: dict[str, Any] = {}
    for name, _flag, var, tp in OPTIONS:
        flag_value = getattr(args, name)
        if flag_value is not None:
            values[name] = tuple(flag_value) if name == "namespaces" else flag_value
            continue
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if name == "namespaces":
            values[name] = tuple(ns.strip() for ns in raw.split(",") if ns.strip())
        elif tp is bool:
            values[name] = _truthy(raw)
        else:
            try:
                values[name] = tp(raw)
            except ValueError as e:
                raise ValueError(f"{var}: {e}") from e
    settings = Settings(**values)
    if not settings.identity:
        # In a cluster the pod name is stable across container restarts, so a
        # restarted leader takes its own Lease back at once.
        settings = dataclasses.replace(
            settings, identity=env.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    if "lease_name" not in values and settings.instance:
        settings = dataclasses.replace(settings, lease_name=f"{settings.lease_name}-{settings.instance}")
    if "lease_namespace" not in values and env.get("POD_NAMESPACE"):
        settings = dataclasses.replace(settings, lease_namespace=env["POD_NAMESPACE"])
    for name in ("resync_s", "progress_s", "lease_s", "http_timeout_s", "discovery_s"):
        if getattr(settings, name) <= 0:
            raise ValueError(f"{name} must be > 0")
    for name in ("max_concurrent_reconciles", "api_concurrency"):
        if getattr(settings, name) < 1:
            raise ValueError(f"{name} must be >= 1")
    try:
        shm_ok = quantity_value(settings.gpu_shm_size) > 0
    except ValueError:
        shm_ok = False
    if not shm_ok:
        raise ValueError(f"gpu_shm_size must be a positive quantity such as 8Gi, not {settings.gpu_shm_size!r}")
    return settings

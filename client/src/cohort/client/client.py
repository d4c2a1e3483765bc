"""``Client``: TrainingJobs on a cluster through the Kubernetes API, for notebooks and the CLI.

Every call is one or a few plain API requests (no operator endpoint, no
port-forward), so the client works wherever ``kubectl`` does with the same
kubeconfig. The API server's refusals come back as :class:`ApiError`, worded
as kubectl words them.

Workers: the operator labels its pods ``cohort.dev/job=<job>`` and
``cohort.dev/role=worker`` and publishes the world (rank -> pod) in the
ConfigMap ``<job>-world`` (docs/contracts.md §3); :meth:`Client.log_pods`
reads both.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from cohort.api.models import GROUP, KIND, PLURAL, VERSION, Progress

from .errors import ApiError, CohortError, JobFailed, from_api_exception
from .job import TrainingJob

API_VERSION = f"{GROUP}/{VERSION}"
LABEL_JOB = "cohort.dev/job"
LABEL_ROLE = "cohort.dev/role"
WORLD_KEY = "world.json"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Event:
    """One Kubernetes Event about a job (or one of its pods)."""

    time: str
    type: str
    reason: str
    message: str
    object: str  # kind/name
    count: int = 1


def load_manifest(manifest_or_path: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The one TrainingJob in a dict, a YAML file or a YAML string, as written (the API server defaults it)."""
    if isinstance(manifest_or_path, dict):
        doc: Any = manifest_or_path
        source = "manifest"
    else:
        text, source = str(manifest_or_path), "manifest"
        if "\n" not in text and (isinstance(manifest_or_path, os.PathLike) or Path(text).suffix in (".yaml", ".yml", ".json")):
            try:
                text, source = Path(text).read_text(), str(manifest_or_path)
            except OSError as e:
                raise CohortError(f"{manifest_or_path}: cannot read ({e.strerror})") from e
        try:
            docs = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as e:
            raise CohortError(f"{source}: not valid YAML ({e})") from e
        jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
        if len(jobs) != 1:
            raise CohortError(f"{source}: expected exactly one TrainingJob, found {len(jobs)}")
        doc = jobs[0]
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise CohortError(f"{source}: expected apiVersion {API_VERSION}, kind {KIND}")
    return json.loads(json.dumps(doc))  # a deep copy the caller's dict never sees changed


class Client:
    """TrainingJobs in one namespace of one cluster.

    ``kubeconfig``: a file (default: $KUBECONFIG, then ~/.kube/config, then the
    in-cluster service account). ``namespace``: default the kubeconfig
    context's, else ``default``.
    """

    def __init__(self, kubeconfig: str | os.PathLike[str] | None = None, namespace: str | None = None,
                 *, context: str | None = None):
        path = str(kubeconfig) if kubeconfig else None
        try:
            self.api = k8s_config.new_client_from_config(config_file=path, context=context)
            ns = _context_namespace(path, context)
        except (k8s_config.ConfigException, OSError):
            if path or not os.environ.get("KUBERNETES_SERVICE_HOST"):
                raise CohortError(f"no usable kubeconfig ({path or os.environ.get('KUBECONFIG') or '~/.kube/config'})"
                                  " and not running in a cluster") from None
            k8s_config.load_incluster_config()
            self.api = k8s.ApiClient()
            ns = _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else None
        self.namespace = namespace or ns or "default"
        self.custom = k8s.CustomObjectsApi(self.api)
        self.core = k8s.CoreV1Api(self.api)

    # --- the job ------------------------------------------------------------------
    def submit(self, manifest_or_path: dict[str, Any] | str | os.PathLike[str]) -> TrainingJob:
        """Create the TrainingJob of a manifest (a dict, a YAML path or YAML text), strictly validated
        (an unknown field is refused, as ``kubectl apply`` refuses it). In the manifest's namespace, else
        the client's."""
        body = load_manifest(manifest_or_path)
        ns = body.setdefault("metadata", {}).get("namespace") or self.namespace
        body["metadata"]["namespace"] = ns
        obj = self._call(self.custom.create_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, body,
                         field_validation="Strict")
        return TrainingJob.from_object(obj)

    def get(self, name: str) -> TrainingJob:
        return TrainingJob.from_object(self._call(self.custom.get_namespaced_custom_object,
                                                  GROUP, VERSION, self.namespace, PLURAL, name))

    def list(self) -> list[TrainingJob]:
        out = self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL)
        return sorted((TrainingJob.from_object(o) for o in out.get("items", [])), key=lambda j: j.name)

    def delete(self, name: str) -> None:
        """Delete the job; the garbage collector removes its pods, Service and ConfigMaps."""
        self._call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name,
                   propagation_policy="Background")

    def scale(self, name: str, replicas: int) -> int:
        """Set ``spec.replicas.target`` through the scale subresource (as ``kubectl scale`` does); the API
        server refuses a target outside [min, max]. Returns the new target."""
        out = self._call(self.custom.patch_namespaced_custom_object_scale, GROUP, VERSION, self.namespace,
                         PLURAL, name, {"spec": {"replicas": int(replicas)}})
        return int((out.get("spec") or {}).get("replicas", replicas))

    def progress(self, name: str) -> Progress:
        """``status.progress``: step, epoch, percent, etaSeconds, loss, samples/tokens per second, MFU."""
        return self.get(name).progress

    def events(self, name: str, *, pods: bool = False, uid: str | None = None) -> builtins.list[Event]:
        """The job's Events, oldest first; ``pods=True`` adds its worker pods' (scheduling, kubelet).

        Chosen by the objects' uids, not their names: an earlier job of the same name (and its pods), or the
        job's PodDisruptionBudget, which has the job's name, are other objects. ``uid`` is the job's, when
        the caller holds it already (saves reading the job)."""
        uids = [uid or str(self.get(name).raw.get("metadata", {}).get("uid") or "")]
        if pods:
            uids += [p.metadata.uid for p in self._worker_pod_objects(name)]
        items = []
        for uid in uids:
            items += self._call(self.core.list_namespaced_event, self.namespace,
                                field_selector=f"involvedObject.uid={uid}").items
        return [Event(time=_event_time(e), type=e.type or "", reason=e.reason or "", message=e.message or "",
                      object=f"{e.involved_object.kind}/{e.involved_object.name}", count=e.count or 1)
                for e in sorted(items, key=event_order)]

    def watch(self, name: str, *, interval_s: float = 1.0, timeout_s: float | None = None) -> Iterator[TrainingJob]:
        """Yield the job each time it changes (by resourceVersion), until it finishes or ``timeout_s`` passes."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen = None
        while True:
            job = self.get(name)
            rv = job.raw.get("metadata", {}).get("resourceVersion")
            if rv != seen:
                seen = rv
                yield job
            if job.finished or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(interval_s)

    def wait(self, name: str, phase: str | Iterable[str] = "Succeeded", timeout_s: float = 600,
             *, interval_s: float = 1.0, on_update: Callable[[TrainingJob], None] | None = None) -> TrainingJob:
        """Until the job is in ``phase`` (one or several). Raises :class:`JobFailed` if it fails instead,
        :class:`TimeoutError` after ``timeout_s``."""
        phases = (phase,) if isinstance(phase, str) else tuple(phase)
        job = None
        for job in self.watch(name, interval_s=interval_s, timeout_s=timeout_s):
            if on_update:
                on_update(job)
            if job.phase in phases:
                return job
            if job.phase == "Failed":
                raise JobFailed(f"TrainingJob {name} failed: {job.failure_reason()}", job)
            if job.finished:  # Succeeded while waiting for, say, Running: never coming
                raise CohortError(f"TrainingJob {name} is {job.phase}; it will not become {'/'.join(phases)}")
        raise TimeoutError(f"TrainingJob {name}: not {'/'.join(phases)} after {timeout_s:g}s "
                           f"(phase {job.phase if job else 'unknown'})")

    # --- workers and logs ---------------------------------------------------------
    def world(self, name: str) -> dict[str, Any]:
        """The published world (``<job>-world``): version, members with their ranks, spares."""
        cm = self._call(self.core.read_namespaced_config_map, f"{name}-world", self.namespace)
        return dict(json.loads((cm.data or {}).get(WORLD_KEY) or "{}"))

    def log_pods(self, name: str, rank: int | None = None) -> builtins.list[str]:
        """The pods whose logs ``logs`` reads: the member holding ``rank`` in the current world, or
        every worker pod of the job (members, spares and pods waiting to join), oldest first."""
        if rank is None:
            pods = self._worker_pods(name)
            if not pods:
                self.get(name)  # a NotFound for a job that does not exist
                raise CohortError(f"TrainingJob {name} has no worker pods (yet)")
            return pods
        try:
            members = self.world(name).get("members") or []
        except ApiError as e:
            if e.status != 404:
                raise
            members = []
        for m in members:
            if m.get("rank") == rank:
                return [str(m["pod"])]
        ranks = ", ".join(str(m.get("rank")) for m in members) or "none: no world published yet"
        raise CohortError(f"TrainingJob {name} has no rank {rank} (ranks: {ranks})")

    def logs(self, name: str, rank: int | None = None, follow: bool = False,
             tail_lines: int | None = None) -> Iterator[str]:
        """Lines of the trainer container's log: one worker's (``rank``) as they are, or every worker's,
        each prefixed ``[pod]``. ``follow`` streams until the pods end (or the caller stops)."""
        pods = self.log_pods(name, rank)
        if len(pods) == 1 and rank is not None:
            yield from self._pod_log(pods[0], follow, tail_lines)
            return
        if not follow:
            for pod in pods:
                for line in self._pod_log(pod, False, tail_lines):
                    yield f"[{pod}] {line}"
            return
        yield from _merge({pod: self._pod_log(pod, True, tail_lines) for pod in pods})

    # --- internals --------------------------------------------------------------------
    def _worker_pod_objects(self, name: str) -> builtins.list[Any]:
        """The job's worker pods (members, spares and pods waiting to join), by ordinal."""
        pods = self._call(self.core.list_namespaced_pod, self.namespace,
                          label_selector=f"{LABEL_JOB}={name},{LABEL_ROLE}=worker").items
        return sorted(pods, key=lambda p: _ordinal(p.metadata.name))

    def _worker_pods(self, name: str) -> builtins.list[str]:
        return [p.metadata.name for p in self._worker_pod_objects(name)]

    def _pod_log(self, pod: str, follow: bool, tail_lines: int | None) -> Iterator[str]:
        kwargs: dict[str, Any] = {"container": "trainer", "follow": follow, "_preload_content": False}
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        try:
            resp = self._call(self.core.read_namespaced_pod_log, pod, self.namespace, **kwargs)
        except ApiError as e:  # say whose log it was: with several pods, the answer alone does not
            raise type(e)(f"pod/{pod}: {e}", status=e.status, reason=e.reason, fields=e.fields) from None
        try:
            pending = b""
            for chunk in resp.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if pending:
                yield pending.decode(errors="replace")
        finally:
            resp.release_conn()

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            raise from_api_exception(e) from None


def _context_namespace(path: str | None, context: str | None) -> str | None:
    contexts, active = k8s_config.list_kube_config_contexts(config_file=path)
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return (chosen or {}).get("context", {}).get("namespace")


def _ordinal(pod: str) -> int:
    tail = pod.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def event_order(e: k8s.CoreV1Event) -> tuple[dt.datetime, dt.datetime]:
    """Oldest first, as ``kubectl describe`` orders them: by when last seen, which core/v1 Events give in whole
    seconds; then by ``eventTime``, to the microsecond where the poster set it (the operator does). Without the
    second key, one second's Events would come in the order the API server lists them: by their random names."""
    last = _last_seen(e) or _EPOCH
    return last, e.event_time or e.first_timestamp or last


_EPOCH = dt.datetime.fromtimestamp(0, dt.timezone.utc)


def _last_seen(e: Any) -> dt.datetime | None:
    return e.last_timestamp or e.event_time or e.first_timestamp or e.metadata.creation_timestamp


def _event_time(e: Any) -> str:
    t = _last_seen(e)
    return t.isoformat() if t else ""


def _merge(streams: dict[str, Iterator[str]]) -> Iterator[str]:
    """Lines of several followed logs as they come, each prefixed with its pod (one thread per pod)."""
    q: queue.Queue[tuple[str, str | None]] = queue.Queue()

    def pump(pod: str, lines: Iterator[str]) -> None:
        try:
            for line in lines:
                q.put((pod, line))
        except CohortError as e:
            q.put((pod, f"(log ended: {e})"))
        finally:
            q.put((pod, None))

    for pod, lines in streams.items():
        threading.Thread(target=pump, args=(pod, lines), daemon=True, name=f"logs-{pod}").start()
    open_ = len(streams)
    while open_:
        pod, line = q.get()
        if line is None:
            open_ -= 1
        else:
            yield f"[{pod}] {line}"

"""A TrainingJob behind a Kueue queue: its Workloads, what they allow, and how they follow the spec. Pure.

The label ``kueue.x-k8s.io/queue-name`` on a TrainingJob opts it in. The
operator then speaks Kueue's Workload API itself (no Go integration): it
creates a Workload owned by the job, with a ``workers`` pod set (``count`` =
``replicas.target``, ``minCount`` = ``replicas.min``: partial admission) and a
``spares`` pod set when the job has spares, and runs only what Kueue admitted.

Quota-following elasticity uses Kueue's workload slices (feature gate
ElasticJobsViaWorkloadSlices; the Workloads carry ``kueue.x-k8s.io/elastic-job``):

- scale down (``replicas.target`` below the admitted count): the admitted
  Workload's counts are lowered in place, which Kueue allows for elastic
  Workloads; the quota is released at once, and the job drops its newest
  workers through the usual membership path;
- scale up (``replicas.target`` above it): a new Workload slice asks for the
  target, with ``minCount`` = admitted + 1 so it never shrinks the job, and the
  annotation ``kueue.x-k8s.io/workload-slice-replacement-for``. The job keeps
  training meanwhile; when Kueue admits the slice it finishes the old one
  (reason WorkloadSliceReplaced), and the job grows in place.

Eviction (preemption, a stopped queue): the job deletes its pods (rank 0 of a
replicated plan checkpoints on SIGTERM), then gives the quota back as Kueue's
own integrations do: it clears the Workload's admission (QuotaReserved=False,
Requeued=True after a preemption), and the same Workload queues again, with
Kueue's requeue state and eviction count kept. A finished job marks its
Workloads Finished. Workloads are named ``<job>-q<n>``, n increasing, and
carry the job label, so the job's Workloads are one list call away.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from cohort.api.models import TrainingJobSpec

from .lifecycle import parse_time
from .manifests import Kind
from .naming import LABEL_JOB, common_labels, owner_reference
from .observe import PodView

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
REPLACES_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
ASK_ANNOTATION = "cohort.dev/asks"  # what a Workload asks for, to tell when the spec moved on
WORKLOAD = Kind("kueue.x-k8s.io/v1beta2", "Workload", "workloads")
FLAVORS_PATH = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"
WORKERS, SPARES = "workers", "spares"
COMPONENT = "queue"


def queue_name(job: Mapping[str, Any]) -> str:
    """The job's Kueue LocalQueue (empty: the job is not queued)."""
    return str(((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or "")


def priority_name(job: Mapping[str, Any]) -> str:
    """The job's WorkloadPriorityClass (empty: none named by label)."""
    return str(((job.get("metadata") or {}).get("labels") or {}).get(PRIORITY_LABEL) or "")


def workload_name(job_name: str, ordinal: int) -> str:
    return f"{job_name}-q{ordinal}"


# --- reading Kueue's state ------------------------------------------------------

def _condition(wl: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def _true(wl: Mapping[str, Any], type_: str) -> bool:
    return _condition(wl, type_).get("status") == "True"


@dataclasses.dataclass(frozen=True)
class Slice:
    """One of the job's Workloads, as far as the job cares."""

    name: str
    ordinal: int
    asks: str  # the ASK_ANNOTATION
    workers: int  # the workers pod set's count (lowered in place on scale-down)
    spares: int | None  # the spares pod set's count (None: it has none)
    admitted: bool
    admitted_workers: int
    admitted_spares: int
    flavors: tuple[str, ...]
    finished: bool
    replaced: bool  # finished by Kueue because a bigger slice of the job was admitted in its place
    evicted: bool
    reason: str  # why it is evicted, or why it waits (Kueue's words)
    message: str
    replaces: str
    pods_ready: tuple[str, str] = ("", "")  # the PodsReady condition's (status, reason)

    @property
    def replacing(self) -> bool:
        return bool(self.replaces)


def parse_slice(wl: Mapping[str, Any]) -> Slice:
    meta = wl.get("metadata") or {}
    name = str(meta.get("name") or "")
    _, _, tail = name.rpartition("-q")
    counts = {ps.get("name"): int(ps.get("count") or 0) for ps in (wl.get("spec") or {}).get("podSets") or []}
    admission = (wl.get("status") or {}).get("admission") or {}
    assigned = {a.get("name"): a for a in admission.get("podSetAssignments") or []}

    def granted(pod_set: str) -> int:
        a = assigned.get(pod_set)
        if a is None:
            return 0
        # A scaled-down Workload keeps its assignment's count: the pod set's count is the live one.
        return min(int(a.get("count", counts.get(pod_set, 0))), counts.get(pod_set, 0))

    flavors = sorted({str(f) for a in assigned.values() for f in (a.get("flavors") or {}).values()})
    admitted = bool(admission) and _true(wl, "Admitted")
    evicted = _condition(wl, "Evicted")
    waiting = _condition(wl, "QuotaReserved")
    ready = _condition(wl, "PodsReady")
    cond = evicted if evicted.get("status") == "True" else waiting if waiting.get("status") == "False" else {}
    return Slice(name=name, ordinal=int(tail) if tail.isdigit() else 0,
                 asks=str((meta.get("annotations") or {}).get(ASK_ANNOTATION) or ""),
                 workers=counts.get(WORKERS, 0), spares=counts.get(SPARES), admitted=admitted,
                 admitted_workers=granted(WORKERS) if admitted else 0,
                 admitted_spares=granted(SPARES) if admitted else 0, flavors=tuple(flavors),
                 finished=_true(wl, "Finished"),
                 replaced=_true(wl, "Finished") and _condition(wl, "Finished").get("reason") == "WorkloadSliceReplaced",
                 evicted=evicted.get("status") == "True",
                 reason=str(cond.get("reason") or ""), message=str(cond.get("message") or ""),
                 replaces=str((meta.get("annotations") or {}).get(REPLACES_ANNOTATION) or ""),
                 pods_ready=(str(ready.get("status") or ""), str(ready.get("reason") or "")))


@dataclasses.dataclass(frozen=True)
class Admission:
    """What Kueue lets the job run now (``Inputs.admission``); workers == 0: nothing."""

    queue: str
    workers: int = 0
    spares: int = 0
    workload: str = ""  # the admitted Workload
    evicted: bool = False  # the admitted Workload was evicted: the job is draining
    reason: str = ""  # why nothing runs: Kueue's reason and message
    message: str = ""
    placement: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # nodeSelector, tolerations


def placement(flavors: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The node labels and tolerations of the admitted ResourceFlavors, for the worker pods (as Kueue's integrations inject them)."""
    selector: dict[str, str] = {}
    tolerations: list[Any] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = selector
    if tolerations:
        out["tolerations"] = tolerations
    return out


def live(slices: Iterable[Slice]) -> list[Slice]:
    return sorted((s for s in slices if not s.finished), key=lambda s: s.ordinal)


def current(slices: Iterable[Slice]) -> Slice | None:
    """The admitted Workload the job runs on: the newest admitted one. While Kueue swaps slices it
    writes the old one Finished and the new one admitted separately; a list can see the first write
    without the second, and then the replaced slice still stands for what the job was granted."""
    slices = list(slices)
    admitted = [s for s in live(slices) if s.admitted]
    if admitted:
        return admitted[-1]
    replacements = {s.replaces for s in live(slices) if s.replacing}
    swapped = sorted((s for s in slices if s.replaced and s.admitted and any(
        r.endswith("/" + s.name) for r in replacements)), key=lambda s: s.ordinal)
    return swapped[-1] if swapped else None


def admission_of(queue: str, slices: list[Slice], flavors: Mapping[str, Mapping[str, Any]]) -> Admission:
    now = current(slices)
    if now is not None and now.evicted:
        return Admission(queue, workload=now.name, evicted=True, reason=now.reason or "Evicted",
                         message=now.message or "Kueue evicted the job's Workload")
    if now is not None:
        return Admission(queue, workers=now.admitted_workers, spares=now.admitted_spares, workload=now.name,
                         placement=placement(flavors[f] for f in now.flavors if f in flavors))
    waiting = [s for s in live(slices) if not s.admitted]
    if waiting:
        s = waiting[-1]
        return Admission(queue, reason=s.reason or "Queued",
                         message=s.message or f"waiting for Kueue to admit Workload {s.name} in queue {queue}")
    return Admission(queue, reason="Queued", message=f"creating a Workload in queue {queue}")


def pods_ready(current: tuple[str, str], training: bool) -> tuple[bool, str] | None:
    """The admitted Workload's next PodsReady (ready, reason), or None when it stands. Kueue's job
    integrations set it (jobframework), and with waitForPodsReady Kueue evicts a Workload that is not
    ready within its timeout of the admission, or of a ready job turning not ready (recovery).

    Ready here is training: a world of at least replicas.min members. An elastic job that lost a worker
    and re-formed in place with at least min is still ready; below min it waits for recovery."""
    status, reason = current
    if training:
        want = (True, "Recovered" if reason in ("WaitForRecovery", "Recovered") else "Started")
    elif status == "True" or reason == "WaitForRecovery":
        want = (False, "WaitForRecovery")
    else:
        want = (False, "WaitForStart")
    return None if (("True" if want[0] else "False"), want[1]) == current else want


def pods_ready_patch(wl: Mapping[str, Any], ready: bool, reason: str, now: str) -> list[dict[str, Any]]:
    """A JSON patch of the Workload's status that sets PodsReady, guarded by the resourceVersion it read."""
    message = ("The job trains with at least replicas.min workers" if ready else
               "Waiting for a world of at least replicas.min workers" if reason == "WaitForStart" else
               "The job lost workers and waits for a world of at least replicas.min again")
    return _conditions_patch(wl, [("PodsReady", ready, reason, message)], now)


def _conditions_patch(wl: Mapping[str, Any], put: Iterable[tuple[str, bool, str, str]], now: str) -> list[dict[str, Any]]:
    """A JSON patch of the Workload's status conditions: each (type, status, reason, message) of ``put`` in
    place of that type's (keeping its lastTransitionTime when status and reason stand), guarded by the
    resourceVersion the Workload was read at."""
    generation = int((wl.get("metadata") or {}).get("generation") or 0)
    new = {type_: {"type": type_, "status": "True" if status else "False", "reason": reason,
                   "message": message[:32000], "lastTransitionTime": now, "observedGeneration": generation}
           for type_, status, reason, message in put}
    existing = (wl.get("status") or {}).get("conditions")
    conditions = []
    for c in existing or []:
        mine = new.pop(c.get("type"), None)
        if mine is not None and c.get("status") == mine["status"] and c.get("reason") == mine["reason"]:
            mine = {**mine, "lastTransitionTime": c.get("lastTransitionTime", now)}
        conditions.append(mine or c)
    conditions += new.values()
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": (wl.get("metadata") or {}).get("resourceVersion")},
            {"op": "add" if existing is None else "replace", "path": "/status/conditions", "value": conditions}]


def holding_quota(pods: Iterable[PodView], now: dt.datetime, stuck_after_s: float) -> tuple[int, float | None]:
    """The job's pods that still hold its quota, and in how many seconds the next one stops holding it.

    A pod holds it until it ends or is gone, or until ``stuck_after_s`` past its deletion deadline: Kueue's
    quota comes back when a suspended or evicted job's pods are gone, and one stuck Terminating (its node
    dead, a finalizer never removed) would keep it forever."""
    holding, wake = 0, None
    for v in pods:
        if not v.owned or v.failed or v.succeeded:
            continue
        deadline = parse_time(v.deletion_deadline) if v.terminating else None
        left = (deadline - now).total_seconds() + stuck_after_s if deadline else None
        if left is not None and left <= 0:
            continue
        holding += 1
        if left is not None:
            wake = left if wake is None else min(wake, left)
    return holding, wake


# --- building Workloads -----------------------------------------------------------

# The parts of a pod's spec that Kueue reads to count quota and pick a flavor.
_QUEUED_POD_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName", "overhead")


def asks(queue: str, priority: str, workers: int, min_workers: int, spares: int, template: Mapping[str, Any]) -> str:
    """A short digest of what a Workload asks for: a Workload that is not admitted is replaced when it changes.

    Of the template, only what Kueue reads (each container's resources, placement, priority): an image, an
    env or a label the operator fills in, which an operator upgrade may change, keeps a pending Workload
    and its place in the queue."""
    pod = template.get("spec") or {}
    containers = [[c.get("name"), c.get("resources") or {}]
                  for key in ("initContainers", "containers") for c in pod.get(key) or []]
    placed = {k: pod[k] for k in _QUEUED_POD_FIELDS if pod.get(k)}
    raw = json.dumps([queue, priority, workers, min_workers, spares, containers, placed], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def build_workload(job: dict[str, Any], spec: TrainingJobSpec, template: Mapping[str, Any], *, ordinal: int,
                   workers: int, min_workers: int, replaces: str = "") -> dict[str, Any]:
    """The Workload for ``workers`` workers (at least ``min_workers``) and the job's spares.

    ``template`` is a worker's PodTemplateSpec: Kueue reads its requests, node
    selector, affinity and tolerations to pick a flavor.
    """
    meta = job["metadata"]
    queue = queue_name(job)
    priority = priority_name(job)
    pod_sets: list[dict[str, Any]] = [{"name": WORKERS, "count": workers, "template": dict(template)}]
    if min_workers < workers:
        pod_sets[0]["minCount"] = min_workers
    if spec.replicas.spares:
        pod_sets.append({"name": SPARES, "count": spec.replicas.spares, "template": dict(template)})
    body: dict[str, Any] = {"queueName": queue, "podSets": pod_sets}
    if priority:
        body["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": priority}
    elif spec.scheduling.priority_class_name:
        body["priorityClassRef"] = {"group": "scheduling.k8s.io", "kind": "PriorityClass",
                                    "name": spec.scheduling.priority_class_name}
    annotations = {ELASTIC_ANNOTATION: "true",
                   ASK_ANNOTATION: asks(queue, priority, spec.replicas.target, spec.replicas.min,
                                        spec.replicas.spares, template)}
    if replaces:
        annotations[REPLACES_ANNOTATION] = f"{meta['namespace']}/{replaces}"
    return {"apiVersion": WORKLOAD.api_version, "kind": WORKLOAD.kind,
            "metadata": {"name": workload_name(meta["name"], ordinal), "namespace": meta["namespace"],
                         "labels": common_labels(meta["name"], COMPONENT), "annotations": annotations,
                         "ownerReferences": [owner_reference(job)]},
            "spec": body}


# --- keeping the Workloads in step with the job --------------------------------

@dataclasses.dataclass(frozen=True)
class Create:
    manifest: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class MarkPodsReady:
    """Set the admitted Workload's PodsReady condition, which Kueue's waitForPodsReady times."""

    name: str
    ready: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Delete:
    name: str
    why: str


@dataclasses.dataclass(frozen=True)
class Shrink:
    name: str
    workers: int
    spares: int | None  # None: the Workload has no spares pod set


@dataclasses.dataclass(frozen=True)
class Requeue:
    """Give an evicted Workload's quota back; Kueue queues it again."""

    name: str
    reason: str  # the eviction's
    message: str


@dataclasses.dataclass(frozen=True)
class Finish:
    name: str
    reason: str
    message: str


Action = Create | Delete | Shrink | Requeue | Finish | MarkPodsReady


def finish(slices: list[Slice], phase: str, reason: str, message: str) -> list[Action]:
    """A finished job's Workloads: Finished releases the quota (Kueue keeps the Workload); one never
    admitted just goes. Needs nothing of the spec: a job whose spec cannot be parsed finishes them too."""
    return [Finish(s.name, reason or phase, message or f"TrainingJob {phase}") if s.admitted
            else Delete(s.name, f"the job {phase}") for s in live(slices)]


def plan(job: dict[str, Any], spec: TrainingJobSpec, slices: list[Slice], template: Mapping[str, Any], *,
         phase: str, finish_reason: str, finish_message: str, active_pods: int, training: bool) -> list[Action]:
    """The writes that keep the job's Workloads in step with the job (after its reconcile decided);
    ``training``: the job has a world of at least replicas.min members (PodsReady)."""
    alive = live(slices)
    if phase in ("Succeeded", "Failed"):
        return finish(slices, phase, finish_reason, finish_message)
    if not queue_name(job):
        # The queue label was removed: the job runs unqueued, and holds no quota.
        return [Delete(s.name, "the job left its queue") for s in alive]
    if spec.run_policy.suspend:
        # A suspended job holds no quota: its Workloads go once its pods are gone.
        return [Delete(s.name, "runPolicy.suspend") for s in alive] if active_pods == 0 else []
    now = current(slices)
    target, spares = spec.replicas.target, spec.replicas.spares
    queue = queue_name(job)
    want = asks(queue, priority_name(job), target, spec.replicas.min, spares, template)
    next_ordinal = max((s.ordinal for s in slices), default=0) + 1
    pending = [s for s in alive if not s.admitted]
    if now is not None and now.evicted:
        # The quota goes back once the pods are gone, and the Workload queues again.
        if active_pods:
            return []
        return [Requeue(now.name, now.reason, now.message),
                *(Delete(s.name, "the job was evicted") for s in alive if s is not now)]
    if now is None:
        fresh = [s for s in pending if s.asks == want]
        drop = [s for s in pending if s.asks != want] + fresh[:-1]
        if drop:
            return [Delete(s.name, "the spec changed") for s in drop]
        if not fresh:
            return [Create(build_workload(job, spec, template, ordinal=next_ordinal, workers=target,
                                          min_workers=min(spec.replicas.min, target)))]
        return []
    # Kueue finishes a replaced slice itself (ElasticJobsViaWorkloadSlices); should it not (the gate
    # off), the older admitted slice would keep its quota: finish it as Kueue would have.
    actions: list[Action] = [Finish(s.name, "WorkloadSliceReplaced", f"replaced by Workload {now.name}")
                             for s in alive if s.admitted and s is not now]
    ready = pods_ready(now.pods_ready, training)
    if ready is not None:
        actions.append(MarkPodsReady(now.name, *ready))
    growing = [s for s in pending if s.replacing]
    for s in pending:
        if s.asks != want or not s.replacing or target <= now.admitted_workers:
            actions.append(Delete(s.name, "the spec changed"))
            growing = [g for g in growing if g is not s]
    if target < now.workers or (now.spares is not None and spares < now.spares):
        actions.append(Shrink(now.name, min(target, now.workers),
                              None if now.spares is None else min(spares, now.spares)))
    elif target > now.admitted_workers and not growing:
        actions.append(Create(build_workload(job, spec, template, ordinal=next_ordinal, workers=target,
                                             min_workers=now.admitted_workers + 1, replaces=now.name)))
    return actions


def requeue_patch(wl: Mapping[str, Any], now: str) -> list[dict[str, Any]]:
    """A JSON patch of an evicted Workload's status that gives its quota back, as Kueue's job
    integrations do after stopping their job (jobframework: UnsetQuotaReservationWithCondition):
    no admission, QuotaReserved, Admitted and PodsReady False, and Requeued True after a preemption
    (other evictions requeue after Kueue's backoff). Guarded by the resourceVersion it was computed from."""
    evicted = _condition(wl, "Evicted")
    reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "")
    guard, conditions = _conditions_patch(wl, [
        ("QuotaReserved", False, "Pending", message),
        ("Admitted", False, "NoReservation", "The workload has no reservation"),
        ("Requeued", reason in ("Preempted", "NodeFailures"), reason, message),
        ("PodsReady", False, "WaitForStart", "Not all pods are ready or succeeded")], now)
    if (wl.get("status") or {}).get("admission") is None:
        return [guard, conditions]
    return [guard, {"op": "remove", "path": "/status/admission"}, conditions]


def label_selector(job_name: str) -> str:
    return f"{LABEL_JOB}={job_name}"

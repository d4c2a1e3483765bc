"""Gang scheduling: which all-or-nothing API the cluster offers, and what to create for it.

When ``scheduling.gang`` is true the workers must be scheduled together, with
whatever the cluster offers, in this order of preference:

1. the native Kubernetes API: a standalone ``scheduling.k8s.io`` PodGroup
   (v1alpha2 and later; pods set ``spec.schedulingGroup``), or the 1.35-era
   ``Workload`` with inline pod groups (v1alpha1; pods set ``spec.workloadRef``);
2. a scheduler-plugins PodGroup (``scheduling.x-k8s.io/v1alpha1``; pods carry
   the ``scheduling.x-k8s.io/pod-group`` label);
3. a Volcano PodGroup (``scheduling.volcano.sh/v1beta1``; pods carry the
   ``scheduling.k8s.io/group-name`` annotation and use the ``volcano`` scheduler).

Pure: :func:`choose_gang_api` takes what discovery found; the builders return
dicts. Discovery itself (HTTP) lives in owned.py. When nothing fits,
the job gets ``GangScheduling=False`` with reason ``Unsupported``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from cohort.api.models import GROUP, KIND, TrainingJobSpec

from .manifests import Kind
from .naming import object_meta

WORKLOAD_GROUP = "workers"


@dataclasses.dataclass(frozen=True)
class GangApi:
    """One way of gang scheduling: the object kind to create and how pods join it."""

    flavour: str  # native | native-workload | scheduler-plugins | volcano
    kind: Kind

    @property
    def description(self) -> str:
        return f"{self.kind.kind} {self.kind.api_version}"


# Native API versions, newest first: the newest served version wins.
NATIVE_PODGROUP_VERSIONS = ("scheduling.k8s.io/v1", "scheduling.k8s.io/v1beta1",
                            "scheduling.k8s.io/v1alpha3", "scheduling.k8s.io/v1alpha2")
CANDIDATES: tuple[GangApi, ...] = (
    *(GangApi("native", Kind(v, "PodGroup", "podgroups")) for v in NATIVE_PODGROUP_VERSIONS),
    GangApi("native-workload", Kind("scheduling.k8s.io/v1alpha1", "Workload", "workloads")),
    GangApi("scheduler-plugins", Kind("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups")),
    GangApi("volcano", Kind("scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups")),
)
# What discovery must ask about: each group/version once.
DISCOVERY_GROUP_VERSIONS = tuple(dict.fromkeys(c.kind.api_version for c in CANDIDATES))


def choose_gang_api(served: Collection[tuple[str, str]]) -> GangApi | None:
    """The preferred gang API among ``served`` (pairs of groupVersion, plural)."""
    for candidate in CANDIDATES:
        if (candidate.kind.api_version, candidate.kind.plural) in served:
            return candidate
    return None


def gang_object_name(job_name: str) -> str:
    return job_name


def build_gang_object(api: GangApi, job: dict[str, Any], spec: TrainingJobSpec) -> dict[str, Any]:
    """The PodGroup (or Workload) gating the job's pods; minimum = replicas.min."""
    name = job["metadata"]["name"]
    minimum = spec.replicas.min
    body: dict[str, Any] = {
        "apiVersion": api.kind.api_version, "kind": api.kind.kind,
        "metadata": object_meta(job, gang_object_name(name), "gang"),
    }
    if api.flavour == "native":
        body["spec"] = {"schedulingPolicy": {"gang": {"minCount": minimum}}}
    elif api.flavour == "native-workload":
        body["spec"] = {
            "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": name},
            "podGroups": [{"name": WORKLOAD_GROUP, "policy": {"gang": {"minCount": minimum}}}],
        }
    else:  # scheduler-plugins and Volcano share the minMember shape
        body["spec"] = {"minMember": minimum}
    return body


def gang_pod_fields(api: GangApi, job_name: str, spec: TrainingJobSpec) -> dict[str, Any]:
    """What each worker pod needs to join the gang: ``labels``, ``annotations`` and ``spec`` fields."""
    group = gang_object_name(job_name)
    if api.flavour == "native":
        return {"spec": {"schedulingGroup": {"podGroupName": group}}}
    if api.flavour == "native-workload":
        return {"spec": {"workloadRef": {"name": group, "podGroup": WORKLOAD_GROUP}}}
    if api.flavour == "scheduler-plugins":
        return {"labels": {"scheduling.x-k8s.io/pod-group": group}}
    fields: dict[str, Any] = {"annotations": {"scheduling.k8s.io/group-name": group}}
    if not spec.scheduling.scheduler_name:
        fields["spec"] = {"schedulerName": "volcano"}
    return fields


def gang_message(api: GangApi | None, job_name: str, spec: TrainingJobSpec) -> str:
    """The GangScheduling condition's message."""
    if api is None:
        return ("scheduling.gang is true but the cluster offers no gang scheduling API: neither the native "
                "scheduling.k8s.io Workload/PodGroup API nor a PodGroup CRD (scheduler-plugins "
                "scheduling.x-k8s.io or Volcano scheduling.volcano.sh); workers are scheduled one by one")
    msg = f"{api.description} {gang_object_name(job_name)} requires {spec.replicas.min} workers scheduled together"
    if api.flavour == "scheduler-plugins" and not spec.scheduling.scheduler_name:
        msg += "; set scheduling.schedulerName to the scheduler running the coscheduling plugin"
    return msg

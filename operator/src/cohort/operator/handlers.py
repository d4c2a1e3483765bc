"""The kopf handlers: thin, they only turn watch events into work for the reconciler.

- a TrainingJob event (only this instance's jobs: see ``Settings.instance``) stores the newest object and enqueues the job (unless
  only its status changed: that is the operator's own write coming back);
- an event on a pod labelled ``cohort.dev/job`` updates the ``pods_by_job``
  index (the reconciler's view of the pods) and enqueues that job;
- the deletion of a ConfigMap or Service the job owns enqueues the job,
  which recreates it; a survivor's report in the reports ConfigMap starts a check of
  its world's members (reports.py);
- where Kueue is installed, any change to a job's Workload (admitted,
  evicted, replaced) enqueues the job.

Only ``on.event`` handlers are used: they keep no progress annotations and
need no finalizers, so deleting a job (or a namespace) never waits for the
operator. Registration happens in :func:`build_registry`, not at import.
Handlers are ``async``: kopf runs sync handlers in a thread pool, and the work
queue belongs to the event loop.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import kopf

from cohort.api.models import GROUP, PLURAL, VERSION

from .jobstate import fingerprint
from .kubeapi import load_configuration
from .kueue import WORKLOAD
from .naming import LABEL_JOB, LABEL_OPERATOR, REPORT_KEY, reports_map_name
from .observe import trim_pod
from .reconciler import Reconciler
from .workqueue import NORMAL, URGENT

POD_BATCH_S = 0.2
WORKLOAD_GROUP, WORKLOAD_VERSION = WORKLOAD.api_version.split("/")

# Owned kinds watched so that a deletion is repaired at once: (group, version,
# plural, kind). The ServiceAccount, Role, RoleBinding and PDB are checked at
# each resync instead (Reconciler.verify_owned): one list per namespace, where
# a watch would cost an event per object per change for a rare repair.
OWNED_KINDS = (
    ("", "v1", "configmaps", "ConfigMap"),
    ("", "v1", "services", "Service"),
)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff-base storage, for an operator that has no change handlers.

    kopf builds a deep copy of every object's "essence" on every event, to
    diff it for on.create/on.update handlers. With only on.event handlers
    nothing ever reads it, and at hundreds of jobs that copy was half of the
    operator's CPU. This storage keeps nothing.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def job_selector(instance: str) -> str:
    """The TrainingJobs an operator instance handles: labelled for it, or unlabelled for the default one."""
    return f"{LABEL_OPERATOR}={instance}" if instance else f"!{LABEL_OPERATOR}"


def configure(settings: kopf.OperatorSettings, instance: str = "", *, kueue: bool = False) -> None:
    """Watch only what carries the job label (and this instance's jobs), filtered by the API server."""
    settings.peering.standalone = True  # leader election is ours (see leader.py)
    settings.posting.enabled = False  # the operator posts its own Events
    settings.persistence.diffbase_storage = NoDiffBase()
    # A job that stops matching (relabelled to another instance) arrives as DELETED: it is forgotten.
    settings.watching.label_selectors[(GROUP, VERSION, PLURAL)] = job_selector(instance)
    settings.watching.label_selectors[("v1", "pods")] = LABEL_JOB
    for group, version, plural, _kind in OWNED_KINDS:
        key = ("v1", plural) if not group else (group, version, plural)
        settings.watching.label_selectors[key] = LABEL_JOB
    if kueue:
        settings.watching.label_selectors[(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD.plural)] = LABEL_JOB


def build_registry(rec: Reconciler, *, kueue: bool = False) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_kwargs: Any) -> kopf.ConnectionInfo:
        # The same credentials as our own client (kubeapi.load_configuration): the pod's
        # service-account token wherever the runtime put it, else the kubeconfig.
        cfg = load_configuration()
        header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization") or ""
        scheme, _sep, token = header.partition(" ")
        return kopf.ConnectionInfo(server=cfg.host, ca_path=cfg.ssl_ca_cert or None,
                                   insecure=not cfg.verify_ssl, scheme=scheme or None, token=token or None,
                                   certificate_path=cfg.cert_file or None, private_key_path=cfg.key_file or None)

    # The pods of each job, kept by kopf from the pod watch. kopf runs no other
    # handler before every index has its initial listing, so a (re)started
    # operator never plans with a partial view of the pods.
    @kopf.index("v1", "pods", id="pods_by_job", registry=registry)
    async def pods_by_job(*, namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                          **_: Any) -> dict[Any, Any]:
        job = labels.get(LABEL_JOB)
        return {(namespace or "", job): trim_pod(dict(body))} if job else {}

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def job_event(*, type: str, event: kopf.RawEvent, namespace: str | None, name: str,
                        **kwargs: Any) -> None:
        rec.pod_index = kwargs["pods_by_job"]  # kopf passes every index to every handler
        key = (namespace or "", name)
        if type == "DELETED":
            rec.job_deleted(key)
            return
        raw: Any = event.get("object") or {}
        mem = rec.memory(key)
        body = copy.deepcopy(dict(raw))
        body.get("metadata", {}).pop("managedFields", None)  # large, and never read
        mem.body = body
        fp = fingerprint(mem.body)
        if fp != mem.fingerprint or type is None:
            mem.fingerprint = fp
            # New or changed specs are urgent; the initial listing after a start is not.
            rec.queue.add(key, NORMAL if type is None else URGENT)

    @kopf.on.event("v1", "pods", registry=registry)
    async def pod_event(*, type: str, event: kopf.RawEvent, namespace: str | None, labels: Mapping[str, str],
                  **_: Any) -> None:
        job = labels.get(LABEL_JOB)
        if not job:
            return
        key = (namespace or "", job)
        raw: Any = event.get("object") or {}
        if type == "DELETED" or (raw.get("metadata") or {}).get("deletionTimestamp") or \
                (raw.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            rec.queue.add(key, URGENT)  # a member may be gone: the world changes at once
        else:
            # Pods of a job change together (created, scheduled, Ready): one reconcile for the burst.
            rec.queue.add_after(key, POD_BATCH_S)

    for group, version, plural, kind in OWNED_KINDS:
        args = ("v1", plural) if not group else (group, version, plural)

        async def owned_event(*, type: str, namespace: str | None, name: str, labels: Mapping[str, str],
                              body: kopf.Body, _kind: str = kind, **_: Any) -> None:
            job = labels.get(LABEL_JOB)
            if job and type == "DELETED":
                rec.object_deleted((namespace or "", job), _kind, name)
            elif job and type == "MODIFIED" and _kind == "ConfigMap" and name == reports_map_name(job):
                rec.peer_reported((namespace or "", job), (body.get("data") or {}).get(REPORT_KEY))

        kopf.on.event(*args, id=f"owned-{plural}", registry=registry)(owned_event)

    if kueue:
        @kopf.on.event(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD.plural, registry=registry)
        async def workload_event(*, namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
            job = labels.get(LABEL_JOB)
            if job:
                rec.queue.add((namespace or "", job), URGENT)

    return registry

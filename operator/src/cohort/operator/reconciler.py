"""The reconcile loop: observe one job, decide, carry out the Decision.

Observing (the job, its status, its pods) is here; every decision is in
:mod:`.decide` (pure); the owned objects are kept by :mod:`.owned`, and the
Decision is carried out by :mod:`.execute`. The order of writes makes a
crash at any point harmless:

1. owned objects (config, Service, RBAC, PDB, gang object) are created if
   absent; the config is updated when the spec changes;
2. the pods are read from kopf's pod index (the pod watch), corrected for
   our own creations and deletions it may not show yet;
3. the world ConfigMap is written (workers learn about departures at once);
4. the status is patched, persisting ``podIndex`` before any pod with that
   index exists, and ``retiring`` before any pod is counted twice;
5. pods are deleted (never before the world that drops them is published);
6. pods are created with create-if-absent (409 means it exists: fine);
7. Events are posted.

A restarted operator re-reads status and world and goes on: names are
deterministic and never reused, so nothing is duplicated or orphaned.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any

from cohort.api.models import MANAGED_BY_SELF, FaultTolerance, RunPolicy, TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import ValidationError, parse, to_dict

from .decide import Inputs, decide
from .decide.invalid import REASON as INVALID_SPEC
from .decide.invalid import Refused, decide_invalid
from .events import EventRecorder
from .execute import Executor
from .jobstate import JobKey, JobMemory
from .kubeapi import ApiError, Kube
from .kueue import Admission, Slice, holding_quota, queue_name
from .kueue import finish as finish_workloads
from .kueue import plan as plan_workloads
from .lifecycle import FINAL_PHASES, get_condition
from .manifests import (
    CONFIG_MAP,
    NETWORK_POLICY,
    PDB,
    POD,
    ROLE,
    ROLE_BINDING,
    SERVICE_ACCOUNT,
    owned_objects,
)
from .metrics import OperatorMetrics
from .naming import LABEL_JOB, METRICS_PORT, WORLD_KEY, job_path, world_map_name
from .observe import view_pods
from .owned import OwnedObjects
from .pods import build_worker_pod
from .queueing import Queues
from .reports import REFORM_INTERVAL_S, Report, check, confirmed, in_old_worlds, parse_report, stuck
from .settings import Settings
from .workqueue import BACKGROUND, URGENT, WorkQueue
from .world import Member, World

log = logging.getLogger(__name__)
# Owned kinds not watched (see handlers.OWNED_KINDS): verified at each resync.
# The NetworkPolicy only where --network-policy is on (only then may the operator list them).
UNWATCHED_KINDS = (SERVICE_ACCOUNT, ROLE, ROLE_BINDING, PDB)
UNWATCHED_NAMES = {k.kind for k in (*UNWATCHED_KINDS, NETWORK_POLICY)}
# How long our own pod creations/deletions are trusted over a pod index that does not show them yet.
EXPECTATION_S = 30.0
REPORT_RECHECK_S = 1.0  # survivors' reports of one world checked at most this often


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings, metrics: OperatorMetrics, recorder: EventRecorder):
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.recorder = recorder
        self.queue = WorkQueue()
        self.jobs: dict[JobKey, JobMemory] = {}
        self._phases: dict[JobKey, str] = {}  # for the jobs-by-phase gauge
        self.pod_index: Any = None  # kopf's pods_by_job index, handed over by the first handler call
        self.owned = OwnedObjects(kube, settings, recorder)
        self.executor = Executor(kube, settings, metrics, recorder, self.queue, self.owned)
        self.queues = Queues(kube, metrics, recorder)
        self._checks: set[asyncio.Task[None]] = set()  # survivors' reports being checked

    # --- triggers (called by the kopf handlers) ------------------------------
    def memory(self, key: JobKey) -> JobMemory:
        mem = self.jobs.get(key)
        if mem is None:
            mem = self.jobs[key] = JobMemory(key=key)
        return mem

    def peer_reported(self, key: JobKey, text: str | None) -> None:
        """A member's collective failed (reports.py): check that world's members, apart from the event
        handler; at most one check a second per world version."""
        mem = self.jobs.get(key)
        report = parse_report(text)
        if self.settings.ignore_reports or mem is None or report is None:
            return
        if report.version != mem.world.version or not mem.world.members:
            return  # a report about a world already replaced: its change is under way
        now = time.monotonic()
        if mem.report_checked[0] == report.version and now - mem.report_checked[1] < REPORT_RECHECK_S:
            return
        mem.report_checked = (report.version, now)
        task = asyncio.get_running_loop().create_task(self._check_report(mem, report))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check_report(self, mem: JobMemory, report: Report) -> None:
        world = mem.world
        found = await check(world.members, METRICS_PORT)
        gone = confirmed(found.gone, report.pod)
        if found.gone and not gone:
            log.warning("%s/%s: the reporter %s itself looks unreachable (%s): the operator cannot reach the "
                        "workers' port, so the check proves nothing", mem.key[0], mem.key[1], report.pod,
                        found.gone[report.pod])
        everyone = found.all_answer(world.members)
        log.info("%s/%s: %s reported a failed collective in world v%d (%s): %s", mem.key[0], mem.key[1],
                 report.pod, report.version, report.error,
                 "; ".join(f"{pod}: {why}" for pod, why in gone.items()) or
                 ("every member answers" if everyone else "none is gone, not every member answers"))
        absent = [m for m in world.members if m.pod in report.absent and m.pod not in gone and m.pod != report.pod]
        hung = {pod: f"it never arrived at world v{report.version}'s rendezvous, which {report.pod} waited out, and "
                     f"{why}" for pod, why in (await stuck(absent, METRICS_PORT, report.version)).items()}
        if hung:
            log.warning("%s/%s: hung: %s", mem.key[0], mem.key[1], "; ".join(f"{p}: {w}" for p, w in hung.items()))
        if mem.world.version != world.version:
            return
        if gone or hung:
            mem.unreachable.update(gone)
            mem.hung.update(hung)
            self.queue.add(mem.key, URGENT)
        elif (not report.absent and (everyone or report.pod in found.answering)
              and time.monotonic() - mem.reformed_at >= REFORM_INTERVAL_S):
            # Nobody is gone: the reporters have left this world and wait for the next. Either it was a false
            # alarm (every member answers) and the same members go on, or a member that does not answer while
            # the reporter does is hung, and the re-formed world's rendezvous names it absent. (A reporter that
            # does not answer either: this operator's checks prove nothing, as when it looks gone.)
            mem.reformed_at = time.monotonic()
            mem.reform = (world.version, f"{report.pod} reported a failed collective ({report.error[:120]}) and "
                                         + ("every member answers" if everyone else
                                            "no member is gone (one that does not answer and never arrives at "
                                            "the next rendezvous is hung)"))
            self.queue.add(mem.key, URGENT)
            task = asyncio.get_running_loop().create_task(self._watch_old_world(mem, world.version))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _watch_old_world(self, mem: JobMemory, left: int) -> None:
        """The members of world ``left`` re-form under a newer version: one whose trainer is still in an older
        world (a step of it, or forming its group) past its own deadline is hung (cohort.api.progress), found
        without waiting for the new world's rendezvous to time out. Until no member is in an older world, or
        twice the group's timeout."""
        try:
            ft = parse(FaultTolerance, ((mem.body or {}).get("spec") or {}).get("faultTolerance"),
                       "spec.faultTolerance")
        except ValidationError:
            return  # the reconciler says why the job is refused
        until = time.monotonic() + 2 * ft.process_group_timeout_seconds + 10
        while time.monotonic() < until:
            await asyncio.sleep(REPORT_RECHECK_S)
            world = mem.world
            if world.version <= left:
                continue  # the re-formed world is not published yet
            old = await in_old_worlds(world.members, METRICS_PORT, world.version)
            if mem.world.version != world.version:
                continue
            if not old:
                return  # every member that answers has left the older worlds
            hung = {pod: why for pod, why in old.items() if why}
            if hung:
                log.warning("%s/%s: hung: %s", mem.key[0], mem.key[1], "; ".join(f"{p}: {w}" for p, w in hung.items()))
                mem.hung.update(hung)
                self.queue.add(mem.key, URGENT)
                return

    def job_deleted(self, key: JobKey) -> None:
        self.jobs.pop(key, None)
        self.metrics.set_queue_workers(key[0], key[1], None, None)
        self.metrics.set_goodput(key[0], key[1], None)
        self.queue.forget(key)
        if self._phases.pop(key, None) is not None:
            self.metrics.set_phases(self._phases.values())

    def object_deleted(self, key: JobKey, kind: str, name: str) -> None:
        mem = self.jobs.get(key)
        if mem is not None and (kind, name) in mem.ensured:
            mem.ensured.discard((kind, name))
            mem.lost.add((kind, name))
            if kind == "ConfigMap" and name == world_map_name(key[1]):
                mem.lost.add(("World", name))
        self.queue.add(key)

    async def resync_forever(self) -> None:
        """Level-based safety net: every job is reconciled at least every resync period."""
        while True:
            await asyncio.sleep(self.settings.resync_s)
            try:
                await self.verify_owned()
            except (ApiError, OSError, asyncio.TimeoutError) as e:
                self.metrics.errors.labels(where="resync").inc()
                log.warning("resync: could not list owned objects: %r", e)
            for key, mem in list(self.jobs.items()):
                if mem.body is not None:
                    self.queue.add(key, BACKGROUND)

    async def verify_owned(self) -> None:
        """Forget owned objects of the unwatched kinds that no longer exist, so reconciles recreate them."""
        namespaces = sorted({key[0] for key, mem in self.jobs.items() if mem.body is not None})
        for ns in namespaces:
            present: set[tuple[str, str]] = set()
            for kind in UNWATCHED_KINDS + ((NETWORK_POLICY,) if self.settings.network_policy else ()):
                for obj in await self.kube.list(kind.path(ns), label_selector=LABEL_JOB):
                    present.add((kind.kind, obj["metadata"]["name"]))
            for key, mem in list(self.jobs.items()):
                if key[0] != ns:
                    continue
                for ident in [i for i in mem.ensured if i[0] in UNWATCHED_NAMES and i not in present]:
                    mem.ensured.discard(ident)
                    mem.lost.add(ident)

    # --- one reconcile -------------------------------------------------------
    async def reconcile(self, key: Any) -> None:
        mem = self.jobs.get(key)
        if mem is None or mem.body is None:
            return
        started = time.perf_counter()
        async with mem.lock:
            try:
                await self._reconcile(mem)
            except ApiError as e:
                if e.status == 403 and "being terminated" in e.message:
                    log.debug("%s/%s: namespace terminating; leaving the job to it", key[0], key[1])
                    return
                self.metrics.errors.labels(where="reconcile").inc()
                log.warning("reconcile %s/%s failed: %s; retrying", key[0], key[1], e)
                mem.loaded = mem.loaded and e.status != 409
                self.queue.add_after(key, 2.0)
            except (OSError, asyncio.TimeoutError) as e:
                self.metrics.errors.labels(where="reconcile").inc()
                log.warning("reconcile %s/%s failed: %r; retrying", key[0], key[1], e)
                self.queue.add_after(key, 2.0)
            except Exception:
                self.metrics.errors.labels(where="reconcile").inc()
                log.exception("reconcile %s/%s crashed; retrying", key[0], key[1])
                mem.loaded = False
                self.queue.add_after(key, 5.0)
            finally:
                elapsed = time.perf_counter() - started
                self.metrics.reconcile_seconds.observe(elapsed)
                log.debug("reconciled %s/%s in %.3fs", key[0], key[1], elapsed)
        self.metrics.set_goodput(key[0], key[1], to_dict(mem.status.goodput.seconds))
        if self._phases.get(key) != mem.status.phase:
            self._phases[key] = mem.status.phase
            self.metrics.set_phases(self._phases.values())

    async def _reconcile(self, mem: JobMemory) -> None:
        job = mem.body
        assert job is not None
        meta = job["metadata"]
        ns, name = mem.key
        if meta.get("deletionTimestamp"):
            return  # the garbage collector removes what the job owns
        if mem.uid != meta.get("uid"):
            mem.reset_for_new_uid(meta.get("uid", ""))
        managed_by = str((job.get("spec") or {}).get("managedBy") or "")
        if managed_by not in ("", MANAGED_BY_SELF):
            if not mem.ignored:
                mem.ignored = True
                log.info("%s/%s: spec.managedBy is %s; leaving the job to it", ns, name, managed_by)
            return
        try:
            spec = parse(TrainingJobSpec, job.get("spec"), "spec")
        except ValidationError as e:
            await self._invalid(mem, job, str(e))
            return
        if not mem.loaded:
            await self._load(mem, job)
        now = dt.datetime.now(dt.timezone.utc)
        status = mem.status
        gang_fields: dict[str, Any] = {}
        active = status.phase not in FINAL_PHASES
        before, after = owned_objects(job, spec, network_policy=self.settings.network_policy)
        # What the pods need (config, ServiceAccount) is ensured while the pods
        # are listed and the status written; it is awaited before any pod is created.
        prerequisites: asyncio.Future[Any] = asyncio.ensure_future(
            self.owned.ensure(mem, job, before, world=True) if active else asyncio.sleep(0))
        slices: list[Slice] = []
        admission: Admission | None = None
        try:
            if active:
                gang_fields = await self.owned.ensure_gang(mem, job, spec, now)
            pods = await self._observed_pods(mem)
            if queue_name(job) or mem.status.replicas.admitted is not None:  # queued, or was until now
                slices, admission = await self.queues.observe(job)
        except BaseException:
            prerequisites.cancel()
            raise
        if mem.unreachable or mem.hung:  # forget the evidence about pods that are gone
            names = {(p.get("metadata") or {}).get("name") for p in pods}
            mem.unreachable = {pod: why for pod, why in mem.unreachable.items() if pod in names}
            mem.hung = {pod: why for pod, why in mem.hung.items() if pod in names}
        inputs = Inputs(job=job, spec=spec, status=mem.status, world=mem.world,
                        pods=view_pods(pods, mem.uid, mem.unreachable, mem.hung),
                        now=now, straggler=mem.verdict, progress=mem.progress, admission=admission,
                        reform=mem.reform[1] if mem.reform[0] == mem.world.version else "")
        decision = decide(inputs)
        # The Service, RBAC and PDB wait for a reconcile that creates no pod:
        # on a busy API server, every job's workers come first.
        if await self.executor.execute(mem, job, spec, decision, gang_fields, prerequisites):
            if queue_name(job) or inputs.status.replicas.admitted is not None:
                await self._follow_queue(mem.key, job, spec, slices, inputs, decision)
            if not active:
                return
            if decision.create:
                self.queue.add_after(mem.key, 1.0, BACKGROUND)
            else:
                await self.owned.ensure(mem, job, after)

    async def _follow_queue(self, key: JobKey, job: dict[str, Any], spec: TrainingJobSpec, slices: list[Slice],
                            inputs: Inputs, decision: Any) -> None:
        """Keep the job's Kueue Workloads in step with what this reconcile decided (:func:`.kueue.plan`)."""
        status = decision.status
        queued_now = status.phase not in FINAL_PHASES
        self.metrics.set_queue_workers(key[0], key[1], spec.replicas.target if queued_now else None,
                                       (status.replicas.admitted or 0) if queued_now else None)
        holding, stuck_in = holding_quota(inputs.pods, inputs.now, self.settings.stuck_terminating_s)
        if stuck_in is not None and status.phase == "Suspended":
            self.queue.add_after(key, stuck_in + 0.5)  # no event tells when a terminating pod is stuck
        final = next((c for c in status.conditions if c.type == status.phase and c.status == "True"), None)
        template_pod = build_worker_pod(job, spec, 0, defaults=self.settings.pod_defaults)
        template = {"metadata": {"labels": template_pod["metadata"]["labels"]}, "spec": template_pod["spec"]}
        actions = plan_workloads(job, spec, slices, template, phase=status.phase,
                                 finish_reason=final.reason if final else "", finish_message=final.message if final else "",
                                 active_pods=holding,
                                 training=status.world.size >= max(spec.replicas.min, 1))
        if actions:
            await self.queues.apply(job, actions)
            self.queue.add_after(key, 1.0)  # see what Kueue made of it, even without the Workload watch

    async def _observed_pods(self, mem: JobMemory) -> list[dict[str, Any]]:
        """The job's pods: kopf's pod index, corrected for our own recent writes.

        The index follows the pod watch, so a pod created a moment ago may be
        missing and one just deleted may still look alive. Without these
        corrections ("expectations") a reconcile right after a creation would
        create the pods again. Without an index (before kopf's first call),
        the pods are listed.
        """
        ns, name = mem.key
        if self.pod_index is None:
            return await self.kube.list(POD.path(ns), label_selector=f"{LABEL_JOB}={name}")
        pods = {p["metadata"]["name"]: p for p in (self.pod_index.get(mem.key) or [])}
        now = time.monotonic()
        for pod, (since, manifest) in list(mem.expected.items()):
            if pod in pods or now - since > EXPECTATION_S:
                del mem.expected[pod]
            else:
                pods[pod] = manifest
        for pod, since in list(mem.deleting.items()):
            seen = pods.get(pod)
            if seen is None or (seen.get("metadata") or {}).get("deletionTimestamp") or now - since > EXPECTATION_S:
                del mem.deleting[pod]
            else:
                pods[pod] = {**seen, "metadata": {**seen["metadata"], "deletionTimestamp": "pending"}}
        return list(pods.values())

    async def _invalid(self, mem: JobMemory, job: dict[str, Any], message: str) -> None:
        """A stored spec the operator cannot parse (stored under older admission rules; the API server
        admits by the same rules as the parser): the job fails, its pods go and its Workloads finish
        (decide.invalid says why and how)."""
        if not mem.loaded:
            await self._load(mem, job)
        now = dt.datetime.now(dt.timezone.utc)
        pods = await self._observed_pods(mem)
        slices: list[Slice] = []
        if queue_name(job) or mem.status.replicas.admitted is not None:
            slices, _ = await self.queues.observe(job)
        decision = decide_invalid(Refused(job=job, status=mem.status, world=mem.world, pods=view_pods(pods, mem.uid),
                                          now=now, message=message, ttl_seconds_after_finished=_ttl(job)))
        done: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(0))
        if not await self.executor.execute(mem, job, None, decision, {}, done):
            return
        final = get_condition(decision.status.conditions, decision.status.phase)
        actions = finish_workloads(slices, decision.status.phase, final.reason if final else INVALID_SPEC,
                                   final.message if final else message)
        if actions:
            self.metrics.set_queue_workers(mem.key[0], mem.key[1], None, None)
            await self.queues.apply(job, actions)

    async def _load(self, mem: JobMemory, job: dict[str, Any]) -> None:
        """Durable state after a (re)start: the status, and the world ConfigMap (the authority)."""
        ns, name = mem.key
        if mem.written:
            # A reload after an error: the watched copy may predate our last
            # status write, and an old podIndex would reuse a pod name.
            job = await self.kube.get(job_path(ns, name)) or job
        mem.status = _parse_status(job)
        mem.written = to_dict(mem.status)
        mem.loaded = True
        if mem.status.pod_index == 0 and mem.status.world.version == 0:
            return  # a new job: no pod, so no world, was ever created
        cm = await self.kube.get(CONFIG_MAP.path(ns, world_map_name(name)))
        stored = World.parse(((cm or {}).get("data") or {}).get(WORLD_KEY))
        from_status = World(version=mem.status.world.version,
                            members=tuple(Member(pod=p) for p in mem.status.world.members))
        mem.world = stored if stored is not None and stored.version >= from_status.version else from_status
        if cm is None:
            mem.lost.add(("World", world_map_name(name)))













def _parse_status(job: dict[str, Any]) -> TrainingJobStatus:
    try:
        return parse(TrainingJobStatus, job.get("status") or {}, "status")
    except ValidationError as e:
        log.warning("status of %s/%s unreadable (%s); starting from an empty status",
                    job["metadata"].get("namespace"), job["metadata"].get("name"), e)
        return TrainingJobStatus()




def _ttl(job: dict[str, Any]) -> int | None:
    """runPolicy.ttlSecondsAfterFinished of a job whose spec as a whole cannot be parsed, if that section can."""
    try:
        return parse(RunPolicy, (job.get("spec") or {}).get("runPolicy"), "spec.runPolicy").ttl_seconds_after_finished
    except (ValidationError, AttributeError):
        return None

"""Leader election decisions, gang API choice, pod views, the work queue."""

from __future__ import annotations

import asyncio
import datetime as dt

from tests.support.specs import with_workload

from cohort.api.models import TrainingJobSpec
from cohort.api.schema import parse
from cohort.operator.gang import CANDIDATES, build_gang_object, choose_gang_api, gang_pod_fields
from cohort.operator.leader import claim
from cohort.operator.observe import view_pod
from cohort.operator.workqueue import WorkQueue

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def lease(holder: str, renewed_s_ago: float, duration: int = 15) -> dict:
    t = (NOW - dt.timedelta(seconds=renewed_s_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"spec": {"holderIdentity": holder, "renewTime": t, "acquireTime": t, "leaseDurationSeconds": duration,
                     "leaseTransitions": 2}}


def test_lease_claim():
    assert claim(None, "me", 15, NOW)["holderIdentity"] == "me"
    assert claim(lease("other", 5), "me", 15, NOW) is None
    taken = claim(lease("other", 20), "me", 15, NOW)
    assert taken["holderIdentity"] == "me" and taken["leaseTransitions"] == 3
    renewed = claim(lease("me", 5), "me", 15, NOW)
    assert renewed["leaseTransitions"] == 2 and renewed["acquireTime"] == lease("me", 5)["spec"]["acquireTime"]


def test_gang_api_preference():
    assert choose_gang_api(set()) is None
    served = {("scheduling.volcano.sh/v1beta1", "podgroups"), ("scheduling.x-k8s.io/v1alpha1", "podgroups")}
    assert choose_gang_api(served).flavour == "scheduler-plugins"
    served.add(("scheduling.k8s.io/v1alpha2", "podgroups"))
    assert choose_gang_api(served).flavour == "native"
    assert choose_gang_api({("scheduling.k8s.io/v1alpha1", "workloads")}).flavour == "native-workload"
    assert choose_gang_api({("scheduling.k8s.io/v1", "priorityclasses")}) is None


def test_gang_objects_and_pod_fields():
    spec = parse(TrainingJobSpec, with_workload({"replicas": {"min": 3, "max": 4, "target": 4}}))
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}
    by = {c.flavour: c for c in CANDIDATES}
    assert build_gang_object(by["scheduler-plugins"], job, spec)["spec"] == {"minMember": 3}
    assert build_gang_object(by["native"], job, spec)["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}
    wl = build_gang_object(by["native-workload"], job, spec)
    assert wl["kind"] == "Workload" and wl["spec"]["podGroups"][0]["policy"] == {"gang": {"minCount": 3}}
    assert gang_pod_fields(by["scheduler-plugins"], "j", spec) == {"labels": {"scheduling.x-k8s.io/pod-group": "j"}}
    volcano = gang_pod_fields(by["volcano"], "j", spec)
    assert volcano["annotations"] == {"scheduling.k8s.io/group-name": "j"} and volcano["spec"]["schedulerName"] == "volcano"
    assert gang_pod_fields(by["native"], "j", spec)["spec"] == {"schedulingGroup": {"podGroupName": "j"}}


def test_view_pod_states():
    owner = [{"controller": True, "uid": "job"}]

    def p(phase: str, **kw) -> dict:
        status = {"phase": phase, "podIP": "10.0.0.1", **kw.pop("status", {})}
        return {"metadata": {"name": "j-worker-4", "uid": "u", "ownerReferences": owner, **kw}, "status": status}

    ready = view_pod(p("Running", status={"conditions": [{"type": "Ready", "status": "True"}]}), "job")
    assert ready.ready and ready.active and ready.owned and ready.index == 4
    failed = view_pod(p("Failed", status={"containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}), "job")
    assert failed.failed and not failed.active and failed.exit_code == 137
    done = view_pod(p("Succeeded", status={"containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": '{"step": 9}'}}}]}), "job")
    assert done.succeeded and done.termination_summary() == {"step": 9}
    going = view_pod(p("Running", deletionTimestamp="2026-01-01T00:00:00Z",
                       status={"conditions": [{"type": "Ready", "status": "True"}]}), "job")
    assert going.terminating and not going.ready
    assert not view_pod(p("Running"), "other-job").owned


def test_work_queue_dedupes_and_reprocesses_keys_marked_dirty_meanwhile():
    async def main() -> list[str]:
        q = WorkQueue()
        seen: list[str] = []
        gate = asyncio.Event()

        async def process(key):
            seen.append(key)
            if len(seen) == 1:
                q.add("a")  # dirty while processing: once more afterwards
                await gate.wait()

        q.add("a")
        q.add("a")
        q.add_after("b", 0.05)
        q.add_after("b", 10)  # a later timer does not replace an earlier one
        task = asyncio.create_task(q.run(process, workers=2))
        await asyncio.sleep(0.1)
        gate.set()
        await asyncio.sleep(0.05)
        task.cancel()
        return seen

    seen = asyncio.run(main())
    assert sorted(seen) == ["a", "a", "b"]


def test_work_queue_serves_urgent_keys_first():
    from cohort.operator.workqueue import BACKGROUND, URGENT

    async def main() -> list[str]:
        q = WorkQueue()
        seen: list[str] = []

        async def process(key):
            seen.append(key)

        q.add("resync", BACKGROUND)
        q.add("routine")
        q.add("new-job", URGENT)
        q.add("routine", URGENT)  # promoted: served once, in the urgent lane
        task = asyncio.create_task(q.run(process, workers=1))
        await asyncio.sleep(0.05)
        task.cancel()
        return seen

    assert asyncio.run(main()) == ["new-job", "routine", "resync"]


def test_a_trimmed_pod_views_the_same():
    from cohort.operator.observe import trim_pod

    pod = {"metadata": {"name": "j-worker-2", "uid": "u", "ownerReferences": [{"controller": True, "uid": "job"}],
                        "annotations": {"cohort.dev/replaces": "j-worker-1", "other": "x"},
                        "managedFields": [{"big": "x" * 1000}], "labels": {"a": "b"}},
           "spec": {"nodeName": "n1", "containers": [{"name": "trainer"}]},
           "status": {"phase": "Running", "podIP": "10.0.0.2", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert view_pod(trim_pod(pod), "job") == view_pod(pod, "job")
    assert "managedFields" not in trim_pod(pod)["metadata"]


def test_per_job_metrics_avoid_the_labels_prometheus_keeps_for_the_scrape_target():
    """Prometheus sets ``namespace`` and ``job`` on every series from the operator's pod (its scrape target) and
    renames a series' own to ``exported_*``, so a dashboard selecting a job by them would find nothing."""
    from cohort.operator.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.set_queue_workers("team-a", "llm", 4, 2)
    metrics.set_goodput("team-a", "llm", {"training": 3.0, "queued": 1.0})
    samples = [s for family in metrics.registry.collect() for s in family.samples]
    per_job = [s for s in samples if "llm" in s.labels.values()]
    assert {s.name for s in per_job} == {"cohort_operator_queue_workers", "cohort_operator_goodput_seconds_total"}
    assert all({"job_namespace", "trainingjob"} <= set(s.labels) for s in per_job), per_job
    clashing = sorted({(s.name, label) for s in samples for label in s.labels if label in ("namespace", "job")})
    assert not clashing, clashing

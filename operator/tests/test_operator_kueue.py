"""A TrainingJob behind Kueue, without a cluster: reading Workloads, what they allow, and the writes
that keep them in step with the job (:mod:`cohort.operator.kueue`), plus the decisions they drive."""

from __future__ import annotations

import copy
import datetime as dt

from tests.support.specs import with_workload

from cohort.api.models import TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import parse
from cohort.operator.decide import Inputs, decide
from cohort.operator.kueue import (
    Admission,
    Create,
    Delete,
    Finish,
    MarkPodsReady,
    Requeue,
    Shrink,
    admission_of,
    build_workload,
    holding_quota,
    parse_slice,
    placement,
    plan,
    pods_ready,
    pods_ready_patch,
    requeue_patch,
)
from cohort.operator.lifecycle import fmt_time, get_condition
from cohort.operator.observe import PodView
from cohort.operator.world import Member, World

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
TEMPLATE = {"spec": {"containers": [{"name": "trainer", "resources": {"requests": {"cpu": "1"}}}]}}


def job(labels=None, **spec) -> tuple[dict, TrainingJobSpec]:
    raw = with_workload({"replicas": {"min": 2, "max": 6, "target": 4}, **spec})
    body = {"metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "generation": 3,
                         "labels": {"kueue.x-k8s.io/queue-name": "team", **(labels or {})}}, "spec": raw}
    return body, parse(TrainingJobSpec, raw)


def workload(name, workers, *, min_count=None, spares=None, admitted=None, evicted=None, finished=None,
             pending=None, replaces="", asks="") -> dict:
    pod_sets = [{"name": "workers", "count": workers, **({"minCount": min_count} if min_count else {})}]
    if spares is not None:
        pod_sets.append({"name": "spares", "count": spares})
    conditions, status = [], {}
    if admitted is not None:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "count": admitted, "flavors": {"cpu": "pool-a"}}]}
        conditions += [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                       {"type": "Admitted", "status": "True", "reason": "Admitted"},
                       {"type": "PodsReady", "status": "True", "reason": "Started"}]
    if pending:
        conditions.append({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": pending})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "reason": evicted, "message": "preempted by x"})
    if finished:
        conditions.append({"type": "Finished", "status": "True", "reason": finished})
    annotations = {"cohort.dev/asks": asks}
    if replaces:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = f"ns/{replaces}"
    status["conditions"] = conditions
    return {"metadata": {"name": name, "annotations": annotations, "resourceVersion": "41", "generation": 1},
            "spec": {"podSets": pod_sets}, "status": status}


def want(body, spec) -> str:
    return build_workload(body, spec, TEMPLATE, ordinal=1, workers=4, min_workers=2)["metadata"]["annotations"][
        "cohort.dev/asks"]


def test_the_workload_asks_for_the_target_with_min_as_partial_admission():
    body, spec = job({"kueue.x-k8s.io/priority-class": "high"}, replicas={"min": 2, "max": 6, "target": 4,
                                                                          "spares": 1})
    wl = build_workload(body, spec, TEMPLATE, ordinal=1, workers=4, min_workers=2)
    assert wl["metadata"]["name"] == "j-q1" and wl["metadata"]["labels"]["cohort.dev/job"] == "j"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert wl["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"] == "true"
    assert wl["spec"]["queueName"] == "team"
    assert [(p["name"], p["count"], p.get("minCount")) for p in wl["spec"]["podSets"]] == [
        ("workers", 4, 2), ("spares", 1, None)]
    assert wl["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                              "name": "high"}
    # min == target: no partial admission.
    body, spec = job(replicas={"min": 4, "max": 6, "target": 4}, scheduling={"priorityClassName": "p"})
    wl = build_workload(body, spec, TEMPLATE, ordinal=2, workers=4, min_workers=4)
    assert "minCount" not in wl["spec"]["podSets"][0] and len(wl["spec"]["podSets"]) == 1
    assert wl["spec"]["priorityClassRef"]["kind"] == "PriorityClass"


def test_admission_reads_the_admitted_count_kueues_reason_and_the_flavor_placement():
    flavors = {"pool-a": {"spec": {"nodeLabels": {"pool": "a"},
                                   "tolerations": [{"key": "gpu", "operator": "Exists"}]}}}
    waiting = [parse_slice(workload("j-q1", 4, min_count=2, pending="insufficient quota"))]
    a = admission_of("team", waiting, flavors)
    assert (a.workers, a.reason, a.message) == (0, "Pending", "insufficient quota")
    a = admission_of("team", [parse_slice(workload("j-q1", 4, min_count=2, admitted=3))], flavors)
    assert (a.workers, a.workload, a.evicted) == (3, "j-q1", False)
    assert a.placement == {"nodeSelector": {"pool": "a"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}
    # Scaled down in place: the pod set's count is the live one, not the assignment's.
    assert admission_of("team", [parse_slice(workload("j-q1", 2, admitted=3))], flavors).workers == 2
    a = admission_of("team", [parse_slice(workload("j-q1", 4, admitted=3, evicted="Preempted"))], flavors)
    assert (a.workers, a.evicted, a.reason) == (0, True, "Preempted")
    # Mid-swap: the old slice is already Finished as replaced, the new one not yet admitted.
    swap = [parse_slice(workload("j-q1", 4, admitted=3, finished="WorkloadSliceReplaced")),
            parse_slice(workload("j-q2", 4, replaces="j-q1"))]
    assert admission_of("team", swap, flavors).workers == 3
    # Finished for another reason: nothing is admitted.
    assert admission_of("team", [parse_slice(workload("j-q1", 4, admitted=3, finished="Succeeded"))],
                        flavors).workers == 0


def test_plan_creates_one_workload_and_replaces_it_when_the_spec_changes_before_admission():
    body, spec = job()
    [create] = plan(body, spec, [], TEMPLATE, phase="Pending", finish_reason="", finish_message="", active_pods=0, training=False)
    assert isinstance(create, Create) and create.manifest["metadata"]["name"] == "j-q1"
    fresh = parse_slice(workload("j-q1", 4, min_count=2, pending="x", asks=want(body, spec)))
    assert plan(body, spec, [fresh], TEMPLATE, phase="Suspended", finish_reason="", finish_message="",
                active_pods=0, training=False) == []
    body2, spec2 = job(replicas={"min": 2, "max": 6, "target": 5})
    assert plan(body2, spec2, [fresh], TEMPLATE, phase="Suspended", finish_reason="", finish_message="",
                active_pods=0, training=False) == [Delete("j-q1", "the spec changed")]


def test_plan_follows_the_quota_shrinks_in_place_and_grows_through_a_replacing_slice():
    body, spec = job()
    asks = want(body, spec)
    admitted3 = parse_slice(workload("j-q1", 4, min_count=2, admitted=3, asks=asks))
    [grow] = plan(body, spec, [admitted3], TEMPLATE, phase="Running", finish_reason="", finish_message="",
                  active_pods=3, training=True)
    assert isinstance(grow, Create)
    m = grow.manifest
    assert m["metadata"]["name"] == "j-q2" and m["spec"]["podSets"][0]["count"] == 4
    assert "minCount" not in m["spec"]["podSets"][0]  # at least 3 + 1 = all 4
    assert m["metadata"]["annotations"]["kueue.x-k8s.io/workload-slice-replacement-for"] == "ns/j-q1"
    pending_grow = parse_slice(workload("j-q2", 4, replaces="j-q1", pending="no quota", asks=asks))
    assert plan(body, spec, [admitted3, pending_grow], TEMPLATE, phase="Running", finish_reason="",
                finish_message="", active_pods=3, training=True) == []
    # kubectl scale to 2: the admitted Workload shrinks in place and the growing slice goes.
    body2, spec2 = job(replicas={"min": 2, "max": 6, "target": 2})
    actions = plan(body2, spec2, [admitted3, pending_grow], TEMPLATE, phase="Running", finish_reason="",
                   finish_message="", active_pods=3, training=True)
    assert actions == [Delete("j-q2", "the spec changed"), Shrink("j-q1", 2, None)]


def test_plan_requeues_an_evicted_workload_only_once_its_pods_are_gone():
    body, spec = job()
    evicted = parse_slice(workload("j-q1", 4, admitted=4, evicted="Preempted", asks=want(body, spec)))
    kw = {"phase": "Suspended", "finish_reason": "", "finish_message": "", "training": False}
    assert plan(body, spec, [evicted], TEMPLATE, active_pods=2, **kw) == []
    assert plan(body, spec, [evicted], TEMPLATE, active_pods=0, **kw) == [
        Requeue("j-q1", "Preempted", "preempted by x")]


def test_plan_finishes_admitted_workloads_of_a_finished_job_and_drops_the_rest():
    body, spec = job()
    slices = [parse_slice(workload("j-q1", 4, admitted=4)), parse_slice(workload("j-q2", 5, replaces="j-q1"))]
    assert plan(body, spec, slices, TEMPLATE, phase="Succeeded", finish_reason="Rank0Succeeded",
                finish_message="rank 0 exited 0", active_pods=0, training=False) == [
        Finish("j-q1", "Rank0Succeeded", "rank 0 exited 0"), Delete("j-q2", "the job Succeeded")]
    # A suspended job holds no quota once its pods are gone.
    body, spec = job(runPolicy={"suspend": True})
    assert plan(body, spec, slices[:1], TEMPLATE, phase="Suspended", finish_reason="", finish_message="",
                active_pods=1, training=False) == []
    assert plan(body, spec, slices[:1], TEMPLATE, phase="Suspended", finish_reason="", finish_message="",
                active_pods=0, training=False) == [Delete("j-q1", "runPolicy.suspend")]


def test_requeue_patch_gives_the_quota_back_as_kueues_integrations_do():
    wl = workload("j-q1", 4, admitted=4, evicted="Preempted")
    ops = requeue_patch(wl, "2026-01-01T12:00:00Z")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert {"op": "remove", "path": "/status/admission"} in ops
    conds = {c["type"]: c for c in ops[-1]["value"]}
    assert conds["QuotaReserved"]["status"] == "False" and conds["QuotaReserved"]["reason"] == "Pending"
    assert conds["Admitted"]["status"] == "False"
    assert conds["Requeued"]["status"] == "True" and conds["Requeued"]["reason"] == "Preempted"
    assert (conds["PodsReady"]["status"], conds["PodsReady"]["reason"]) == ("False", "WaitForStart")
    assert conds["Evicted"]["status"] == "True"  # Kueue's own record of the eviction stays
    assert placement([]) == {}


def pods(n: int) -> list[PodView]:
    return [PodView(name=f"j-worker-{i}", uid=f"u{i}", index=i, ip=f"10.0.0.{i}", phase="Running", ready=True)
            for i in range(n)]


def inputs(admission: Admission | None, n_pods: int, status: TrainingJobStatus | None = None,
           w: World | None = None) -> Inputs:
    body, spec = job()
    return Inputs(job=body, spec=spec, status=status or TrainingJobStatus(start_time=fmt_time(NOW)),
                  world=w or World(), pods=pods(n_pods), now=NOW, admission=admission)


def test_decide_keeps_a_queued_job_suspended_with_kueues_words_and_no_pods():
    d = decide(inputs(Admission("team", reason="Pending", message="insufficient unused quota for cpu"), 0))
    assert d.status.phase == "Suspended" and not d.create
    cond = get_condition(d.status.conditions, "Suspended")
    assert (cond.status, cond.reason, cond.message) == ("True", "Pending", "insufficient unused quota for cpu")
    assert get_condition(d.status.conditions, "Admitted").status == "False"
    assert d.status.replicas.admitted == 0


def test_decide_runs_the_admitted_count_on_the_flavors_nodes():
    admission = Admission("team", workers=3, workload="j-q1", placement={"nodeSelector": {"pool": "a"}})
    d = decide(inputs(admission, 0))
    assert len(d.create) == 3  # target 4, Kueue admitted 3
    assert d.placement == {"nodeSelector": {"pool": "a"}} and d.admitted_after is not None
    assert get_condition(d.status.conditions, "Admitted").status == "True"
    members = World(version=1, members=tuple(Member(f"j-worker-{i}", f"u{i}", f"10.0.0.{i}") for i in range(3)))
    st = TrainingJobStatus(phase="Running", start_time=fmt_time(NOW), pod_index=3)
    st.replicas.admitted = 3
    d = decide(inputs(admission, 3, st, members))
    assert not d.create and d.status.replicas.admitted == 3 and d.admitted_after is None


def test_decide_drains_an_evicted_job():
    members = World(version=2, members=tuple(Member(f"j-worker-{i}", f"u{i}", f"10.0.0.{i}") for i in range(2)))
    st = TrainingJobStatus(phase="Running", start_time=fmt_time(NOW), pod_index=2)
    d = decide(inputs(Admission("team", workload="j-q1", evicted=True, reason="Preempted", message="by x"), 2,
                      st, members))
    assert sorted(d.delete) == ["j-worker-0", "j-worker-1"] and d.world.members == ()
    assert d.status.phase == "Suspended"
    assert get_condition(d.status.conditions, "Suspended").reason == "Preempted"
    assert any("Kueue evicted Workload j-q1" in e.message for e in d.events)


def test_plan_finishes_an_older_admitted_slice_that_kueue_left_admitted():
    # Without Kueue's ElasticJobsViaWorkloadSlices the scheduler admits a replacing slice beside the old
    # one instead of finishing it: the operator finishes the old one, or its quota would leak.
    body, spec = job()
    asks = want(body, spec)
    old = parse_slice(workload("j-q1", 4, admitted=3, asks=asks))
    new = parse_slice(workload("j-q2", 4, admitted=4, replaces="j-q1", asks=asks))
    assert plan(body, spec, [old, new], TEMPLATE, phase="Running", finish_reason="", finish_message="",
                active_pods=4, training=True) == [Finish("j-q1", "WorkloadSliceReplaced", "replaced by Workload j-q2")]


def test_plan_releases_the_workloads_of_a_job_taken_out_of_its_queue():
    body, spec = job()
    del body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    slices = [parse_slice(workload("j-q1", 4, admitted=4))]
    assert plan(body, spec, slices, TEMPLATE, phase="Running", finish_reason="", finish_message="",
                active_pods=4, training=False) == [Delete("j-q1", "the job left its queue")]


def test_a_pending_workload_keeps_its_place_when_only_the_operators_defaults_change():
    # An operator upgrade changes the default image (and may add env or labels) in every worker's template;
    # a pending Workload that asks for the same quota is kept, so the job keeps its place in the queue.
    body, spec = job()
    pending = parse_slice(workload("j-q1", 4, min_count=2, pending="no quota", asks=want(body, spec)))
    upgraded = copy.deepcopy(TEMPLATE)
    upgraded["metadata"] = {"labels": {"cohort.dev/operator-version": "2"}}
    upgraded["spec"]["containers"][0] |= {"image": "cohort-trainer:0.2.0", "env": [{"name": "X", "value": "1"}]}
    assert plan(body, spec, [pending], upgraded, phase="Suspended", finish_reason="", finish_message="",
                active_pods=0, training=False) == []
    # what Kueue counts or places by does replace it
    for change in ({"containers": [{"name": "trainer", "resources": {"requests": {"cpu": "2"}}}]},
                   {"nodeSelector": {"pool": "b"}}, {"tolerations": [{"key": "gpu", "operator": "Exists"}]}):
        moved = {"spec": {**copy.deepcopy(TEMPLATE["spec"]), **change}}
        assert plan(body, spec, [pending], moved, phase="Suspended", finish_reason="", finish_message="",
                    active_pods=0, training=False) == [Delete("j-q1", "the spec changed")], change


def test_a_pod_stuck_terminating_stops_holding_the_quota_after_the_grace():
    def pod(name, deadline="", **kw):
        return PodView(name=name, terminating=bool(deadline), deletion_deadline=deadline, **kw)

    pods = [pod("j-worker-0", fmt_time(NOW - dt.timedelta(seconds=30))),  # 30 s past its deadline
            pod("j-worker-1", fmt_time(NOW + dt.timedelta(seconds=10))),  # still in its grace period
            pod("j-worker-2"), pod("j-worker-3", failed=True), pod("x", owned=False)]
    assert holding_quota(pods, NOW, 60) == (3, 30.0)   # worker-0 stuck for 30 more s, the first to let go
    assert holding_quota(pods, NOW, 20) == (2, 30.0)   # worker-0 let go; worker-1 in 10 + 20 s
    assert holding_quota(pods[2:], NOW, 20) == (1, None)


def test_podsready_follows_kueues_states_from_the_world():
    # Kueue's waitForPodsReady evicts an admitted Workload not PodsReady within its timeout (WaitForStart from
    # the admission, WaitForRecovery from the loss); the job is ready while it trains with >= replicas.min.
    assert pods_ready(("", ""), False) == (False, "WaitForStart")
    assert pods_ready(("False", "WaitForStart"), False) is None
    assert pods_ready(("False", "WaitForStart"), True) == (True, "Started")
    assert pods_ready(("True", "Started"), True) is None
    assert pods_ready(("True", "Started"), False) == (False, "WaitForRecovery")
    assert pods_ready(("False", "WaitForRecovery"), False) is None
    assert pods_ready(("False", "WaitForRecovery"), True) == (True, "Recovered")
    assert pods_ready(("True", "Recovered"), False) == (False, "WaitForRecovery")
    body, spec = job()
    admitted = workload("j-q1", 4, admitted=4, asks=want(body, spec))
    admitted["status"]["conditions"] = [c for c in admitted["status"]["conditions"] if c["type"] != "PodsReady"]
    kw = {"phase": "Running", "finish_reason": "", "finish_message": "", "active_pods": 4}
    assert plan(body, spec, [parse_slice(admitted)], TEMPLATE, training=True, **kw) == [
        MarkPodsReady("j-q1", True, "Started")]
    admitted["metadata"]["resourceVersion"] = "41"
    ops = pods_ready_patch(admitted, True, "Started", "2026-01-01T12:00:00Z")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert [c["type"] for c in ops[1]["value"]] == ["QuotaReserved", "Admitted", "PodsReady"]
    assert ops[1]["value"][-1]["status"] == "True"

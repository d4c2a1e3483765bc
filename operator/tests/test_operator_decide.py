"""Lifecycle decisions of one reconcile (issue 3 §4, contract §3), without a cluster."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from tests.support.specs import WORKLOAD

from cohort.api.models import TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import parse, to_dict
from cohort.operator.decide import Decision, Inputs, decide
from cohort.operator.decide.finish import FINISHING_GRACE_S
from cohort.operator.lifecycle import fmt_time, get_condition
from cohort.operator.observe import PodView
from cohort.operator.stragglers import Straggler
from cohort.operator.world import Member, World

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def pod(i: int, *, ready: bool = True, **kw) -> PodView:
    name = f"j-worker-{i}"
    return PodView(name=name, uid=f"u{i}", index=i, ip=f"10.0.0.{i}", node=kw.pop("node", "n1"),
                   phase=kw.pop("phase", "Running"), ready=ready, **kw)


def world(version: int, *idx: int, spares: tuple[int, ...] = ()) -> World:
    return World(version=version, members=tuple(Member(f"j-worker-{i}", f"u{i}", f"10.0.0.{i}") for i in idx),
                 spares=tuple(Member(f"j-worker-{i}", f"u{i}", f"10.0.0.{i}") for i in spares))


def run(pods, *, spec=None, status=None, w=None, now=NOW, **kw) -> Decision:
    raw = {"workload": dict(WORKLOAD), "replicas": {"min": 2, "max": 4, "target": 2},
           "faultTolerance": {"backoffSeconds": 10, "maxBackoffSeconds": 60, "maxRestarts": 3,
                              "belowMinTimeoutSeconds": 100}}
    for k, v in (spec or {}).items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "generation": 7}, "spec": raw}
    st = status or TrainingJobStatus(start_time=fmt_time(now))
    return decide(Inputs(job=job, spec=parse(TrainingJobSpec, raw), status=st, world=w or World(), pods=list(pods),
                           now=now, **kw))


def reasons(plan: Decision) -> list[str]:
    return [e.reason for e in plan.events]


def running(version=1, *idx, **kw) -> TrainingJobStatus:
    st = TrainingJobStatus(phase="Running", start_time=fmt_time(NOW - dt.timedelta(seconds=30)), pod_index=max(idx) + 1)
    for k, v in kw.items():
        setattr(st, k, v)
    return st


def test_new_job_creates_target_plus_spares_and_stays_pending():
    plan = run([], spec={"replicas": {"spares": 1}})
    assert [r.index for r in plan.create] == [0, 1, 2]
    assert plan.status.pod_index == 3
    assert plan.status.phase == "Pending"
    assert plan.status.start_time and plan.status.below_min_since
    assert plan.world is None
    assert get_condition(plan.status.conditions, "Running").status == "False"
    assert plan.status.selector == "cohort.dev/job=j,cohort.dev/role=worker"


def test_gang_start_waits_for_the_target_within_the_grace():
    # 2 of 3 Ready, 119 s into the 120 s default grace: no world yet, and a wake-up when it ends.
    # (Past belowMinTimeoutSeconds=100 too: min are Ready, so the job does not fail.)
    st = TrainingJobStatus(pod_index=3, start_time=fmt_time(NOW), below_min_since=fmt_time(NOW - dt.timedelta(seconds=119)))
    plan = run([pod(0), pod(1), pod(2, ready=False)], spec={"replicas": {"target": 3}}, status=st)
    assert (plan.world is None or not plan.world.members) and plan.status.phase == "Pending"
    assert plan.requeue_after is not None and plan.requeue_after <= 1
    assert "gang start" in get_condition(plan.status.conditions, "Running").message
    # The third turns Ready: the first world is the whole gang, at once.
    plan = run([pod(0), pod(1), pod(2)], spec={"replicas": {"target": 3}}, status=st)
    assert plan.world.version == 1 and plan.world.names == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert "GangStartTimedOut" not in reasons(plan)


def test_gang_start_does_not_hide_too_few_workers():
    st = TrainingJobStatus(pod_index=3, start_time=fmt_time(NOW), below_min_since=fmt_time(NOW - dt.timedelta(seconds=101)))
    plan = run([pod(0), pod(1, ready=False), pod(2, ready=False)],
               spec={"replicas": {"target": 3, "startupGraceSeconds": 600}}, status=st)
    assert get_condition(plan.status.conditions, "Failed").reason == "BelowMinTimeout"


def test_gang_start_grace_zero_starts_at_min():
    plan = run([pod(0), pod(1), pod(2, ready=False)], spec={"replicas": {"target": 3, "startupGraceSeconds": 0}},
               status=TrainingJobStatus(pod_index=3, start_time=fmt_time(NOW)))
    assert plan.world.names == ["j-worker-0", "j-worker-1"]


def test_min_ready_forms_the_world_once_the_start_grace_has_passed():
    st = TrainingJobStatus(pod_index=3, start_time=fmt_time(NOW), below_min_since=fmt_time(NOW - dt.timedelta(seconds=121)))
    plan = run([pod(0), pod(1), pod(2, ready=False)], spec={"replicas": {"target": 3}}, status=st)
    assert plan.world.version == 1 and plan.world.names == ["j-worker-0", "j-worker-1"]
    assert plan.status.phase == "Running"
    assert {"WorldPublished", "Running", "GangStartTimedOut"} <= set(reasons(plan))
    cond = get_condition(plan.status.conditions, "Running")
    assert cond.status == "True" and cond.observed_generation == 7
    assert get_condition(plan.status.conditions, "Ready").status == "False"  # 2 of 3
    assert plan.status.replicas.active == 2 and plan.status.replicas.desired == 3
    assert plan.create == []


def test_failed_member_leaves_the_world_at_once_and_is_replaced_after_backoff():
    plan = run([pod(0), pod(1, ready=False, phase="Failed", failed=True, exit_code=137)],
               status=running(1, 0, 1), w=world(1, 0, 1))
    assert plan.status.restarts == 1 and plan.status.replacements.failure == 1
    assert plan.delete == {"j-worker-1": "failed"}
    assert plan.world.version == 2 and plan.world.members == ()  # below min: survivors wait
    assert "j-worker-1" in plan.status.retiring
    assert plan.create == [] and plan.requeue_after == pytest.approx(10)
    assert plan.status.phase == "Recovering"
    assert "WorkerFailed" in reasons(plan)
    # Backoff over: the replacement is created; the failure is not counted twice.
    later = run([pod(0), pod(1, ready=False, phase="Failed", failed=True, terminating=True)],
                status=plan.status, w=plan.world, now=NOW + dt.timedelta(seconds=11))
    assert later.status.restarts == 1
    assert [r.index for r in later.create] == [2]


def test_backoff_is_exponential_and_capped():
    st = running(1, 0, 1, restarts=2)
    plan = run([pod(0), pod(1, failed=True, ready=False, phase="Failed")], status=st, w=world(1, 0, 1),
               spec={"faultTolerance": {"maxRestarts": 10, "maxBackoffSeconds": 30}})
    assert plan.status.backoff_until == fmt_time(NOW + dt.timedelta(seconds=30))  # 10 * 2**2 = 40, capped


def test_spare_is_promoted_immediately():
    plan = run([pod(0), pod(1, failed=True, ready=False, phase="Failed"), pod(2)],
               spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2), w=world(1, 0, 1, spares=(2,)))
    assert plan.world.names == ["j-worker-0", "j-worker-2"] and plan.world.version == 2
    assert "SparePromoted" in reasons(plan)


def test_an_unreachable_member_leaves_at_once_and_its_failure_is_counted_when_seen():
    """Its peers reported a failed collective and nothing listens on its port (reports.py): it leaves the
    world before its kubelet says anything, a spare takes its rank, and it is never admitted again."""
    gone = "nothing listens on 10.0.0.1:9400"
    pods = [pod(0), pod(1, unreachable=gone), pod(2)]
    plan = run(pods, spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2), w=world(1, 0, 1, spares=(2,)))
    assert plan.world.names == ["j-worker-0", "j-worker-2"] and plan.world.version == 2
    assert "is unreachable" in plan.world.reason
    assert any(e.reason == "WorkerLost" and gone in e.message for e in plan.events)
    assert "j-worker-1" not in plan.delete and plan.status.restarts == 0  # its kubelet reports it
    again = run(pods, spec={"replicas": {"spares": 1}}, status=plan.status, w=plan.world)
    assert again.world is None or "j-worker-1" not in again.world.names + [m.pod for m in again.world.spares]
    failed = run([pod(0), pod(1, failed=True, ready=False, phase="Failed", unreachable=gone), pod(2)],
                 spec={"replicas": {"spares": 1}}, status=plan.status, w=plan.world)
    assert failed.status.restarts == 1 and "j-worker-1" in failed.delete


def test_a_hung_member_is_counted_as_a_failure_deleted_and_its_rank_taken_by_a_spare():
    """Its peers found it absent from a rendezvous and the operator checked its trainer (reports.stuck): its
    process lives, so no kubelet will report it; it is counted and replaced like a failed worker."""
    why = "it never arrived at world v2's rendezvous, which j-worker-0 waited out, and its trainer is still in a step"
    pods = [pod(0), pod(1, hung=why), pod(2)]
    plan = run(pods, spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2), w=world(2, 0, 1, spares=(2,)))
    assert plan.world.names == ["j-worker-0", "j-worker-2"] and plan.world.version == 3
    assert plan.delete == {"j-worker-1": "failed"}
    assert plan.status.restarts == 1 and plan.status.replacements.failure == 1
    assert any(e.reason == "WorkerFailed" and "hung: " + why in e.message for e in plan.events), plan.events
    again = run([pod(0), pod(1, hung=why, terminating=True), pod(2)], spec={"replicas": {"spares": 1}},
                status=plan.status, w=plan.world)
    assert again.status.restarts == 1  # counted once


def test_a_false_alarm_re_forms_the_same_members_under_a_new_version():
    """A report that every member answers (reports.py): nobody is lost, their collective failed anyway and
    they wait for the next world, so the same members, ranks and spares are published as the next version."""
    pods = [pod(0), pod(1), pod(2)]
    why = "j-worker-0 reported a failed collective (Timed out) and every member answers"
    plan = run(pods, spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2), w=world(3, 0, 1, spares=(2,)),
               reform=why)
    assert plan.world.version == 4 and plan.world.names == ["j-worker-0", "j-worker-1"]
    assert [m.pod for m in plan.world.spares] == ["j-worker-2"] and why in plan.world.reason
    assert "WorldReformed" in reasons(plan) and not plan.delete and plan.status.restarts == 0
    quiet = run(pods, spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2), w=world(3, 0, 1, spares=(2,)))
    assert quiet.world is None or quiet.world.version == 3  # no report, no new version


def test_too_many_restarts_fails_the_job():
    error = json.dumps({"error": "workload.dataset: no files match '*.txt' under /data/missing"})
    plan = run([pod(0), pod(1, failed=True, ready=False, phase="Failed", exit_code=2, reason="Error", message=error)],
               status=running(1, 0, 1, restarts=3), w=world(1, 0, 1))
    assert plan.status.phase == "Failed"
    cond = get_condition(plan.status.conditions, "Failed")
    assert cond.status == "True" and cond.reason == "TooManyRestarts"
    # The worker's own words, so `cohort submit --watch` and `kubectl describe` say why.
    assert cond.message == ("4 worker failures exceed faultTolerance.maxRestarts=3; the last: j-worker-1 (exit code 2, "
                            "Error, workload.dataset: no files match '*.txt' under /data/missing)")
    assert set(plan.delete) == {"j-worker-0", "j-worker-1"}
    assert plan.status.completion_time


def test_deleted_member_is_replaced_without_backoff_or_restart_count():
    plan = run([pod(0), pod(1, terminating=True, ready=False)], status=running(1, 0, 1), w=world(1, 0, 1))
    assert plan.status.restarts == 0
    assert "was deleted" in plan.world.reason
    assert [r.index for r in plan.create] == [2]
    assert "WorkerLost" in reasons(plan)


@pytest.mark.parametrize("policy,done,expect", [
    ("rank0", {0}, "Succeeded"), ("rank0", {1}, "Running"), ("all", {0}, "Running"), ("all", {0, 1}, "Succeeded")])
def test_success_policy(policy, done, expect):
    pods = [pod(i, ready=i not in done, phase="Succeeded" if i in done else "Running", succeeded=i in done,
                exit_code=0 if i in done else None,
                message='{"step": 100, "epoch": 3, "loss": 0.1, "accuracy": 0.97}' if i in done else "")
            for i in (0, 1)]
    plan = run(pods, spec={"runPolicy": {"successPolicy": policy}}, status=running(1, 0, 1), w=world(1, 0, 1))
    assert plan.status.phase == expect
    if expect == "Succeeded":
        assert get_condition(plan.status.conditions, "Succeeded").status == "True"
        assert plan.status.progress.step == 100 and plan.status.progress.accuracy == 0.97
        assert all(f"j-worker-{i}" not in plan.delete for i in done)
        # A member still running gets the finishing grace to exit on its own (its log stays), then goes.
        running_members = {f"j-worker-{i}" for i in (0, 1)} - {f"j-worker-{i}" for i in done}
        assert not running_members & set(plan.delete)
        assert plan.requeue_after == (pytest.approx(FINISHING_GRACE_S) if running_members else None)
        later = run(pods, spec={"runPolicy": {"successPolicy": policy}}, status=plan.status, w=world(1, 0, 1),
                    now=NOW + dt.timedelta(seconds=FINISHING_GRACE_S + 0.1))
        assert later.delete == {n: "job Succeeded" for n in running_members}
    else:
        assert plan.world is None and plan.create == []  # completing: membership frozen


def test_ttl_after_finished_deletes_the_job():
    st = TrainingJobStatus(phase="Succeeded", completion_time=fmt_time(NOW - dt.timedelta(seconds=5)))
    assert run([], status=st, spec={"runPolicy": {"ttlSecondsAfterFinished": 10}}).requeue_after == pytest.approx(5)
    assert run([], status=st, spec={"runPolicy": {"ttlSecondsAfterFinished": 2}}).delete_job
    assert not run([], status=st).delete_job


def test_suspend_deletes_pods_publishes_an_empty_world_and_resume_recreates():
    plan = run([pod(0), pod(1)], spec={"runPolicy": {"suspend": True}}, status=running(1, 0, 1, restarts=1),
               w=world(1, 0, 1))
    assert plan.status.phase == "Suspended" and plan.status.restarts == 1
    assert set(plan.delete) == {"j-worker-0", "j-worker-1"}
    assert plan.world.version == 2 and plan.world.members == ()
    assert get_condition(plan.status.conditions, "Suspended").status == "True"
    resumed = run([], status=plan.status, w=plan.world, now=NOW + dt.timedelta(seconds=60))
    assert "Resumed" in reasons(resumed)
    assert [r.index for r in resumed.create] == [2, 3]
    assert resumed.status.phase == "Pending"
    assert resumed.status.start_time == fmt_time(NOW + dt.timedelta(seconds=60))


def test_active_deadline():
    st = running(1, 0, 1)
    st.start_time = fmt_time(NOW - dt.timedelta(seconds=100))
    plan = run([pod(0), pod(1)], status=st, w=world(1, 0, 1), spec={"runPolicy": {"activeDeadlineSeconds": 50}})
    assert plan.status.phase == "Failed"
    assert get_condition(plan.status.conditions, "Failed").reason == "DeadlineExceeded"
    ok = run([pod(0), pod(1)], status=st, w=world(1, 0, 1), spec={"runPolicy": {"activeDeadlineSeconds": 150}})
    assert ok.status.phase == "Running" and ok.requeue_after == pytest.approx(50)


def test_below_min_timeout_fails():
    st = TrainingJobStatus(pod_index=2, start_time=fmt_time(NOW), below_min_since=fmt_time(NOW - dt.timedelta(seconds=99)))
    assert run([pod(0), pod(1, ready=False)], status=st).requeue_after == pytest.approx(1)
    st.below_min_since = fmt_time(NOW - dt.timedelta(seconds=101))
    plan = run([pod(0), pod(1, ready=False)], status=st)
    assert plan.status.phase == "Failed"
    assert get_condition(plan.status.conditions, "Failed").reason == "BelowMinTimeout"


def test_scale_down_publishes_first_and_deletes_the_newest():
    pods = [pod(0), pod(1), pod(2), pod(3)]
    plan = run(pods, spec={"replicas": {"target": 2}}, status=running(1, 0, 1, 2, 3), w=world(1, 0, 1, 2, 3))
    assert plan.world.names == ["j-worker-0", "j-worker-1"]
    assert set(plan.delete) == {"j-worker-2", "j-worker-3"}
    assert plan.status.replicas.active == 2


def test_after_a_full_restart_the_next_world_waits_for_the_gang_again():
    # The world fell below min (empty): re-forming waits for the target like a start does.
    st = running(2, 0, 1, 2)
    st.below_min_since = fmt_time(NOW - dt.timedelta(seconds=5))
    plan = run([pod(0), pod(3), pod(4, ready=False)], spec={"replicas": {"target": 3}}, status=st, w=World(version=2))
    assert plan.world is None or not plan.world.members
    plan = run([pod(0), pod(3), pod(4)], spec={"replicas": {"target": 3}}, status=st, w=World(version=2))
    assert plan.world.version == 3 and plan.world.size == 3


def test_scale_up_creates_pods_and_admits_them_when_ready():
    plan = run([pod(0), pod(1)], spec={"replicas": {"target": 4}}, status=running(1, 0, 1), w=world(1, 0, 1))
    assert [r.index for r in plan.create] == [2, 3] and plan.world is None
    assert plan.status.phase == "Running"  # a scale-up is not a recovery
    later = run([pod(0), pod(1), pod(2), pod(3)], spec={"replicas": {"target": 4}}, status=plan.status,
                w=world(1, 0, 1))
    assert later.world.names == ["j-worker-0", "j-worker-1", "j-worker-2", "j-worker-3"]


def test_extra_pods_are_deleted():
    plan = run([pod(0), pod(1), dataclasses.replace(pod(7), owned=False, name="intruder")],
               status=running(1, 0, 1), w=world(1, 0, 1))
    assert plan.delete == {"intruder": "carries the job's labels but was not created for it"}
    assert "ExtraPodDeleted" in reasons(plan)


def test_pod_index_never_goes_back():
    st = running(1, 0, 1)
    st.pod_index = 0  # e.g. a status lost behind the operator's back
    plan = run([pod(0), pod(5, ready=False)], status=st, w=world(1, 0))
    assert plan.status.pod_index >= 6
    assert all(r.index >= 6 for r in plan.create)


def test_steady_state_is_a_no_op():
    first = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1))
    again = run([pod(0), pod(1)], status=first.status, w=world(1, 0, 1))
    assert again.world is None and again.create == [] and again.delete == {} and again.events == []
    assert again.status == first.status


def test_straggler_replace_flow():
    verdict = Straggler(pod="j-worker-1", mean_s=0.4, reference_s=0.1)
    spec = {"replicas": {"target": 3, "max": 4}}
    pods = [pod(0), pod(1, node="slow"), pod(2)]
    st = running(1, 0, 1, 2)
    plan = run(pods, spec=spec, status=st, w=world(1, 0, 1, 2), straggler=verdict)
    (req,) = plan.create
    assert req.replaces == "j-worker-1" and req.avoid_nodes == ("slow",) and req.index == 3
    assert plan.straggler_handled and "StragglerDetected" in reasons(plan)
    # The replacement starts: nothing changes, and it is not a surplus pod.
    starting = pods + [pod(3, ready=False, node="fast", replaces="j-worker-1")]
    plan2 = run(starting, spec=spec, status=plan.status, w=world(1, 0, 1, 2))
    assert plan2.delete == {} and plan2.create == [] and plan2.world is None
    # Ready: one new version removes the straggler and appends the replacement; then it is deleted.
    ready = pods + [pod(3, node="fast", replaces="j-worker-1")]
    plan3 = run(ready, spec=spec, status=plan2.status, w=world(1, 0, 1, 2))
    assert plan3.world.version == 2 and plan3.world.names == ["j-worker-0", "j-worker-2", "j-worker-3"]
    assert plan3.delete == {"j-worker-1": "replaced as a straggler"}
    assert plan3.status.replacements.straggler == 1 and "StragglerReplaced" in reasons(plan3)
    assert plan3.status.phase == "Running"
    # A restart after the world was published but before the status: finished exactly once.
    plan4 = run(ready, spec=spec, status=plan2.status, w=plan3.world)
    assert plan4.status.replacements.straggler == 1 and "j-worker-1" in plan4.delete
    plan5 = run(ready, spec=spec, status=plan3.status, w=plan3.world)
    assert plan5.status.replacements.straggler == 1 and plan5.delete == {"j-worker-1": "replaced"}


def test_straggler_ignore_policy_only_reports():
    verdict = Straggler(pod="j-worker-1", mean_s=0.4, reference_s=0.1)
    plan = run([pod(0), pod(1)], spec={"stragglers": {"policy": "ignore"}}, status=running(1, 0, 1),
               w=world(1, 0, 1), straggler=verdict)
    assert plan.create == [] and plan.delete == {} and plan.straggler_handled
    assert "StragglerDetected" in reasons(plan)


def test_straggler_swapped_with_a_ready_spare():
    verdict = Straggler(pod="j-worker-0", mean_s=0.4, reference_s=0.1)
    plan = run([pod(0), pod(1), pod(2, node="n2")], spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2),
               w=world(1, 0, 1, spares=(2,)), straggler=verdict)
    assert plan.world.names == ["j-worker-1", "j-worker-2"]
    assert plan.delete == {"j-worker-0": "replaced as a straggler"}
    assert [r.index for r in plan.create] == [3]  # the spare is replenished


def test_progress_is_copied_into_status():
    progress = {"step": 42, "epoch": 1, "loss": 0.5, "samplesPerSecond": 1000.0, "plan": "dp=2",
                "lastCheckpoint": {"step": 40, "location": "/c/j/step-00000040", "time": 1767268800.0}}
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1), progress=progress)
    pr = plan.status.progress
    assert (pr.step, pr.epoch, pr.loss, pr.samples_per_second, pr.plan) == (42, 1, 0.5, 1000.0, "dp=2")
    assert pr.updated_at == fmt_time(NOW)
    assert plan.status.last_checkpoint.step == 40 and plan.status.last_checkpoint.time.startswith("2026-01-01")


def test_the_durable_checkpoint_tells_its_size_and_the_cost_of_a_restart():
    progress = {"step": 42, "restartCostSeconds": 7.4,
                "lastCheckpoint": {"step": 40, "location": "/c/j/step-00000040", "time": "2026-01-01T00:00:00Z",
                                   "bytes": 123456}}
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1), progress=progress)
    d = plan.status.last_durable_checkpoint
    assert (d.step, d.location, d.time, d.bytes, d.restart_cost_seconds) == (
        40, "/c/j/step-00000040", "2026-01-01T00:00:00Z", 123456, 7)
    assert to_dict(plan.status)["lastDurableCheckpoint"]["restartCostSeconds"] == 7
    # before the first checkpoint: a restart would lose everything so far; no checkpoint is named
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1),
               progress={"step": 5, "restartCostSeconds": 3})
    assert (plan.status.last_durable_checkpoint.step, plan.status.last_durable_checkpoint.restart_cost_seconds) == (0, 3)


def test_progress_shows_percent_eta_and_a_readable_loss():
    """Kubeflow Trainer-style progress: percent from the trainer's stepsTotal, its ETA as
    reported, and the loss at 4 significant digits (kubectl prints every digit it gets)."""
    progress = {"step": 33, "stepsTotal": 120, "etaSeconds": 87, "loss": 0.0004406031632930907}
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1), progress=progress)
    pr = plan.status.progress
    assert (pr.percent, pr.eta_seconds, pr.loss) == (27.5, 87, 0.0004406)
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1), progress={"step": 7})
    assert plan.status.progress.percent is None  # no total reported: no guess


def test_a_language_models_eval_loss_and_perplexity_reach_the_status():
    """From /progress (evalLoss) and from a termination summary (eval_loss), at 4 significant digits."""
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1),
               progress={"step": 300, "evalLoss": 4.490033382962306, "perplexity": 89.12442106618707})
    assert (plan.status.progress.eval_loss, plan.status.progress.perplexity) == (4.49, 89.12)
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1),
               progress={"step": 300, "eval_loss": 5.123456, "perplexity": 167.9})
    assert plan.status.progress.eval_loss == 5.123


def test_a_succeeded_job_shows_100_percent_and_no_time_left():
    pods = [pod(0, ready=False, phase="Succeeded", succeeded=True, exit_code=0), pod(1)]
    plan = run(pods, status=running(1, 0, 1), w=world(1, 0, 1),
               progress={"step": 118, "stepsTotal": 120, "etaSeconds": 3})
    assert plan.status.phase == "Succeeded"
    assert (plan.status.progress.percent, plan.status.progress.eta_seconds) == (100.0, 0)


def test_rank0_success_wins_over_peers_failing_on_the_way_out():
    pods = [pod(0, ready=False, phase="Succeeded", succeeded=True, exit_code=0),
            pod(1, ready=False, phase="Failed", failed=True, exit_code=1)]
    plan = run(pods, status=running(1, 0, 1, restarts=3), w=world(1, 0, 1))
    assert plan.status.phase == "Succeeded" and plan.status.restarts == 3


def test_throughput_in_tokens_and_mfu_reach_the_status():
    """The Tokens/s column (and MFU with -o wide) read these, at 4 significant digits."""
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1),
               progress={"step": 9, "samplesPerSecond": 123.4, "tokensPerSecond": 126361.6, "mfu": 0.41234567})
    pr = plan.status.progress
    assert (pr.tokens_per_second, pr.mfu) == (126400.0, 0.4123)
    plan = run([pod(0), pod(1)], status=running(1, 0, 1), w=world(1, 0, 1), progress={"step": 9, "mfu": None})
    assert plan.status.progress.mfu is None  # a worker that knows no peak reports none


def test_a_straggler_is_swapped_for_a_spare_on_another_node_never_its_own():
    # In make demo the straggler's own node also held the first spare, and that spare was promoted: when the
    # node is the cause (throttling, a noisy neighbour) it is as slow. Spares: 2 on the slow node, 3 elsewhere.
    verdict = Straggler(pod="j-worker-0", mean_s=0.4, reference_s=0.1)
    pods = [pod(0, node="slow"), pod(1), pod(2, node="slow"), pod(3, node="fast")]
    plan = run(pods, spec={"replicas": {"spares": 2}}, status=running(1, 0, 1, 2, 3),
               w=world(1, 0, 1, spares=(2, 3)), straggler=verdict)
    assert plan.world.names == ["j-worker-1", "j-worker-3"]
    assert plan.delete == {"j-worker-0": "replaced as a straggler"}
    events = {e.reason: e.message for e in plan.events}
    assert "swapping in spare j-worker-3 on node fast, away from node slow" in events["StragglerDetected"]
    assert "(node fast)" in events["SparePromoted"]
    # Only a spare on the straggler's node: a replacement starts away from it, and the straggler stays.
    pods = [pod(0, node="slow"), pod(1), pod(2, node="slow")]
    plan = run(pods, spec={"replicas": {"spares": 1}}, status=running(1, 0, 1, 2),
               w=world(1, 0, 1, spares=(2,)), straggler=verdict)
    assert plan.world is None and plan.delete == {}
    (req,) = plan.create
    assert req.replaces == "j-worker-0" and req.avoid_nodes == ("slow",)


def test_a_straggler_s_place_goes_to_its_replacement_not_a_spare_on_its_node():
    # make demo (2026-12-02): a failed worker's replacement (worker 2) turned Ready on the straggler's node while
    # the straggler's own replacement (worker 3, away from it) started; when worker 3 was Ready, worker 2 took
    # the straggler's place on the slow node and worker 3 was left over as a spare.
    spec = {"replicas": {"target": 2, "max": 4, "spares": 1}}
    pods = [pod(0, node="slow"), pod(1), pod(2, node="slow"), pod(3, node="fast", replaces="j-worker-0")]
    plan = run(pods, spec=spec, status=running(1, 0, 1, 2, 3), w=world(1, 0, 1, spares=(2,)))
    assert plan.world.names == ["j-worker-1", "j-worker-3"]
    assert plan.delete == {"j-worker-0": "replaced as a straggler"}
    assert "by j-worker-3" in {e.reason: e.message for e in plan.events}["StragglerReplaced"]


@pytest.mark.parametrize("message, said", [
    ('{"error": "workload.model: no module named x"}', "workload.model: no module named x"),
    ('{"step": 60, "loss": 1.2}', ""),  # a summary says nothing went wrong
    ("Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: no files match\n\n",
     "ValueError: no files match"),  # the kubelet's log tail in place of a termination message
    (r'{"level": "error", "msg": "step failed", "exc": "Traceback ...\nRuntimeError: NCCL error"}',
     "RuntimeError: NCCL error"),
    ('{"level": "info", "msg": "rendezvous"}', "rendezvous"),
    ("x" * 400, "x" * 297 + "..."),
    ("", ""),
])
def test_a_failed_workers_words(message, said):
    view = pod(1, failed=True, phase="Failed", exit_code=1, message=message)
    assert view.error() == said
    assert view.describe_exit() == ", ".join(["exit code 1"] + ([said] if said else []))
